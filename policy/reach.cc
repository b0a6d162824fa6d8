#include "policy/reach.h"

namespace stensor {

Reach ChooseReach(const ReachFacts& facts, EvictionOrder& order,
                  const EvictionOrder::Filter& filter) {
  if (!facts.servable) return Reach::kFetch;
  // Brought in, it would go again before its next use and push out one
  // needed no later: it moves its bytes once, over the link.
  if (facts.predicted && !facts.overwritten && !facts.fits) {
    const EvictionState* victim = order.Victim(filter);
    if (victim != nullptr && order.ServeRatherThanFetch(facts.next_use, *victim)) {
      return Reach::kServeByChoice;
    }
    // The one to go is never used again (a gradient the optimizer has read,
    // to be freed) but dirty: its room costs a copy out of all its bytes,
    // while serving moves this buffer's once. Between predicted times only,
    // as above: before a profile, nothing is known to be done with.
    if (victim != nullptr && order.policy().RanksByNextUse() &&
        facts.next_use < EvictionCandidate::kInSequence &&
        victim->next_use == EvictionCandidate::kNoNextUse && order.Copies(*victim) &&
        victim->reserved > facts.bytes) {
      return Reach::kServeByChoice;
    }
  }
  // Mapped to its host copy as it is, should the kernel reach it after all:
  // fetching it would move bytes nobody reads.
  if (facts.far) return Reach::kServeFar;
  return Reach::kFetch;
}

}  // namespace stensor
