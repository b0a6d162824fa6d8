#include "interpose/nvml_devices.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "interpose/state.h"

namespace stensor {
namespace {

// NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as its 16 bytes; false
// for anything else (a MIG instance's "MIG-..." included).
bool ParseGpuUuid(const char* text, std::array<unsigned char, 16>* uuid) {
  if (std::strncmp(text, "GPU-", 4) != 0) return false;
  size_t digits = 0;
  for (const char* p = text + 4; *p != '\0'; ++p) {
    if (*p == '-') continue;
    if (!std::isxdigit(static_cast<unsigned char>(*p)) || digits == 32) return false;
    const int c = std::tolower(static_cast<unsigned char>(*p));
    const int value = c <= '9' ? c - '0' : c - 'a' + 10;
    unsigned char& byte = (*uuid)[digits / 2];
    byte = static_cast<unsigned char>(digits % 2 == 0 ? value << 4 : byte | value);
    ++digits;
  }
  return digits == 32;
}

}  // namespace

NvmlDevices& NvmlDevices::Get() {
  static NvmlDevices* devices = new NvmlDevices;  // leaked: hooks may run during exit
  return *devices;
}

void* NvmlDevices::Real(const char* name) {
  // Found by its SONAME whatever path the program loaded it from; only the
  // reference taken here is dropped again.
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (nvml == nullptr) return nullptr;
  void* fn = RealDlsym(nvml, name);
  dlclose(nvml);
  return fn;
}

int NvmlDevices::OrdinalOf(const Driver& driver, const Uuid& uuid) {
  MutexLock lock(&mu_);
  if (!listed_) {
    // CUDA's devices do not change while the process runs.
    int count = 0;
    if (driver.cuDeviceGetCount == nullptr || driver.cuDeviceGet == nullptr ||
        driver.cuDeviceGetUuid_v2 == nullptr || driver.cuDeviceGetCount(&count) != CUDA_SUCCESS) {
      return -1;
    }
    std::vector<Uuid> uuids;
    for (int ordinal = 0; ordinal < count; ++ordinal) {
      CUdevice device = 0;
      CUuuid id{};
      if (driver.cuDeviceGet(&device, ordinal) != CUDA_SUCCESS ||
          driver.cuDeviceGetUuid_v2(&id, device) != CUDA_SUCCESS) {
        return -1;  // asked again next time
      }
      Uuid& u = uuids.emplace_back();
      std::memcpy(u.data(), id.bytes, u.size());
    }
    uuids_ = std::move(uuids);
    listed_ = true;
  }
  for (size_t ordinal = 0; ordinal < uuids_.size(); ++ordinal) {
    if (uuids_[ordinal] == uuid) return static_cast<int>(ordinal);
  }
  return -1;
}

std::optional<NvmlDevices::Capped> NvmlDevices::CappedMemory(nvmlDevice_t device) {
  const InterposeState* state = StateIfCudaInUse();
  if (state == nullptr || !state->tracker->capped()) return std::nullopt;
  const Driver& driver = state->driver;
  // Not initialised in this process (a child of fork() whose parent was).
  int count = 0;
  if (driver.cuDeviceGetCount == nullptr || driver.cuDeviceGetCount(&count) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  auto uuid_fn = reinterpret_cast<decltype(&::nvmlDeviceGetUUID)>(Real("nvmlDeviceGetUUID"));
  char text[NVML_DEVICE_UUID_BUFFER_SIZE] = {};
  Uuid uuid{};
  if (uuid_fn == nullptr || uuid_fn(device, text, sizeof(text)) != NVML_SUCCESS ||
      !ParseGpuUuid(text, &uuid)) {
    return std::nullopt;
  }
  const int ordinal = OrdinalOf(driver, uuid);
  if (ordinal < 0) return std::nullopt;
  // A per-device limit may leave this device uncapped.
  size_t device_total = 0;
  if (driver.cuDeviceTotalMem_v2 == nullptr ||
      driver.cuDeviceTotalMem_v2(&device_total, ordinal) != CUDA_SUCCESS ||
      !state->tracker->config().memory_limit.BytesFor(ordinal, device_total)) {
    return std::nullopt;
  }
  const MemoryManager::Usage usage = state->tracker->memory()->DeviceUsage(ordinal);
  return Capped{usage.cap, std::min(usage.used, usage.cap)};
}

}  // namespace stensor
