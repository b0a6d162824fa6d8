#include "policy/apply_plan.h"

#include "absl/container/inlined_vector.h"

namespace stensor {

PlanApplied ApplyPlan(absl::Span<const PlannedAction> actions, PlanSteps& steps) {
  PlanApplied applied;
  // Pieces of allocations the planner evicts, not yet evicted.
  absl::InlinedVector<EvictionState*, 16> deferred;
  for (const PlannedAction& a : actions) {
    bool pieces = false;
    const std::vector<EvictionState*> named = steps.Named(a.id, &pieces);
    if (named.empty()) {
      if (a.kind == PlannedAction::Kind::kFetch) steps.Cancel(a.id);
      continue;
    }
    if (a.kind == PlannedAction::Kind::kEvict) {
      if (!steps.CarriesOutEvictions()) continue;
      if (pieces) {
        for (EvictionState* b : named) {
          if (steps.Resident(*b)) deferred.push_back(b);
        }
      } else if (steps.Resident(*named.front())) {
        steps.Evict(*named.front());
      }
      continue;
    }
    uint64_t missing = 0;
    for (const EvictionState* b : named) {
      if (!steps.Resident(*b)) missing += b->reserved;
    }
    // Of the allocations evicted for it, only the pieces its room needs.
    for (size_t i = 0; i < deferred.size() && missing > 0 && !steps.Fits(missing); ++i) {
      if (steps.Resident(*deferred[i])) steps.Evict(*deferred[i]);
    }
    deferred.clear();
    bool fetched = false;
    bool refused = missing == 0 || !steps.Fits(missing);
    for (EvictionState* b : named) {
      if (refused) break;
      if (!steps.NeedsFetch(*b)) continue;
      if (steps.Fetch(*b)) {
        fetched = true;
      } else {
        refused = true;
      }
    }
    if (refused && !fetched) {
      ++applied.fetches_refused;
      steps.Cancel(a.id);
      continue;
    }
    ++applied.fetches_issued;
  }
  // Room for what comes due later: whole.
  for (EvictionState* b : deferred) {
    if (steps.Resident(*b)) steps.Evict(*b);
  }
  return applied;
}

}  // namespace stensor
