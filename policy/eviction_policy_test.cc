#include "policy/eviction_policy.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stensor {
namespace {

using ::testing::IsEmpty;

// Test candidates are built from the three states that matter to a policy,
// so that each table row reads as "which buffer, how big, how old".

// Only on the device. The versions are set equal on purpose: a gpu-only
// buffer must not count as clean just because its version fields match.
EvictionCandidate GpuOnly(uint64_t id, uint64_t bytes, uint64_t last_use) {
  EvictionCandidate c;
  c.id = id;
  c.bytes = bytes;
  c.location = Location::kGpuOnly;
  c.gpu_version = 7;
  c.host_version = 7;
  c.last_use = last_use;
  return c;
}

// On both sides and unmodified since the host copy was taken.
EvictionCandidate Clean(uint64_t id, uint64_t bytes, uint64_t last_use) {
  EvictionCandidate c = GpuOnly(id, bytes, last_use);
  c.location = Location::kCpuGpu;
  return c;
}

// On both sides, but written on the device after the host copy was taken.
EvictionCandidate Stale(uint64_t id, uint64_t bytes, uint64_t last_use) {
  EvictionCandidate c = Clean(id, bytes, last_use);
  c.host_version = c.gpu_version - 1;
  return c;
}

// Evictions compared as (id, copy) pairs: Eviction has no operator==, and
// gtest prints pairs readably.
using Taken = std::pair<uint64_t, bool>;
Taken Copied(uint64_t id) { return {id, true}; }
Taken Dropped(uint64_t id) { return {id, false}; }

std::vector<Taken> AsTaken(const std::vector<Eviction>& evictions) {
  std::vector<Taken> taken;
  for (const Eviction& e : evictions) taken.emplace_back(e.id, e.copy);
  return taken;
}

enum class Kind { kLru, kVersion, kBelady };

std::unique_ptr<EvictionPolicy> MakePolicy(Kind kind) {
  switch (kind) {
    case Kind::kLru:
      return MakeLruPolicy();
    case Kind::kVersion:
      return MakeVersionPolicy();
    case Kind::kBelady:
      return MakeBeladyPolicy();
  }
  return nullptr;
}

// A candidate with a predicted next use (what `belady` reads).
EvictionCandidate WithNext(EvictionCandidate c, uint64_t next_use) {
  c.next_use = next_use;
  return c;
}

TEST(EvictionPolicyTest, NamesAreTheStensorPolicyValues) {
  EXPECT_EQ(MakeLruPolicy()->name(), "lru");
  EXPECT_EQ(MakeVersionPolicy()->name(), "version");
  EXPECT_EQ(MakeBeladyPolicy()->name(), "belady");
}

constexpr uint64_t kNoNext = EvictionCandidate::kNoNextUse;

// The farthest next use goes first, whatever the age; no prediction counts
// as farthest of all.
TEST(BeladyPolicyTest, FarthestNextUseFirstUnknownFarthest) {
  const auto belady = MakeBeladyPolicy();
  const std::vector<EvictionCandidate> c = {
      WithNext(GpuOnly(1, 10, /*last_use=*/1), 50), WithNext(GpuOnly(2, 10, 9), 500),
      WithNext(GpuOnly(3, 10, 5), kNoNext), WithNext(GpuOnly(4, 10, 0), 20)};
  EXPECT_EQ(AsTaken(belady->Choose(c, 40)),
            (std::vector<Taken>{Copied(3), Copied(2), Copied(1), Copied(4)}));
  // LRU would take the oldest (4), the one needed soonest.
  EXPECT_EQ(AsTaken(MakeLruPolicy()->Choose(c, 10)), (std::vector<Taken>{Copied(4)}));
  EXPECT_EQ(AsTaken(belady->Choose(c, 10)), (std::vector<Taken>{Copied(3)}));
}

// At equal distance a clean buffer is dropped before a dirty one is copied,
// then the least recently used goes first.
TEST(BeladyPolicyTest, CleanFirstThenLeastRecentlyUsedAtEqualDistance) {
  const auto belady = MakeBeladyPolicy();
  const std::vector<EvictionCandidate> c = {
      WithNext(GpuOnly(1, 10, 1), 100), WithNext(Clean(2, 10, 8), 100),
      WithNext(Stale(3, 10, 2), 100), WithNext(Clean(4, 10, 3), 100),
      WithNext(Clean(5, 10, 0), 99)};
  EXPECT_EQ(AsTaken(belady->Choose(c, 50)),
            (std::vector<Taken>{Dropped(4), Dropped(2), Copied(1), Copied(3), Dropped(5)}));
}

// Without a predicted time, buffers of a sequence (written in a burst, not
// read since) go first, the last written first, then those nothing
// predicts least recently used first; a predicted time comes last.
TEST(BeladyPolicyTest, ASequenceGoesFirstLastWrittenFirst) {
  const auto belady = MakeBeladyPolicy();
  constexpr uint64_t kSequence = EvictionCandidate::kInSequence;
  const std::vector<EvictionCandidate> c = {
      WithNext(GpuOnly(1, 10, 1), kSequence + 1), WithNext(GpuOnly(2, 10, 3), kSequence + 3),
      WithNext(GpuOnly(3, 10, 2), kSequence + 2), WithNext(GpuOnly(4, 10, 0), kNoNext),
      WithNext(GpuOnly(5, 10, 4), kNoNext),       WithNext(GpuOnly(6, 10, 5), 1000)};
  EXPECT_EQ(AsTaken(belady->Choose(c, 60)),
            (std::vector<Taken>{Copied(2), Copied(3), Copied(1), Copied(4), Copied(5), Copied(6)}));
  EXPECT_FALSE(WithNext(GpuOnly(1, 1, 1), kSequence).next_use_is_time());
  EXPECT_FALSE(WithNext(GpuOnly(1, 1, 1), kNoNext).next_use_is_time());
  EXPECT_TRUE(WithNext(GpuOnly(1, 1, 1), kSequence - 1).next_use_is_time());
}

// The Key is what a caller indexes by: it must agree with Choose.
TEST(BeladyPolicyTest, KeyOrdersLikeChoose) {
  const auto belady = MakeBeladyPolicy();
  EXPECT_LT(belady->Key(WithNext(GpuOnly(1, 1, 1), kNoNext)),
            belady->Key(WithNext(Clean(2, 1, 0), 1000)));
  EXPECT_LT(belady->Key(WithNext(Clean(1, 1, 9), 5)), belady->Key(WithNext(GpuOnly(2, 1, 0), 5)));
  EXPECT_TRUE(belady->Copies(GpuOnly(1, 1, 1)));
  EXPECT_FALSE(belady->Copies(Clean(1, 1, 1)));
}

// Belady with bypass: a buffer needed again no sooner than the one its room
// would displace is served, not fetched (when both are needed at the same
// time, one of the two is missing then all the same, and fetching would
// move both); unknown or sequence ranks never decide it.
TEST(BeladyPolicyTest, ServesWhatIsNeededLaterThanWhatItWouldDisplace) {
  const auto belady = MakeBeladyPolicy();
  constexpr uint64_t kSequence = EvictionCandidate::kInSequence;
  const EvictionCandidate displaced = WithNext(GpuOnly(1, 10, 1), 500);
  EXPECT_TRUE(belady->ServeRatherThanFetch(501, displaced));
  EXPECT_TRUE(belady->ServeRatherThanFetch(500, displaced));
  EXPECT_FALSE(belady->ServeRatherThanFetch(499, displaced));
  EXPECT_FALSE(belady->ServeRatherThanFetch(100, displaced));
  EXPECT_FALSE(belady->ServeRatherThanFetch(kNoNext, displaced));
  EXPECT_FALSE(belady->ServeRatherThanFetch(kSequence + 5, displaced));
  EXPECT_FALSE(belady->ServeRatherThanFetch(600, WithNext(GpuOnly(1, 10, 1), kNoNext)));
  EXPECT_FALSE(belady->ServeRatherThanFetch(600, WithNext(GpuOnly(1, 10, 1), kSequence + 1)));
  // Policies that predict nothing never serve by choice.
  EXPECT_FALSE(MakeLruPolicy()->ServeRatherThanFetch(501, displaced));
  EXPECT_FALSE(MakeVersionPolicy()->ServeRatherThanFetch(501, displaced));
}

// clean() decides whether an eviction costs a transfer, so every state is
// pinned down here, including the ones whose version fields look current.
TEST(EvictionCandidateTest, CleanOnlyWhenBothCopiesExistAndMatch) {
  EXPECT_TRUE(Clean(1, 1, 1).clean());
  EXPECT_FALSE(Stale(1, 1, 1).clean());
  EXPECT_FALSE(GpuOnly(1, 1, 1).clean());
  EvictionCandidate cpu_only = Clean(1, 1, 1);
  cpu_only.location = Location::kCpuOnly;
  EXPECT_FALSE(cpu_only.clean());
  EXPECT_FALSE(EvictionCandidate{}.clean());  // gpu-only, versions both 0
}

struct ChooseCase {
  std::string name;
  Kind kind;
  std::vector<EvictionCandidate> candidates;
  uint64_t needed;
  std::vector<Taken> want;
};

std::ostream& operator<<(std::ostream& os, const ChooseCase& c) { return os << c.name; }

class ChooseTest : public ::testing::TestWithParam<ChooseCase> {};

TEST_P(ChooseTest, PicksExpectedEvictions) {
  const ChooseCase& c = GetParam();
  const auto policy = MakePolicy(c.kind);
  EXPECT_EQ(AsTaken(policy->Choose(c.candidates, c.needed)), c.want);
}

constexpr uint64_t kMax = UINT64_MAX;

INSTANTIATE_TEST_SUITE_P(
    Table, ChooseTest,
    ::testing::Values(
        ChooseCase{"Lru_EmptyCandidates", Kind::kLru, {}, 100, {}},
        ChooseCase{"Version_EmptyCandidates", Kind::kVersion, {}, 100, {}},
        ChooseCase{"Lru_NeededZero", Kind::kLru, {GpuOnly(1, 100, 1)}, 0, {}},
        // Even a free (clean) eviction is not made when nothing is needed.
        ChooseCase{"Version_NeededZero", Kind::kVersion, {Clean(1, 100, 1)}, 0, {}},
        // 50 + 70 is exactly 120: the third buffer stays.
        ChooseCase{"Lru_ExactFit",
                   Kind::kLru,
                   {GpuOnly(1, 100, 3), GpuOnly(2, 50, 1), GpuOnly(3, 70, 2)},
                   120,
                   {Copied(2), Copied(3)}},
        // The two clean buffers free exactly 170: the dirty one stays.
        ChooseCase{"Version_ExactFit",
                   Kind::kVersion,
                   {Clean(1, 100, 3), GpuOnly(2, 50, 1), Clean(3, 70, 2)},
                   170,
                   {Dropped(3), Dropped(1)}},
        ChooseCase{"Lru_OvershootStopsAtFirstReachingNeeded",
                   Kind::kLru,
                   {GpuOnly(1, 100, 1), GpuOnly(2, 100, 2), GpuOnly(3, 100, 3)},
                   150,
                   {Copied(1), Copied(2)}},
        ChooseCase{"Version_OvershootStopsAtFirstReachingNeeded",
                   Kind::kVersion,
                   {Clean(1, 100, 5), GpuOnly(2, 100, 1), GpuOnly(3, 100, 2)},
                   150,
                   {Dropped(1), Copied(2)}},
        // The baseline: strictly by age, and clean buffers are copied too.
        ChooseCase{"Lru_IgnoresCleanlinessAndCopiesEverything",
                   Kind::kLru,
                   {Clean(1, 100, 5), GpuOnly(2, 100, 1), Clean(3, 100, 2)},
                   300,
                   {Copied(2), Copied(3), Copied(1)}},
        // A free eviction beats an older one that would need a transfer.
        ChooseCase{"Version_TakesCleanNewerBeforeDirtyOlderWithoutCopy",
                   Kind::kVersion,
                   {GpuOnly(1, 100, 1), Clean(2, 100, 9)},
                   100,
                   {Dropped(2)}},
        // host_version < gpu_version: the host copy is outdated, so the
        // buffer is dirty, goes after the clean one and is copied.
        ChooseCase{"Version_StaleHostCopyIsDirtyAndCopied",
                   Kind::kVersion,
                   {Stale(1, 100, 1), Clean(2, 100, 9)},
                   200,
                   {Dropped(2), Copied(1)}},
        ChooseCase{"Lru_StaleHostCopyIsCopied",
                   Kind::kLru,
                   {Stale(1, 100, 1), Clean(2, 100, 9)},
                   200,
                   {Copied(1), Copied(2)}},
        // Matching version fields do not make a gpu-only buffer clean: both
        // are copied, oldest first, after the clean one.
        ChooseCase{"Version_GpuOnlyIsNeverClean",
                   Kind::kVersion,
                   {GpuOnly(1, 100, 9), Clean(3, 100, 10), GpuOnly(2, 100, 1)},
                   300,
                   {Dropped(3), Copied(2), Copied(1)}},
        ChooseCase{"Lru_TiesBrokenById",
                   Kind::kLru,
                   {GpuOnly(3, 10, 5), GpuOnly(1, 10, 5), GpuOnly(2, 10, 5)},
                   30,
                   {Copied(1), Copied(2), Copied(3)}},
        ChooseCase{"Version_TiesBrokenById",
                   Kind::kVersion,
                   {GpuOnly(4, 10, 5), Clean(3, 10, 5), GpuOnly(2, 10, 5), Clean(1, 10, 5)},
                   40,
                   {Dropped(1), Dropped(3), Copied(2), Copied(4)}},
        ChooseCase{"Lru_NotEnoughCandidatesTakesAll",
                   Kind::kLru,
                   {GpuOnly(1, 10, 1), Clean(2, 10, 2), Stale(3, 10, 0)},
                   1000,
                   {Copied(3), Copied(1), Copied(2)}},
        ChooseCase{"Version_NotEnoughCandidatesTakesAll",
                   Kind::kVersion,
                   {GpuOnly(1, 10, 1), Clean(2, 10, 2), Stale(3, 10, 0)},
                   1000,
                   {Dropped(2), Copied(3), Copied(1)}},
        // A caller that lists an id twice still gets it once.
        ChooseCase{"Lru_DuplicateIdTakenOnce",
                   Kind::kLru,
                   {GpuOnly(1, 10, 1), GpuOnly(1, 10, 2), GpuOnly(2, 10, 3)},
                   30,
                   {Copied(1), Copied(2)}},
        // Summing taken bytes would wrap around here and take a third
        // buffer; counting down what is missing does not.
        ChooseCase{"Lru_HugeBuffersDoNotOverflow",
                   Kind::kLru,
                   {GpuOnly(1, kMax - 1, 1), GpuOnly(2, kMax - 1, 2), GpuOnly(3, kMax - 1, 3)},
                   kMax,
                   {Copied(1), Copied(2)}}),
    [](const ::testing::TestParamInfo<ChooseCase>& info) { return info.param.name; });

// --- Randomized invariants ------------------------------------------------

// Small ranges on purpose: last_use ties, zero-byte buffers, clean and dirty
// buffers and "not enough candidates" all occur often.
std::vector<EvictionCandidate> RandomCandidates(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> count(0, 24);
  std::uniform_int_distribution<uint64_t> id(0, 63);
  std::uniform_int_distribution<uint64_t> bytes(0, 4096);
  std::uniform_int_distribution<uint64_t> last_use(0, 8);
  std::uniform_int_distribution<int> location(0, 2);
  std::uniform_int_distribution<uint64_t> version(0, 3);
  std::uniform_int_distribution<uint64_t> next_use(9, 16);  // 14: none, 15-16: sequence
  std::bernoulli_distribution zero_bytes(0.1);
  std::bernoulli_distribution current(0.5);

  std::vector<EvictionCandidate> candidates;
  std::set<uint64_t> ids;
  for (int n = count(rng); static_cast<int>(candidates.size()) < n;) {
    EvictionCandidate c;
    c.id = id(rng);
    if (!ids.insert(c.id).second) continue;  // ids are unique per registry
    c.bytes = zero_bytes(rng) ? 0 : bytes(rng);
    c.location = static_cast<Location>(location(rng));
    c.gpu_version = version(rng);
    c.host_version = current(rng) ? c.gpu_version : version(rng);
    c.last_use = last_use(rng);
    c.next_use = next_use(rng);
    if (c.next_use == 14) c.next_use = EvictionCandidate::kNoNextUse;
    if (c.next_use > 14) c.next_use = EvictionCandidate::kInSequence + c.next_use - 15;
    candidates.push_back(c);
  }
  return candidates;
}

// The order a policy must evict in: (class, distance, group, age, id). Under
// `belady` only, the class puts buffers of a sequence first, then those
// nothing predicts, then predicted times farthest first (the distance); the
// group is 0 for all under LRU and clean-before-dirty otherwise; the age is
// the last use, except in a sequence, where the last written goes first.
std::tuple<int, uint64_t, int, int64_t, uint64_t> Key(Kind kind, const EvictionCandidate& c) {
  const int group = kind != Kind::kLru && !c.clean() ? 1 : 0;
  const int64_t age = static_cast<int64_t>(c.last_use);
  if (kind != Kind::kBelady) return {0, 0, group, age, c.id};
  if (c.next_use == EvictionCandidate::kNoNextUse) return {1, 0, group, age, c.id};
  if (c.next_use >= EvictionCandidate::kInSequence) {
    return {0, 0, group, -static_cast<int64_t>(c.next_use - EvictionCandidate::kInSequence), c.id};
  }
  return {2, EvictionCandidate::kNoNextUse - c.next_use, group, age, c.id};
}

// Checks everything the header and the method promise about one result.
void CheckInvariants(Kind kind, const std::vector<EvictionCandidate>& candidates, uint64_t needed,
                     const std::vector<Eviction>& result) {
  if (needed == 0) {
    EXPECT_THAT(result, IsEmpty());
    return;
  }
  std::map<uint64_t, const EvictionCandidate*> by_id;
  for (const EvictionCandidate& c : candidates) by_id[c.id] = &c;

  std::set<uint64_t> seen;
  uint64_t covered = 0;
  const EvictionCandidate* previous = nullptr;
  for (const Eviction& e : result) {
    const auto it = by_id.find(e.id);
    ASSERT_NE(it, by_id.end()) << "id " << e.id << " is not a candidate";
    ASSERT_TRUE(seen.insert(e.id).second) << "id " << e.id << " twice";
    const EvictionCandidate& c = *it->second;
    covered += c.bytes;  // small sizes: no overflow
    if (kind == Kind::kLru) {
      EXPECT_TRUE(e.copy) << "lru must copy id " << e.id;
    } else {
      EXPECT_EQ(e.copy, !c.clean()) << "id " << e.id;
    }
    // Strictly increasing keys: by last_use (and, under `version`, every
    // clean buffer before any dirty one; under `belady` by distance first),
    // ties by id.
    if (previous != nullptr) {
      EXPECT_LT(Key(kind, *previous), Key(kind, c)) << "id " << e.id;
    }
    previous = &c;
  }

  // Enough bytes, or nothing left to take.
  EXPECT_TRUE(covered >= needed || result.size() == candidates.size())
      << "covered " << covered << " of " << needed;
  // Minimal: without the last one it would fall short, so no eviction more
  // than the request needs.
  if (covered >= needed && !result.empty()) {
    EXPECT_LT(covered - by_id[result.back().id]->bytes, needed);
  }
  // A prefix of the eviction order: nothing left behind is evicted earlier
  // than the last one taken.
  if (previous != nullptr) {
    for (const EvictionCandidate& c : candidates) {
      if (seen.count(c.id) == 0) {
        EXPECT_LT(Key(kind, *previous), Key(kind, c)) << "skipped " << c.id;
      }
    }
  }
}

TEST(EvictionPolicyPropertyTest, RandomCandidateSetsKeepInvariants) {
  std::mt19937_64 rng(20240611);
  int reached = 0;
  int exhausted = 0;
  int dropped = 0;
  for (int round = 0; round < 1000 && !HasFailure(); ++round) {
    const std::vector<EvictionCandidate> candidates = RandomCandidates(rng);
    uint64_t total = 0;
    for (const EvictionCandidate& c : candidates) total += c.bytes;
    const uint64_t needed = std::uniform_int_distribution<uint64_t>(0, total + 1000)(rng);
    SCOPED_TRACE(::testing::Message() << "round " << round << ", " << candidates.size()
                                      << " candidates, needed " << needed);

    for (Kind kind : {Kind::kLru, Kind::kVersion, Kind::kBelady}) {
      const auto policy = MakePolicy(kind);
      SCOPED_TRACE(std::string(policy->name()));
      const std::vector<Eviction> result = policy->Choose(candidates, needed);
      CheckInvariants(kind, candidates, needed, result);

      // Pure and deterministic: the caller's listing order does not matter.
      const std::vector<EvictionCandidate> reversed(candidates.rbegin(), candidates.rend());
      EXPECT_EQ(AsTaken(policy->Choose(reversed, needed)), AsTaken(result));

      reached += needed > 0 && result.size() < candidates.size();
      exhausted += result.size() == candidates.size() && !candidates.empty();
      for (const Eviction& e : result) dropped += !e.copy;
    }
  }
  // The generator must exercise every branch, or the test proves little.
  EXPECT_GT(reached, 100);
  EXPECT_GT(exhausted, 100);
  EXPECT_GT(dropped, 100);
}

}  // namespace
}  // namespace stensor
