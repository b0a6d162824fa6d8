#include "policy/apply_plan.h"

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

constexpr uint64_t kGranule = 2 << 20;

// Buffers and allocations in pieces over a cap, with what was done to them.
class Steps : public PlanSteps {
 public:
  // A buffer (one piece) or an allocation of `pieces` pieces, resident.
  void Add(uint64_t id, int pieces, bool resident = true) {
    std::vector<EvictionState*>& named = named_[id];
    for (int i = 0; i < pieces; ++i) {
      EvictionState& b = all_.emplace_back();
      b.id = id * 100 + i;
      b.reserved = kGranule;
      named.push_back(&b);
      if (resident) {
        resident_[&b] = true;
        used += kGranule;
      }
    }
    if (pieces > 1) grouped_[id] = true;
  }
  EvictionState& Piece(uint64_t id, int i) { return *named_.at(id).at(i); }

  std::vector<EvictionState*> Named(uint64_t id, bool* pieces) override {
    auto it = named_.find(id);
    if (it == named_.end()) return {};
    *pieces = grouped_.count(id) != 0;
    return it->second;
  }
  bool Resident(const EvictionState& b) override {
    auto it = resident_.find(&b);
    return it != resident_.end() && it->second;
  }
  bool Fits(uint64_t missing) override { return used + missing <= cap; }
  void Evict(EvictionState& b) override {
    resident_[&b] = false;
    used -= kGranule;
    log.push_back("evict " + std::to_string(b.id));
  }
  bool Fetch(EvictionState& b) override {
    if (fail_fetch == b.id) return false;
    resident_[&b] = true;
    used += kGranule;
    log.push_back("fetch " + std::to_string(b.id));
    return true;
  }
  void Cancel(uint64_t id) override { log.push_back("cancel " + std::to_string(id)); }
  bool CarriesOutEvictions() override { return evictions; }

  uint64_t used = 0, cap = 0;
  uint64_t fail_fetch = ~uint64_t{0};
  bool evictions = true;
  std::vector<std::string> log;

 private:
  std::deque<EvictionState> all_;
  std::map<uint64_t, std::vector<EvictionState*>> named_;
  std::map<uint64_t, bool> grouped_;
  std::map<const EvictionState*, bool> resident_;
};

using Log = std::vector<std::string>;

PlannedAction Evict(uint64_t id) { return {PlannedAction::Kind::kEvict, id, true}; }
PlannedAction Fetch(uint64_t id) { return {PlannedAction::Kind::kFetch, id, false}; }

// An allocation in pieces the planner evicts gives the fetch after it only
// the pieces its room needs, and the rest stays; evicted after the last
// fetch (room for what comes due later), it goes whole.
TEST(ApplyPlanTest, PiecesGoAsFarAsTheNextFetchNeeds) {
  Steps s;
  s.Add(1, 3);  // resident, three pieces
  s.Add(2, 1, false);
  s.Add(3, 2);
  s.cap = 5 * kGranule;
  PlanApplied applied = ApplyPlan({Evict(1), Fetch(2), Evict(3)}, s);
  EXPECT_EQ(s.log, Log({"evict 100", "fetch 200", "evict 300", "evict 301"}));
  EXPECT_EQ(applied.fetches_issued, 1u);
  EXPECT_EQ(applied.fetches_refused, 0u);
}

TEST(ApplyPlanTest, AWholeBufferGoesAtOnce) {
  Steps s;
  s.Add(1, 1);
  s.Add(2, 1, false);
  s.cap = kGranule;
  ApplyPlan({Evict(1), Fetch(2)}, s);
  EXPECT_EQ(s.log, Log({"evict 100", "fetch 200"}));
}

// A fetch never evicts what the planner did not choose: without room it is
// refused and handed back; so is one naming nothing that may move, or
// nothing missing.
TEST(ApplyPlanTest, RefusesWhatDoesNotFitOrNeedsNothing) {
  Steps s;
  s.Add(1, 1);
  s.Add(2, 1, false);
  s.cap = kGranule;
  PlanApplied applied = ApplyPlan({Fetch(2), Fetch(1), Fetch(9)}, s);
  EXPECT_EQ(s.log, Log({"cancel 2", "cancel 1", "cancel 9"}));
  EXPECT_EQ(applied.fetches_issued, 0u);
  EXPECT_EQ(applied.fetches_refused, 2u);  // the unknown one is not a refusal
}

// A fetch whose first piece could not be brought in brings in none of the
// rest; one that brought some in counts as issued.
TEST(ApplyPlanTest, AFailedFetchStopsThere) {
  Steps s;
  s.Add(1, 2, false);
  s.Add(2, 2, false);
  s.cap = 8 * kGranule;
  s.fail_fetch = 100;
  PlanApplied applied = ApplyPlan({Fetch(1)}, s);
  EXPECT_EQ(s.log, Log({"cancel 1"}));
  EXPECT_EQ(applied.fetches_refused, 1u);
  s.log.clear();
  s.fail_fetch = 201;
  applied = ApplyPlan({Fetch(2)}, s);
  EXPECT_EQ(s.log, Log({"fetch 200"}));
  EXPECT_EQ(applied.fetches_issued, 1u);
}

TEST(ApplyPlanTest, WithoutPlannedEvictionsFetchesOnlyIntoFreeMemory) {
  Steps s;
  s.Add(1, 1);
  s.Add(2, 1, false);
  s.cap = kGranule;
  s.evictions = false;
  ApplyPlan({Evict(1), Fetch(2)}, s);
  EXPECT_EQ(s.log, Log({"cancel 2"}));
}

}  // namespace
}  // namespace stensor
