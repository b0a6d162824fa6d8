#include "tools/replay.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "policy/eviction_policy.h"
#include "tools/test_log.h"
#include "tools/workload.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = TestLog::kMiB;

// A workload as given (no pieces), `version` at `cap`.
absl::StatusOr<ReplayResult> ReplayVersion(const Workload& workload, uint64_t cap) {
  std::unique_ptr<EvictionPolicy> policy = MakeVersionPolicy();
  ReplayOptions options;
  options.cap = cap;
  options.policy = policy.get();
  return Replay(workload, options);
}

absl::StatusOr<ReplayResult> Sim(const std::string& log, uint64_t cap, bool lru = false,
                                 double bandwidth_gbps = 16, bool belady = false,
                                 bool prefetch = false, bool planned_evictions = false,
                                 bool host_vmm = true) {
  absl::StatusOr<Workload> workload = ParseWorkload(log);
  if (!workload.ok()) return workload.status();
  // As `stensor sim` replays: with host-located VMM, large allocations in
  // pieces.
  if (host_vmm) *workload = SplitIntoPieces(*workload, cap);
  std::unique_ptr<EvictionPolicy> policy = lru      ? MakeLruPolicy()
                                           : belady ? MakeBeladyPolicy()
                                                    : MakeVersionPolicy();
  ReplayOptions options;
  options.cap = cap;
  options.policy = policy.get();
  options.version_rules = !lru;
  options.bandwidth_gbps = bandwidth_gbps;
  options.prefetch = prefetch;
  options.planned_evictions = planned_evictions;
  options.host_vmm = host_vmm;
  return Replay(*workload, options);
}

// Three (or `n`) buffers updated in a cycle (A B C A B C ...) by a kernel
// each, with a synchronize after each kernel where `sync` (the host never
// ahead of the device). Of three, two fitting: LRU order evicts the one
// needed next every time; belady, on the next uses the predictor learns
// once the iteration (three launches) is detected, keeps the one needed next
// and evicts the other.
std::string Cycle(int rounds, int n = 3, bool sync = false) {
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(log.Alloc(2 * kMiB));
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < n; ++i) {
      log.Launch({ids[i]}, {ids[i]}, -1, absl::StrCat("k", i));
      if (sync) log.Sync();
    }
  }
  return log.Text();
}

// With the planner and its evictions, the profiled iteration's fetches are
// issued ahead of their use (room made by planned evictions of what is needed
// later): fewer swap-ins stall the compute stream. As in the library, the
// planner is asked while the operation holds its buffers (its Prepare), so
// its evictions take only others: in a cycle of three buffers of which two
// fit, the only one not held is the one needed next, and nothing can be
// fetched ahead; of four, the one used before goes and the next but one
// comes in. Synchronized after every kernel, the host is never ahead of the
// device to issue a swap-in early itself.
TEST(ReplayTest, PrefetchWithPlannedEvictionsHidesSwapIns) {
  absl::StatusOr<ReplayResult> three = Sim(Cycle(20, 3, /*sync=*/true), 4 * kMiB, false, 16, false,
                                           /*prefetch=*/true, /*planned_evictions=*/true);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->prefetches, 0u);
  absl::StatusOr<ReplayResult> off = Sim(Cycle(20, 4, /*sync=*/true), 4 * kMiB);
  absl::StatusOr<ReplayResult> on = Sim(Cycle(20, 4, /*sync=*/true), 4 * kMiB, false, 16, false,
                                        /*prefetch=*/true, /*planned_evictions=*/true);
  ASSERT_TRUE(off.ok() && on.ok());
  EXPECT_EQ(off->prefetches, 0u);
  EXPECT_GT(on->prefetches, 30u);
  EXPECT_EQ(on->fetches_wasted, 0u);
  EXPECT_LE(on->on_demand_swap_ins * 3, off->on_demand_swap_ins * 2);  // a third fewer
  EXPECT_LT(on->stall_us, off->stall_us * 0.7);
}

