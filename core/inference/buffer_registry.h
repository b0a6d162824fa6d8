// BufferRegistry: the ordered interval map of live device buffers that
// access inference looks every launch parameter word up in.
//
// A buffer is a [base, base+size) range with a stable id (ids are never
// reused within a process, so access logs can name buffers unambiguously).
// Lookups accept interior pointers. The hot path, FindAll over a launch's
// parameter words, first asks a small per-thread cache of recent hits (a
// training step launches the same kernels on the same buffers over and
// over); only misses take the reader lock and binary-search the sorted array
// of base addresses. A cached hit stays valid for as long as its buffer
// lives, whatever else is added or removed meanwhile: each live buffer owns
// a liveness cell holding its id, which Remove clears, and a hit is only
// taken when the cell still holds the cached id (ids are never reused, so a
// cell handed to a later buffer cannot revive an old entry).
//
// Thread-safety: all methods are thread-safe; lookups run concurrently with
// each other and exclude only Add/Remove on their miss path. A FindAll that
// overlaps a Remove of a buffer it hits may report it or not, as a lookup
// just before or just after the Remove would.
#ifndef STENSOR_CORE_INFERENCE_BUFFER_REGISTRY_H_
#define STENSOR_CORE_INFERENCE_BUFFER_REGISTRY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/base/mutex.h"
#include "core/base/thread_cache.h"

namespace stensor {

// How the application obtained a buffer; decides what stensor may do to it.
enum class BufferKind : uint8_t {
  kDeviceAlloc,    // cuMemAlloc / cuMemAllocPitch
  kStreamOrdered,  // cuMemAllocAsync / cuMemAllocFromPoolAsync
  kAppVmm,         // mapped by the application's own VMM calls: never swapped
};

const char* BufferKindName(BufferKind kind);

struct Buffer {
  uint64_t id = 0;
  uint64_t base = 0;
  uint64_t size = 0;
  int device = 0;
  BufferKind kind = BufferKind::kDeviceAlloc;
};

class BufferRegistry {
  struct CacheEntry;  // below: one slot of the per-thread cache

 public:
  // A live buffer's liveness cell: its id while it lives, 0 once removed
  // (see StillLive).
  using LivenessCell = std::atomic<uint64_t>;

  BufferRegistry() = default;
  BufferRegistry(const BufferRegistry&) = delete;
  BufferRegistry& operator=(const BufferRegistry&) = delete;

  // Registers [base, base+size). Returns the new buffer's id, or nullopt when
  // the range is empty or overlaps a live buffer (the registry is left as it
  // was: stensor then treats the range as unknown memory).
  std::optional<uint64_t> Add(uint64_t base, uint64_t size, int device, BufferKind kind)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Unregisters the buffer that starts exactly at `base`.
  std::optional<Buffer> Remove(uint64_t base) ABSL_LOCKS_EXCLUDED(mu_);

