#include "core/swap/vmm.h"

namespace stensor {

CUresult Vmm::Map(CUdeviceptr va, absl::Span<const PhysicalChunk> chunks, int device, bool* mapped,
                  uint64_t* left_mapped) const {
  *mapped = false;
  uint64_t left = 0;
  if (left_mapped == nullptr) left_mapped = &left;
  *left_mapped = 0;
  uint64_t bytes = 0;
  for (const PhysicalChunk& c : chunks) {
    CUresult r = Check(driver_->cuMemMap(va + bytes, c.bytes, 0, c.handle, 0));
    if (r == CUDA_SUCCESS) {
      bytes += c.bytes;
      continue;
    }
    // Undo the chunks mapped so far (one call unmaps consecutive mappings);
    // should that fail too, a mapping is left behind.
    *mapped = bytes > 0 && Unmap(va, bytes) != CUDA_SUCCESS;
    if (*mapped) *left_mapped = bytes;
    return r;
  }
  *mapped = true;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult r = Check(driver_->cuMemSetAccess(va, bytes, &access, 1));
  if (r != CUDA_SUCCESS) {
    if (Unmap(va, bytes) == CUDA_SUCCESS) {
      *mapped = false;
    } else {
      *left_mapped = bytes;
    }
  }
  return r;
}

}  // namespace stensor
