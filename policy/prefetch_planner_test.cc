#include "policy/prefetch_planner.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "policy/access_profile.h"
#include "policy/eviction_policy.h"

namespace stensor {
namespace {

using Kind = PlannedAction::Kind;
constexpr uint64_t kNone = EvictionCandidate::kNoNextUse;
constexpr uint64_t kMB = 1000 * 1000;

}  // namespace

// Readable failure messages.
void PrintTo(const PlannedAction& a, std::ostream* os) {
  *os << (a.kind == PlannedAction::Kind::kFetch ? "Fetch(" : "Evict(") << a.id
      << (a.kind == PlannedAction::Kind::kEvict ? (a.copy ? ", copy)" : ", drop)") : ")");
}

namespace {

PlannedAction Fetch(uint64_t id) { return {Kind::kFetch, id, false}; }
PlannedAction Evict(uint64_t id, bool copy) { return {Kind::kEvict, id, copy}; }

// `ops` operations of `ms` milliseconds each, on a 1 GB/s link both ways
// (1 MB takes 1 ms).
std::shared_ptr<const AccessProfile> Profile(size_t ops, double ms) {
  AccessProfile::Builder b;
  for (size_t i = 0; i < ops; ++i) {
    b.Add(i, {});
    EXPECT_TRUE(b.SetComputeSeconds(i, ms * 1e-3).ok());
  }
  auto p = std::move(b).Build({1e9, 1e9});
  EXPECT_TRUE(p.ok());
  return std::make_shared<const AccessProfile>(*std::move(p));
}

// `ops` operations of 1 ms each, on a 1 GB/s link, touching buffer 1
// (1 MB) at `phases` only, written when `write`.
std::shared_ptr<const AccessProfile> ProfileTouching(size_t ops, std::vector<size_t> phases,
                                                     bool write) {
  AccessProfile::Builder b;
  for (size_t i = 0; i < ops; ++i) {
    if (std::find(phases.begin(), phases.end(), i) != phases.end()) {
      b.Add(i, {{1, kMB, write}});
    } else {
      b.Add(i, {});
    }
    EXPECT_TRUE(b.SetComputeSeconds(i, 1e-3).ok());
  }
  auto p = std::move(b).Build({1e9, 1e9});
  EXPECT_TRUE(p.ok());
  return std::make_shared<const AccessProfile>(*std::move(p));
}

// A buffer used once at `time` and then swapped out.
void SwappedOut(PrefetchPlanner& p, uint64_t id, uint64_t bytes, uint64_t time, uint64_t next_use) {
  p.OnUse(id, bytes, time, next_use, /*write=*/true);
  p.OnEvicted(id);
}

TEST(PrefetchPlannerTest, NothingWithoutAProfile) {
  PrefetchPlanner p;
  SwappedOut(p, 1, kMB, 0, 5);
  EXPECT_TRUE(p.Plan(1, 100 * kMB, 0).empty());
  EXPECT_TRUE(p.Plan(4, 100 * kMB, 0).empty());
  EXPECT_EQ(p.stats().fetches, 0u);
  // And again after the profile is withdrawn (a changed pattern).
  p.SetProfile(Profile(10, 1), 0);
  p.SetProfile(nullptr, 0);
  EXPECT_TRUE(p.Plan(4, 100 * kMB, 0).empty());
}

// Full memory: the fetch of a 3 ms buffer due at 108 is issued at the last
// operation that still leaves 3 ms of compute (1 ms per op) before the use,
// never later, and not needlessly early, after evicting a buffer needed
// later to make room.
TEST(PrefetchPlannerTest, FetchIsIssuedAtLeastItsTransferTimeAhead) {
  for (double queued_ms : {0.0, 2.0}) {
    SCOPED_TRACE(queued_ms);
    PrefetchPlanner p;
    auto profile = Profile(20, 1.0);
    p.SetProfile(profile, 100);
    SwappedOut(p, 1, 3 * kMB, 90, 108);
    p.OnUse(2, 3 * kMB, 99, kNone, /*write=*/true);  // resident, not needed
    uint64_t issued = 0;
    for (uint64_t now = 100; now < 108 && issued == 0; ++now) {
      const auto actions = p.Plan(now, /*free=*/0, queued_ms * 1e-3);
      if (actions.empty()) continue;
      EXPECT_EQ(actions, (std::vector<PlannedAction>{Evict(2, true), Fetch(1)}));
      issued = now;
    }
    ASSERT_NE(issued, 0u);
    const double ahead = profile->ComputeBetweenTimes(100, issued, 108);
    EXPECT_GE(ahead, 3e-3 + queued_ms * 1e-3 - 1e-12);
    // One op later would have been too late.
    EXPECT_LT(profile->ComputeBetweenTimes(100, issued + 1, 108), 3e-3 + queued_ms * 1e-3);
    EXPECT_EQ(p.stats().fetches, 1u);
    EXPECT_EQ(p.stats().fetch_evictions, 1u);
  }
}

// The planner models the link itself: a write-back queued at 104 (4 ms)
// is ahead of the fetch of a 3 ms buffer due at 110, so the fetch goes at
// 104 (7 ms needed, 5 left), not at 107 as with an empty link, though the
// caller reports no queue.
TEST(PrefetchPlannerTest, WriteBacksQueueOnTheModelledLink) {
  PrefetchPlanner p(PrefetchPlanner::Options{.early_factor = 1.0});
  p.SetProfile(Profile(20, 1.0), 100);
  SwappedOut(p, 1, 3 * kMB, 90, 110);
  for (uint64_t now = 100; now < 104; ++now) {
    EXPECT_TRUE(p.Plan(now, 100 * kMB, 0).empty()) << now;
  }
  p.OnUse(2, 4 * kMB, 104, kNone, /*write=*/true);
  p.OnEvicted(2);  // dirty: written back
  EXPECT_EQ(p.Plan(104, 100 * kMB, 0), (std::vector<PlannedAction>{Fetch(1)}));
}

// A fetch's copy stays on the modelled link across plans: a 6 ms buffer
// due at 113 goes at 107; at 108, 5 ms of it are left ahead of a 1 ms
// buffer due at 110, which then goes at once rather than at 109 (the last
// operation that leaves it 1 ms on an empty link).
TEST(PrefetchPlannerTest, FetchesStayQueuedAcrossPlans) {
  PrefetchPlanner p(PrefetchPlanner::Options{.early_factor = 1.0});
  p.SetProfile(Profile(20, 1.0), 100);
  SwappedOut(p, 1, 6 * kMB, 90, 113);
  SwappedOut(p, 2, 1 * kMB, 90, 110);
  std::vector<uint64_t> when(3, 0);
  for (uint64_t now = 100; now < 110; ++now) {
    for (const PlannedAction& a : p.Plan(now, 100 * kMB, 0)) {
      ASSERT_EQ(a.kind, Kind::kFetch);
      when[a.id] = now;
      p.OnResident(a.id);
    }
  }
  EXPECT_EQ(when[1], 107u);  // 5 ms of compute left before 113 after it
  EXPECT_EQ(when[2], 108u);
}

// With free memory a fetch may start early_factor (2) times its lead ahead:
// a 1 ms buffer due at 15 goes at 13 (2 ms of compute before it), not
// before, and only where it leaves the reserve free.
TEST(PrefetchPlannerTest, FetchesEarlyWhileMemoryIsFree) {
  PrefetchPlanner p(PrefetchPlanner::Options{.free_reserve_bytes = 2 * kMB});
  p.SetProfile(Profile(20, 1.0), 0);
  SwappedOut(p, 1, kMB, 0, 15);
  SwappedOut(p, 2, kMB, 0, 25);
  for (uint64_t now = 1; now < 13; ++now) {
    EXPECT_TRUE(p.Plan(now, 100 * kMB, 0).empty()) << now;
  }
  EXPECT_TRUE(p.Plan(13, 2 * kMB, 0).empty());  // all of it is reserve
  EXPECT_EQ(p.Plan(13, 3 * kMB, 0), (std::vector<PlannedAction>{Fetch(1)}));
  p.OnResident(1);
  EXPECT_TRUE(p.Plan(14, 3 * kMB, 0).empty());  // 2 is not due yet
  p.OnUse(1, kMB, 15, kNone, false);
  EXPECT_EQ(p.stats().fetch_hits, 1u);
  EXPECT_EQ(p.stats().on_demand, 0u);
  // Urgent, the reserve does not hold it back.
  EXPECT_EQ(p.Plan(24, 1 * kMB, 0), (std::vector<PlannedAction>{Fetch(2)}));
}

// Buffer 1, used once an iteration (of 20 operations, at phase 15), is due
// at 15 with memory free. Had the cap forced out, within the last
// iteration, a buffer needed again no farther off than 20 operations, the
// use at 15 would serve buffer 1 (ChooseReach) rather than bring it in to be
// forced out again: no fetch, no room made. Forced evictions of buffers
// needed sooner than that, older than an iteration, or none at all leave
// the fetch as it was.
TEST(PrefetchPlannerTest, LeavesToItsUseWhatTheCapWouldForceOutAgain) {
  const auto profile = ProfileTouching(20, {15}, /*write=*/true);
  struct Case {
    const char* what;
    uint64_t time, distance;  // of a forced eviction (distance 0: none)
    bool fetched;
  };
  for (const Case& c : {Case{"none", 0, 0, true}, Case{"needed as far off", 2, 20, false},
                        Case{"needed sooner", 2, 8, false}, Case{"needed farther", 2, 25, true}}) {
    SCOPED_TRACE(c.what);
    PrefetchPlanner p;
    p.SetProfile(profile, 0);
    SwappedOut(p, 1, kMB, 0, 15);
    ForcedOutLog forced;
    if (c.distance != 0) forced.Note(c.time, c.distance);
    std::vector<PlannedAction> all;
    for (uint64_t now = 1; now < 15; ++now) {
      for (const PlannedAction& a : p.Plan(now, 100 * kMB, 0, &forced)) all.push_back(a);
    }
    EXPECT_EQ(all, c.fetched ? std::vector<PlannedAction>{Fetch(1)} : std::vector<PlannedAction>{});
    EXPECT_EQ(p.stats().left_to_use > 0, !c.fetched);
  }
  // A forced eviction more than an iteration before the use says nothing
  // of it: the use at 35, an iteration later, is fetched.
  PrefetchPlanner p;
  p.SetProfile(profile, 0);
  SwappedOut(p, 1, kMB, 10, 35);
  ForcedOutLog forced;
  forced.Note(12, 20);
  std::vector<PlannedAction> all;
  for (uint64_t now = 21; now < 35; ++now) {
    for (const PlannedAction& a : p.Plan(now, 100 * kMB, 0, &forced)) all.push_back(a);
  }
  EXPECT_EQ(all, std::vector<PlannedAction>{Fetch(1)});
}

// Buffer 1 is used at phases 5 and 15 of a 20-operation iteration. Under a
// next-use policy (a ForcedOutLog given), the use at 5 serves it rather than
// bring it in over a buffer needed before 15 (ChooseReach): no such buffer
// makes its room. Without one, the policy's order does not serve, and a
// buffer needed after 5 does.
TEST(PrefetchPlannerTest, NoRoomFromWhatItsUseWouldServeItRatherThanDisplace) {
  const auto profile = ProfileTouching(20, {5, 15}, /*write=*/false);
  struct Case {
    uint64_t victim_next;
    bool next_use_policy;
    std::vector<PlannedAction> plan;
  };
  for (const Case& c : {Case{12, true, {}}, Case{12, false, {Evict(2, true), Fetch(1)}},
                        Case{18, true, {Evict(2, true), Fetch(1)}}}) {
    SCOPED_TRACE(testing::Message()
                 << "victim next " << c.victim_next << ", next-use policy " << c.next_use_policy);
    PrefetchPlanner p;
    p.SetProfile(profile, 0);
    SwappedOut(p, 1, kMB, 0, 5);
    p.OnUse(2, kMB, 1, c.victim_next, true);
    ForcedOutLog forced;  // nothing forced out
    EXPECT_EQ(p.Plan(4, 0, 0, c.next_use_policy ? &forced : nullptr), c.plan);
  }
}

TEST(PrefetchPlannerTest, NeverEvictsWhatIsNeededSooner) {
  PrefetchPlanner p;
  p.SetProfile(Profile(20, 1.0), 0);
  SwappedOut(p, 1, 5 * kMB, 0, 12);  // 5 ms lead: urgent at 7
  p.OnUse(2, kMB, 1, 9, true);       // needed before 1
  p.OnUse(3, kMB, 1, 12, true);      // needed with 1: not later
  p.OnUse(4, kMB, 1, 10, true);
  for (uint64_t now = 2; now <= 7; ++now) {
    EXPECT_TRUE(p.Plan(now, 0, 0).empty()) << now;
  }
  // Buffers needed later appear (used by the current op, 7): they go, and
  // only they, farthest first.
  p.OnUse(5, 3 * kMB, 7, 30, false);
  p.OnUse(6, 3 * kMB, 7, kNone, false);
  p.OnResident(5);
  p.OnResident(6);
  EXPECT_EQ(p.Plan(7, 0, 0),
            (std::vector<PlannedAction>{Evict(6, false), Evict(5, false), Fetch(1)}));
}

// At equal distance (here: both unknown) a clean buffer makes the room, not
// a dirty one: the drop costs no write-back (a shard read and one written
// at start and never read since, on mlp_train).
TEST(PrefetchPlannerTest, RoomForAFetchTakesTheCleanBufferAtEqualDistance) {
  PrefetchPlanner p;
  p.SetProfile(Profile(20, 1.0), 0);
  SwappedOut(p, 1, 4 * kMB, 0, 6);      // 4 ms lead: urgent at once
  p.OnUse(9, 4 * kMB, 0, kNone, true);  // dirty; the larger id
  SwappedOut(p, 2, 4 * kMB, 0, kNone);
  p.OnResident(2);
  p.OnUse(2, 4 * kMB, 1, kNone, false);  // clean
  EXPECT_EQ(p.Plan(2, 0, 0), (std::vector<PlannedAction>{Evict(2, false), Fetch(1)}));
}

// Every buffer needed after the fetched one may make its room. Those not
// needed again this iteration that are clean go first, even when a dirty
// one is needed later: its write-back is a copy on-demand swapping may never
// make (a shard of mlp_train read again only after the run's end, at a 60 %
// cap). Dirty ones follow when the clean ones do not suffice. Within the
// iteration the farthest goes first, clean or not.
TEST(PrefetchPlannerTest, RoomForAFetchTakesCleanBuffersBeyondTheIterationFirst) {
  struct Case {
    uint64_t fetched_bytes, clean_next_use;
    std::vector<PlannedAction> expected;
  };
  // The profile's iteration is 20 operations: the horizon at 2 is 22.
  for (const Case& c : {Case{4 * kMB, 30, {Evict(2, false), Fetch(1)}},
                        Case{8 * kMB, 30, {Evict(2, false), Evict(9, true), Fetch(1)}},
                        Case{4 * kMB, 15, {Evict(9, true), Fetch(1)}}}) {
    PrefetchPlanner p;
    p.SetProfile(Profile(20, 1.0), 0);
    SwappedOut(p, 1, c.fetched_bytes, 0, c.fetched_bytes == 4 * kMB ? 6 : 10);  // urgent
    p.OnUse(9, 4 * kMB, 0, 50, true);  // dirty, needed last
    SwappedOut(p, 2, 4 * kMB, 0, c.clean_next_use);
    p.OnResident(2);
    p.OnUse(2, 4 * kMB, 1, c.clean_next_use, false);  // clean, needed sooner
    EXPECT_EQ(p.Plan(2, 0, 0), c.expected) << c.fetched_bytes << " " << c.clean_next_use;
  }
}

// A randomized check of the same rule and of the bookkeeping, against a
// model of memory: each fetch's evictions have later next uses than the
// fetched buffer, never one used by the current operation or fetched and
// unused, and nothing is fetched that does not fit.
TEST(PrefetchPlannerTest, RandomizedNeverEvictsSoonerAndStaysInMemory) {
  std::mt19937_64 rng(7);
  // Random predictions are wrong all the time: without a cut-off, so that
  // the rules are exercised all along.
  PrefetchPlanner p(PrefetchPlanner::Options{.max_actions = 8, .cost_share = 1e18});
  p.SetProfile(Profile(16, 1.0), 0);
  constexpr uint64_t kCap = 12 * kMB;
  struct Model {
    uint64_t bytes;
    uint64_t next;
    bool resident;
    bool fetched = false;
    bool dirty = true;  // no current host copy
  };
  std::map<uint64_t, Model> bufs;
  uint64_t used = 0;
  uint64_t fetches = 0;
  for (uint64_t now = 1; now < 6000; ++now) {
    // The op: one buffer used (on demand if needed, evicting farthest).
    const uint64_t id = rng() % 24;
    const uint64_t bytes = (1 + id % 3) * kMB;
    const uint64_t next = rng() % 5 == 0 ? kNone : now + 1 + rng() % 40;
    auto it = bufs.find(id);
    if (it == bufs.end() || !it->second.resident) {
      while (used + bytes > kCap) {
        uint64_t victim = 0, far = 0;
        bool any = false;
        for (auto& [vid, m] : bufs) {
          if (m.resident && vid != id && (!any || m.next >= far)) {
            victim = vid, far = m.next, any = true;
          }
        }
        ASSERT_TRUE(any);
        bufs[victim].resident = false;
        bufs[victim].dirty = false;
        used -= bufs[victim].bytes;
        p.OnEvicted(victim);
      }
      used += bytes;
      if (it != bufs.end()) {
        p.OnResident(id);
        it->second.dirty = false;
      }
    }
    const bool write = rng() % 2 == 0;
    const bool dirty = it == bufs.end() || it->second.dirty || write;
    bufs[id] = Model{bytes, next, true, false, dirty};
    p.OnUse(id, bytes, now, next, write);
    uint64_t free = kCap - used;
    const std::vector<PlannedAction> actions = p.Plan(now, free, 0);
    for (size_t i = 0; i < actions.size(); ++i) {
      const PlannedAction& a = actions[i];
      Model& m = bufs.at(a.id);
      if (a.kind == Kind::kEvict) {
        ASSERT_TRUE(m.resident);
        // The fetch it makes room for, if any: the next fetch in the list.
        size_t f = i + 1;
        while (f < actions.size() && actions[f].kind != Kind::kFetch) ++f;
        if (f < actions.size()) {
          // A prediction that passed counts as none (the planner says so).
          const uint64_t next = m.next < now ? kNone : m.next;
          ASSERT_GT(next, bufs.at(actions[f].id).next)
              << "evicted " << a.id << " needed sooner than " << actions[f].id;
        } else {
          // A planned eviction: never the current op's, never an unknown
          // future unless clean (a drop).
          ASSERT_NE(a.id, id);
          if (m.next < now || m.next == kNone) {
            ASSERT_FALSE(m.dirty) << a.id;
            ASSERT_FALSE(a.copy) << a.id;
          }
        }
        ASSERT_EQ(a.copy, m.dirty) << a.id;
        m.resident = false;
        m.dirty = false;  // the host copy is current
        used -= m.bytes;
        free += m.bytes;
        p.OnEvicted(a.id);
      } else {
        ASSERT_FALSE(m.resident);
        ASSERT_LE(m.bytes, free) << "fetch does not fit";
        ASSERT_GT(m.next, now);
        m.resident = true;
        m.dirty = false;
        used += m.bytes;
        free -= m.bytes;
        p.OnResident(a.id);
        ++fetches;
      }
    }
  }
  EXPECT_GT(fetches, 50u);  // the check exercised the planner
  EXPECT_GT(p.stats().fetch_evictions + p.stats().planned_evictions, 50u);
}

// A clean resident buffer (read since its last swap-in).
void CleanResident(PrefetchPlanner& p, uint64_t id, uint64_t bytes, uint64_t time,
                   uint64_t next_use) {
  SwappedOut(p, id, bytes, 0, time);
  p.OnResident(id);
  p.OnUse(id, bytes, time, next_use, /*write=*/false);
}

TEST(PrefetchPlannerTest, PlannedEvictionAfterLastUseBeforeALongGap) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  CleanResident(p, 1, 4 * kMB, 1, 90);  // long gap after this use
  p.OnUse(2, 4 * kMB, 1, 3, true);      // short gap: stays
  SwappedOut(p, 3, 4 * kMB, 0, 20);     // due at 20, 4 ms lead
  for (uint64_t now = 2; now < 12; ++now) {
    EXPECT_TRUE(p.Plan(now, 0, 0).empty()) << now;  // not due soon yet
  }
  // At 12 (within twice its lead) 3 does not fit, nothing is urgent: 1 is
  // dropped now, ahead of the urgent fetch.
  EXPECT_EQ(p.Plan(12, 0, 0), (std::vector<PlannedAction>{Evict(1, false)}));
  EXPECT_EQ(p.stats().planned_evictions, 1u);
  EXPECT_EQ(p.stats().planned_copies, 0u);
  p.OnEvicted(1);
  // The memory it frees takes the fetch before it is urgent.
  EXPECT_EQ(p.Plan(13, 4 * kMB, 0), (std::vector<PlannedAction>{Fetch(3)}));
}

// A planned write-back is a copy swapping on demand may never make: a dirty
// buffer is never evicted early, only for a fetch that is urgent.
TEST(PrefetchPlannerTest, PlannedEvictionNeverWritesBack) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  p.OnUse(1, 4 * kMB, 1, 90, /*write=*/true);
  SwappedOut(p, 3, 4 * kMB, 0, 20);
  for (uint64_t now = 2; now < 16; ++now) {
    EXPECT_TRUE(p.Plan(now, 0, 0).empty()) << now;
  }
  EXPECT_EQ(p.stats().planned_evictions, 0u);
  // Urgent (less than its 4 ms lead left): room from 1, written back.
  EXPECT_EQ(p.Plan(16, 0, 0), (std::vector<PlannedAction>{Evict(1, true), Fetch(3)}));
}

