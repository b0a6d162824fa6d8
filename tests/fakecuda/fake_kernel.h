// Host kernels for the fake CUDA driver.
//
// A module for the fake driver is a shared library (loaded by cuModuleLoad)
// whose kernels are ordinary host functions with exactly the C++ signature of
// their CUDA twins, so the symbol g++ emits is the name nvcc emits for the
// `__global__` function and cuFuncGetName/cuModuleGetFunction see real names:
//
//   namespace ops {
//   FAKECUDA_KERNEL(axpy, float a, const float* x, float* y, int n) {
//     for (int i = 0; i < n; ++i) y[i] += a * x[i];   // the whole grid's work
//   }
//   }  // namespace ops        -> "_ZN3ops4axpyEfPKfPfi", as nvcc names it
//
// A host kernel is called once per launch, on the launching stream's worker
// thread, and does the work of the whole grid; fakecuda::GridDim() and
// fakecuda::BlockDim() give the launch geometry. Templates: define the
// function template normally and register each instantiation with
// FAKECUDA_REGISTER_KERNEL(name<T>). `extern "C"` kernels use
// FAKECUDA_EXTERN_C_KERNEL.
//
// Thread-safety: registration runs in static initialisers of the module;
// the registry is read-only once the module is loaded.
#ifndef STENSOR_TESTS_FAKECUDA_FAKE_KERNEL_H_
#define STENSOR_TESTS_FAKECUDA_FAKE_KERNEL_H_

#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tests/fakecuda/module_abi.h"

namespace fakecuda {
namespace internal {

struct LaunchGeometry {
  fakecuda_dim3 grid{1, 1, 1};
  fakecuda_dim3 block{1, 1, 1};
};

__attribute__((visibility("hidden"))) inline LaunchGeometry& CurrentGeometry() {
  static thread_local LaunchGeometry geometry;
  return geometry;
}

__attribute__((visibility("hidden"))) inline std::vector<fakecuda_kernel_desc>& Registry() {
  // Leaked: a stream's thread may still run one of these kernels while
  // exit() destroys the module's statics (a real module's code outlives
  // them too).
  static auto* registry = new std::vector<fakecuda_kernel_desc>;
  return *registry;
}

constexpr std::size_t AlignUp(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

template <typename... Args>
struct Layout {
  static constexpr std::size_t kCount = sizeof...(Args);
  // +1 keeps the arrays non-empty for kernels without parameters.
  std::size_t offsets[kCount + 1] = {};
  std::size_t sizes[kCount + 1] = {};
  std::size_t total = 0;
  constexpr Layout() {
    const std::size_t sz[kCount + 1] = {sizeof(Args)..., 0};
    const std::size_t al[kCount + 1] = {alignof(Args)..., 1};
    std::size_t off = 0;
    for (std::size_t i = 0; i < kCount; ++i) {
      off = AlignUp(off, al[i]);
      offsets[i] = off;
      sizes[i] = sz[i];
      off += sz[i];
    }
    total = off;
  }
};

template <typename T>
T LoadParam(const unsigned char* p) {
  T value;
  std::memcpy(static_cast<void*>(&value), p, sizeof(T));
  return value;
}

template <typename... Args>
struct Kernel {
  static constexpr Layout<Args...> kLayout{};

  template <std::size_t... I>
  static void Call(void (*fn)(Args...), const unsigned char* args, std::index_sequence<I...>) {
    (void)args;
    fn(LoadParam<Args>(args + kLayout.offsets[I])...);
  }

  static void Invoke(void* fn, const unsigned char* args, fakecuda_dim3 grid, fakecuda_dim3 block) {
    CurrentGeometry() = LaunchGeometry{grid, block};
    Call(reinterpret_cast<void (*)(Args...)>(fn), args, std::index_sequence_for<Args...>{});
  }
};

template <typename... Args>
bool Register(void (*fn)(Args...)) {
  static_assert((std::is_trivially_copyable<Args>::value && ...),
                "kernel parameters must be trivially copyable");
  using K = Kernel<Args...>;
  void* address = reinterpret_cast<void*>(fn);
  // The symbol table gives the exact name the compiler emitted.
  Dl_info info{};
  const char* name = nullptr;
  if (dladdr(address, &info) != 0 && info.dli_saddr == address) {
    name = info.dli_sname;
  }
  if (name == nullptr) return false;  // not exported: invisible to the driver
  Registry().push_back(
      fakecuda_kernel_desc{name, address, &K::Invoke, static_cast<unsigned>(sizeof...(Args)),
                           K::kLayout.offsets, K::kLayout.sizes, K::kLayout.total});
  return true;
}

}  // namespace internal

// Launch geometry of the kernel running on this thread.
inline fakecuda_dim3 GridDim() { return internal::CurrentGeometry().grid; }
inline fakecuda_dim3 BlockDim() { return internal::CurrentGeometry().block; }

}  // namespace fakecuda

// Weak, so any number of translation units of one module may include this
// header; dlsym on the module's handle finds the module's own copy.
extern "C" __attribute__((weak, visibility("default"))) int fakecuda_module_kernels(
    const fakecuda_kernel_desc** kernels) {
  auto& registry = fakecuda::internal::Registry();
  *kernels = registry.data();
  return static_cast<int>(registry.size());
}

#define FAKECUDA_INTERNAL_CONCAT2(a, b) a##b
#define FAKECUDA_INTERNAL_CONCAT(a, b) FAKECUDA_INTERNAL_CONCAT2(a, b)

// Registers an existing kernel (e.g. one template instantiation).
#define FAKECUDA_REGISTER_KERNEL(...)                                             \
  static const bool FAKECUDA_INTERNAL_CONCAT(fakecuda_registered_, __COUNTER__) = \
      ::fakecuda::internal::Register(&__VA_ARGS__)

#define FAKECUDA_KERNEL(name, ...)                                     \
  __attribute__((visibility("default"), used)) void name(__VA_ARGS__); \
  FAKECUDA_REGISTER_KERNEL(name);                                      \
  void name(__VA_ARGS__)

#define FAKECUDA_EXTERN_C_KERNEL(name, ...)                                       \
  extern "C" __attribute__((visibility("default"), used)) void name(__VA_ARGS__); \
  FAKECUDA_REGISTER_KERNEL(name);                                                 \
  extern "C" void name(__VA_ARGS__)

#endif  // STENSOR_TESTS_FAKECUDA_FAKE_KERNEL_H_
