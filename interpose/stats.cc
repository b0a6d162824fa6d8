// stensor_stats_json: the statistics STENSOR_STATS=1 prints at exit, as one
// JSON object a program can read while it runs (the Python package's
// stensor.stats(), for a training loop's log):
//   {"started": false, "capped": false}       no CUDA call has reached stensor yet
//   {"started": true, "capped": false}        running without a cap
//   {"started": true, "capped": true, ...}    the counters (MemoryManager::AppendStatsJson)
// Asking starts nothing: before the program's first CUDA call the answer is
// the first form.
//
// Thread-safety: any thread.
#include <cstring>
#include <string>

#include "core/base/json.h"
#include "interpose/state.h"

#define STENSOR_EXPORT extern "C" __attribute__((visibility("default")))

// Writes the object into buf (at most len bytes, NUL included; truncated
// when it does not fit, as snprintf) and returns its length without the
// NUL: a result >= len asks for a larger buffer.
STENSOR_EXPORT size_t stensor_stats_json(char* buf, size_t len) {
  stensor::JsonLine j;
  const bool started = stensor::StateReady();
  const stensor::Tracker* tracker = started ? stensor::State().tracker : nullptr;
  const bool capped = tracker != nullptr && tracker->capped();
  j.Bool("started", started).Bool("capped", capped);
  if (capped) tracker->memory()->AppendStatsJson(&j);
  const std::string text = j.Finish();
  if (buf != nullptr && len > 0) {
    const size_t n = text.size() < len ? text.size() : len - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}
