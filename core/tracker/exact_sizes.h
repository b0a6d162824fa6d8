// ExactSizes: under a cap, stensor's buffers are VMM ranges of whole
// granules whose physical memory comes and goes; to the program each must
// still look like the cuMemAlloc allocation it asked for. This answers the
// driver's queries about them that way, resident or swapped out: the extent
// a copy or memset may span (CheckExtents), cuMemGetAddressRange, and the
// pointer attributes that would otherwise describe the current mapping
// (context, memory type, a buffer id stable across swaps, range, ...).
// Each query about anything else is left to the driver.
//
// Thread-safety: holds no state of its own (the manager's answers are
// taken under its lock); every method may be called from any thread.
#ifndef STENSOR_CORE_TRACKER_EXACT_SIZES_H_
#define STENSOR_CORE_TRACKER_EXACT_SIZES_H_

#include <cstddef>
#include <cstdint>

#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"

namespace stensor {

class ExactSizes {
 public:
  // `memory`: the manager of the cap, or null without one (then every
  // answer is the driver's). Both outlive this.
  ExactSizes(const Driver* driver, const MemoryManager* memory);

  // A transfer whose side at `dst` (`src`) spans `dst_extent` (`src_extent`)
  // bytes from there: CUDA_ERROR_INVALID_VALUE when either runs past the
  // requested size of a stensor buffer, as the driver checks a cuMemAlloc
  // allocation (the driver is then not called); else CUDA_SUCCESS.
  CUresult CheckExtents(uint64_t dst, uint64_t dst_extent, uint64_t src, uint64_t src_extent) const;
  // A 2D or 3D copy naming a memory type the driver does not know, between
  // the device addresses `src` and `dst`: CUDA_ERROR_INVALID_VALUE when
  // either is in a stensor buffer, the answer the program would get for
  // the cuMemAlloc allocation it thinks it has (driver 580 refuses such a
  // copy for cuMemAlloc memory but makes it for VMM memory, where stensor
  // would never see the write); else CUDA_SUCCESS, the driver answers.
  CUresult CheckUntypedCopy(uint64_t src, uint64_t dst) const;
  // Each of these returns false when `ptr` is not in a stensor buffer (the
  // caller asks the driver), else sets `*result` to the answer.
  bool AddressRange(CUdeviceptr ptr, CUdeviceptr* base, size_t* size, CUresult* result) const;
  bool PointerAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr,
                        CUresult* result) const;
  bool PointerAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                         CUdeviceptr ptr, CUresult* result) const;

 private:
  const Driver* const driver_;
  const MemoryManager* const memory_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_EXACT_SIZES_H_