TEST(PrefetchPlannerTest, NoPlannedEvictionWithoutPressureOrForUnknownFutures) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  CleanResident(p, 1, 4 * kMB, 1, 90);
  p.OnUse(2, 4 * kMB, 1, kNone, true);   // maybe a temporary about to be freed
  EXPECT_TRUE(p.Plan(2, 0, 0).empty());  // nothing needs the room
  // 8 ms lead: soon from 5 on. Dropped clean, so no write-back of it is
  // queued on the modelled link ahead of its fetch.
  p.OnUse(3, 8 * kMB, 0, 20, /*write=*/false);
  p.OnResident(3);
  p.OnEvicted(3);
  EXPECT_TRUE(p.Plan(3, 0, 0).empty());
  // Pressure: only the predicted one goes, the unknown (dirty) one stays.
  EXPECT_EQ(p.Plan(5, 0, 0), (std::vector<PlannedAction>{Evict(1, false)}));
}

// A clean buffer nothing predicts (a shard read, its next read unknown) is
// the cheapest room there is: dropped for what is due, before a dirty one
// predicted later is written back.
TEST(PrefetchPlannerTest, PlannedEvictionDropsACleanBufferNobodyPredicts) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  p.OnUse(1, 4 * kMB, 1, 90, true);  // dirty, needed late
  SwappedOut(p, 2, 4 * kMB, 0, kNone);
  p.OnResident(2);  // fetched back on demand: clean
  p.OnUse(2, 4 * kMB, 1, kNone, false);
  SwappedOut(p, 3, 4 * kMB, 0, 20);  // due at 20, 4 ms lead
  EXPECT_TRUE(p.Plan(2, 0, 0).empty());
  EXPECT_EQ(p.Plan(12, 0, 0), (std::vector<PlannedAction>{Evict(2, false)}));
  EXPECT_EQ(p.stats().planned_copies, 0u);
}

