// Which context a stream's or a device's work runs in, and the primary
// contexts stensor retains for devices whose context is not current. Shared
// by the memory manager (where its own streams and events live), the
// stream-ordered allocator (core/stream_ordered) and the pluggable
// allocator (interpose/torch_allocator.cc).
//
// Thread-safety: thread-safe; the cache of retained primary contexts is
// guarded.
#ifndef STENSOR_CORE_DRIVER_DEVICE_CONTEXT_H_
#define STENSOR_CORE_DRIVER_DEVICE_CONTEXT_H_

#include "core/driver/driver.h"

namespace stensor {

// The context work on `stream` runs in: a named stream's own
// (cuStreamGetCtx), else (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) the
// current one. The driver's error for a handle it refuses (a destroyed or
// bogus stream: CUDA_ERROR_INVALID_HANDLE), or CUDA_ERROR_INVALID_CONTEXT
// when no context is current for a stream that names the current
// context's. Asks without side effects, so it also serves to check a handle
// where stensor answers a call itself.
CUresult StreamContext(const Driver& driver, CUstream stream, CUcontext* context);

// The context to run device `ordinal`'s work in: the current one when it is
// on that device, else the device's primary context, retained once per
// device and kept for the process (as the CUDA runtime keeps it). The
// driver's error when the ordinal is invalid or the context cannot be had.
CUresult ContextForDevice(const Driver& driver, int ordinal, CUcontext* context);

// `context` ended (destroyed, or a primary context reset): if it is a
// primary context retained above, it is retained afresh when next needed.
void ForgetRetainedContext(CUcontext context);

// Device `device`'s primary context while it is active, without changing
// its reference count for good; null when it is inactive or the driver
// will not say.
CUcontext ActivePrimaryContext(const Driver& driver, CUdevice device);

}  // namespace stensor

#endif  // STENSOR_CORE_DRIVER_DEVICE_CONTEXT_H_
