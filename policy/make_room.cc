#include "policy/make_room.h"

namespace stensor {

RoomResult MakeRoomLoop(RoomSteps& steps, bool version_rules) {
  using Outcome = RoomSteps::Outcome;
  // The first step that makes progress starts the next look; a step that
  // stops ends the search.
  auto done = [](Outcome o) { return o != Outcome::kNothing; };
  for (;;) {
    if (steps.Fits()) return RoomResult::kFits;  // S401/S402
    if (Outcome o = steps.Reclaim(); done(o)) {
      if (o == Outcome::kStop) return RoomResult::kStopped;
      continue;
    }
    if (version_rules && steps.DropOneClean(/*spend_prefetched=*/false)) continue;  // S403
    if (steps.ReleaseGarbage()) continue;                                           // S404
    if (steps.EvictByPolicy(/*spend_prefetched=*/false)) continue;                  // S405
    // Last, what was fetched ahead of its use: taken before, prefetching
    // would only feed the next eviction.
    if (!steps.MayTakePrefetched()) return RoomResult::kStopped;
    if ((version_rules && steps.DropOneClean(/*spend_prefetched=*/true)) ||
        steps.EvictByPolicy(/*spend_prefetched=*/true)) {
      continue;
    }
    if (Outcome o = steps.LastResort(); done(o)) {
      if (o == Outcome::kStop) return RoomResult::kStopped;
      continue;
    }
    return RoomResult::kNoRoom;
  }
}

}  // namespace stensor