TEST(PrefetchPlannerTest, BacksOffWhenFetchesAreEvictedBeforeUse) {
  PrefetchPlanner::Options options;
  options.min_backoff = 10;
  PrefetchPlanner p(options);
  p.SetProfile(Profile(100, 1.0), 0);
  SwappedOut(p, 1, kMB, 0, 30);
  SwappedOut(p, 2, kMB, 0, 45);
  ASSERT_EQ(p.Plan(28, 10 * kMB, 0), (std::vector<PlannedAction>{Fetch(1)}));
  p.OnResident(1);
  p.OnEvicted(1);  // thrash: gone before its use
  EXPECT_EQ(p.stats().fetches_wasted, 1u);
  EXPECT_EQ(p.stats().backoffs, 1u);
  for (uint64_t now = 29; now < 38; ++now) {
    EXPECT_TRUE(p.Plan(now, 10 * kMB, 0).empty()) << now;
  }
  EXPECT_EQ(p.stats().plans_paused, 9u);
  ASSERT_EQ(p.Plan(43, 10 * kMB, 0), (std::vector<PlannedAction>{Fetch(2)}));
  p.OnResident(2);
  p.OnEvicted(2);  // again: the pause doubles to 20
  for (uint64_t now = 44; now < 63; ++now) {
    EXPECT_TRUE(p.Plan(now, 10 * kMB, 0).empty()) << now;
  }
  EXPECT_EQ(p.stats().backoffs, 2u);
  EXPECT_EQ(p.stats().plans_paused, 9u + 19u);
  // 1's use passes while paused: an on-demand swap-in, counted.
  p.OnResident(1);
  p.OnUse(1, kMB, 63, 90, false);
  EXPECT_EQ(p.stats().on_demand, 1u);
}

