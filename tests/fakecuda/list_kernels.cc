// Prints the kernel names of a fake-driver module, one per line: what
// cuModuleGetFunction will find in it. Used to compare a module with the
// symbols nvcc emits for its .cu twin.
//
//   list_kernels path/to/module.so
#include <dlfcn.h>

#include <cstdio>

#include "tests/fakecuda/module_abi.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODULE.so\n", argv[0]);
    return 2;
  }
  void* dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) {
    std::fprintf(stderr, "list_kernels: %s\n", dlerror());
    return 1;
  }
  auto list = reinterpret_cast<fakecuda_module_kernels_fn>(dlsym(dl, "fakecuda_module_kernels"));
  if (list == nullptr) {
    std::fprintf(stderr, "list_kernels: %s is not a fake-driver module\n", argv[1]);
    return 1;
  }
  const fakecuda_kernel_desc* kernels = nullptr;
  int n = list(&kernels);
  for (int i = 0; i < n; ++i) std::printf("%s\n", kernels[i].name);
  return 0;
}
