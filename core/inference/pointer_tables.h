// PointerTables: device memory known to hold pointers to other buffers.
//
// Kernels reach buffers through pointers stored in device memory: PyTorch's
// split_with_sizes_copy and _chunk_cat build `char**` tables on the host and
// copy them to the device, cuBLAS *Batched calls take device arrays of
// pointers, grouped GEMM builds its arrays with a kernel. Access inference
// only sees the launch's own parameters, so a kernel reading through such a
// table would touch buffers stensor thinks idle.
//
// A table entry is an 8-byte-aligned word of device memory that points into
// a live buffer. Entries are learnt where their contents are known on the
// host: the source of a host-to-device copy is scanned when the copy is
// submitted, and device memory read back by stensor is scanned the same way.
// The program may not change a source after submitting its copy, but work
// queued ahead of the copy may (a host function, a kernel writing mapped
// memory, a copy into pinned memory): such a scan is only a guess, and the
// range stays stale until the caller learns what landed (Tracker waits for
// the copy's stream and scans again, or reads the range back). A device copy
// carries entries along; a memset clears them. Entries hold addresses, not
// buffer ids, so a target freed and replaced at the same address resolves
// to its successor, as the kernel would reach it.
//
// A table is the byte ranges of its buffer whose contents were learnt (the
// ranges its uploads, device copies and read-backs wrote), not the whole
// buffer: a caching allocator carves tables and data tensors out of the
// same segment. The rest of the buffer is plain data, as a buffer without a
// table is. Each range is current or stale (something may have rewritten
// it since it was learnt), and carries marks: what a read-back of it has to
// wait for (the copy that landed it, the kernels and copies that may have
// written it since), or "any" (unknown writers: all work ordered before
// the reading launch).
//
// The reach rule. A kernel is given pointers, not extents: through a
// pointer at address p it may read and write anywhere from p to the end of
// p's buffer, never before p. Where the program's allocator put its blocks
// (and whether it coalesced or reused them) is unknown, so the extent ends
// at the buffer's end, not at a block's: a write through a pointer below a
// table reaches it, one past its last byte does not. Copies and memsets have
// exact extents.
//
// Thread-safety: all methods are thread-safe. empty() is lock-free, so the
// hot paths pay one atomic load while a program has no tables.
#ifndef STENSOR_CORE_INFERENCE_POINTER_TABLES_H_
#define STENSOR_CORE_INFERENCE_POINTER_TABLES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "core/base/mutex.h"
#include "core/inference/buffer_registry.h"

namespace stensor {

class PointerTables {
 public:
  enum class State {
    kNone,   // no entries known (where looked)
    kKnown,  // entries known, and nothing wrote their ranges since
    kStale,  // had entries, then something may have rewritten them
  };

  // What a read-back of a range waits for before it reads: an opaque token
  // the caller makes (Tracker: an event recorded on a stream), released
  // when no range holds it. A null Mark passed as a landing mark means
  // nothing to wait for (the write has landed); AnyWriter() means the
  // writers are unknown (a read-back waits for all work ordered before the
  // launch that reads the table).
  using Mark = std::shared_ptr<const void>;
  static const Mark& AnyWriter();
  // Past this many marks on a range, those `done` (SetMarkDone) are
  // dropped, and if none is, the range's writers count as unknown.
  static constexpr size_t kMaxMarks = 8;
  // Whether a mark was observed complete (a wait for it returns at once).
  // Called under the lock; set before any other call.
  void SetMarkDone(std::function<bool(const Mark&)> done) { done_ = std::move(done); }

  // A write (or read) of buffer `id` through a pointer at address `from`:
  // it reaches the buffer's bytes at and after `from` (0: the whole buffer).
  struct Reach {
    uint64_t id = 0;
    uint64_t from = 0;
  };

