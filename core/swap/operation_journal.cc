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
                                 uint64_t tick, const Use& use) {
  Record& r = records_.emplace_back();
  r.ids_at = words_.size();
  r.ids_count = ids.size();
  words_.insert(words_.end(), ids.begin(), ids.end());
  r.written_at = words_.size();
  r.written_count = written.size();
  words_.insert(words_.end(), written.begin(), written.end());
  r.tick = tick;
  r.use = use;
}

void OperationJournal::Clear() {
  records_.clear();
  words_.clear();
}

void OperationJournal::Release() {
  std::vector<Record>().swap(records_);
  std::vector<uint64_t>().swap(words_);
}

}  // namespace stensor
