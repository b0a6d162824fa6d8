// EvictionPolicy: which resident buffers to take off the GPU when room is
// needed (step S405 of the method, and for `version` also S403). Policies
// decide over metadata only: no CUDA, no locks, no side effects, so they are
// unit-tested alone.
//
// A policy is an order: Key() ranks one candidate (smaller evicts first)
// from fields that change only when the buffer is used, written, copied to
// the host or given a new predicted next use, so a caller can keep its
// resident buffers in an ordered index and take the first in O(log n)
// instead of sorting them all at every eviction. Choose() is the same order
// over a list (tests, the simulator).
//
// Thread-safety: implementations are immutable; every method may be called
// from any thread.
#ifndef STENSOR_POLICY_EVICTION_POLICY_H_
#define STENSOR_POLICY_EVICTION_POLICY_H_

#include <array>
#include <cstdint>
#include <limits>
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
  uint64_t bytes = 0;  // device memory freed by evicting it
  Location location = Location::kGpuOnly;
  uint64_t gpu_version = 0;   // logical time of the last write on the device
  uint64_t host_version = 0;  // logical time the host copy was taken
  uint64_t last_use = 0;      // logical time of the last access; smaller = older
  // Predicted logical time of the next access (from the profiled
  // iteration), kNoNextUse when nothing predicts one. Only `belady` reads it.
  uint64_t next_use = kNoNextUse;
  static constexpr uint64_t kNoNextUse = std::numeric_limits<uint64_t>::max();
  // next_use from kInSequence up (kNoNextUse excepted) is not a time:
  // nothing predicts when the buffer is used next, but it was first used in
  // a burst of operations of one kind on fresh buffers and not used since (a
  // dataset written shard by shard, a stack of same-shaped layers
  // initialised). Such buffers are read in the order they were written, so
  // the one written last is needed last. The value is kInSequence + the
  // logical time of that first use. Logical times stay below 2^63.
  static constexpr uint64_t kInSequence = uint64_t{1} << 63;
  // Whether next_use is a predicted time (not unknown, not a sequence rank).
  bool next_use_is_time() const { return next_use < kInSequence; }
  // True when the host copy exists and is current: dropping the device copy
  // costs no transfer.
  bool clean() const { return location == Location::kCpuGpu && host_version == gpu_version; }
};

// Rank of a candidate: compared lexicographically, smaller evicts first. A
// caller breaks ties by id.
using EvictionKey = std::array<uint64_t, 3>;

struct Eviction {
  uint64_t id = 0;
  bool copy = true;  // false: drop the device copy, the host copy is current
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;

  // Where `c` stands in eviction order (smaller goes first).
  virtual EvictionKey Key(const EvictionCandidate& c) const = 0;
  // Whether evicting `c` copies it to the host: false when its device copy
  // may simply be dropped (S403; never under `lru`, which has no version
  // control).
  virtual bool Copies(const EvictionCandidate& c) const = 0;

  // Whether the order ranks by predicted next uses (EvictionCandidate::
  // next_use): only then do other choices weigh them (EvictionOrder's sizes,
  // ChooseReach).
  virtual bool RanksByNextUse() const { return false; }
  // Where the device can reach a swapped-out buffer in host memory (served
  // at its address, over the link): whether an operation should be served
  // the buffer rather than have it brought in, when its room would displace
  // `displaced` (the first in this policy's order). `next_use` is the
  // buffer's predicted next use after this operation's. A buffer fetched
  // only to be evicted before its next use moves its bytes in (and, when
  // written, out again) where serving moves them once, and displaces one
  // that was needed no later (needed at the same time, one of the two is
  // missing then all the same): belady with bypass. False unless the
  // policy predicts next uses.
  virtual bool ServeRatherThanFetch(uint64_t next_use, const EvictionCandidate& displaced) const {
    (void)next_use;
    (void)displaced;
    return false;
  }
  // Picks buffers to evict, in the order to evict them, whose bytes add up
  // to at least `needed` (all candidates when they do not suffice). Every
  // returned id is one of the candidates; none twice.
  virtual std::vector<Eviction> Choose(absl::Span<const EvictionCandidate> candidates,
                                       uint64_t needed) const = 0;
};

// Takes candidates in Key order (ties by id) until their bytes cover
// `needed`: what every policy's Choose does.
std::vector<Eviction> ChooseInKeyOrder(const EvictionPolicy& policy,
                                       absl::Span<const EvictionCandidate> candidates,
                                       uint64_t needed);

// Least recently used first, always copying to the host: what swapping
// without version control does (the baseline).
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

// Clean buffers first (least recently used among them; no transfer), then
// the rest least recently used first, copying only what is dirty.
std::unique_ptr<EvictionPolicy> MakeVersionPolicy();

// Belady's rule on the predicted future: the farthest next_use first
// (kNoNextUse farthest of all), clean before dirty at equal distance (no
// transfer), then least recently used; copies only what is dirty. Buffers
// with no predicted time but a place in a sequence (kInSequence) go before
// all others, the last written first: an LRU order would evict first the
// shard of a cyclic dataset that is read first.
// next_use comes from NextUsePredictor (policy/next_use.h). Serves rather
// than fetches a buffer whose next use is predicted later than the
// displaced one's (both predicted times).
std::unique_ptr<EvictionPolicy> MakeBeladyPolicy();

}  // namespace stensor

#endif  // STENSOR_POLICY_EVICTION_POLICY_H_
