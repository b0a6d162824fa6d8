// A fake NVML (libnvidia-ml.so.1) over the fake driver's physical devices:
// FAKECUDA_DEVICES of them (every one, as NVML numbers them: it ignores
// CUDA_VISIBLE_DEVICES), each with FAKECUDA_DEVICE_MEMORY bytes, the UUID
// and PCI bus the fake driver gives it. Only what stensor's NVML tests call
// is here: init and shutdown, the device count, handles by index, UUID, PCI
// information, memory information (v1 and v2, with NVML's argument and
// version checks) and error strings.
//
// The memory it reports is the device's own, as a real NVML does: the whole
// device as total, kReserved bytes reserved by the "driver", nothing else
// used.
//
// Thread-safety: any thread; the device table is built once.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/fakecuda/physical_devices.h"
#include "third_party/nvml/nvml_types.h"

#define FAKENVML_EXPORT extern "C" __attribute__((visibility("default")))

struct nvmlDevice_st {
  int index;
};

namespace fakenvml {
namespace {

constexpr int kMaxDevices = 16;
constexpr unsigned long long kReserved = 1ull << 20;

struct Devices {
  int count = 1;
  unsigned long long memory = 16ull << 30;
  nvmlDevice_st handles[kMaxDevices];
};

// The options as the fake driver reads them; one it would refuse leaves
// the default (the driver stops the program on it anyway).
const Devices& GetDevices() {
  static const Devices* devices = [] {
    auto* d = new Devices;
    if (const char* v = std::getenv("FAKECUDA_DEVICES")) {
      int n = std::atoi(v);
      if (n >= 1 && n <= kMaxDevices) d->count = n;
    }
    size_t bytes = 0;
    if (const char* v = std::getenv("FAKECUDA_DEVICE_MEMORY");
        v != nullptr && fakecuda::ParseSize(v, &bytes)) {
      d->memory = bytes;
    }
    for (int i = 0; i < kMaxDevices; ++i) d->handles[i].index = i;
    return d;
  }();
  return *devices;
}

std::atomic<int> g_init_count{0};

// The device a handle names, or -1 (also before nvmlInit).
int IndexOf(nvmlDevice_t device) {
  if (g_init_count.load() == 0 || device == nullptr) return -1;
  const Devices& d = GetDevices();
  for (int i = 0; i < d.count; ++i) {
    if (device == &d.handles[i]) return i;
  }
  return -1;
}

}  // namespace
}  // namespace fakenvml

using fakenvml::GetDevices;
using fakenvml::IndexOf;

FAKENVML_EXPORT nvmlReturn_t nvmlInit_v2() {
  fakenvml::g_init_count.fetch_add(1);
  return NVML_SUCCESS;
}
FAKENVML_EXPORT nvmlReturn_t nvmlInit() { return nvmlInit_v2(); }
FAKENVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int) { return nvmlInit_v2(); }

FAKENVML_EXPORT nvmlReturn_t nvmlShutdown() {
  int n = fakenvml::g_init_count.load();
  do {
    if (n == 0) return NVML_ERROR_UNINITIALIZED;
  } while (!fakenvml::g_init_count.compare_exchange_weak(n, n - 1));
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (fakenvml::g_init_count.load() == 0) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = static_cast<unsigned>(GetDevices().count);
  return NVML_SUCCESS;
}
FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) {
  return nvmlDeviceGetCount_v2(count);
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                           nvmlDevice_t* device) {
  if (fakenvml::g_init_count.load() == 0) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= static_cast<unsigned>(GetDevices().count)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *device = const_cast<nvmlDevice_t>(&GetDevices().handles[index]);
  return NVML_SUCCESS;
}
FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid,
                                               unsigned int length) {
  const int i = IndexOf(device);
  if (fakenvml::g_init_count.load() == 0) return NVML_ERROR_UNINITIALIZED;
  if (i < 0 || uuid == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const std::string text = fakecuda::UuidText(i);
  if (length < text.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(uuid, text.c_str(), text.size() + 1);
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  const int i = IndexOf(device);
  if (fakenvml::g_init_count.load() == 0) return NVML_ERROR_UNINITIALIZED;
  if (i < 0 || pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(pci, 0, sizeof(*pci));
  pci->bus = fakecuda::PhysicalPciBus(i);
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus & 0xff);
  std::snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus & 0xff);
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  const int i = IndexOf(device);
  if (fakenvml::g_init_count.load() == 0) return NVML_ERROR_UNINITIALIZED;
  if (i < 0 || memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  // v1's used counts the reserved memory.
  memory->total = GetDevices().memory;
  memory->used = fakenvml::kReserved;
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                        nvmlMemory_v2_t* memory) {
  const int i = IndexOf(device);
  if (fakenvml::g_init_count.load() == 0) return NVML_ERROR_UNINITIALIZED;
  if (i < 0 || memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  memory->total = GetDevices().memory;
  memory->reserved = fakenvml::kReserved;
  memory->used = 0;
  memory->free = memory->total - memory->reserved;
  return NVML_SUCCESS;
}

FAKENVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "Argument Version Mismatch";
    default:
      return "Unknown Error";
  }
}
