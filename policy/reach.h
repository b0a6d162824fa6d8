// ChooseReach: how an operation reaches a buffer it names that is swapped
// out, for the memory manager (PrepareOnce) and `stensor sim` alike: swapped
// in before it runs, or served from the host copy mapped at its address
// (zero-copy over the link) where bringing it in would cost more than it
// saves.
//
// Thread-safety: none of its own (it reads the caller's EvictionOrder).
#ifndef STENSOR_POLICY_REACH_H_
#define STENSOR_POLICY_REACH_H_

#include <cstdint>

#include "policy/eviction_order.h"

namespace stensor {

enum class Reach {
  kFetch,          // swapped in (served after all if no room can be made)
  kServeByChoice,  // brought in, it would displace one needed no later, or
                   // one never needed again whose copy out moves more, or
                   // be forced out again before its next use
  kServeFar,       // a piece no pointer of the launch likely reaches
};

// What the choice reads of the buffer and the operation.
struct ReachFacts {
  // It may be served: its host copy is at its address and the operation
  // may be served now.
  bool servable = false;
  bool overwritten = false;  // the operation overwrites it whole: fetched without a copy
  // Its next use after the operation is known (the operation was shown to
  // the planner before its swap-ins).
  bool predicted = false;
  uint64_t next_use = EvictionCandidate::kNoNextUse;
  uint64_t bytes = 0;  // its device charge: what fetching it, or serving one use, moves
  bool fits = false;   // room for it under the cap without displacing anything
  bool far = false;    // a piece of a segment no pointer of the launch likely reaches
  // The predictor's time now and the iteration's length in its operations
  // (0: none known): with both, what the cap forced out within the last
  // iteration tells whether it would stay until its next use.
  uint64_t now = 0;
  uint64_t period = 0;
};

// `order` and `filter` give the buffer its room would displace first.
Reach ChooseReach(const ReachFacts& facts, EvictionOrder& order,
                  const EvictionOrder::Filter& filter);

}  // namespace stensor

#endif  // STENSOR_POLICY_REACH_H_
