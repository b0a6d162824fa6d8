// Stream capture as stensor must respect it. While a stream is being
// captured into a CUDA graph, the work pushed into it does not run: it
// becomes graph nodes, and runs at each cuGraphLaunch (core/inference/graph_plan.h
// handles it there). So an operation submitted to a capturing stream is
// passed through untouched: nothing is swapped in for it, no event is
// recorded or waited for in it (either would become part of the graph, or
// break it), and it marks no buffer used or written.
//
// stensor's own driver calls during a capture (swap copies on its own
// streams, event queries, VMM calls, a synchronisation for a table
// read-back) are "potentially unsafe" calls in the driver's terms: a
// thread whose capture mode is GLOBAL (the default) may not make them while
// any GLOBAL capture is in progress, and doing so invalidates that capture.
// RelaxedCaptureScope switches the calling thread to RELAXED for the
// duration of stensor's own work, and back before the program's call runs,
// so the program's calls to the driver are judged by its own mode. (A
// cuMemAlloc or cuMemFree stensor serves itself under a cap does not reach
// the driver: it succeeds during a capture where the driver, in the
// program's mode, might refuse it.)
//
// A capture is counted from just before the driver begins it, so stensor's
// work that starts after that is relaxed. Work already under way on another
// thread when the capture begins is not: its unsafe calls may still
// invalidate that capture (a race no test covers).
//
// Thread-safety: CaptureState is thread-safe; a RelaxedCaptureScope belongs
// to the thread that made it.
#ifndef STENSOR_CORE_INFERENCE_CAPTURE_H_
#define STENSOR_CORE_INFERENCE_CAPTURE_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"

namespace stensor {

class CaptureState {
 public:
  explicit CaptureState(const Driver* driver) : driver_(driver) {}

  // Whether some capture may be in progress: the only question the hot
  // paths ask (an atomic load) when none is.
  bool any() const { return active_.load(std::memory_order_acquire) > 0; }

  // A capture is about to begin on `origin` (before cuStreamBeginCapture*;
  // OnEnd undoes it when the begin failed).
  void OnBegin(CUstream origin) ABSL_LOCKS_EXCLUDED(mu_);
  // cuStreamEndCapture on `origin` returned (whatever its result: a failed
  // end may still have ended the capture, e.g. an invalidated one): the
  // driver is asked whether `origin` still captures.
  void OnEnd(CUstream origin) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether work pushed into `stream` now is captured, not run. The legacy
  // stream while a blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_
  // IMPLICIT) counts as capturing: nothing may be inserted into it, and the
  // driver refuses the program's operation there anyway. A query that
  // fails otherwise counts as not capturing: the operation's writes are
  // then recorded, never lost.
  bool Capturing(CUstream stream) const { return any() && CapturingSlow(stream); }

  // A stream of stensor's own in the current context, outside every
  // capture: the consumer of the swap-ins made for a captured copy or
  // memset (nothing may be inserted into the capture itself). Null when
  // none could be made.
  CUstream SideStream() ABSL_LOCKS_EXCLUDED(mu_);
  // `ctx` ended, and its side stream with it: a context made later at the
  // same address gets a new one.
  void ForgetContext(CUcontext ctx) ABSL_LOCKS_EXCLUDED(mu_);

  const Driver* driver() const { return driver_; }

 private:
  bool CapturingSlow(CUstream stream) const;

  const Driver* const driver_;
  std::atomic<int> active_{0};
  Mutex mu_;
  // A capture's origin: the stream, and for a per-thread stream (the same
  // handle in every thread) the thread, whose own stream it is.
  using Origin = std::pair<CUstream, std::thread::id>;
  static Origin OriginOf(CUstream stream);
  absl::flat_hash_set<Origin> origins_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<CUcontext, CUstream> side_ ABSL_GUARDED_BY(mu_);
};

class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(const CaptureState& state) {
    if (state.any()) Relax(state.driver());
  }
  ~RelaxedCaptureScope() {
    if (driver_ != nullptr) Restore();
  }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  void Relax(const Driver* driver);
  void Restore();

  const Driver* driver_ = nullptr;  // set once the mode was exchanged
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
};

}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_CAPTURE_H_
