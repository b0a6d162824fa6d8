// HostCopy: the host side of one swappable buffer. Where the device supports
// host-located VMM memory it is such a handle, mapped read-write at a VA of
// its own (and mappable at the buffer's address while the buffer is swapped
// out, so that address keeps reading the data); elsewhere pinned host memory.
// It makes, releases and copies; when to do so is the manager's decision.
//
// Every driver call goes through Vmm (checked, failures counted). A failure
// leaves the copy in a state Release can finish: each step is recorded as it
// succeeds.
//
// Thread-safety: none; one buffer owns it and the manager uses it under its
// mutex.
#ifndef STENSOR_CORE_SWAP_HOST_COPY_H_
#define STENSOR_CORE_SWAP_HOST_COPY_H_

#include <cstdint>

#include "core/swap/vmm.h"

namespace stensor {

class HostCopy {
 public:
  // Holds memory that can be copied to and from.
  bool exists() const { return ptr_ != nullptr || vmm(); }
  // Host-located VMM memory, mapped at va().
  bool vmm() const { return handle_ != 0 && va_mapped_; }
  CUmemGenericAllocationHandle handle() const { return handle_; }
  CUdeviceptr va() const { return va_; }
  void* ptr() const { return ptr_; }

  // Makes the copy: with `host_vmm`, `reserved` bytes (whole granules) of
  // host-located VMM memory mapped for `device`; else `size` bytes pinned.
  // `*held` (host bytes in use) grows by `reserved` while memory is held.
  // On failure what was made is released again, as far as the driver lets.
  CUresult Create(const Vmm& vmm, bool host_vmm, uint64_t reserved, uint64_t size, int device,
                  uint64_t* held);
  // Releases all of it. False when a driver call failed (the rest stays for
  // a retry).
  bool Release(const Vmm& vmm, uint64_t reserved, uint64_t* held);

  // Asynchronous copies of `size` bytes on `stream` between it, from
  // `offset` on, and device memory at `device_ptr`.
  CUresult CopyFromDevice(const Vmm& vmm, CUdeviceptr device_ptr, uint64_t size, CUstream stream,
                          uint64_t offset = 0) const;
  CUresult CopyToDevice(const Vmm& vmm, CUdeviceptr device_ptr, uint64_t size, CUstream stream,
                        uint64_t offset = 0) const;

 private:
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  bool va_mapped_ = false;
  void* ptr_ = nullptr;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_HOST_COPY_H_