// Without a synchronize the host runs ahead of the device, as a program's
// does: an operation's swap-in is issued when the host reaches it, its copy
// queued behind the eviction that makes its room rather than behind the
// operation before, so the same swaps stall the compute stream far less.
// A prefetch of a buffer whose copy out is still in flight is refused, as
// the library's is ("not now"): it would wait for that copy anyway.
TEST(ReplayTest, TheHostRunningAheadIssuesSwapInsEarly) {
  absl::StatusOr<ReplayResult> synced = Sim(Cycle(20, 4, /*sync=*/true), 4 * kMiB);
  absl::StatusOr<ReplayResult> ahead = Sim(Cycle(20, 4), 4 * kMiB);
  ASSERT_TRUE(synced.ok() && ahead.ok());
  EXPECT_EQ(ahead->bytes_in, synced->bytes_in);  // the same decisions
  EXPECT_EQ(ahead->bytes_out, synced->bytes_out);
  EXPECT_LT(ahead->stall_us, synced->stall_us * 0.4);
  absl::StatusOr<ReplayResult> planned =
      Sim(Cycle(20, 4), 4 * kMiB, false, 16, false, /*prefetch=*/true, /*planned_evictions=*/true);
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(planned->prefetches, 0u);
}

// Without planned evictions (--planned-evictions off): with the cap full
// nothing can be fetched, and nothing changes.
TEST(ReplayTest, PrefetchWithoutPlannedEvictionsOnlyUsesFreeMemory) {
  absl::StatusOr<ReplayResult> off = Sim(Cycle(20), 4 * kMiB);
  absl::StatusOr<ReplayResult> on = Sim(Cycle(20), 4 * kMiB, false, 16, false, /*prefetch=*/true);
  ASSERT_TRUE(off.ok() && on.ok());
  EXPECT_EQ(on->prefetches, 0u);
  EXPECT_EQ(on->bytes_in, off->bytes_in);
  EXPECT_EQ(on->bytes_out, off->bytes_out);
}

TEST(ReplayTest, BeladyUsesPredictedNextUses) {
  absl::StatusOr<ReplayResult> version = Sim(Cycle(20), 4 * kMiB);
  absl::StatusOr<ReplayResult> belady = Sim(Cycle(20), 4 * kMiB, false, 16, /*belady=*/true);
  ASSERT_TRUE(version.ok() && belady.ok());
  EXPECT_EQ(belady->iteration_period, 3u);
  // version misses on each of the 57 uses after the first three.
  EXPECT_EQ(version->on_demand_swap_ins, 57u);
  EXPECT_LT(belady->on_demand_swap_ins, 57u * 3 / 4);
  EXPECT_LT(belady->bytes_moved(), version->bytes_moved());
}

// As in the library (IterationPlanner::Wanted): the cycle's three buffers
// under a cap they fill less than half of are never fed to the planner, so
// nothing is detected; under one they fill half of, the cycle is.
TEST(ReplayTest, ThePlannerSleepsUntilHalfTheCapIsHeld) {
  absl::StatusOr<ReplayResult> roomy = Sim(Cycle(20), 14 * kMiB, false, 16, /*belady=*/true);
  absl::StatusOr<ReplayResult> half = Sim(Cycle(20), 12 * kMiB, false, 16, /*belady=*/true);
  ASSERT_TRUE(roomy.ok() && half.ok());
  EXPECT_EQ(roomy->iteration_period, 0u);
  EXPECT_EQ(half->iteration_period, 3u);
  EXPECT_EQ(roomy->bytes_moved() + half->bytes_moved(), 0u);
}

// Three 2 MiB buffers under a cap of two (worked by hand):
//   version: allocating C evicts A (dirty: copied out); reading A drops C
//   (never written: no copy) and copies A in; writing C drops A (clean
//   now: no copy) and brings C back without a copy (never written).
//   lru: copies every eviction: A at C's allocation, B for A, A for B.
std::string ThreeBuffers() {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  log.Launch({}, {b});
  uint64_t c = log.Alloc(2 * kMiB);
  log.Launch({a}, {});
  log.Launch({}, {c});
  log.Launch({b}, {});
  return log.Text();
}

