#include "core/inference/capture.h"

namespace stensor {

CaptureState::Origin CaptureState::OriginOf(CUstream stream) {
  return {stream, stream == CU_STREAM_PER_THREAD ? std::this_thread::get_id() : std::thread::id()};
}

void CaptureState::OnBegin(CUstream origin) {
  MutexLock lock(&mu_);
  if (origins_.insert(OriginOf(origin)).second) active_.fetch_add(1, std::memory_order_acq_rel);
}

void CaptureState::OnEnd(CUstream origin) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // Unknown answer: the capture is taken as still going (the safe side:
  // stensor keeps asking about streams, and keeps its calls relaxed).
  if (driver_->cuStreamIsCapturing == nullptr ||
      driver_->cuStreamIsCapturing(origin, &status) != CUDA_SUCCESS ||
      status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    return;
  }
  MutexLock lock(&mu_);
  if (origins_.erase(OriginOf(origin)) > 0) active_.fetch_sub(1, std::memory_order_acq_rel);
}

bool CaptureState::CapturingSlow(CUstream stream) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver_->cuStreamIsCapturing == nullptr) return false;
  CUresult r = driver_->cuStreamIsCapturing(stream, &status);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    r = driver_->cuStreamIsCapturing(stream, &status);  // once more: guessing costs
  }
  // The legacy stream while a blocking stream captures: the driver refuses
  // the program's operation there as well, so nothing is to be done for it.
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return true;
  // Any other failure: taken as not capturing. Its operation is then
  // handled as run now, so its writes are never lost; were it captured
  // after all, the driver refuses what stensor inserts, and says so.
  if (r != CUDA_SUCCESS) return false;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;  // active or invalidated
}

CUstream CaptureState::SideStream() {
  CUcontext ctx = nullptr;
  if (driver_->cuCtxGetCurrent == nullptr || driver_->cuStreamCreate == nullptr ||
      driver_->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    return nullptr;
  }
  MutexLock lock(&mu_);
  auto it = side_.find(ctx);
  if (it != side_.end()) return it->second;
  CUstream stream = nullptr;
  // Non-blocking: the legacy stream's implicit ordering would tie it to the
  // capturing stream, which the driver refuses.
  if (driver_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return nullptr;
  side_[ctx] = stream;
  return stream;
}

void CaptureState::ForgetContext(CUcontext ctx) {
  MutexLock lock(&mu_);
  side_.erase(ctx);
}

void RelaxedCaptureScope::Relax(const Driver* driver) {
  if (driver->cuThreadExchangeStreamCaptureMode == nullptr) return;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (driver->cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS) return;
  previous_ = mode;
  driver_ = driver;
}

void RelaxedCaptureScope::Restore() {
  CUstreamCaptureMode mode = previous_;
  // A failure leaves the thread relaxed: its later unsafe calls then succeed
  // where the driver would have refused them, which loses no data.
  driver_->cuThreadExchangeStreamCaptureMode(&mode);
}

}  // namespace stensor
