// HostStore: the host memory that holds swapped-out buffers' data. It makes
// and releases each buffer's HostCopy, counts what the copies of each device
// hold in all (against STENSOR_HOST_LIMIT), and keeps whole copies of
// released buffers for the next copy of the same size on the same device:
// pinned ones always, since cuMemFreeHost synchronises every context, which
// inside a call the program expects not to block (cuMemGetInfo, cuMemAlloc)
// would deadlock a program whose stream waits on its own host thread;
// host-located VMM ones up to a device cap's worth per device, so that a
// step's temporaries swapped out and freed make no cuMemCreate/cuMemRelease.
// Kept copies stay counted; they are freed when the limit needs the room
// and at exit. Which buffer goes to the host, and when, is the manager's.
//
// Thread-safety: any thread. Its own lock, which may be taken while the
// manager's is held, never the other way round; the driver calls that make
// and free host memory run under it, checked and their failures counted
// here (driver_errors).
#ifndef STENSOR_CORE_SWAP_HOST_STORE_H_
#define STENSOR_CORE_SWAP_HOST_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "core/base/mutex.h"
#include "core/swap/host_copy.h"
#include "core/swap/vmm.h"

namespace stensor {

class HostStore {
 public:
  // `driver` outlives the store.
  explicit HostStore(const Driver* driver) : vmm_(driver, &driver_errors_) {}

  // A kept copy of `reserved` bytes for `device`, taken out of the store
  // (still counted), when the first such is host-located VMM memory as
  // `host_vmm` says and, with `vmm_only`, is VMM memory at all (one that is
  // mapped, so it can be zeroed on the device). It holds an earlier
  // buffer's bytes.
  std::optional<HostCopy> TakeSpare(int device, uint64_t reserved, bool host_vmm, bool vmm_only)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Puts back a copy TakeSpare gave that was not used, where it was.
  void PutBack(int device, uint64_t reserved, const HostCopy& copy) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `reserved` more bytes for `device` stay within `limit`, the
  // kept copies of every device freed first when they would not.
  bool Fits(int device, uint64_t reserved, uint64_t limit) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `*copy` (HostCopy::Create), counted for `device`.
  CUresult Create(HostCopy* copy, int device, bool host_vmm, uint64_t reserved, uint64_t size)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of `*copy` (left empty): kept whole where the rules above
  // allow (`keep_up_to`: the device's cap, for VMM copies), else released.
  // False when the driver would not release it (it stays in `*copy`, still
  // counted, for a retry).
  bool Release(HostCopy* copy, int device, uint64_t reserved, uint64_t keep_up_to)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases every kept copy the driver lets go of; whether any went.
  bool FreeSpares() ABSL_LOCKS_EXCLUDED(mu_);
  // What `device`'s copies hold, kept ones included.
  uint64_t bytes(int device) const ABSL_LOCKS_EXCLUDED(mu_);
  // The driver calls of the store that failed.
  uint64_t driver_errors() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct PerDevice {
    uint64_t bytes = 0;      // every copy, kept ones included
    uint64_t spare_vmm = 0;  // kept host-located VMM copies
  };
  bool FreeSparesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  uint64_t driver_errors_ ABSL_GUARDED_BY(mu_) = 0;
  const Vmm vmm_;  // called under mu_, which guards its counter
  absl::flat_hash_map<int, PerDevice> devices_ ABSL_GUARDED_BY(mu_);
  // Kept copies by (reserved size, device).
  std::multimap<std::pair<uint64_t, int>, HostCopy> spares_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_HOST_STORE_H_