TEST(ReplayTest, VersionDropsCleanAndNeverWrittenBuffersWithoutCopies) {
  absl::StatusOr<ReplayResult> r = Sim(ThreeBuffers(), 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->swap_outs, 1u);
  EXPECT_EQ(r->bytes_out, 2 * kMiB);
  EXPECT_EQ(r->swap_ins, 1u);
  EXPECT_EQ(r->bytes_in, 2 * kMiB);
  EXPECT_EQ(r->clean_drops, 1u);
  EXPECT_EQ(r->never_written_drops, 1u);
  EXPECT_EQ(r->swap_ins_never_written, 1u);
  EXPECT_EQ(r->peak_resident, 4 * kMiB);
}

TEST(ReplayTest, LruCopiesEveryEviction) {
  absl::StatusOr<ReplayResult> r = Sim(ThreeBuffers(), 4 * kMiB, /*lru=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_out, 6 * kMiB);
  EXPECT_EQ(r->swap_outs, 3u);
  EXPECT_EQ(r->bytes_in, 4 * kMiB);
  EXPECT_EQ(r->clean_drops + r->never_written_drops, 0u);
}

TEST(ReplayTest, NothingMovesUncapped) {
  absl::StatusOr<ReplayResult> r = Sim(ThreeBuffers(), 6 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_moved(), 0u);
  EXPECT_EQ(r->stall_us, 0);
  EXPECT_EQ(r->compute_us, 5 * 100.0);  // five launches at the default 100 us
}

// Where the host waited: a synchronize marks the operation after it, a
// blocking copy to or from host memory itself.
TEST(ReplayTest, TheWorkloadKeepsWhereTheHostWaited) {
  TestLog log;
  const uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  log.Sync();
  log.Sync();
  log.Launch({a}, {});
  log.ReadToHost(a);
  log.Memset(a);  // synchronous, but only device memory: no wait
  log.Sync();     // nothing after it
  absl::StatusOr<Workload> w = ParseWorkload(log.Text());
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<std::pair<bool, bool>> waits;
  for (const WorkloadOp& op : w->ops) waits.emplace_back(op.host_waits_before, op.host_waits_after);
  EXPECT_EQ(waits,
            (std::vector<std::pair<bool, bool>>{
                {false, false}, {false, false}, {true, false}, {false, true}, {false, false}}));
}

// The stall of the version run at 1 GB/s: C's allocation waits for A's
// swap-out (2 MiB), the read of A for its swap-in; nothing else copies.
// A's copy out (at C's allocation) is queued behind A's last use, the first
// launch, which ends at 100 us, while B's runs (the host is ahead): two
// transfers from 100 us on, less B's 100 us of compute.
TEST(ReplayTest, TimeModelStallsOnDemandTransfers) {
  absl::StatusOr<ReplayResult> r = Sim(ThreeBuffers(), 4 * kMiB, false, /*bandwidth=*/1);
  ASSERT_TRUE(r.ok()) << r.status();
  const double transfer_us = 2.0 * kMiB / 1e3;  // bytes / (1 GB/s) in us
  EXPECT_NEAR(r->stall_us, 2 * transfer_us - 100, 1e-6);
}

TEST(ReplayTest, RecordComputeTimeWins) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a}, /*compute_us=*/250);
  log.Launch({a}, {});
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->compute_us, 350.0);
}

