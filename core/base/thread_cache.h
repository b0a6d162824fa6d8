// PerThread<T>: one T per thread, reached through a single initial-exec TLS
// pointer. Hot paths in libstensor.so use it instead of `thread_local T`:
// a preloaded library's general-dynamic TLS costs a __tls_get_addr call per
// access, and a large initial-exec TLS block could not be loaded with
// dlopen (the benchmarks do that). The object is created on a thread's first
// use and destroyed when the thread exits.
//
// Thread-safety: each thread sees only its own object.
#ifndef STENSOR_CORE_BASE_THREAD_CACHE_H_
#define STENSOR_CORE_BASE_THREAD_CACHE_H_

#include <memory>

namespace stensor {

template <typename T>
class PerThread {
 public:
  static T& Get() {
    T* p = current_;
    if (__builtin_expect(p != nullptr, 1)) return *p;
    return Create();
  }

 private:
  // Frees the thread's object at thread exit and clears the fast pointer,
  // so a hook called later in the exit sequence makes a fresh object
  // instead of using a freed one.
  struct Owner {
    std::unique_ptr<T> object;
    ~Owner() {
      current_ = nullptr;
      object.reset();
    }
  };

  static T& Create() {
    static thread_local Owner owner;
    owner.object = std::make_unique<T>();
    current_ = owner.object.get();
    return *current_;
  }

  static thread_local T* current_ __attribute__((tls_model("initial-exec")));
};

template <typename T>
thread_local T* PerThread<T>::current_ = nullptr;

}  // namespace stensor

#endif  // STENSOR_CORE_BASE_THREAD_CACHE_H_
