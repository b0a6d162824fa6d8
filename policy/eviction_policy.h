// EvictionPolicy: which resident buffers to take off the GPU when room is
// needed (step S405 of the method, and for `version` also S403). Policies
// decide over metadata only: no CUDA, no locks, no side effects, so they are
// unit-tested alone.
//
// Thread-safety: implementations are immutable; Choose may be called from
// any thread.
#ifndef STENSOR_POLICY_EVICTION_POLICY_H_
#define STENSOR_POLICY_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace stensor {

// Where a buffer's current contents live (S03).
enum class Location : uint8_t {
  kGpuOnly,  // on the device only
  kCpuOnly,  // swapped out: the host copy is the only one
  kCpuGpu,   // a copy on each side (the host one may be stale: see versions)
};

// What a policy sees of one resident, evictable buffer.
struct EvictionCandidate {
  uint64_t id = 0;
  uint64_t bytes = 0;       // device memory freed by evicting it
  Location location = Location::kGpuOnly;
  uint64_t gpu_version = 0;   // logical time of the last write on the device
  uint64_t host_version = 0;  // logical time the host copy was taken
  uint64_t last_use = 0;      // logical time of the last access; smaller = older
  // True when the host copy exists and is current: dropping the device copy
  // costs no transfer.
  bool clean() const {
    return location == Location::kCpuGpu && host_version == gpu_version;
  }
};

struct Eviction {
  uint64_t id = 0;
  bool copy = true;  // false: drop the device copy, the host copy is current
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;

  // Picks buffers to evict, in the order to evict them, whose bytes add up
  // to at least `needed` (all candidates when they do not suffice). Every
  // returned id is one of the candidates; none twice.
  virtual std::vector<Eviction> Choose(
      absl::Span<const EvictionCandidate> candidates,
      uint64_t needed) const = 0;
};

// Least recently used first, always copying to the host: what swapping
// without version control does (the baseline).
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

// Clean buffers first (least recently used among them; no transfer), then
// the rest least recently used first, copying only what is dirty.
std::unique_ptr<EvictionPolicy> MakeVersionPolicy();

}  // namespace stensor

#endif  // STENSOR_POLICY_EVICTION_POLICY_H_