// Whole overwrites come back without a copy; a device-to-host read of a
// swapped-out buffer is served from its host copy.
TEST(ReplayTest, OverwritesAndHostReads) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  uint64_t b = log.Alloc(2 * kMiB);  // evicts A: dirty, copied out
  log.Memset(a);                     // A back without a copy; B dropped unwritten
  log.ReadToHost(b);                 // served from B's host copy
  log.ReadToHost(a);                 // resident: a plain access
  log.WriteFromHost(b);              // B back without a copy; A (dirty) copied out
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 2 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_out, 4 * kMiB);
  EXPECT_EQ(r->swap_outs, 2u);
  EXPECT_EQ(r->bytes_in, 0u);
  EXPECT_EQ(r->swap_ins_without_copy, 2u);
  EXPECT_EQ(r->never_written_drops, 1u);
  EXPECT_EQ(r->reads_served_from_host, 1u);
}

// With host-located VMM an allocation larger than a granule is replayed as
// one-granule pieces (SplitIntoPieces), as the library holds it: room for a
// granule moves one, and a memset of part of it reaches only its pieces,
// one it covers whole coming back without a copy. Without, the allocation
// moves whole.
TEST(ReplayTest, PiecesMoveByGranule) {
  TestLog log;
  const uint64_t a = log.Alloc(6 * kMiB);  // three pieces
  log.Launch({}, {a});
  const uint64_t b = log.Alloc(2 * kMiB);  // a's first piece goes
  log.Launch({}, {b});
  log.Memset(a, 2 * kMiB);  // covers that piece: back without a copy; the second goes
  absl::StatusOr<ReplayResult> pieces = Sim(log.Text(), 6 * kMiB);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ(pieces->bytes_out, 4 * kMiB);
  EXPECT_EQ(pieces->bytes_in, 0u);
  EXPECT_EQ(pieces->swap_ins_without_copy, 1u);
  absl::StatusOr<ReplayResult> whole = Sim(log.Text(), 6 * kMiB, false, 16, false, false, false,
                                           /*host_vmm=*/false);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->bytes_out, 8 * kMiB);  // all of a, then b for a's return
  EXPECT_EQ(whole->bytes_in, 6 * kMiB);

  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok());
  size_t split = 0;
  const Workload split_workload = SplitIntoPieces(*workload, 6 * kMiB, &split);
  EXPECT_EQ(split, 1u);
  EXPECT_EQ(split_workload.ops.size(), workload->ops.size() + 2);  // three allocs for one
  const WorkloadOp& memset = split_workload.ops.back();
  ASSERT_EQ(memset.ids.size(), 1u);
  EXPECT_EQ(memset.overwritten, memset.ids);
  EXPECT_EQ(memset.writes, memset.ids);
  EXPECT_EQ(SplitIntoPieces(*workload, 4 * kMiB, &split).ops.size(), workload->ops.size());
  EXPECT_EQ(split, 0u);  // larger than the cap: whole
}

// As the library allocates them, an allocation's pieces are evictable only
// once all exist: room for its second piece takes a written buffer, never
// its own first piece (fresh, so first in the order of what drops free).
TEST(ReplayTest, RoomForAPieceNeverTakesAnotherOfItsAllocation) {
  TestLog log;
  const uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  const uint64_t b = log.Alloc(4 * kMiB);  // two pieces; one granule free
  log.Launch({b}, {b});
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->never_written_drops, 0u);
  EXPECT_EQ(r->swap_outs, 1u);  // a, copied
  EXPECT_EQ(r->bytes_out, 2 * kMiB);
  EXPECT_EQ(r->served_from_host, 0u);  // b is resident, whole
}

// A partial memset is no overwrite: the old contents come back first.
TEST(ReplayTest, PartialMemsetCopiesIn) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  log.Alloc(2 * kMiB);
  log.Memset(a, kMiB);
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 2 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_in, 2 * kMiB);
}

