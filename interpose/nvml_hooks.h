// NVML under a cap: libstensor.so exports nvmlDeviceGetMemoryInfo and
// nvmlDeviceGetMemoryInfo_v2, which call the process's own NVML and, for a
// CUDA device under a cap, replace its answer with the cap as total and
// what stensor charges to the device as used (interpose/nvml_devices.h
// says when). Every other NVML entry point is NVML's.
//
// Thread-safety: any thread.
#ifndef STENSOR_INTERPOSE_NVML_HOOKS_H_
#define STENSOR_INTERPOSE_NVML_HOOKS_H_

namespace stensor {

// dlsym's answer for the NVML name `name`, given the C library's answer
// `real` (not null): NVML's own entry point for a hooked name becomes
// stensor's hook; stensor's own export, found where NVML is not loaded,
// becomes null; anything else is `real`.
void* NvmlDlsym(const char* name, void* real);

}  // namespace stensor

#endif  // STENSOR_INTERPOSE_NVML_HOOKS_H_