TEST(PrefetchPlannerTest, PassedPredictionsDoNotBlockTheScan) {
  PrefetchPlanner::Options options;
  options.max_scan = 4;
  PrefetchPlanner p(options);
  p.SetProfile(Profile(100, 1.0), 0);
  // Ten buffers whose predicted use at 3 never came.
  for (uint64_t id = 10; id < 20; ++id) SwappedOut(p, id, kMB, 0, 3);
  SwappedOut(p, 1, kMB, 0, 50);
  std::vector<PlannedAction> got;
  for (uint64_t now = 10; now < 50 && got.empty(); ++now) {
    got = p.Plan(now, 10 * kMB, 0);
  }
  EXPECT_EQ(got, (std::vector<PlannedAction>{Fetch(1)}));
}

TEST(PrefetchPlannerTest, PassedResidentPredictionsMakeRoomAgain) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  p.OnUse(2, kMB, 1, 3, true);  // predicted at 3, never used again
  SwappedOut(p, 1, kMB, 0, 10);
  // Before 3 passes, 2 is needed sooner than 1: it stays.
  EXPECT_TRUE(p.Plan(2, 0, 0).empty());
  EXPECT_EQ(p.Plan(9, 0, 0), (std::vector<PlannedAction>{Evict(2, true), Fetch(1)}));
}

