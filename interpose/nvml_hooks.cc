// The exported NVML hooks: each calls NVML's own entry point (which checks
// the handle, the pointer and the struct's version as it always does) and,
// when it succeeded for a device under the cap, reports the cap instead.
#include "interpose/nvml_hooks.h"

#include <cstring>

#include "interpose/nvml_devices.h"

#define STENSOR_EXPORT extern "C" __attribute__((visibility("default")))

namespace stensor {
namespace {

template <typename Fn>
Fn RealNvml(const char* name) {
  return reinterpret_cast<Fn>(NvmlDevices::Real(name));
}

}  // namespace
}  // namespace stensor

// Under a cap: total the cap, used what stensor charges, free the rest (v1's
// used counts what the driver reserves; under a cap nothing of it is).
STENSOR_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  auto real = stensor::RealNvml<decltype(&::nvmlDeviceGetMemoryInfo)>("nvmlDeviceGetMemoryInfo");
  if (real == nullptr) return NVML_ERROR_UNINITIALIZED;  // no NVML: nvmlInit never ran
  nvmlReturn_t r = real(device, memory);
  if (r != NVML_SUCCESS || memory == nullptr) return r;
  if (auto capped = stensor::NvmlDevices::Get().CappedMemory(device)) {
    memory->total = capped->total;
    memory->used = capped->used;
    memory->free = capped->total - capped->used;
  }
  return r;
}

// As above, with nothing reserved: total = reserved + used + free.
STENSOR_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                       nvmlMemory_v2_t* memory) {
  auto real =
      stensor::RealNvml<decltype(&::nvmlDeviceGetMemoryInfo_v2)>("nvmlDeviceGetMemoryInfo_v2");
  if (real == nullptr) return NVML_ERROR_UNINITIALIZED;
  // NVML checks the version; checked here too, so that a struct of another
  // layout is never written as this one.
  if (memory != nullptr && memory->version != nvmlMemory_v2) {
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  }
  nvmlReturn_t r = real(device, memory);
  if (r != NVML_SUCCESS || memory == nullptr) return r;
  if (auto capped = stensor::NvmlDevices::Get().CappedMemory(device)) {
    memory->total = capped->total;
    memory->reserved = 0;
    memory->used = capped->used;
    memory->free = capped->total - capped->used;
  }
  return r;
}

namespace stensor {

void* NvmlDlsym(const char* name, void* real) {
  struct Hook {
    const char* name;
    void* hook;
  };
  static const Hook kHooks[] = {
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo)},
      {"nvmlDeviceGetMemoryInfo_v2", reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo_v2)},
  };
  for (const Hook& h : kHooks) {
    if (std::strcmp(name, h.name) != 0) continue;
    void* nvml = NvmlDevices::Real(name);
    if (real == h.hook) return nvml != nullptr ? h.hook : nullptr;
    return real == nvml ? h.hook : real;
  }
  return real;
}

}  // namespace stensor
