// The part of NVML's ABI (nvml.h, NVIDIA Management Library) that stensor
// and its fake NVML use, declared here because Debian ships no NVML header.
// Every layout, value and name is NVML's own; the static_asserts pin the
// sizes and offsets its 64-bit Linux ABI has.
//
// Thread-safety: declarations only.
#ifndef STENSOR_THIRD_PARTY_NVML_NVML_TYPES_H_
#define STENSOR_THIRD_PARTY_NVML_NVML_TYPES_H_

#include <cstddef>

extern "C" {

typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st* nvmlDevice_t;

// nvmlDeviceGetMemoryInfo: `used` includes what the driver reserves.
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

// nvmlDeviceGetMemoryInfo_v2; the caller sets `version` to nvmlMemory_v2.
typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(data, ver) \
  (unsigned int)(sizeof(nvml##data##_v##ver##_t) | (ver << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

#define NVML_DEVICE_UUID_BUFFER_SIZE 80
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

// nvmlDeviceGetPciInfo_v3 (nvmlDeviceGetPciInfo in nvml.h).
typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length);

}  // extern "C"

static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t ABI");
static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t ABI");
static_assert(offsetof(nvmlMemory_v2_t, total) == 8, "nvmlMemory_v2_t ABI");
static_assert(nvmlMemory_v2 == 0x02000028u, "nvmlMemory_v2 ABI");
static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t ABI");
static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t ABI");

#endif  // STENSOR_THIRD_PARTY_NVML_NVML_TYPES_H_