// The same after many uses before any plan (re-keyed keys pile up unread
// until a plan pops them, and are thinned out meanwhile): only a buffer's
// current key counts, so the one whose prediction passed makes room, and a
// buffer used since, whose old keys passed too, does not.
TEST(PrefetchPlannerTest, PassedResidentPredictionsMakeRoomAfterManyUses) {
  PrefetchPlanner p;
  p.SetProfile(Profile(10000, 1.0), 0);
  for (uint64_t t = 1; t <= 1000; ++t) p.OnUse(3, kMB, t, t + 1, true);  // needed again soon
  p.OnUse(3, kMB, 1001, 2000, true);
  p.OnUse(2, kMB, 1001, 1003, true);  // predicted at 1003, never used again
  SwappedOut(p, 1, kMB, 1001, 1010);
  EXPECT_EQ(p.resident(), 2u);
  EXPECT_EQ(p.Plan(1009, 0, 0), (std::vector<PlannedAction>{Evict(2, true), Fetch(1)}));
}

TEST(PrefetchPlannerTest, PinnedBuffersAreNeverEvicted) {
  PrefetchPlanner p;
  p.SetProfile(Profile(20, 1.0), 0);
  SwappedOut(p, 1, kMB, 0, 4);
  p.OnUse(2, kMB, 1, kNone, true);
  p.SetPinned(2, true);
  EXPECT_TRUE(p.Plan(3, 0, 0).empty());
  p.SetPinned(2, false);
  EXPECT_EQ(p.Plan(3, 0, 0), (std::vector<PlannedAction>{Evict(2, true), Fetch(1)}));
}

