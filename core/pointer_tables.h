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
// table stays stale until the caller learns what landed (Tracker waits for
// the copy's stream and scans again, or reads the table back). A device copy
// carries entries along; a memset clears them. Whatever a kernel may have
// written makes a buffer's entries stale: its contents are no longer known,
// and a consumer has to read it back (or treat its accesses as unknown).
// Entries hold addresses, not buffer ids, so a target freed and replaced at
// the same address resolves to its successor, as the kernel would reach it.
//
// Thread-safety: all methods are thread-safe. empty() is lock-free, so the
// hot paths pay one atomic load while a program has no tables.
#ifndef STENSOR_CORE_POINTER_TABLES_H_
#define STENSOR_CORE_POINTER_TABLES_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "absl/types/span.h"
#include "core/buffer_registry.h"

namespace stensor {

class PointerTables {
 public:
  enum class State {
    kNone,   // no entries known
    kKnown,  // entries known, and nothing wrote the buffer since
    kStale,  // had entries, then something may have rewritten them
  };

  // The entries of `table` in [dst, dst+bytes) are replaced by the words of
  // `src` (host memory about to land there) that point into live buffers.
  // `settled`: `src` holds what the copy will copy. Otherwise (work queued
  // ahead of the copy may still write its source) the words found are only a
  // guess, and a table that has a record after the update is stale: its
  // contents are learnt by reading it back once the copy ran. Returns the
  // number of entries found.
  size_t OnHostWrite(const Buffer& table, uint64_t dst, const void* src,
                     uint64_t bytes, bool settled, const BufferRegistry& registry)
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
  size_t ApplyHostWrite(const Buffer& table, HostScan scan, bool settled)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A device copy of [src, src+bytes) into `to` at dst: the destination gets
  // the source's entries (shifted). A source whose contents are not known
  // (stale, plain device data, or untracked memory: from == nullptr) makes
  // a table `to` stale.
  void OnDeviceCopy(const Buffer& to, uint64_t dst, const Buffer* from,
                    uint64_t src, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // A memset of [dst, dst+bytes): no pointers there any more.
  void OnClear(const Buffer& table, uint64_t dst, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Something on the device (a kernel) may have written these buffers.
  void OnDeviceWrite(absl::Span<const uint64_t> ids) ABSL_LOCKS_EXCLUDED(mu_);
  void OnFree(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // The whole contents of `table` as read back from the device, read after
  // Changes() returned `since`: entries replaced, stale no more. If any
  // table changed meanwhile (a host copy or kernel submitted during the
  // read-back), what was read may be older than what is recorded: the
  // entries found are added to the table's, which stays as stale as it was.
  // Returns the number of entries found.
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

  // Get for many buffers under one lock: one Found for each of `ids` that
  // has a table (kKnown or kStale).
  struct Found {
    uint64_t id = 0;
    State state = State::kNone;
    uint64_t base = 0;
    std::vector<uint64_t> words;  // distinct
  };
  void Collect(absl::Span<const uint64_t> ids, std::vector<Found>* found) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // True while no buffer has entries.
  bool empty() const { return tables_.load(std::memory_order_acquire) == 0; }

 private:
  struct Table {
    uint64_t base = 0;  // of the buffer holding the table
    std::map<uint64_t, uint64_t> entries;  // device address -> pointer
    bool stale = false;
  };

  // Erases entries in [dst, dst+bytes) of `t`.
  static void EraseRange(Table& t, uint64_t dst, uint64_t bytes);
  // Adds the entries found in `bytes` of host memory landing at dst.
  static size_t Scan(Table& t, uint64_t dst, const unsigned char* src,
                     uint64_t bytes, const BufferRegistry& registry);
  static void DistinctWords(const Table& t, std::vector<uint64_t>* words);
  // Drops `id` when it holds nothing worth remembering.
  void Prune(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Table> by_id_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<size_t> tables_{0};
};

}  // namespace stensor

#endif  // STENSOR_CORE_POINTER_TABLES_H_
