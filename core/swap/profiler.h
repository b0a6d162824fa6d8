// Profiler: what step S02 of the method measures on the device.
//   - β, the host<->device bandwidth per direction, from a short probe of
//     pinned copies at start (or STENSOR_BANDWIDTH);
//   - c, the compute time of each kernel launched while an iteration is
//     profiled, from a pair of timing events recorded around the launch on
//     its stream and read once both completed. Nothing waits for them: a
//     timing not complete yet is asked again later, so profiling never
//     blocks the host.
// Events are only recorded while profiling, so later iterations pay nothing.
//
// Thread-safety: all methods are thread-safe.
#ifndef STENSOR_CORE_SWAP_PROFILER_H_
#define STENSOR_CORE_SWAP_PROFILER_H_

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/config.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "policy/access_profile.h"

namespace stensor {

class Profiler {
 public:
  // β from the configuration, else probed in the current context with
  // copies of `probe_bytes` between pinned host memory and a device buffer
  // (the best of a few, after a warm-up). An error when a driver call of the
  // probe failed; everything it allocated is freed either way.
  // Bytes per second in each direction (the profile's Bandwidth).
  static absl::StatusOr<Bandwidth> MeasureBandwidth(const Config& config, const Driver* driver,
                                                    uint64_t probe_bytes = 16ull << 20);

  explicit Profiler(const Driver* driver) : driver_(driver) {}
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Before a launch on `stream`: records its start event. Returns a token
  // for EndTiming, or -1 when no event could be recorded (the launch then
  // goes untimed).
  int BeginTiming(CUstream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // After the launch: records the stop event and names the timing `op`.
  // When the launch was not submitted the timing is dropped.
  void EndTiming(int token, CUstream stream, uint64_t op, bool submitted) ABSL_LOCKS_EXCLUDED(mu_);
  // The timings whose events both completed since the last call, as
  // (op, seconds), in the order they were begun; never waits, and takes no
  // lock when no timing is open.
  std::vector<std::pair<uint64_t, double>> TakeCompleted() ABSL_LOCKS_EXCLUDED(mu_);
  // Timings begun and not yet taken.
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Timing {
    CUevent start = nullptr;
    CUevent stop = nullptr;
    uint64_t op = 0;
    // Begun (EndTiming not called yet), stop recorded, or abandoned (the
    // launch failed or its stop event could not be recorded).
    enum class State { kOpen, kRecorded, kAbandoned } state = State::kOpen;
  };
  // An event pair from the free list or new; false when none could be made.
  bool TakePair(Timing* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GivePair(Timing* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys the pair instead of keeping it (GivePair of the emptied
  // Timing then keeps nothing).
  void DropPair(Timing* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Driver* const driver_;
  mutable Mutex mu_;
  // Slots by token; a free slot has no events.
  std::vector<Timing> timings_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);
  // Tokens begun, oldest first, so completed timings come back in order.
  std::vector<int> order_ ABSL_GUARDED_BY(mu_);
  // order_.size(), readable without the lock: TakeCompleted with nothing
  // begun (every launch once the profile is taken) takes no lock. A timing
  // begun by another thread meanwhile is taken by the next call.
  std::atomic<size_t> open_{0};
  std::vector<std::pair<CUevent, CUevent>> spare_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_PROFILER_H_