// After a launch of unknown accesses every buffer counts as written: the
// never-written shortcut is gone and dirty copies move.
TEST(ReplayTest, UnknownLaunchMakesEverythingWritten) {
  auto make = [](bool unknown) {
    TestLog log;
    uint64_t a = log.Alloc(2 * kMiB);
    log.Alloc(2 * kMiB);  // A dropped unwritten
    if (unknown) log.UnknownLaunch();
    log.Launch({a}, {});
    return log.Text();
  };
  absl::StatusOr<ReplayResult> plain = Sim(make(false), 2 * kMiB);
  absl::StatusOr<ReplayResult> unknown = Sim(make(true), 2 * kMiB);
  ASSERT_TRUE(plain.ok() && unknown.ok());
  EXPECT_EQ(plain->bytes_moved(), 0u);
  EXPECT_EQ(unknown->bytes_out, 2 * kMiB);
  EXPECT_EQ(unknown->bytes_in, 2 * kMiB);
}

// Without host-located VMM, a launch whose buffers do not fit together is
// out of memory.
TEST(ReplayTest, OutOfMemoryNamesTheLine) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({a, b}, {});
  absl::StatusOr<ReplayResult> r =
      Sim(log.Text(), 3 * kMiB, false, 16, false, false, false, /*host_vmm=*/false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(r.status().message()).find("log line 4"), std::string::npos) << r.status();
}

// With it, as the library does (MemoryManager::PrepareOnce): the buffer that
// finds no room with the operation's other buffers is served from its host
// copy, read over the link while the launch computes (2 MiB at 16 GB/s:
// 131 us, 31 beyond its 100 us of compute), and nothing is out of memory.
TEST(ReplayTest, WhatDoesNotFitIsServedFromHost) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);  // a dropped unwritten for b
  log.Launch({a, b}, {a});
  log.Launch({a}, {});  // fits now: a is brought in, b goes
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 3 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->served_from_host, 1u);
  EXPECT_EQ(r->bytes_served, 2 * kMiB);
  EXPECT_EQ(r->born_on_host, 0u);
  EXPECT_NEAR(r->serve_us, 2.0 * kMiB / 16e3 - 100, 1e-6);
  // Written in host memory by the first launch: its host copy is the only
  // current one, copied in for the second.
  EXPECT_EQ(r->bytes_in, 2 * kMiB);
  EXPECT_EQ(r->peak_resident, 2 * kMiB);
}

// A buffer larger than the cap (or with no room at all) is born in host
// memory (MemoryManager::AllocateOnHost) and served there at every use; so
// is a small one that does not fit, made a buffer of one granule
// (MemoryManager::Allocate), which is brought in once a granule is free.
// Without host-located VMM a small one that does not fit is out of memory.
TEST(ReplayTest, ABufferOverTheCapIsBornOnHostAndServed) {
  TestLog log;
  uint64_t big = log.Alloc(8 * kMiB);
  uint64_t a = log.Alloc(2 * kMiB);
  for (int i = 0; i < 3; ++i) log.Launch({a, big}, {big});
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->born_on_host, 1u);
  EXPECT_EQ(r->bytes_born_on_host, 8 * kMiB);
  EXPECT_EQ(r->served_from_host, 3u);
  EXPECT_EQ(r->bytes_served, 24 * kMiB);
  EXPECT_EQ(r->bytes_moved(), 0u);
  EXPECT_EQ(r->peak_resident, 2 * kMiB);
  // 8 MiB at 16 GB/s each launch, 524 us, while its 100 us of compute run.
  EXPECT_NEAR(r->serve_us, 3 * (8.0 * kMiB / 16e3 - 100), 1e-6);

  TestLog small;
  // Under half a granule: charged in pages, 2,000 KiB of a 2 MiB cap.
  const uint64_t s1 = small.Alloc(1000 * 1024), s2 = small.Alloc(1000 * 1024);
  const uint64_t s3 = small.Alloc(600 * 1024);  // no room: one granule on the host
  small.Launch({s1, s3}, {s3});
  small.Free(s1);
  small.Free(s2);
  small.Launch({s3}, {});  // a granule is free now: brought in
  absl::StatusOr<ReplayResult> hosted = Sim(small.Text(), 2 * kMiB);
  ASSERT_TRUE(hosted.ok()) << hosted.status();
  EXPECT_EQ(hosted->born_on_host, 1u);
  EXPECT_EQ(hosted->bytes_born_on_host, 600u * 1024);
  EXPECT_EQ(hosted->served_from_host, 1u);
  EXPECT_EQ(hosted->bytes_in, 600u * 1024);  // written on the host, copied in
  EXPECT_EQ(hosted->peak_resident, 2 * kMiB);
  absl::StatusOr<ReplayResult> refused =
      Sim(small.Text(), 2 * kMiB, false, 16, false, false, false, /*host_vmm=*/false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
}

