// PinnedHost: the page-locked host memory the program allocated
// (cuMemHostAlloc, cuMemAllocHost) or registered (cuMemHostRegister). Device
// work reaches it through its address, so a kernel argument or an uploaded
// word that points into it means the device may read or write host memory
// (the tables it holds, the host copy of an upload's source).
//
// Thread-safety: any thread; its own lock. Any() reads no lock: a launch
// asks it every time, and a program that pins nothing pays one load.
#ifndef STENSOR_CORE_TRACKER_PINNED_HOST_H_
#define STENSOR_CORE_TRACKER_PINNED_HOST_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "absl/types/span.h"
#include "core/base/mutex.h"

namespace stensor {

class PinnedHost {
 public:
  // [base, base+bytes) allocated page-locked; its free.
  void Allocated(uint64_t base, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Its bytes; 0 when `base` starts no such allocation.
  uint64_t Freed(uint64_t base) ABSL_LOCKS_EXCLUDED(mu_);
  // [base, base+bytes) registered; its unregistration.
  void Registered(uint64_t base, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregistered(uint64_t base) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether any is allocated or registered now.
  bool Any() const { return any_.load(std::memory_order_acquire); }
  // Whether `addr` is in any of it.
  bool Contains(uint64_t addr) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether one of the 8-byte words of `words` (from its start) points
  // into any of it.
  bool AnyWordIn(absl::Span<const unsigned char> words) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether host memory [src, src+bytes), about to be copied to the device
  // at `dst`, holds a word pointing into any of it: words as a kernel reads
  // them, 8-byte aligned at the destination.
  bool HoldsPointer(uint64_t dst, const void* src, uint64_t bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // The allocation (not registration) holding `addr`: (base, bytes).
  std::optional<std::pair<uint64_t, uint64_t>> AllocationAt(uint64_t addr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // What the live allocations hold.
  uint64_t allocated_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool ContainsLocked(uint64_t addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets any_ from the maps, after each change to them.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::map<uint64_t, uint64_t> allocated_ ABSL_GUARDED_BY(mu_);   // base -> bytes
  std::map<uint64_t, uint64_t> registered_ ABSL_GUARDED_BY(mu_);  // base -> bytes
  uint64_t allocated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> any_{false};
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_PINNED_HOST_H_
