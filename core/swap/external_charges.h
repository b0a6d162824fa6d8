// ExternalCharges: what the cap is charged for device memory that stensor
// neither made nor swaps, by what it belongs to, so that the program's free,
// release or unmap ends the right charge: driver allocations made for the
// program under the cap (cuMemAllocPitch, stream-ordered allocations), by
// base address, and the program's own device-located VMM handles, charged
// while the program holds a reference to one or a mapping of it. The bytes
// themselves are counted in the manager's device state; this keeps only what
// to uncharge. (A stream-ordered free's charge ends when the free has run:
// the manager keeps such frees with their stream uses.)
//
// Thread-safety: any thread. Its own lock, which may be taken while the
// manager's is held, never the other way round; no driver call under it.
#ifndef STENSOR_CORE_SWAP_EXTERNAL_CHARGES_H_
#define STENSOR_CORE_SWAP_EXTERNAL_CHARGES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"

namespace stensor {

class ExternalCharges {
 public:
  struct Charge {
    int device = 0;
    uint64_t bytes = 0;
    // A small default-pool allocation counted toward the device's
    // SlabOnset (STENSOR_SLABS=auto), as asked: uncounted when it ends.
    uint64_t before_slabs = 0;
    bool operator==(const Charge& o) const {
      return device == o.device && bytes == o.bytes && before_slabs == o.before_slabs;
    }
  };

  // A driver allocation at `base`, charged `charge`.
  void AddAllocation(CUdeviceptr base, Charge charge) ABSL_LOCKS_EXCLUDED(mu_);
  // Its charge, no longer remembered; nullopt when `base` is none of them.
  std::optional<Charge> RemoveAllocation(CUdeviceptr base) ABSL_LOCKS_EXCLUDED(mu_);

  // A handle the program created (one reference), charged `charge`.
  void AddHandle(CUmemGenericAllocationHandle handle, Charge charge) ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemRetainAllocationHandle of one of them (else nothing).
  void Retain(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemRelease: the charge that ends, when no reference nor mapping of
  // the handle is left.
  std::optional<Charge> Release(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemMap of one of them at [ptr, ptr+size) (else nothing).
  void Map(CUdeviceptr ptr, uint64_t size, CUmemGenericAllocationHandle handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemUnmap of [ptr, ptr+size): every mapping that starts in it is gone
  // (the driver unmaps whole mappings only); the charges that end.
  absl::InlinedVector<Charge, 1> Unmap(CUdeviceptr ptr, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Handle {
    Charge charge;
    int refs = 1;      // cuMemCreate plus retains, minus releases
    int mappings = 0;  // live cuMemMap of it
  };
  // The charge of `it`'s handle once nothing holds it (then forgotten).
  std::optional<Charge> EndIfUnheld(
      absl::flat_hash_map<CUmemGenericAllocationHandle, Handle>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Charge> allocations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<CUmemGenericAllocationHandle, Handle> handles_ ABSL_GUARDED_BY(mu_);
  // The program's mappings of those handles: base -> (size, handle).
  std::map<uint64_t, std::pair<uint64_t, CUmemGenericAllocationHandle>> mappings_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_EXTERNAL_CHARGES_H_
