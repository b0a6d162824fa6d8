// A driver table for unit tests whose kernel queries (cuFuncGetName,
// cuFuncGetParamInfo, cuKernelGetName, cuKernelGetParamInfo) answer from a
// script: kernel handles, names and parameter layouts the test chooses,
// including the driver's failure modes (no parameter queries, a query that
// fails part way, a list that never ends). Every other entry point stays
// null unless the test sets it.
//
// The table holds plain function pointers, so the script is process-wide:
// one lookup per test program, installed before the first query.
//
// Thread-safety: the queries may run on any thread once installed; the
// lookup must be safe to call concurrently.
#ifndef STENSOR_TESTS_SUPPORT_SCRIPTED_DRIVER_TESTING_H_
#define STENSOR_TESTS_SUPPORT_SCRIPTED_DRIVER_TESTING_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/driver/driver.h"

namespace stensor {
namespace testing_support {

struct ScriptedKernel {
  uintptr_t handle;
  // True: a CUkernel, which the cuFunc* queries reject.
  bool is_cukernel;
  const char* name;
  // (offset, size) of each parameter; querying past the last one gives
  // CUDA_ERROR_INVALID_VALUE, as the driver documents.
  std::vector<std::pair<size_t, size_t>> params;
  // From this parameter index on, the layout query fails with `error`.
  size_t fail_from = SIZE_MAX;
  CUresult error = CUDA_SUCCESS;
  // Every index succeeds: a driver that never says where the list ends.
  bool endless = false;
};

// The kernel a handle names now (null: an unknown handle, which the queries
// answer with CUDA_ERROR_INVALID_HANDLE). A function, not a table, so that
// a test can change what a handle means (a module unloaded and another
// loaded at the same handle).
using KernelLookup = const ScriptedKernel* (*)(uintptr_t handle, bool is_cukernel);

// The first kernel of `kernels` with that handle and kind, or null.
const ScriptedKernel* FindKernel(const std::vector<ScriptedKernel>& kernels, uintptr_t handle,
                                 bool is_cukernel);

// Points the four kernel queries of `driver` at the scripted ones, which
// answer from `lookup` (replacing any earlier lookup).
void InstallScriptedKernels(KernelLookup lookup, Driver* driver);

// How often cuFuncGetName was asked since the program started: a cache
// asks once per description it builds.
int ScriptedFuncNameQueries();

}  // namespace testing_support
}  // namespace stensor

#endif  // STENSOR_TESTS_SUPPORT_SCRIPTED_DRIVER_TESTING_H_
