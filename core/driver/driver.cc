#include "core/driver/driver.h"

namespace stensor {

int LoadDriver(void* handle, void* (*resolve)(void*, const char*), Driver* driver) {
  int found = 0;
#define STENSOR_LOAD(name)                                                         \
  driver->name = reinterpret_cast<decltype(driver->name)>(resolve(handle, #name)); \
  found += driver->name != nullptr;
#define STENSOR_HOOK(name) STENSOR_LOAD(name)
#define STENSOR_CALL(name) STENSOR_LOAD(name)
#include "core/driver/driver_symbols.inc"
#undef STENSOR_HOOK
#undef STENSOR_CALL
#undef STENSOR_LOAD
  return found;
}

}  // namespace stensor
