// OperationJournal: the operations the memory manager lets through before
// the cap presses without per-buffer bookkeeping. Until then nothing has
// been evicted, so every buffer is resident and ready: an operation needs no
// look at its buffers and no pin. What it leaves behind (its buffers' last
// use on its stream, their LRU ticks, the versions of what it wrote) is kept
// here, one record per operation, and applied to the buffers
// (MemoryManager::ApplyJournal) before anything reads them: at every other
// entry point of the manager, and when the cap first presses. Applied newest
// first, a buffer named by many records is updated once.
// Operations between their Prepare and Finish are kept too, in a slot of
// their thread's (their Prepare takes no lock), so that whoever ends the
// journaling pins their buffers.
//
// Thread-safety: the records are the memory manager's, under its mutex; the
// slots are each their thread's, read by others as Slot says.
#ifndef STENSOR_CORE_SWAP_OPERATION_JOURNAL_H_
#define STENSOR_CORE_SWAP_OPERATION_JOURNAL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "core/base/thread_cache.h"
#include "core/swap/stream_use.h"  // StreamMark

namespace stensor {

class OperationJournal {
 public:
  // Ids an operation in flight keeps: one naming more is not journaled.
  static constexpr size_t kMaxIds = 16;
  // Records kept before the manager applies them (bounded memory).
  static constexpr size_t kMaxRecords = 4096;

  // A thread's journaled operation between its Prepare and Finish (one at a
  // time), reached without any lock. `owner` (the manager, null when none)
  // is stored last and read first, sequentially consistent with the
  // manager's own flag saying whether it journals: a thread that ends the
  // journaling either sees the operation, with its ids, or that operation's
  // Prepare sees the journaling ended.
  struct Slot {
    Slot();   // registered, so that ForEachInFlight finds it
    ~Slot();  // at the thread's exit
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    absl::Span<const uint64_t> named() const { return {ids, count}; }

    std::atomic<const void*> owner{nullptr};
    size_t count = 0;
    uint64_t ids[kMaxIds];
    // Its buffers were pinned when the journaling ended: its Finish is the
    // manager's full one. Guarded by the owner's mutex.
    bool pinned = false;
  };
  // The calling thread's slot (made at its first use).
  static Slot& ThisThread() { return PerThread<Slot>::Get(); }
  // Calls `f` on every thread's slot whose operation in flight is `owner`'s,
  // under the registry's own lock (taken after the owner's).
  static void ForEachInFlight(const void* owner, absl::FunctionRef<void(Slot&)> f);

  // A submitted operation's use of its stream: the stream's key (the
  // manager's UseKey), and the mark it was noted with (null when none could
  // be had) at record `gen`, how (the manager's Marked), on `device`.
  struct Use {
    CUstream stream = nullptr;
    uint64_t thread = 0;
    StreamMark* mark = nullptr;
    uint64_t gen = 0;
    int marked = 0;
    int device = 0;
  };
  // A submitted operation: its buffers (ids, pieces and slabs already
  // expanded), what it wrote, the LRU tick of its first buffer (the i-th has
  // tick + i, as ticks are handed out one per buffer), and its use, whose
  // stream and thread are the journal's key number `key` (so that a buffer
  // named by many records on one stream is looked at once for them).
  struct Record {
    uint32_t ids_at = 0, ids_count = 0;
    uint32_t written_at = 0, written_count = 0;
    uint32_t key = 0;
    uint64_t tick = 0;
    Use use;
  };

  // Records a submitted operation. One naming the same buffers, writing the
  // same and on the same stream as the latest record takes its place: applied
  // newest first, the older one would change nothing.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Add(absl::Span<const uint64_t> ids,
                                        absl::Span<const uint64_t> written, uint64_t tick,
                                        const Use& use) {  // inline: every journaled launch
    if (!records_.empty()) {
      Record& last = records_.back();
      if (last.use.stream == use.stream && last.use.thread == use.thread) {
        if (this->ids(last) == ids && this->written(last) == written) {
          last.tick = tick;
          last.use = use;
          return;
        }
        AddRecord(ids, written, tick, use, last.key);
        return;
      }
    }
    AddRecord(ids, written, tick, use, KeyOf(use));
  }
  bool empty() const { return records_.empty(); }
  bool full() const { return records_.size() >= kMaxRecords; }
  absl::Span<const Record> records() const { return records_; }
  absl::Span<const uint64_t> ids(const Record& r) const {
    return {words_.get() + r.ids_at, r.ids_count};
  }
  absl::Span<const uint64_t> written(const Record& r) const {
    return {words_.get() + r.written_at, r.written_count};
  }
  // Forgets the records (applied); keeps their memory for the next ones.
  void Clear();
  // Forgets the records and gives their memory back (journaling ended).
  void Release();

 private:
  void AddRecord(absl::Span<const uint64_t> ids, absl::Span<const uint64_t> written, uint64_t tick,
                 const Use& use, uint32_t key);
  uint32_t KeyOf(const Use& use);
  void GrowWords(size_t need);

  std::vector<Record> records_;
  // Every record's ids, then its written ids: a plain array, so that a
  // record costs a copy of its words and no vector insert.
  std::unique_ptr<uint64_t[]> words_;
  size_t words_size_ = 0, words_capacity_ = 0;
  // The streams and threads of the records' uses, numbered.
  std::vector<std::pair<CUstream, uint64_t>> keys_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_OPERATION_JOURNAL_H_
