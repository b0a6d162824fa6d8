#include "core/swap/stream_use.h"

#include <atomic>

namespace stensor {

void RecordStreamUse(const Vmm& vmm, std::vector<StreamUse>* uses, CUstream stream, int device) {
  StreamUse* u = nullptr;
  for (StreamUse& x : *uses) {
    if (x.stream == stream) u = &x;
  }
  if (u == nullptr) {
    u = &uses->emplace_back();
    u->stream = stream;
  }
  u->device = device;
  ++u->seq;
  u->done = false;
  u->recorded = false;
  const Driver& driver = vmm.driver();
  u->mark = nullptr;
  u->event = nullptr;
  if (u->own == nullptr &&
      vmm.Check(driver.cuEventCreate(&u->own, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
    u->own = nullptr;
    return;  // not recorded: waits fall back to the stream or the context
  }
  u->event = u->own;
  u->recorded = vmm.Check(driver.cuEventRecord(u->event, stream)) == CUDA_SUCCESS;
}

bool ObservedComplete(const Driver& driver, StreamUse& u) {
  if (u.done) return true;
  if (u.mark != nullptr) {
    StreamMark& m = *u.mark;
    // Noted ahead of the record that covers it: no event tells yet.
    if (m.recorded_gen < u.mark_gen) return false;
    // That record was made since: the use is known to its event.
    u.recorded = true;
    u.event = m.event;
    if (m.completed_gen < u.mark_gen) {
      // Its record, or a later one on the same stream.
      if (driver.cuEventQuery(m.event) != CUDA_SUCCESS) return false;
      m.completed_gen = m.recorded_gen;
    }
    u.done = true;
    return true;
  }
  if (!u.recorded || driver.cuEventQuery(u.event) != CUDA_SUCCESS) return false;
  u.done = true;
  return true;
}

uint64_t ThreadTag() {
  static std::atomic<uint64_t> next{1};
  static thread_local const uint64_t tag = next.fetch_add(1, std::memory_order_relaxed);
  return tag;
}

CUresult WaitForStreamUse(const Driver& driver, const StreamUse& u, CUstream swap_stream) {
  if (u.recorded && driver.cuEventSynchronize(u.event) == CUDA_SUCCESS) {
    return CUDA_SUCCESS;
  }
  if (swap_stream != nullptr && u.stream == swap_stream) {
    return driver.cuStreamSynchronize(swap_stream);
  }
  CUdevice current = 0;
  if (CUresult r = driver.cuCtxGetDevice(&current); r != CUDA_SUCCESS) return r;
  if (current != u.device) return CUDA_ERROR_INVALID_CONTEXT;
  return driver.cuCtxSynchronize();
}

}  // namespace stensor
