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
  // Needed again only as far off as buffers the cap forced out within the
  // last iteration (an optimizer's moments, read and written once a step):
  // brought in, it would be forced out before then too, and copied out if
  // written, while serving moves its bytes once a use and leaves the room
  // to what is needed sooner. Even where it fits now.
  if (facts.predicted && !facts.overwritten && facts.period != 0 && facts.now != 0 &&
      facts.next_use > facts.now && facts.next_use < EvictionCandidate::kInSequence &&
      order.policy().RanksByNextUse() &&
      order.ForcedOutWithin(facts.next_use - facts.now,
                            facts.now > facts.period ? facts.now - facts.period : 0)) {
    return Reach::kServeByChoice;
  }
  // Mapped to its host copy as it is, should the kernel reach it after all:
  // fetching it would move bytes nobody reads.
  if (facts.far) return Reach::kServeFar;
  return Reach::kFetch;
}

}  // namespace stensor
