#include "policy/make_room.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

// Steps that record what was asked of them and make room as scripted.
class ScriptedSteps : public RoomSteps {
 public:
  bool Fits() override {
    log.push_back("fits");
    return used <= cap;
  }
  Outcome Reclaim() override {
    log.push_back("reclaim");
    return Take(&reclaimable) ? Outcome::kProgress : Outcome::kNothing;
  }
  bool DropOneClean(bool spend) override {
    log.push_back(spend ? "drop+fetched" : "drop");
    return Take(spend ? &fetched_clean : &clean);
  }
  bool ReleaseGarbage() override {
    log.push_back("garbage");
    return Take(&garbage);
  }
  bool EvictByPolicy(bool spend) override {
    log.push_back(spend ? "evict+fetched" : "evict");
    return Take(spend ? &fetched_dirty : &dirty);
  }
  bool MayTakePrefetched() override {
    log.push_back("may-take-fetched");
    return may_take_fetched;
  }
  Outcome LastResort() override {
    log.push_back("last");
    if (stop_last) return Outcome::kStop;
    return Take(&last) ? Outcome::kProgress : Outcome::kNothing;
  }

  int used = 0, cap = 0;
  int reclaimable = 0, clean = 0, garbage = 0, dirty = 0, fetched_clean = 0, fetched_dirty = 0,
      last = 0;
  bool may_take_fetched = true, stop_last = false;
  std::vector<std::string> log;

 private:
  // One unit of room from `pool`, if it has any.
  bool Take(int* pool) {
    if (*pool == 0) return false;
    --*pool;
    --used;
    return true;
  }
};

using Log = std::vector<std::string>;

TEST(MakeRoomLoopTest, FitsWithoutAStep) {
  ScriptedSteps s;
  s.used = 1;
  s.cap = 1;
  EXPECT_EQ(MakeRoomLoop(s, true), RoomResult::kFits);
  EXPECT_EQ(s.log, Log({"fits"}));
}

// S403 before S404 before S405, each look starting from the top; what was
// fetched ahead of use last.
TEST(MakeRoomLoopTest, TakesTheCheapestRoomFirstAndLooksAgainAfterEach) {
  ScriptedSteps s;
  s.used = 5;
  s.cap = 0;
  s.reclaimable = s.clean = s.garbage = s.dirty = s.fetched_clean = 1;
  EXPECT_EQ(MakeRoomLoop(s, true), RoomResult::kFits);
  EXPECT_EQ(s.log, Log({"fits",
                        "reclaim",  //
                        "fits",
                        "reclaim",
                        "drop",  //
                        "fits",
                        "reclaim",
                        "drop",
                        "garbage",  //
                        "fits",
                        "reclaim",
                        "drop",
                        "garbage",
                        "evict",  //
                        "fits",
                        "reclaim",
                        "drop",
                        "garbage",
                        "evict",  //
                        "may-take-fetched",
                        "drop+fetched",
                        "fits"}));
}

TEST(MakeRoomLoopTest, WithoutVersionRulesNothingIsDropped) {
  ScriptedSteps s;
  s.used = 2;
  s.cap = 0;
  s.clean = s.fetched_clean = 5;
  s.dirty = s.fetched_dirty = 1;
  EXPECT_EQ(MakeRoomLoop(s, false), RoomResult::kFits);
  EXPECT_EQ(s.clean, 5);
  EXPECT_EQ(s.fetched_clean, 5);
  EXPECT_EQ(s.log.back(), "fits");
  EXPECT_EQ(s.fetched_dirty, 0);
}

TEST(MakeRoomLoopTest, StopsWhereAStepSaysSo) {
  ScriptedSteps s;
  s.used = 3;
  s.cap = 0;
  s.fetched_dirty = 5;
  s.may_take_fetched = false;
  EXPECT_EQ(MakeRoomLoop(s, true), RoomResult::kStopped);
  EXPECT_EQ(s.fetched_dirty, 5);
  s.may_take_fetched = true;
  s.fetched_dirty = 0;
  s.stop_last = true;
  EXPECT_EQ(MakeRoomLoop(s, true), RoomResult::kStopped);
}

TEST(MakeRoomLoopTest, LastResortsAreTriedLastThenNoRoom) {
  ScriptedSteps s;
  s.used = 3;
  s.cap = 0;
  s.last = 2;
  EXPECT_EQ(MakeRoomLoop(s, true), RoomResult::kNoRoom);
  EXPECT_EQ(s.used, 1);
  EXPECT_EQ(s.log.back(), "last");
}

}  // namespace
}  // namespace stensor
