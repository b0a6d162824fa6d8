// Driver: the real CUDA driver as stensor calls it, one typed pointer per
// entry point of core/driver_symbols.inc. interpose/ fills it from the real
// libcuda.so.1; tests may fill it from the fake or by hand.
//
// A pointer stays null when the driver lacks that entry point; callers check
// and return an error instead of calling it.
//
// Thread-safety: filled once before use, then read-only.
#ifndef STENSOR_CORE_DRIVER_DRIVER_H_
#define STENSOR_CORE_DRIVER_DRIVER_H_

#ifndef __CUDA_API_VERSION_INTERNAL
#error "build with -D__CUDA_API_VERSION_INTERNAL: the table names versioned symbols"
#endif
#include <cuda.h>

namespace stensor {

struct Driver {
#define STENSOR_HOOK(name) decltype(&::name) name = nullptr;
#define STENSOR_CALL(name) decltype(&::name) name = nullptr;
#include "core/driver/driver_symbols.inc"
#undef STENSOR_HOOK
#undef STENSOR_CALL
};

// Looks every entry point up with `resolve` (a dlsym that is not hooked) in
// `handle`. Returns how many were found.
int LoadDriver(void* handle, void* (*resolve)(void*, const char*), Driver* driver);

}  // namespace stensor

#endif  // STENSOR_CORE_DRIVER_DRIVER_H_