// With no compute before the use to hide a transfer under, a fetch only
// holds memory: none is made, even into free memory.
TEST(PrefetchPlannerTest, NoFetchWithoutComputeToHideItUnder) {
  PrefetchPlanner p;
  p.SetProfile(Profile(20, 0.0), 0);
  SwappedOut(p, 1, kMB, 0, 5);
  for (uint64_t now = 1; now < 5; ++now) {
    EXPECT_TRUE(p.Plan(now, 10 * kMB, 0).empty()) << now;
  }
  PrefetchPlanner q;
  q.SetProfile(Profile(20, 1.0), 0);  // 1 ms per operation: 1 MB hides
  SwappedOut(q, 1, kMB, 0, 5);
  EXPECT_EQ(q.Plan(4, 10 * kMB, 0), (std::vector<PlannedAction>{Fetch(1)}));
}

// A victim that comes back before the use it made room for was needed
// sooner than what it made room for: its write-back and its return are bytes
// the planner caused, and past the cut-off it proposes nothing more.
TEST(PrefetchPlannerTest, StopsWhenItsVictimsComeBackSooner) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  SwappedOut(p, 1, 2 * kMB, 0, 5);
  p.OnUse(2, 2 * kMB, 1, 30, true);  // predicted at 30: room for 1, due at 5
  ASSERT_EQ(p.Plan(3, 0, 0), (std::vector<PlannedAction>{Evict(2, true), Fetch(1)}));
  p.OnEvicted(2);
  p.OnResident(1);
  EXPECT_EQ(p.stats().bytes_caused, 0u);
  p.OnResident(2);  // wrong: needed at 4, swapped in on demand
  p.OnUse(2, 2 * kMB, 4, 30, false);
  EXPECT_EQ(p.stats().bytes_caused, 4 * kMB);
  EXPECT_TRUE(p.stats().stopped);
  SwappedOut(p, 3, kMB, 4, 7);
  EXPECT_TRUE(p.Plan(5, 10 * kMB, 0).empty());
  EXPECT_EQ(p.stats().fetches, 1u);
}