// Small allocations are charged in pages and never swapped.
TEST(ReplayTest, SmallAllocationsCountButStay) {
  TestLog log;
  uint64_t s = log.Alloc(100);  // one page
  uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({s}, {a});
  uint64_t b = log.Alloc(2 * kMiB);  // evicts A, never the small one
  log.Launch({s}, {b});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok());
  EXPECT_EQ(workload->working_set, 4 * kMiB + 4096);
  absl::StatusOr<ReplayResult> r = Sim(log.Text(), 2 * kMiB + 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_out, 2 * kMiB);
  EXPECT_EQ(r->peak_resident, 2 * kMiB + 4096);
  // The page does not fit beside B: out of memory without host-located VMM;
  // with it, A and B are born in host memory and served there.
  EXPECT_FALSE(Sim(log.Text(), 2 * kMiB, false, 16, false, false, false, false).ok());
  absl::StatusOr<ReplayResult> served = Sim(log.Text(), 2 * kMiB);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->born_on_host, 2u);
  EXPECT_EQ(served->served_from_host, 2u);
  EXPECT_EQ(served->peak_resident, 4096u);
}

// STENSOR_SLABS=on as the sim replays it (PackIntoSlabs): small allocations
// placed by the library's SlabPool, operations naming their slabs once, an
// overwrite of one block no overwrite of its slab, and a slab's copies
// carrying its live blocks only.
TEST(ReplayTest, SmallAllocationsPackedIntoSlabsMoveTheirLiveBytes) {
  constexpr uint64_t kQuarter = 256 * 1024;  // eight to a slab
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back(log.Alloc(kQuarter));
  for (uint64_t id : ids) log.Launch({}, {id});
  // Half of each slab freed: four blocks live in each.
  for (int i : {4, 5, 6, 7, 12, 13, 14, 15}) log.Free(ids[i]);
  log.Memset(ids[0]);  // overwrites block 0 whole
  for (int round = 0; round < 3; ++round) {
    log.Launch({ids[0], ids[1]}, {ids[1]});
    log.Launch({ids[8]}, {ids[8]});
  }
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  size_t packed = 0;
  const Workload slabs = PackIntoSlabs(*workload, std::nullopt, &packed);
  EXPECT_EQ(packed, 16u);
  std::vector<uint64_t> slab_ids;
  for (const auto& [id, b] : slabs.buffers) {
    if (b.slab) slab_ids.push_back(id);
  }
  ASSERT_EQ(slab_ids.size(), 2u);
  const uint64_t first = slabs.buffers.at(ids[0]).in_slab;
  EXPECT_EQ(slabs.buffers.at(ids[7]).in_slab, first);
  EXPECT_NE(slabs.buffers.at(ids[8]).in_slab, first);
  EXPECT_EQ(slabs.buffers.at(ids[0]).charge, 0u);
  // The memset names the slab, writes it, overwrites nothing of it.
  const WorkloadOp* memset = nullptr;
  const WorkloadOp* pair = nullptr;
  for (const WorkloadOp& op : slabs.ops) {
    if (op.kind != WorkloadOp::Kind::kAccess) continue;
    if (!op.launch) {
      memset = &op;
    } else if (memset != nullptr && pair == nullptr) {
      pair = &op;
    }
  }
  ASSERT_NE(memset, nullptr);
  EXPECT_EQ(memset->ids, std::vector<uint64_t>{first});
  EXPECT_EQ(memset->writes, std::vector<uint64_t>{first});
  EXPECT_TRUE(memset->overwritten.empty());
  ASSERT_NE(pair, nullptr);
  EXPECT_EQ(pair->ids, std::vector<uint64_t>{first}) << "blocks 0 and 1: their slab, once";

  // One slab fits: the first slab goes out whole when the second is made
  // (eight live blocks), and then each switch copies four, 1 MiB.
  absl::StatusOr<ReplayResult> r = ReplayVersion(slabs, 2 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GT(r->swap_outs, 1u);
  EXPECT_EQ(r->bytes_out, 2 * kMiB + (r->swap_outs - 1) * 4 * kQuarter);
  EXPECT_EQ(r->bytes_in, r->swap_ins * 4 * kQuarter);
  EXPECT_EQ(r->born_on_host, 0u);
  // Without slabs, small allocations that find the cap full are each a
  // granule born in host memory.
  absl::StatusOr<ReplayResult> plain = ReplayVersion(*workload, 2 * kMiB);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_GT(plain->born_on_host, 0u);
}

// The slab kept empty for the next small allocation is released when room
// is needed, as the library's MakeRoom does first (no copy: it holds
// nothing), and the small allocation that lands there later finds a fresh
// slab: brought in with no copy, where a slab kept as it was, written
// before, would copy its live bytes in.
TEST(ReplayTest, TheEmptySlabKeptGoesWhenRoomIsNeededAndComesBackFresh) {
  constexpr uint64_t kQuarter = 256 * 1024;  // eight to a slab
  TestLog log;
  std::vector<uint64_t> full;
  for (int i = 0; i < 8; ++i) full.push_back(log.Alloc(kQuarter));
  for (uint64_t id : full) log.Launch({}, {id});
  const uint64_t b = log.Alloc(kQuarter);  // a second slab
  log.Launch({}, {b});
  log.Free(b);                             // empty, kept
  const uint64_t x = log.Alloc(2 * kMiB);  // no room beside both slabs
  log.Launch({}, {x});
  const uint64_t c = log.Alloc(kQuarter);  // in the second slab again
  log.Launch({c}, {c});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  const Workload slabs = PackIntoSlabs(*workload);
  ASSERT_EQ(slabs.buffers.at(b).in_slab, slabs.buffers.at(c).in_slab);
  absl::StatusOr<ReplayResult> r = ReplayVersion(slabs, 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_in, 0u);
  EXPECT_EQ(r->swap_ins_never_written, 1u) << "the fresh slab, for c";
  // Made room for x with no copy out: the first slab's eight blocks stay.
  EXPECT_EQ(r->bytes_out, 2 * kMiB) << "x or the first slab, for the fresh one";
}

// STENSOR_SLABS=auto as the sim replays it: small allocations stay outside
// slabs, counted, frees uncounted, until those held reach an eighth of the
// cap; every later one is packed, whatever is freed meanwhile.
TEST(ReplayTest, AutoPacksOnceTheSmallAllocationsHeldReachTheLibrarysShare) {
  constexpr uint64_t kSmall = 100000;  // counted at 100,352
  constexpr uint64_t kCap = 6 * kMiB;  // the share: 786,432, the eighth one held
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 7; ++i) ids.push_back(log.Alloc(kSmall));
  for (int i = 0; i < 7; ++i) log.Free(ids[i]);
  for (int i = 0; i < 10; ++i) ids.push_back(log.Alloc(kSmall));
  for (int i = 7; i < 17; ++i) log.Free(ids[i]);
  ids.push_back(log.Alloc(kSmall));
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  size_t packed = 0;
  const Workload slabs = PackIntoSlabs(*workload, kCap, &packed);
  EXPECT_EQ(packed, 3u) << "the ninth and tenth held, and the one after the frees";
  for (int i = 0; i < 18; ++i) EXPECT_EQ(slabs.buffers.at(ids[i]).in_slab != 0, i >= 15) << i;
}

}  // namespace
}  // namespace stensor
