// Fake driver: the time model. Host<->device copies occupy a copy engine
// per direction (FAKECUDA_LINK) and the costly VMM calls take host time
// (FAKECUDA_VMM_LATENCY_US), so overlap of transfers with compute, and the
// price of creating and mapping physical memory, can be measured without a
// GPU. Both are off unless configured.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "tests/fakecuda/internal.h"
#include "tests/fakecuda/trace.h"

namespace fakecuda {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// One DMA engine: the copies that reached it are scheduled back to back.
struct Engine {
  std::mutex mu;
  Clock::time_point free_at;  // guarded by mu: end of the last copy scheduled
};

Engine& EngineFor(int device, Link link) {
  // Two engines per device, for the life of the process (exit-time copies).
  static Engine* engines = new Engine[2 * DeviceCount()];
  return engines[2 * device + (link == Link::kDeviceToHost ? 1 : 0)];
}

double BytesPerSecond(Link link) {
  switch (link) {
    case Link::kHostToDevice:
      return GetOptions().h2d_bytes_per_s;
    case Link::kDeviceToHost:
      return GetOptions().d2h_bytes_per_s;
    case Link::kNone:
      break;
  }
  return 0;
}

Clock::duration TransferTime(size_t bytes, double bytes_per_s) {
  // Capped at about three years, so a tiny bandwidth cannot overflow.
  double ns = std::min(static_cast<double>(bytes) / bytes_per_s * 1e9, 1e17);
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(static_cast<int64_t>(ns)));
}

}  // namespace

bool LinkTimed(Link link) { return BytesPerSecond(link) > 0; }

void RunOnCopyEngine(int device, Link link, size_t bytes, const std::function<void()>& move,
                     Clock::time_point began, const std::function<void()>& garbage) {
  double bw = BytesPerSecond(link);
  if (bw <= 0 || device < 0 || device >= DeviceCount()) {
    move();
    return;
  }
  Engine& engine = EngineFor(device, link);
  Clock::time_point reached, start, end;
  {
    std::lock_guard<std::mutex> lock(engine.mu);
    reached = Clock::now();
    if (began != Clock::time_point{}) reached = std::min(reached, began);
    start = std::max(reached, engine.free_at);
    end = start + TransferTime(bytes, bw);
    engine.free_at = end;
  }
  // Sleeping, not spinning: a DMA engine does not use a core.
  std::this_thread::sleep_until(start);
  if (garbage) {
    garbage();
    std::this_thread::sleep_until(end);
    move();
  } else {
    move();
    std::this_thread::sleep_until(end);
  }
  Clock::time_point done = Clock::now();
  if (done > end) {
    // The move overran its window: the engine was busy until now. Copies
    // already scheduled behind it keep their slots (they start later only
    // when their own reservation says so).
    std::lock_guard<std::mutex> lock(engine.mu);
    engine.free_at = std::max(engine.free_at, done);
  }
  if (TraceEnabled()) {
    TraceCopyEngine(device, link, bytes, Ns(reached), Ns(start), Ns(end), Ns(done));
  }
}

void ChargeVmmLatency(VmmCall call, bool host_located) {
  const std::chrono::microseconds t =
      GetOptions().vmm_latency[host_located ? 1 : 0][static_cast<int>(call)];
  if (t.count() <= 0) return;
  // Short times by spinning: a sleep overshoots tens of microseconds, which
  // would double the figures of the cheap calls.
  const Clock::time_point end = Clock::now() + t;
  if (t < std::chrono::microseconds(200)) {
    while (Clock::now() < end) {
    }
  } else {
    std::this_thread::sleep_until(end);
  }
}

}  // namespace fakecuda
