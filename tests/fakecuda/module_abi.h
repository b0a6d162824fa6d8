// The binary interface between the fake CUDA driver and a module of host
// kernels: what cuModuleLoad finds in the shared library it opens. Kernel
// authors use fake_kernel.h instead, which fills these in.
#ifndef STENSOR_TESTS_FAKECUDA_MODULE_ABI_H_
#define STENSOR_TESTS_FAKECUDA_MODULE_ABI_H_

#include <stddef.h>

extern "C" {

struct fakecuda_dim3 {
  unsigned x, y, z;
};

// One kernel of a module, as the fake driver sees it. Offsets and sizes follow
// the CUDA parameter ABI: each parameter at the next offset aligned for its type.
struct fakecuda_kernel_desc {
  const char* name;  // symbol name: mangled, or plain for extern "C"
  void* fn;
  void (*invoke)(void* fn, const unsigned char* args, fakecuda_dim3 grid, fakecuda_dim3 block);
  unsigned num_params;
  const size_t* param_offsets;
  const size_t* param_sizes;
  size_t args_size;  // bytes of the packed parameter buffer
};

// The entry point cuModuleLoad looks up by the name "fakecuda_module_kernels"
// (fake_kernel.h defines it): the module's kernels and their count.
typedef int (*fakecuda_module_kernels_fn)(const fakecuda_kernel_desc** kernels);

}  // extern "C"

#endif  // STENSOR_TESTS_FAKECUDA_MODULE_ABI_H_
