// Vmm: the driver calls of stensor's virtual-memory plumbing (mapping
// physical chunks at a buffer's address, unmapping them), each result
// checked and every failure counted in one counter (the manager's
// "driver errors" statistic). It decides nothing: what to map where, and
// what a failure means, is the caller's.
//
// Thread-safety: as the counter it is given; MemoryManager calls it under
// its mutex, which guards that counter.
#ifndef STENSOR_CORE_SWAP_VMM_H_
#define STENSOR_CORE_SWAP_VMM_H_

#include <cstdint>

#include "absl/types/span.h"
#include "core/driver/driver.h"
#include "core/swap/physical_pool.h"

namespace stensor {

class Vmm {
 public:
  using Handle = CUmemGenericAllocationHandle;

  // `errors` (not null) outlives this and counts the failed calls.
  Vmm(const Driver* driver, uint64_t* errors) : driver_(driver), errors_(errors) {}

  const Driver& driver() const { return *driver_; }

  // `r`, counted when it is a failure.
  CUresult Check(CUresult r) const {
    if (r != CUDA_SUCCESS) ++*errors_;
    return r;
  }

  // cuMemMap of each of `chunks` (whole) at consecutive offsets from `va`,
  // then one cuMemSetAccess (read-write for `device`) over them all. A failed step unmaps what was
  // mapped; `*mapped` tells whether a mapping is left behind all the same (the undo failed too),
  // and `*left_mapped` (when given) how much of it from `va` on after a
  // failure.
  CUresult Map(CUdeviceptr va, absl::Span<const PhysicalChunk> chunks, int device, bool* mapped,
               uint64_t* left_mapped = nullptr) const;

  // cuMemUnmap of [va, va+bytes) (consecutive mappings: one call).
  CUresult Unmap(CUdeviceptr va, uint64_t bytes) const {
    return Check(driver_->cuMemUnmap(va, bytes));
  }

 private:
  const Driver* const driver_;
  uint64_t* const errors_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_VMM_H_
