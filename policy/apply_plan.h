// ApplyPlan: carries out the prefetch planner's actions after an operation
// (S02's planned evictions and fetches), for the memory manager and `stensor
// sim` alike. The planner plans allocations; an allocation held in pieces
// is evicted only as far as the fetch it makes room for needs (the planner's
// last victim for a fetch is often larger than the room missing), and the
// rest of it after the last fetch (room for what comes due later). A fetch
// goes only into memory that is free once the planner's evictions are done:
// it never evicts what the planner did not choose.
//
// Thread-safety: as the steps given; ApplyPlan keeps no state.
#ifndef STENSOR_POLICY_APPLY_PLAN_H_
#define STENSOR_POLICY_APPLY_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "policy/eviction_order.h"
#include "policy/prefetch_planner.h"

namespace stensor {

// What carrying out a plan does to the buffers, supplied by the library
// (copies on its streams) and by the simulator (counted and modelled).
class PlanSteps {
 public:
  virtual ~PlanSteps() = default;

  // The buffers the planner's `id` names now, in address order: a buffer,
  // or an allocation's pieces (then `*pieces` is true). Empty when none may
  // move (freed, or never swapped).
  virtual std::vector<EvictionState*> Named(uint64_t id, bool* pieces) = 0;
  virtual bool Resident(const EvictionState& b) = 0;
  // Whether fetching `b` brings data in: not resident, or (the library's
  // case) resident without its data.
  virtual bool NeedsFetch(const EvictionState& b) { return !Resident(b); }
  // Whether `missing` more bytes fit under the cap now, evicting nothing.
  virtual bool Fits(uint64_t missing) = 0;
  // A planned eviction of a resident buffer, queued behind its last use;
  // one that cannot go now stays.
  virtual void Evict(EvictionState& b) = 0;
  // Brings `b` in ahead of its use; false when it could not.
  virtual bool Fetch(EvictionState& b) = 0;
  // A fetch not issued (nothing to move, no room, or none brought in),
  // handed back to the planner (IterationPlanner::CancelFetch).
  virtual void Cancel(uint64_t id) = 0;
  // Whether the planner's evictions are carried out (`stensor sim
  // --planned-evictions off`: fetches go only into free memory).
  virtual bool CarriesOutEvictions() { return true; }
};

struct PlanApplied {
  uint64_t fetches_issued = 0;   // with at least one buffer brought in
  uint64_t fetches_refused = 0;  // of buffers that may move: no room, or none brought in
};

PlanApplied ApplyPlan(absl::Span<const PlannedAction> actions, PlanSteps& steps);

}  // namespace stensor

#endif  // STENSOR_POLICY_APPLY_PLAN_H_
