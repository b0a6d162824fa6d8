#include "core/driver/device_context.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace stensor {
namespace {

// Primary contexts retained by ContextForDevice, by device ordinal.
std::mutex& RetainedMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::vector<CUcontext>& Retained() {
  static std::vector<CUcontext>* retained = new std::vector<CUcontext>;
  return *retained;
}

}  // namespace

CUresult StreamContext(const Driver& driver, CUstream stream, CUcontext* context) {
  *context = nullptr;
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    if (CUresult r = driver.cuCtxGetCurrent(context); r != CUDA_SUCCESS) return r;
    return *context != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  if (driver.cuStreamGetCtx == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return driver.cuStreamGetCtx(stream, context);
}

CUresult ContextForDevice(const Driver& driver, int ordinal, CUcontext* context) {
  *context = nullptr;
  if (driver.cuDeviceGet == nullptr || driver.cuDevicePrimaryCtxRetain == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUdevice device = 0;
  if (CUresult r = driver.cuDeviceGet(&device, ordinal); r != CUDA_SUCCESS) return r;
  CUcontext current = nullptr;
  if (CUresult r = driver.cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  if (current != nullptr) {
    CUdevice on = 0;
    if (CUresult r = driver.cuCtxGetDevice(&on); r != CUDA_SUCCESS) return r;
    if (on == device) {
      *context = current;
      return CUDA_SUCCESS;
    }
  }
  // Retained once and never released: releasing the last reference would
  // destroy the context and every allocation in it.
  std::lock_guard<std::mutex> lock(RetainedMutex());
  std::vector<CUcontext>& retained = Retained();
  if (static_cast<size_t>(ordinal) < retained.size() && retained[ordinal] != nullptr) {
    *context = retained[ordinal];
    return CUDA_SUCCESS;
  }
  CUcontext primary = nullptr;
  if (CUresult r = driver.cuDevicePrimaryCtxRetain(&primary, device); r != CUDA_SUCCESS) {
    return r;
  }
  if (static_cast<size_t>(ordinal) >= retained.size()) retained.resize(ordinal + 1);
  retained[ordinal] = primary;
  *context = primary;
  return CUDA_SUCCESS;
}

void ForgetRetainedContext(CUcontext context) {
  if (context == nullptr) return;
  std::lock_guard<std::mutex> lock(RetainedMutex());
  for (CUcontext& c : Retained()) {
    if (c == context) c = nullptr;
  }
}

CUcontext ActivePrimaryContext(const Driver& driver, CUdevice device) {
  if (driver.cuDevicePrimaryCtxGetState == nullptr || driver.cuDevicePrimaryCtxRetain == nullptr ||
      driver.cuDevicePrimaryCtxRelease_v2 == nullptr) {
    return nullptr;
  }
  unsigned flags = 0;
  int active = 0;
  if (driver.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || !active) {
    return nullptr;
  }
  // Active: a retain only names it (nothing is created), and the release
  // gives the reference back. Were the release refused, the context would
  // keep one reference more, and the program's last release end nothing, as
  // when stensor retains a device's primary context (ContextForDevice).
  CUcontext primary = nullptr;
  if (driver.cuDevicePrimaryCtxRetain(&primary, device) != CUDA_SUCCESS) return nullptr;
  (void)driver.cuDevicePrimaryCtxRelease_v2(device);
  return primary;
}

}  // namespace stensor
