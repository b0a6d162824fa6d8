// PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator):
// every tensor's memory comes from stensor_torch_malloc and goes back through
// stensor_torch_free, so under a cap each tensor is a buffer of its own
// (swappable from half a granule up) instead of a caching-allocator segment.
//
// How PyTorch calls them (torch/csrc/cuda/CUDAPluggableAllocator.cpp): malloc
// with the current device and that device's current stream (or the stream of
// raw_alloc_with_stream), the device current; free from the tensor's deleter,
// on any thread and with any device current, with the size, device and
// stream recorded at malloc. A null result is not checked there (the tensor
// gets a null pointer); a tensor of 0 bytes calls malloc too, and its
// deleter is never called for the null pointer. recordStream calls nothing
// unless a record-stream function was set from C++, so the free's stream is
// the allocation's own.
//
// Both are the stream-ordered hooks with the device's context current:
// cuMemAllocAsync on `stream`, and cuMemFreeAsync on `stream`, which under a
// cap frees in stream order behind every use stensor saw on any stream
// (core/swap/stream_ordered.h) and without a cap is the driver's stream-ordered
// free. Logged and tracked as those calls.
//
// Thread-safety: as the hooks (any thread).
#include <cuda.h>
#include <sys/types.h>

#include <cstdint>

#include "absl/strings/str_format.h"
#include "core/base/log.h"
#include "core/swap/stream_ordered.h"
#include "interpose/state.h"

#define STENSOR_EXPORT extern "C" __attribute__((visibility("default")))

namespace stensor {
namespace {

// A failure PyTorch cannot be told about beyond a null pointer: said on
// stderr (STENSOR_LOG_LEVEL warn or finer), the first few times (core/base/log.h).
void Warn(const char* what, int device, int64_t size, CUresult r) {
  Say(LogLevel::kWarn, "torch-alloc",
      absl::StrFormat("%s(size %d, device %d) failed: CUresult %d", what, size, device,
                      static_cast<int>(r)));
}

// Runs `call` with device `device`'s context current (the current one when
// it is on that device, else the device's primary context, pushed and popped).
template <typename Call>
CUresult OnDevice(int device, Call&& call) {
  CUcontext context = nullptr;
  if (CUresult r = ContextForDevice(State().driver, device, &context); r != CUDA_SUCCESS) {
    return r;
  }
  ContextScope scope(State().driver, context);
  if (scope.result() != CUDA_SUCCESS) return scope.result();
  CUresult r = call();
  CUresult popped = scope.Restore();
  return r != CUDA_SUCCESS ? r : popped;
}

}  // namespace
}  // namespace stensor

STENSOR_EXPORT void* stensor_torch_malloc(ssize_t size, int device, CUstream stream) {
  if (size <= 0) return nullptr;  // 0 bytes: no memory, and no free follows
  CUdeviceptr p = 0;
  CUresult r = stensor::OnDevice(
      device, [&] { return ::cuMemAllocAsync(&p, static_cast<size_t>(size), stream); });
  if (r != CUDA_SUCCESS) {
    // An allocation whose context could not be popped is still live.
    if (p != 0 && ::cuMemFreeAsync(p, stream) != CUDA_SUCCESS) {
      stensor::Warn("stensor_torch_malloc: freeing", device, size, r);
    }
    stensor::Warn("stensor_torch_malloc", device, size, r);
    return nullptr;
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

STENSOR_EXPORT void stensor_torch_free(void* ptr, ssize_t size, int device, CUstream stream) {
  if (ptr == nullptr) return;
  const auto p = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
  CUresult r = stensor::OnDevice(device, [&] { return ::cuMemFreeAsync(p, stream); });
  if (r != CUDA_SUCCESS) stensor::Warn("stensor_torch_free", device, size, r);
}
