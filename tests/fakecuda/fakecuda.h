// Test controls of the fake CUDA driver (tests/fakecuda), beyond the CUDA API.
//
// Tests link these directly (they are exported by the fake libcuda.so.1) or
// look them up with dlsym; a real driver has none of them. All functions are
// thread-safe.
#ifndef STENSOR_TESTS_FAKECUDA_FAKECUDA_H_
#define STENSOR_TESTS_FAKECUDA_FAKECUDA_H_

#include <cuda.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bytes of device memory in use on `device` now, and the most ever in use
// since start or the last fakecuda_reset_peak_bytes.
size_t fakecuda_used_bytes(int device);
size_t fakecuda_peak_bytes(int device);
void fakecuda_reset_peak_bytes(int device);

// Makes the `nth` call (1 = the next one) of the entry point `name` (the
// exported symbol, e.g. "cuMemCreate") return `result` without doing
// anything. Rules are one-shot; FAKECUDA_FAIL=name:nth[:result],... arms the
// same rules at start, counting from the first call.
void fakecuda_fail_call(const char* name, int nth, CUresult result);
void fakecuda_clear_failures(void);

// Calls of `name` since the process started (counted only while some rule
// is armed, after fakecuda_count_calls(1), or from cuInit on when
// FAKECUDA_REPORT_CALLS is set).
void fakecuda_count_calls(int enable);
unsigned long long fakecuda_call_count(const char* name);

#ifdef __cplusplus
}
#endif

#endif  // STENSOR_TESTS_FAKECUDA_FAKECUDA_H_
