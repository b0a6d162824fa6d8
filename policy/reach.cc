#include "policy/reach.h"

namespace stensor {

Reach ChooseReach(const ReachFacts& facts, EvictionOrder& order,
                  const EvictionOrder::Filter& filter) {
  if (!facts.servable) return Reach::kFetch;
  // Brought in, it would go again before its next use and push out one
  // needed sooner: it moves its bytes once, over the link.
  if (facts.predicted && !facts.overwritten && !facts.fits) {
    const EvictionState* victim = order.Victim(filter);
    if (victim != nullptr && order.ServeRatherThanFetch(facts.next_use, *victim)) {
      return Reach::kServeByChoice;
    }
  }
  // Mapped to its host copy as it is, should the kernel reach it after all:
  // fetching it would move bytes nobody reads.
  if (facts.far) return Reach::kServeFar;
  return Reach::kFetch;
}

}  // namespace stensor
