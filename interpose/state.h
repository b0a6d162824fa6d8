// The interposer's process-wide state: the real driver's function table and
// the tracker, set up once (on the first hooked call, or by the library's
// constructor, whichever comes first).
//
// Thread-safety: State() is safe from any thread; the state is immutable
// once built, apart from the tracker's own synchronised contents.
#ifndef STENSOR_INTERPOSE_STATE_H_
#define STENSOR_INTERPOSE_STATE_H_

#include "core/driver/driver.h"
#include "core/tracker/tracker.h"

namespace stensor {

struct InterposeState {
  Driver driver;      // the real driver's entry points
  Tracker* tracker;   // never null once built
  void* real_handle;  // dlopen handle of the real libcuda.so.1
};

// Builds the state on first use. An invalid configuration or a missing real
// driver stops the program with one line on stderr.
const InterposeState& State();

// Whether State() has been built; lets dlsym pass through during start-up
// instead of building the state from inside the loader.
bool StateReady();

// The state, built if need be, when this process uses CUDA: the state is
// built already, or the driver is loaded and initialised (cuInit). Else
// null, and nothing is loaded, initialised or built: for observers such as
// NVML's hooks, which a process may call without ever using CUDA, or before
// it does (a process that initialised CUDA cannot use it in a child of
// fork(), so stensor never initialises it on its own).
const InterposeState* StateIfCudaInUse();

// The hook libstensor.so exports for the real driver function `real`, or
// null when that function is not hooked.
void* HookFor(void* real);

// dlsym as the C library provides it, bypassing stensor's own dlsym.
void* RealDlsym(void* handle, const char* name);

}  // namespace stensor

#endif  // STENSOR_INTERPOSE_STATE_H_