  // The entries of `table` in [dst, dst+bytes) are replaced by the words of
  // `src` (host memory about to land there) that point into live buffers.
  // `settled`: `src` holds what the copy will copy. Otherwise (work queued
  // ahead of the copy may still write its source) the words found are only a
  // guess, and the range written is stale: its contents are learnt by reading
  // it back once the copy ran. `landing`: what tells that the copy ran (null
  // once it has). Returns the number of entries found.
  size_t OnHostWrite(const Buffer& table, uint64_t dst, const void* src, uint64_t bytes,
                     bool settled, const BufferRegistry& registry, Mark landing = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OnHostWrite in two steps, so that a caller can look at what a source
  // holds before deciding whether it is settled: the scan (no lock), and
  // its application to `table`.
  struct HostScan {
    uint64_t dst = 0;
    uint64_t bytes = 0;
    size_t found = 0;
    std::map<uint64_t, uint64_t> entries;  // device address -> pointer
  };
  static HostScan ScanHost(uint64_t dst, const void* src, uint64_t bytes,
                           const BufferRegistry& registry);
  size_t ApplyHostWrite(const Buffer& table, HostScan scan, bool settled, Mark landing = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A device copy of [src, src+bytes) into `to` at dst: the destination gets
  // the source's entries (shifted) and ranges. Source bytes of unknown
  // contents (outside the source's current ranges, or untracked memory:
  // from == nullptr) make the destination's ranges they land on stale.
  // `landing` makes what tells that the copy ran (called at most once, only
  // if a range lands; AnyWriter() when unknown, as without it).
  void OnDeviceCopy(const Buffer& to, uint64_t dst, const Buffer* from, uint64_t src,
                    uint64_t bytes, absl::FunctionRef<Mark()> landing) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDeviceCopy(const Buffer& to, uint64_t dst, const Buffer* from, uint64_t src,
                    uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // A memset of [dst, dst+bytes): no pointers there any more.
  void OnClear(const Buffer& table, uint64_t dst, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Something on the device (a kernel) may have written the buffers of
  // `writes` at and after their `from`: the ranges it reaches are stale,
  // with the mark `mark()` makes (called at most once, only if some range
  // is reached; AnyWriter() or null when it cannot tell).
  void OnDeviceWrite(absl::Span<const Reach> writes, absl::FunctionRef<Mark()> mark)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whole buffers, by unknown writers.
  void OnDeviceWrite(absl::Span<const uint64_t> ids) ABSL_LOCKS_EXCLUDED(mu_);
  // A kernel that may store pointers through a pointer-to-pointer
  // parameter at `from` in `table` (a table built on the device): any word
  // from there to the buffer's end may be an entry now, whatever ranges
  // were known (learnt from what the memory held before, they may be
  // shorter than what the kernel wrote), so all of it is one stale range,
  // marked `mark()` besides its ranges' marks.
  void OnPointerWrite(const Buffer& table, uint64_t from, const Mark& mark)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnFree(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // What a read-back reads: [start, end) of the device, and whether it
  // learns a new range there (a pointer-to-pointer parameter into bytes no
  // range covers) or refreshes the ranges it covers.
  struct Window {
    uint64_t start = 0;
    uint64_t end = 0;
    bool learn = false;
  };
  // `data` (the windows' bytes, one after another) as read back from the
  // device after Changes() returned `since`: entries in the windows
  // replaced, their ranges current again with no marks; a learning window
  // adds a range from its start to its last entry. If any table changed
  // meanwhile (a copy or kernel submitted during the read-back), what was
  // read may be older than what is recorded: the entries found are added,
  // and nothing is vouched for. Returns the number of entries found.
  size_t Rescan(const Buffer& table, absl::Span<const Window> windows, const void* data,
                uint64_t since, const BufferRegistry& registry) ABSL_LOCKS_EXCLUDED(mu_);
  // The whole buffer, learnt.
  size_t Rescan(const Buffer& table, const void* data, uint64_t since,
                const BufferRegistry& registry) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts every change to any table.
  uint64_t Changes() const ABSL_LOCKS_EXCLUDED(mu_);
  // An operation whose accesses are unknown may have rewritten any table.
  void MarkAllStale() ABSL_LOCKS_EXCLUDED(mu_);

  // The state of buffer `id`; for kKnown and kStale, appends the entries'
  // distinct words to `words` (kStale: what it held last, still worth
  // keeping resident) and sets `base` (if not null) to the buffer's base.
  State Get(uint64_t id, std::vector<uint64_t>* words, uint64_t* base) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // What a launch reaching buffers finds there, under one lock: one Found
  // for each reach whose buffer has ranges at or after `from` (kKnown or
  // kStale), with the entries there and the stale parts to read back.
  struct StaleRange {
    uint64_t start = 0;
    uint64_t end = 0;
    bool any = false;         // writers unknown
    std::vector<Mark> marks;  // else: what to wait for
  };
  struct Found {
    uint64_t id = 0;
    State state = State::kNone;
    uint64_t base = 0;
    uint64_t from = 0;
    std::vector<uint64_t> words;  // distinct
    std::vector<StaleRange> stale;
  };
  void Collect(absl::Span<const Reach> reach, std::vector<Found>* found) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whole buffers.
  void Collect(absl::Span<const uint64_t> ids, std::vector<Found>* found) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `addr` lies in one of buffer `id`'s ranges.
  bool Covers(uint64_t id, uint64_t addr) const ABSL_LOCKS_EXCLUDED(mu_);
  // The ranges of buffer `id` as [start, end, stale] (tests, the log).
  std::vector<std::array<uint64_t, 3>> Ranges(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  // True while no buffer has entries.
  bool empty() const { return tables_.load(std::memory_order_acquire) == 0; }

 private:
  struct Range {
    uint64_t end = 0;
    bool stale = false;
    bool any = false;
    std::vector<Mark> marks;
  };
  struct Table {
    uint64_t base = 0;                     // of the buffer holding the table
    std::map<uint64_t, uint64_t> entries;  // device address -> pointer
    std::map<uint64_t, Range> ranges;      // start -> range, disjoint
  };

  // Erases entries in [dst, dst+bytes) of `t`.
  static void EraseRange(Table& t, uint64_t dst, uint64_t bytes);
  // Adds the entries found in `bytes` of host memory landing at dst.
  static size_t Scan(Table& t, uint64_t dst, const unsigned char* src, uint64_t bytes,
                     const BufferRegistry& registry);
  static void DistinctWords(const Table& t, uint64_t from, std::vector<uint64_t>* words);
  // Splits the range holding `at` (if it starts before `at`) in two.
  static void Split(Table& t, uint64_t at);
  // Splits at lo and hi; the first range starting at or after lo.
  static std::map<uint64_t, Range>::iterator Isolate(Table& t, uint64_t lo, uint64_t hi);
  // Removes [lo, hi) from the ranges (entries are the caller's).
  static void Cut(Table& t, uint64_t lo, uint64_t hi);
  // Adds `mark` to a range's marks (AnyWriter(): unknown writers).
  void AddMark(Range& r, const Mark& mark) const;
  // Drops current ranges holding no entry, and `id` when no range is left.
  void Prune(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectOne(const Reach& r, std::vector<Found>* found) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Table> by_id_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<size_t> tables_{0};
  std::function<bool(const Mark&)> done_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_POINTER_TABLES_H_
