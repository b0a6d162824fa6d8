#include "core/vmm.h"

namespace stensor {

CUresult Vmm::Map(CUdeviceptr va, absl::Span<const Handle> chunks, uint64_t chunk_bytes,
                  int device, bool* mapped) const {
  *mapped = false;
  const uint64_t bytes = chunks.size() * chunk_bytes;
  for (size_t i = 0; i < chunks.size(); ++i) {
    CUresult r = Check(driver_->cuMemMap(va + i * chunk_bytes, chunk_bytes, 0, chunks[i], 0));
    if (r == CUDA_SUCCESS) continue;
    // Undo the chunks mapped so far (one call unmaps consecutive mappings);
    // should that fail too, a mapping is left behind.
    *mapped = i > 0 && Unmap(va, i * chunk_bytes) != CUDA_SUCCESS;
    return r;
  }
  *mapped = true;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult r = Check(driver_->cuMemSetAccess(va, bytes, &access, 1));
  if (r != CUDA_SUCCESS && Unmap(va, bytes) == CUDA_SUCCESS) *mapped = false;
  return r;
}

}  // namespace stensor
