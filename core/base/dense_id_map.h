// DenseIdMap<T>: pointers by ids that are handed out counting up from a
// base (0, 1, 2, ...), found in a few instructions: a directory of
// fixed-size pages, indexed by the id's high bits. A hash map costs a hash
// and a probe; every launch looks its buffers up, so that difference is
// paid thousands of times a step.
//
// Ids come and go in any order. A page is freed when its last id leaves, so
// memory follows the ids alive, plus one directory word per kPage ids ever
// handed out. Ids at or above kMaxId are refused (Put returns false): the
// caller keeps them elsewhere.
//
// Thread-safety: none of its own; the owner's lock guards it.
#ifndef STENSOR_CORE_BASE_DENSE_ID_MAP_H_
#define STENSOR_CORE_BASE_DENSE_ID_MAP_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace stensor {

template <typename T>
class DenseIdMap {
 public:
  static constexpr unsigned kPageBits = 8;
  static constexpr uint64_t kPage = uint64_t{1} << kPageBits;
  // 2^32 ids: a directory of at most 16M words (128 MiB) if all were used.
  static constexpr uint64_t kMaxId = uint64_t{1} << 32;

  // The pointer put for `id`, or null.
  T* Find(uint64_t id) const {
    const uint64_t p = id >> kPageBits;
    if (p >= pages_.size()) return nullptr;
    const Page* page = pages_[p].get();
    return page == nullptr ? nullptr : page->at[id & (kPage - 1)];
  }

  // Puts `value` (not null) for `id`, replacing what was there; false, with
  // nothing kept, when `id` is at or above kMaxId.
  bool Put(uint64_t id, T* value) {
    if (id >= kMaxId) return false;
    const uint64_t p = id >> kPageBits;
    if (p >= pages_.size()) pages_.resize(p + 1);
    std::unique_ptr<Page>& page = pages_[p];
    if (page == nullptr) page = std::make_unique<Page>();
    T*& slot = page->at[id & (kPage - 1)];
    if (slot == nullptr) {
      ++page->live;
      ++size_;
    }
    slot = value;
    return true;
  }

  // Forgets `id` (nothing when it has nothing put).
  void Erase(uint64_t id) {
    const uint64_t p = id >> kPageBits;
    if (p >= pages_.size() || pages_[p] == nullptr) return;
    T*& slot = pages_[p]->at[id & (kPage - 1)];
    if (slot == nullptr) return;
    slot = nullptr;
    --size_;
    if (--pages_[p]->live == 0) pages_[p].reset();
  }

  size_t size() const { return size_; }
  // Pages held (for tests: memory follows the ids alive).
  size_t pages() const {
    size_t n = 0;
    for (const auto& page : pages_) n += page != nullptr;
    return n;
  }

 private:
  struct Page {
    std::array<T*, kPage> at{};
    uint64_t live = 0;
  };
  std::vector<std::unique_ptr<Page>> pages_;
  size_t size_ = 0;
};

}  // namespace stensor

#endif  // STENSOR_CORE_BASE_DENSE_ID_MAP_H_
