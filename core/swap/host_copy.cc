#include "core/swap/host_copy.h"

namespace stensor {

CUresult HostCopy::Create(const Vmm& vmm, bool host_vmm, uint64_t reserved, uint64_t size,
                          int device, uint64_t* held) {
  const Driver& driver = vmm.driver();
  if (!host_vmm) {
    if (CUresult r = vmm.Check(driver.cuMemHostAlloc(&ptr_, reserved, 0)); r != CUDA_SUCCESS) {
      ptr_ = nullptr;
      return r;
    }
    *held += reserved;
    return CUDA_SUCCESS;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CUresult r = vmm.Check(driver.cuMemCreate(&handle_, reserved, &prop, 0));
  if (r != CUDA_SUCCESS) {
    handle_ = 0;
    return r;
  }
  *held += reserved;
  r = vmm.Check(driver.cuMemAddressReserve(&va_, reserved, 0, 0, 0));
  if (r == CUDA_SUCCESS) {
    r = vmm.Map(va_, {PhysicalChunk{handle_, reserved}}, device, &va_mapped_);
  } else {
    va_ = 0;
  }
  if (r != CUDA_SUCCESS) {
    // Undo what was made, so a later attempt starts afresh (what the
    // driver refuses to undo now goes with the buffer's release).
    Release(vmm, reserved, held);
  }
  return r;
}

bool HostCopy::Release(const Vmm& vmm, uint64_t reserved, uint64_t* held) {
  const Driver& driver = vmm.driver();
  if (va_mapped_) {
    if (vmm.Unmap(va_, reserved) != CUDA_SUCCESS) return false;
    va_mapped_ = false;
  }
  if (handle_ != 0) {
    if (vmm.Check(driver.cuMemRelease(handle_)) != CUDA_SUCCESS) return false;
    handle_ = 0;
    *held -= reserved;
  }
  if (va_ != 0) {
    if (vmm.Check(driver.cuMemAddressFree(va_, reserved)) != CUDA_SUCCESS) return false;
    va_ = 0;
  }
  if (ptr_ != nullptr) {
    if (vmm.Check(driver.cuMemFreeHost(ptr_)) != CUDA_SUCCESS) return false;
    ptr_ = nullptr;
    *held -= reserved;
  }
  return true;
}

CUresult HostCopy::CopyFromDevice(const Vmm& vmm, CUdeviceptr device_ptr, uint64_t size,
                                  CUstream stream, uint64_t offset) const {
  const Driver& driver = vmm.driver();
  return vmm.Check(handle_ != 0
                       ? driver.cuMemcpyDtoDAsync_v2(va_ + offset, device_ptr, size, stream)
                       : driver.cuMemcpyDtoHAsync_v2(static_cast<char*>(ptr_) + offset, device_ptr,
                                                     size, stream));
}

CUresult HostCopy::CopyToDevice(const Vmm& vmm, CUdeviceptr device_ptr, uint64_t size,
                                CUstream stream, uint64_t offset) const {
  const Driver& driver = vmm.driver();
  return vmm.Check(handle_ != 0
                       ? driver.cuMemcpyDtoDAsync_v2(device_ptr, va_ + offset, size, stream)
                       : driver.cuMemcpyHtoDAsync_v2(device_ptr, static_cast<char*>(ptr_) + offset,
                                                     size, stream));
}

}  // namespace stensor