  // Unregisters every buffer that starts in [base, base+size).
  std::vector<Buffer> RemoveRange(uint64_t base, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // The buffer containing `addr`, if any.
  std::optional<Buffer> Find(uint64_t addr) const ABSL_LOCKS_EXCLUDED(mu_);

  // Calls on_hit(word_index, buffer_id) for each of `words` that points
  // into a live buffer. Hits from the per-thread cache take no lock; the
  // rest are looked up under a single reader lock.
  template <typename OnHit>
  void FindAll(const uint64_t* words, size_t count, OnHit&& on_hit) const ABSL_LOCKS_EXCLUDED(mu_) {
    // Relaxed is enough: a buffer whose address reached this thread was
    // added before (happens-before), so these see its bounds or later ones,
    // and later ones still cover every live buffer.
    const uint64_t lowest = lowest_atomic_.load(std::memory_order_relaxed);
    const uint64_t highest = highest_atomic_.load(std::memory_order_relaxed);
    CacheEntry* const cache = ThreadCache();  // one TLS access per call
    // 64 words at a time, with the misses of the cache pass in a bitmask.
    for (size_t start = 0; start < count; start += 64) {
      const size_t n = count - start < 64 ? count - start : 64;
      uint64_t missed = 0;
      for (size_t k = 0; k < n; ++k) {
        const uint64_t w = words[start + k];
        if (w < lowest || w >= highest) continue;  // a scalar, most likely
        const CacheEntry& e = cache[Slot(w)];
        // The owner first: only this registry's cells may be read.
        if (e.owner == instance_ && w - e.base < e.size &&
            e.cell->load(std::memory_order_relaxed) == e.id) {
          on_hit(start + k, e.id);
        } else {
          missed |= uint64_t{1} << k;
        }
      }
      if (missed == 0) continue;
      ReaderMutexLock lock(&mu_);
      for (; missed != 0; missed &= missed - 1) {
        const size_t k = static_cast<size_t>(__builtin_ctzll(missed));
        const size_t i = FindLocked(words[start + k]);
        if (i == kNotFound) continue;
        const Buffer& b = entries_[i];
        cache[Slot(words[start + k])] = CacheEntry{instance_, b.base, b.size, b.id, cells_[i]};
        on_hit(start + k, b.id);
      }
    }
  }

  // Word-at-a-time lookups for the launch path, where a batch would cost
  // more than it saves: the bounds and this thread's cache are fetched once,
  // a cache hit takes no lock, each miss takes the reader lock on its own.
  // Use on the thread that made it, within one operation.
  class Reader {
   public:
    explicit Reader(const BufferRegistry& registry)
        : registry_(registry), instance_(registry.instance_), cache_(ThreadCache()) {
      const uint64_t lowest = registry.lowest_atomic_.load(std::memory_order_relaxed);
      const uint64_t highest = registry.highest_atomic_.load(std::memory_order_relaxed);
      lowest_ = lowest;
      span_ = highest > lowest ? highest - lowest : 0;
    }
    // The id of the live buffer containing `addr`, or 0.
    uint64_t Lookup(uint64_t addr) const {
      // [lowest, highest) in one compare; most misses are scalars.
      if (addr - lowest_ >= span_) return 0;
      const CacheEntry& e = cache_[Slot(addr)];
      if (e.owner == instance_ && addr - e.base < e.size &&
          e.cell->load(std::memory_order_relaxed) == e.id) {
        return e.id;
      }
      return registry_.LookupMissed(addr, cache_, nullptr);
    }
    // The same, and on a hit the buffer's liveness cell in `*cell`, for an
    // answer kept past generation changes (see StillLive).
    uint64_t Lookup(uint64_t addr, const LivenessCell** cell) const {
      if (addr - lowest_ >= span_) return 0;
      const CacheEntry& e = cache_[Slot(addr)];
      if (e.owner == instance_ && addr - e.base < e.size &&
          e.cell->load(std::memory_order_relaxed) == e.id) {
        *cell = e.cell;
        return e.id;
      }
      return registry_.LookupMissed(addr, cache_, cell);
    }

   private:
    // Copies, so that the caller's stores (hits appended to a vector) do
    // not make the compiler reload them from the registry for every word.
    const BufferRegistry& registry_;
    const uint64_t instance_;
    CacheEntry* const cache_;
    uint64_t lowest_, span_;
  };

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // A process-unique number for this registry (never 0), and a count that
  // grows with every Add and every Remove that changed something. Together
  // they let a caller keep an answer computed from the registry (a launch's
  // hits and misses) for as long as no buffer came or went. The same
  // ordering argument as for FindAll's bounds holds: a buffer whose address
  // reached this thread was added before, so a load here sees that Add's
  // count or a later one.
  uint64_t instance() const { return instance_; }
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  // What lets such an answer outlive a generation change that did not touch
  // it, checked word by word after reading generation() (whose acquire makes
  // every earlier Add's bounds and Remove's cleared cell visible here):
  // - a word that hit buffer `id` through `cell` (Reader::Lookup) still
  //   hits it while StillLive(cell, id): buffers never change extent;
  // - a word that hit nothing still hits nothing while OutsideBounds(word).
  // A word in neither case must be looked up again.
  static bool StillLive(const LivenessCell* cell, uint64_t id) {
    return cell->load(std::memory_order_relaxed) == id;
  }
  bool OutsideBounds(uint64_t addr) const {
    return addr < lowest_atomic_.load(std::memory_order_relaxed) ||
           addr >= highest_atomic_.load(std::memory_order_relaxed);
  }

 private:
  // A live buffer's liveness cell: its id while it lives, 0 once removed.
  // Cells sit in chunks that never move or shrink while the registry lives,
  // so a cached pointer to one stays readable; a cell is reused by a later
  // buffer (with a new id) once its buffer is removed.
  using Cell = LivenessCell;
  static constexpr size_t kCellsPerChunk = 1024;

  static constexpr size_t kNotFound = SIZE_MAX;
  // The index into bases_/entries_ of the buffer containing `addr`, or
  // kNotFound.
  size_t FindLocked(uint64_t addr) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Reader's miss path: looks `addr` up under the reader lock and caches a
  // hit in `cache`; with `cell`, stores the hit's liveness cell there.
  uint64_t LookupMissed(uint64_t addr, CacheEntry* cache, const Cell** cell) const
      ABSL_LOCKS_EXCLUDED(mu_);
  Cell* TakeCell(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseCell(Cell* cell) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One slot of the per-thread cache of recent lookups. `owner` is the
  // registry's process-unique instance number (0: empty slot), so a registry
  // built where another was destroyed never meets that one's entries.
  struct CacheEntry {
    uint64_t owner = 0;
    uint64_t base = 0;
    uint64_t size = 0;
    uint64_t id = 0;
    const Cell* cell = nullptr;
  };
  static constexpr size_t kCacheSlots = 256;
  struct ThreadCacheSlots;
  static CacheEntry* ThreadCache();
  // Words into the same 4 KiB page share a slot.
  static size_t Slot(uint64_t addr) {
    return static_cast<size_t>(((addr >> 12) * 0x9E3779B97F4A7C15ull) >> 56);
  }
  void Published() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static uint64_t NextInstance();

  const uint64_t instance_ = NextInstance();
  mutable Mutex mu_;
  // Parallel arrays sorted by base: the bases alone keep the binary search
  // within few cache lines; entries_ holds the rest, cells_ the liveness
  // cells.
  std::vector<uint64_t> bases_ ABSL_GUARDED_BY(mu_);
  std::vector<Buffer> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<Cell*> cells_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Cell[]>> cell_chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<Cell*> free_cells_ ABSL_GUARDED_BY(mu_);
  uint64_t lowest_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;  // quick reject
  uint64_t highest_end_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Copies of lowest_ and highest_end_ for FindAll's lock-free reject.
  std::atomic<uint64_t> lowest_atomic_{UINT64_MAX};
  std::atomic<uint64_t> highest_atomic_{0};
  std::atomic<uint64_t> generation_{0};  // bumped by Published()
};

// Out of the class so the TLS pointer behind it has external linkage (gold
// mislinks initial-exec TLS of internal-linkage types in shared libraries).
struct BufferRegistry::ThreadCacheSlots {
  CacheEntry entries[kCacheSlots];
};

inline BufferRegistry::CacheEntry* BufferRegistry::ThreadCache() {
  return PerThread<ThreadCacheSlots>::Get().entries;
}

}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_BUFFER_REGISTRY_H_
