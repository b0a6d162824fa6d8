#include "tests/support/scripted_driver_testing.h"

#include <atomic>

namespace stensor {
namespace testing_support {
namespace {

std::atomic<KernelLookup> lookup{nullptr};
std::atomic<int> func_name_queries{0};

const ScriptedKernel* Lookup(uintptr_t handle, bool is_cukernel) {
  KernelLookup f = lookup.load();
  return f == nullptr ? nullptr : f(handle, is_cukernel);
}

CUresult ParamInfo(const ScriptedKernel* k, size_t index, size_t* offset, size_t* size) {
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (offset == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (index >= k->fail_from) return k->error;
  if (k->endless) {
    *offset = index * 8;
    *size = 8;
    return CUDA_SUCCESS;
  }
  if (index >= k->params.size()) return CUDA_ERROR_INVALID_VALUE;
  *offset = k->params[index].first;
  *size = k->params[index].second;
  return CUDA_SUCCESS;
}

CUresult Name(const ScriptedKernel* k, const char** name) {
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = k->name;
  return CUDA_SUCCESS;
}

CUresult FuncGetName(const char** name, CUfunction f) {
  func_name_queries.fetch_add(1);
  return Name(Lookup(reinterpret_cast<uintptr_t>(f), /*is_cukernel=*/false), name);
}

CUresult FuncGetParamInfo(CUfunction f, size_t index, size_t* offset, size_t* size) {
  return ParamInfo(Lookup(reinterpret_cast<uintptr_t>(f), false), index, offset, size);
}

CUresult KernelGetName(const char** name, CUkernel kernel) {
  return Name(Lookup(reinterpret_cast<uintptr_t>(kernel), /*is_cukernel=*/true), name);
}

CUresult KernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) {
  return ParamInfo(Lookup(reinterpret_cast<uintptr_t>(kernel), true), index, offset, size);
}

}  // namespace

const ScriptedKernel* FindKernel(const std::vector<ScriptedKernel>& kernels, uintptr_t handle,
                                 bool is_cukernel) {
  for (const ScriptedKernel& k : kernels) {
    if (k.handle == handle && k.is_cukernel == is_cukernel) return &k;
  }
  return nullptr;
}

void InstallScriptedKernels(KernelLookup f, Driver* driver) {
  lookup.store(f);
  driver->cuFuncGetName = &FuncGetName;
  driver->cuFuncGetParamInfo = &FuncGetParamInfo;
  driver->cuKernelGetName = &KernelGetName;
  driver->cuKernelGetParamInfo = &KernelGetParamInfo;
}

int ScriptedFuncNameQueries() { return func_name_queries.load(); }

}  // namespace testing_support
}  // namespace stensor
