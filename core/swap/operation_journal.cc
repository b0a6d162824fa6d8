#include "core/swap/operation_journal.h"

#include <algorithm>

#include "core/base/mutex.h"

namespace stensor {

namespace {

// Every thread's slot, for ForEachInFlight. Never destroyed: threads may
// exit after static destructors ran.
struct Registry {
  Mutex mu;
  std::vector<OperationJournal::Slot*> slots ABSL_GUARDED_BY(mu);
};

Registry& Slots() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

OperationJournal::Slot::Slot() {
  Registry& r = Slots();
  MutexLock lock(&r.mu);
  r.slots.push_back(this);
}

OperationJournal::Slot::~Slot() {
  Registry& r = Slots();
  MutexLock lock(&r.mu);
  r.slots.erase(std::find(r.slots.begin(), r.slots.end(), this));
}

void OperationJournal::ForEachInFlight(const void* owner, absl::FunctionRef<void(Slot&)> f) {
  Registry& r = Slots();
  MutexLock lock(&r.mu);
  for (Slot* slot : r.slots) {
    if (slot->owner.load(std::memory_order_seq_cst) == owner) f(*slot);
  }
}

void OperationJournal::AddRecord(absl::Span<const uint64_t> ids, absl::Span<const uint64_t> written,
                                 uint64_t tick, const Use& use, uint32_t key) {
  const size_t need = words_size_ + ids.size() + written.size();
  if (need > words_capacity_) GrowWords(need);
  Record& r = records_.emplace_back();
  uint64_t* w = words_.get() + words_size_;
  r.ids_at = static_cast<uint32_t>(words_size_);
  r.ids_count = static_cast<uint32_t>(ids.size());
  for (uint64_t id : ids) *w++ = id;
  r.written_at = static_cast<uint32_t>(words_size_ + ids.size());
  r.written_count = static_cast<uint32_t>(written.size());
  for (uint64_t id : written) *w++ = id;
  words_size_ = need;
  r.key = key;
  r.tick = tick;
  r.use = use;
}

uint32_t OperationJournal::KeyOf(const Use& use) {
  for (size_t k = 0; k < keys_.size(); ++k) {
    if (keys_[k].first == use.stream && keys_[k].second == use.thread) {
      return static_cast<uint32_t>(k);
    }
  }
  keys_.emplace_back(use.stream, use.thread);
  return static_cast<uint32_t>(keys_.size() - 1);
}

void OperationJournal::GrowWords(size_t need) {
  // Room for kMaxRecords operations of 16 words at first: grown (copied)
  // only for larger ones.
  const size_t capacity = std::max({need, 2 * words_capacity_, size_t{16} * kMaxRecords});
  std::unique_ptr<uint64_t[]> words(new uint64_t[capacity]);  // not zeroed: written before read
  std::copy(words_.get(), words_.get() + words_size_, words.get());
  words_ = std::move(words);
  words_capacity_ = capacity;
}

void OperationJournal::Clear() {
  records_.clear();
  words_size_ = 0;
  keys_.clear();
}

void OperationJournal::Release() {
  std::vector<Record>().swap(records_);
  words_.reset();
  words_size_ = words_capacity_ = 0;
  std::vector<std::pair<CUstream, uint64_t>>().swap(keys_);
}

}  // namespace stensor
