// HostWrites: device-side work queued that may still write host memory a
// device can reach (page-locked, mapped or registered memory).
//
// A pointer table uploaded from such memory is scanned when its copy is
// submitted, but the copy reads its source only when it runs. The scan is
// what lands unless work queued ahead of the copy may write the source
// first; only then must the tracker wait before it scans (or leave the
// table stale). Asking this instead of whether the copy's stream is idle
// lets a program that builds its tables on the host upload them while its
// streams are busy, as PyTorch does each step, with no host wait.
//
// What may write such memory, and how each is recorded:
//   - asynchronous copies and memsets into it: their range, with a mark;
//   - host functions and stream callbacks, graphs (host nodes, copies,
//     kernels): anywhere, with a mark;
//   - kernels: only through a pointer into it. Once any such pointer may
//     have reached the device (a launch's parameter, an uploaded word, a
//     launch or copy whose contents are unknown) any later kernel may write
//     through it, so from then on every range counts as possibly written
//     (Escaped, for good: the caller falls back to waiting for the stream).
// A mark is the caller's (Tracker: an event recorded after the work on its
// stream); a write is forgotten once its mark is seen done.
//
// Thread-safety: all methods are thread-safe; escaped() and empty() are
// lock-free.
#ifndef STENSOR_CORE_TRACKER_HOST_WRITES_H_
#define STENSOR_CORE_TRACKER_HOST_WRITES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/base/mutex.h"

namespace stensor {

class HostWrites {
 public:
  // An opaque token for "the work is done" (PointerTables::Mark's type).
  using Mark = std::shared_ptr<const void>;
  // A range that covers every address.
  static constexpr uint64_t kEverywhere = ~uint64_t{0};
  // Past this many writes pending, those seen done are dropped; if that
  // leaves as many, the rest collapse into one write everywhere that is
  // never seen done (the caller then always waits: safe, slower).
  static constexpr size_t kMaxPending = 512;

  // Whether a mark was observed complete. Called under the lock, without
  // waiting; set before any other call.
  void SetMarkDone(std::function<bool(const Mark&)> done) { done_ = std::move(done); }

  // Work just queued may write [start, start + bytes) (bytes kEverywhere:
  // anywhere) until `done` is seen complete; a null mark is never seen so.
  void Add(uint64_t start, uint64_t bytes, Mark done) ABSL_LOCKS_EXCLUDED(mu_);
  // A pointer into device-reachable host memory may be on the device now.
  void Escaped() { escaped_.store(true, std::memory_order_relaxed); }
  bool escaped() const { return escaped_.load(std::memory_order_relaxed); }
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }

  // Whether work queued so far may still write any of [start, start +
  // bytes): an escaped pointer, or a recorded write overlapping it whose
  // mark is not done yet (those done are forgotten here).
  bool MayWrite(uint64_t start, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Write {
    uint64_t start = 0;
    uint64_t bytes = 0;
    Mark done;
  };
  bool Done(const Write& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropDone() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::function<bool(const Mark&)> done_;
  mutable Mutex mu_;
  std::vector<Write> writes_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> count_{0};
  std::atomic<bool> escaped_{false};
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_HOST_WRITES_H_