// A use with no swap-in reported read the buffer where it is, in host
// memory (served): it stays swapped out, so it is fetched ahead of its next
// use and never proposed as a victim (proposing it made no room, and the
// fetch it was for was refused). As the first thing the planner hears of a
// buffer, too.
TEST(PrefetchPlannerTest, AServedBufferStaysSwappedOut) {
  for (bool known : {true, false}) {
    PrefetchPlanner p;
    p.SetProfile(Profile(100, 1.0), 0);
    if (known) {
      SwappedOut(p, 1, kMB, 0, 5);
    } else {
      p.OnEvicted(1);  // before any use the planner heard of
    }
    p.OnUse(1, kMB, 5, 20, /*write=*/true);  // served
    EXPECT_EQ(p.stats().served, 1u);
    EXPECT_EQ(p.stats().on_demand, 0u);
    EXPECT_EQ(p.swapped_out(), 1u);
    EXPECT_EQ(p.resident(), 0u);
    // Room for another buffer is not looked for in it.
    SwappedOut(p, 2, kMB, 6, 8);
    EXPECT_TRUE(p.Plan(7, 0, 0).empty()) << known;
    // Fetched ahead of its use at 20, into free memory.
    p.OnResident(2);
    p.OnUse(2, kMB, 8, kNone, false);
    EXPECT_EQ(p.Plan(18, 10 * kMB, 0), (std::vector<PlannedAction>{Fetch(1)})) << known;
  }
}

TEST(PrefetchPlannerTest, VictimsBackAfterTheirPredictedUseCostNothing) {
  PrefetchPlanner p;
  p.SetProfile(Profile(100, 1.0), 0);
  SwappedOut(p, 1, kMB, 0, 4);
  p.OnUse(2, kMB, 1, 30, true);
  ASSERT_EQ(p.Plan(3, 0, 0), (std::vector<PlannedAction>{Evict(2, true), Fetch(1)}));
  p.OnEvicted(2);
  p.OnResident(1);
  p.OnUse(1, kMB, 4, 40, false);
  p.OnUse(2, kMB, 30, 60, false);  // as predicted, after 1's use
  EXPECT_EQ(p.stats().bytes_caused, 0u);
  EXPECT_FALSE(p.stats().stopped);
  SwappedOut(p, 3, kMB, 30, 33);
  EXPECT_EQ(p.Plan(31, 10 * kMB, 0), (std::vector<PlannedAction>{Fetch(3)}));
}

}  // namespace
}  // namespace stensor
