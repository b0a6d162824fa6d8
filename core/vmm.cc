#include "core/vmm.h"

namespace stensor {

CUresult Vmm::Map(CUdeviceptr va, absl::Span<const Handle> chunks, uint64_t chunk_bytes,
                  int device, bool* mapped, uint64_t* left_mapped) const {
  *mapped = false;
  uint64_t left = 0;
  if (left_mapped == nullptr) left_mapped = &left;
  *left_mapped = 0;
  const uint64_t bytes = chunks.size() * chunk_bytes;
  for (size_t i = 0; i < chunks.size(); ++i) {
    CUresult r = Check(driver_->cuMemMap(va + i * chunk_bytes, chunk_bytes, 0, chunks[i], 0));
    if (r == CUDA_SUCCESS) continue;
    // Undo the chunks mapped so far (one call unmaps consecutive mappings);
    // should that fail too, a mapping is left behind.
    *mapped = i > 0 && Unmap(va, i * chunk_bytes) != CUDA_SUCCESS;
    if (*mapped) *left_mapped = i * chunk_bytes;
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
