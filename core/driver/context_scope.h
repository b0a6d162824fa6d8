// ContextScope: a context made current for the calls in a C++ scope, the
// previous one current again at its end. A stream belongs to the context
// current at its creation and an event is recorded only on a stream of its
// own context, so stensor's work for a device runs in that device's
// context, whatever the program has current (core/memory_manager), and the
// pluggable allocator's calls run in the tensor's device's
// (core/stream_ordered).
//
// Thread-safety: one thread's scope, on that thread's context stack.
#ifndef STENSOR_CORE_DRIVER_CONTEXT_SCOPE_H_
#define STENSOR_CORE_DRIVER_CONTEXT_SCOPE_H_

#include <cstdint>

#include "core/driver/driver.h"

namespace stensor {

class ContextScope {
 public:
  // Pushes `target` unless it is null or already current; result() says
  // whether the calls that follow run in it. Each failed driver call is
  // counted in `*errors` (when not null).
  ContextScope(const Driver& driver, CUcontext target, uint64_t* errors = nullptr)
      : driver_(driver), errors_(errors) {
    if (target == nullptr) return;
    CUcontext current = nullptr;
    result_ = Count(driver_.cuCtxGetCurrent(&current));
    if (result_ != CUDA_SUCCESS || current == target) return;
    result_ = Count(driver_.cuCtxPushCurrent_v2(target));
    pushed_ = result_ == CUDA_SUCCESS;
  }
  ~ContextScope() { (void)Restore(); }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  CUresult result() const { return result_; }
  // Pops what was pushed; once more if that fails, since a program left
  // with stensor's context current would run its next work on another
  // device. The last pop's result.
  CUresult Restore() {
    if (!pushed_) return CUDA_SUCCESS;
    pushed_ = false;
    CUresult r = Count(driver_.cuCtxPopCurrent_v2(nullptr));
    if (r != CUDA_SUCCESS) r = Count(driver_.cuCtxPopCurrent_v2(nullptr));
    return r;
  }

 private:
  CUresult Count(CUresult r) {
    if (r != CUDA_SUCCESS && errors_ != nullptr) ++*errors_;
    return r;
  }

  const Driver& driver_;
  uint64_t* const errors_;
  CUresult result_ = CUDA_SUCCESS;
  bool pushed_ = false;
};

}  // namespace stensor

#endif  // STENSOR_CORE_DRIVER_CONTEXT_SCOPE_H_
