// Leaks: the device buffers a program never freed, told at exit (with
// STENSOR_STATS or an access log): how many, how many bytes, and for the
// largest their size, the call that allocated them and the first kernel that
// used them, so a leak can be traced to its line of code.
//
// Kept only when a report is wanted: the launch hook then notes the first
// kernel of each buffer it has not seen used yet (a hash lookup per buffer of
// a launch); without a report nothing is recorded.
//
// Thread-safety: every method may be called from any thread.
#ifndef STENSOR_CORE_TRACKER_LEAKS_H_
#define STENSOR_CORE_TRACKER_LEAKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "core/base/mutex.h"

namespace stensor {

class Leaks {
 public:
  // `api` and `kernel` strings must outlive the Leaks (string literals, the
  // tracker's kernel descriptions).
  void OnAlloc(uint64_t id, const char* api, uint64_t bytes, int device) ABSL_LOCKS_EXCLUDED(mu_);
  void OnFree(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void OnLaunch(const char* kernel, absl::Span<const uint64_t> reads,
                absl::Span<const uint64_t> writes) ABSL_LOCKS_EXCLUDED(mu_);

  // The report's lines (no prefix), or none when every buffer was freed:
  // a summary, then the `shown` largest buffers, then how many more.
  std::vector<std::string> Report(size_t shown = 8) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Live {
    const char* api;
    const char* first_kernel;  // nullptr: never used by a kernel
    uint64_t bytes;
    int device;
  };
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Live> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_LEAKS_H_
