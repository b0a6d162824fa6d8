// Tests for core/memory_manager: the device-memory cap and the allocation
// loop of the method (S401-S405, docs/design.md) on the fake CUDA driver
// (tests/fakecuda), with 2 MiB granules and a cap of a few granules.
//
// Covered, one step per test where the method names one:
//   - S401/S402: allocation under the cap, MemInfo under the cap, small
//     allocations charged in 4 KiB pages and never swapped;
//   - S405: least-recently-used swap-out with a copy, swap-in at the same
//     address with the data intact, the fake's peak never above the cap;
//   - S403: clean buffers dropped without a copy under `version` (and copied
//     under `lru`), writes making a buffer dirty again;
//   - S404: frees of buffers still in use deferred as garbage and released
//     (waiting for the work when needed) before any eviction;
//   - pinned buffers never evicted, CUDA_ERROR_OUT_OF_MEMORY only when
//     nothing is left to evict; the device itself full below the cap;
//   - swap-in without a copy for buffers about to be overwritten whole,
//     reads served from the host copy, frees of swapped-out buffers, the
//     swapped-out address reading the host copy ("never fault");
//   - several threads sharing one small cap;
//   - STENSOR_VERIFY (copy and hash): a write the manager was not told of
//     turns a clean drop into a copy, an honest one goes ahead, a check that
//     cannot be made copies.
//   - never-written buffers evicted and brought back without any copy
//     (under `version`; copied under `lru`, and after unknown writes);
//   - no eviction under pending work of unknown accesses on any stream, and
//     with host-located VMM no swap-in unmapping the host copy under it;
//   - fault sweeps: every driver call of the swap path failed at each of
//     its first occurrences in a short program; every byte checked and the
//     codes the program saw asserted (run with and without host-located
//     VMM by the memory_manager_fault_test and _no_host_vmm_test targets).
// The tests under "Failure paths" are regressions: each failed before the
// fix of the bug its comment describes (the threads test failed through the
// same bug as UnboundBuffersStayUnderTheCap).
//
// The manager's log sink captures the JSON records; tests assert their exact
// sequence in a short form ("swap_out:1", "swap_in:1:copy", "oom", ...).
// All tests run in one process on device 0; each frees what it allocated,
// and the fixture checks that the fake's device memory is back where it was.
// Helpers synchronise the context after each copy, as an application that
// waits for its work would, so that whether an eviction had to wait (an
// evict_wait record) never depends on timing.
#include "core/swap/memory_manager.h"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/base/config.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

// The register_id of an allocation the registry could not track.
constexpr auto kUntracked = [](CUdeviceptr) -> uint64_t { return 0; };

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using testing_support::HeldStream;
using testing_support::kCap;
using testing_support::kGranule;

using testing_support::Ids;
using testing_support::kWords;
using testing_support::Mismatch;
using testing_support::Pattern;

// One record in short form: type, id, and for swap_in whether it copied.
std::string Summarize(const std::string& json) {
  static const std::regex kType("\"type\":\"([a-z_]+)\"");
  static const std::regex kId("\"id\":([0-9]+)");
  static const std::regex kCopy("\"copy\":(true|false)");
  std::smatch m;
  if (!std::regex_search(json, m, kType)) return "unparsed:" + json;
  std::string out = m[1];
  if (std::regex_search(json, m, kId)) out += ":" + m[1].str();
  if (std::regex_search(json, m, kCopy)) {
    out += m[1] == "true" ? ":copy" : ":nocopy";
  }
  return out;
}

class MemoryManagerTest : public testing_support::ManagerBufferTest {
 protected:
  // A manager with STENSOR_MEMORY_LIMIT=`limit` and STENSOR_POLICY=`policy`,
  // logging into this fixture.
  std::unique_ptr<MemoryManager> Make(const std::string& limit,
                                      const std::string& policy = "version") {
    std::unique_ptr<MemoryManager> mm =
        MakeManager({{"STENSOR_MEMORY_LIMIT", limit}, {"STENSOR_POLICY", policy}});
    EXPECT_NE(mm, nullptr);
    return mm;
  }

  // Without host-located VMM each manager logs that limitation once; the
  // sequences asserted are the same either way.
  std::vector<std::string> Records() {
    std::vector<std::string> out;
    for (const std::string& line : Lines()) {
      std::string record = Summarize(line);
      // Host waits for the swap stream depend on how fast its copies run.
      if (record != "limitation" && record.rfind("swap_wait", 0) != 0) {
        out.push_back(std::move(record));
      }
    }
    return out;
  }

  // A memset of the whole buffer on `stream`, wrapped likewise: the
  // buffer's last use is then that memset.
  // Holds `stream` (for the per-thread stream, the calling thread's) until
  // `*open`.
  static void HoldStream(CUstream stream, std::atomic<bool>* open) {
    ASSERT_CU(cuLaunchHostFunc(
        stream,
        [](void* flag) {
          while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
        },
        open));
  }

  void MemsetOn(MemoryManager& mm, uint64_t id, CUdeviceptr p, CUstream stream) {
    Ids ids = {id};
    ASSERT_CU(mm.Prepare(ids, {}, stream));
    CUresult r = cuMemsetD32Async(p, 0xdeadbeef, kGranule / 4, stream);
    mm.Finish(ids, ids, stream, r == CUDA_SUCCESS);
    ASSERT_CU(r);
  }

  // FillThree, then D (id 4) swaps A out (S405) and is written (seed 4).
  void FillAndSwapOutA(MemoryManager& mm, CUdeviceptr* a, CUdeviceptr* b, CUdeviceptr* c,
                       CUdeviceptr* d) {
    FillThree(mm, a, b, c);
    ClearLog();
    *d = Alloc(mm, 4);
    EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
    Write(mm, 4, *d, 4);
  }

  // FillAndSwapOutA, then B, C and D (kOthers) held by an operation, not
  // finished: with no room to make, an operation on A (kServed) is served
  // from its host copy.
  void HoldAllButSwappedOutA(MemoryManager& mm, CUdeviceptr* a, CUdeviceptr* b, CUdeviceptr* c,
                             CUdeviceptr* d) {
    FillAndSwapOutA(mm, a, b, c, d);
    ASSERT_CU(mm.Prepare(kOthers, {}, nullptr));
  }
  const Ids kOthers = {2, 3, 4};
  const Ids kServed = {1};

  // Frees buffers whose work has completed (the context is synchronised
  // first), so each is released at once instead of becoming garbage.
  void FreeAll(MemoryManager& mm, std::initializer_list<CUdeviceptr> ptrs) {
    Settle();
    for (CUdeviceptr p : ptrs) EXPECT_CU(mm.Free(p));
  }

  // Releases all garbage: a cap-sized allocation needs the whole cap, and
  // S404 comes before any eviction. For the end of a test.
  void ReleaseGarbage(MemoryManager& mm, uint64_t cap) {
    CUdeviceptr all = 0;
    ASSERT_CU(mm.Allocate(cap, &all, kUntracked));
    // Reused chunks are zeroed on the swap stream: once that is done, the
    // free releases at once.
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_CU(mm.Free(all));
  }

  // The fake's device memory in use outside the manager's physical pool
  // (pooled chunks stay allocated, and charged, for reuse).
  size_t Held(MemoryManager& mm) { return Used() - mm.stats().pooled_bytes; }

  size_t FreeBytes(MemoryManager& mm) {
    size_t free_bytes = 0, total_bytes = 0;
    mm.MemInfo(0, &free_bytes, &total_bytes);
    EXPECT_EQ(total_bytes, kCap);
    return free_bytes;
  }
};

// --- S401/S402 ---------------------------------------------------------------

// A driver without an entry point swapping needs (an old driver, or
// STENSOR_REAL_LIBCUDA naming something else): no manager, so the program
// runs uncapped, with one line saying why, instead of calling a null
// pointer at its first eviction.
TEST_F(MemoryManagerTest, DriverLackingAnEntryPointGetsNoCap) {
  EXPECT_EQ(MemoryManager::MissingEntryPoints(driver_), "");
  driver_.cuMemMap = nullptr;
  driver_.cuEventQuery = nullptr;
  EXPECT_EQ(MemoryManager::MissingEntryPoints(driver_), "cuEventQuery, cuMemMap");
  testing::internal::CaptureStderr();
  std::unique_ptr<MemoryManager> mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"}});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(mm, nullptr);
  EXPECT_THAT(err, HasSubstr("STENSOR_MEMORY_LIMIT is not applied: the CUDA driver lacks "
                             "cuEventQuery, cuMemMap"));
}

// S401/S402: the cap has room, so Allocate maps at once, with no record; the
// cap is the total MemInfo reports and cap minus use its free memory.
TEST_F(MemoryManagerTest, S401AllocatesUnderTheCapAtOnce) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(FreeBytes(*mm), kCap);

  CUdeviceptr p = 0;
  EXPECT_EQ(mm->Allocate(0, &p, kUntracked), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(mm->Allocate(kGranule, nullptr, kUntracked), CUDA_ERROR_INVALID_VALUE);

  CUdeviceptr a = Alloc(*mm, 1);
  EXPECT_TRUE(mm->Owns(a));
  EXPECT_EQ(Used(), kGranule);
  EXPECT_EQ(FreeBytes(*mm), kCap - kGranule);
  // A size between granules takes whole granules.
  CUdeviceptr b = Alloc(*mm, 2, kGranule + 1000);
  EXPECT_EQ(Used(), 3 * kGranule);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  Write(*mm, 2, b, 2, kGranule + 1000 - 1000 % 8);
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(mm->stats().peak_resident_bytes, kCap);
  EXPECT_EQ(mm->stats().swap_outs_copied, 0u);

  FreeAll(*mm, {a});
  EXPECT_FALSE(mm->Owns(a));
  EXPECT_EQ(mm->Free(a), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FreeBytes(*mm), kCap - 2 * kGranule);
  FreeAll(*mm, {b});
  EXPECT_EQ(Held(*mm), 0u);
  // Kept for reuse (A's went back to the driver when MemInfo was asked).
  EXPECT_EQ(mm->stats().pooled_bytes, 2 * kGranule);
  EXPECT_EQ(FreeBytes(*mm), kCap);
  EXPECT_EQ(Used(), 0u);  // asked what is free: the pool went back to the driver
  EXPECT_THAT(Records(), IsEmpty());
}

// S402: an allocation below the granularity goes to the driver's allocator,
// is charged in whole 4 KiB pages and is never chosen for eviction.
TEST_F(MemoryManagerTest, S402SmallAllocationIsChargedInPagesAndNeverSwapped) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr s = Alloc(*mm, 10, 1000);
  EXPECT_TRUE(mm->Owns(s));
  EXPECT_EQ(FreeBytes(*mm), kCap - 4096);
  EXPECT_EQ(Used(), 4096u);
  Write(*mm, 10, s, 10, 1000 - 1000 % 8);  // used first: least recently

  CUdeviceptr a = Alloc(*mm, 1);
  CUdeviceptr b = Alloc(*mm, 2);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  EXPECT_THAT(Records(), IsEmpty());
  // 4 KiB + 2 granules used: a third granule does not fit. The small buffer
  // is the least recently used, but only VMM buffers are swapped.
  CUdeviceptr c = Alloc(*mm, 3);
  Write(*mm, 3, c, 3);
  CUdeviceptr d = Alloc(*mm, 4);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1", "swap_out:2"));
  EXPECT_EQ(FreeBytes(*mm), kCap - 4096 - 2 * kGranule);

  // Still resident: no record, no host copy to read from.
  ClearLog();
  ExpectData(*mm, 10, s, 10, 1000 - 1000 % 8);
  EXPECT_THAT(Records(), IsEmpty());
  uint64_t word = 0;
  EXPECT_FALSE(mm->ReadFromHostCopy(10, 0, &word, sizeof(word)));
  EXPECT_EQ(mm->stats().bytes_copied_out, 2 * kGranule);

  FreeAll(*mm, {s, a, b, c, d});
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// Once the cap presses, an operation whose buffers are all plain
// allocations (never swapped) holds none of them: its ticket says that
// Finish has nothing to do, and a free while it is in flight gives the
// memory back at once, as without a cap. One with a swappable buffer among
// them holds that one.
TEST_F(MemoryManagerTest, AnOperationOnPlainAllocationsOnlyHoldsNothing) {
  // Nothing planned (no prefetch, no belady), so that an operation once the
  // cap presses is not noted either.
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"},
                         {"STENSOR_POLICY", "version"},
                         {"STENSOR_PREFETCH", "off"}});
  ASSERT_NE(mm, nullptr);
  CUdeviceptr s = Alloc(*mm, 10, 1000);
  CUdeviceptr a = Alloc(*mm, 1);
  // Two granules of six: the cap presses (before, operations are journaled).
  CUdeviceptr a2 = Alloc(*mm, 2);
  MemoryManager::OpTicket plain_ticket, mixed_ticket;
  MemoryManager::Operation op;
  op.key = 7;
  op.ticket = &plain_ticket;
  const Ids plain = {10};
  ASSERT_CU(mm->Prepare(plain, {}, nullptr, &op));
  EXPECT_FALSE(plain_ticket.finish);
  op.ticket = &mixed_ticket;
  const Ids mixed = {10, 1};
  ASSERT_CU(mm->Prepare(mixed, {}, nullptr, &op));
  EXPECT_TRUE(mixed_ticket.finish);
  mm->Finish(mixed, {}, nullptr, /*submitted=*/true, mixed_ticket.journal);
  // The first operation is still in flight (no Finish): nothing of it is
  // held, so the free releases the small allocation now.
  ASSERT_CU(mm->Free(s));
  EXPECT_EQ(FreeBytes(*mm), kCap - 2 * kGranule);
  EXPECT_EQ(Used(), 2 * kGranule);
  FreeAll(*mm, {a, a2});
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

bool HostVmm();  // memory_manager_bounds_test.cc

// A cap full of small buffers (never swapped): with host-located VMM one
// more is no refusal but a buffer of one granule born in host memory,
// right to the byte, brought in when a granule is free; without, out of
// memory as the driver would say.
TEST_F(MemoryManagerTest, SmallAllocationFindingTheCapFullIsBornOnTheHost) {
  // Outside slabs (with them, core/swap/memory_manager_slabs_test.cc).
  auto mm = MakeManager(
      {{"STENSOR_MEMORY_LIMIT", "6MiB"}, {"STENSOR_POLICY", "version"}, {"STENSOR_SLABS", "off"}});
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 512 * 1024;
  std::vector<CUdeviceptr> held;
  for (uint64_t id = 1; id <= 12; ++id) {  // 6 MiB of them
    held.push_back(Alloc(*mm, id, kSmall));
    Write(*mm, id, held.back(), id, kSmall);
  }
  EXPECT_EQ(FreeBytes(*mm), 0u);
  CUdeviceptr extra = 0;
  const CUresult r = mm->Allocate(kSmall, &extra, [](CUdeviceptr) { return uint64_t{20}; });
  auto free_held = [&] {
    Settle();
    for (CUdeviceptr p : held) EXPECT_CU(mm->Free(p));
  };
  if (!HostVmm()) {
    EXPECT_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    free_held();
    return;
  }
  ASSERT_CU(r);
  EXPECT_LE(Peak(), kCap);
  Write(*mm, 20, extra, 20, kSmall);  // served from the host copy
  EXPECT_GE(mm->stats().served_from_host, 1u);
  ExpectData(*mm, 1, held[0], 1, kSmall);
  // Room for its granule: it comes in, every byte its own.
  FreeAll(*mm, {held[0], held[1], held[2], held[3]});
  held.erase(held.begin(), held.begin() + 4);
  ExpectData(*mm, 20, extra, 20, kSmall);
  EXPECT_LE(Peak(), kCap);
  held.push_back(extra);
  free_held();
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// --- S405 --------------------------------------------------------------------

// S405: the cap is full and nothing is clean or garbage, so the least
// recently used buffer is copied to the host and unmapped; the fake never
// holds more than the cap. A later use swaps it back in at the same address
// with its data, evicting the next least recently used buffer.
TEST_F(MemoryManagerTest, S405SwapsOutLeastRecentlyUsedAndBackAtSameAddress) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  EXPECT_THAT(Records(), IsEmpty());

  fakecuda_reset_peak_bytes(0);
  CUdeviceptr d = Alloc(*mm, 4);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_THAT(Lines(), ElementsAre(R"({"type":"swap_out","id":1,)"
                                   R"("bytes":2097152,"device":0})"));
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.swap_outs_copied, 1u);
  EXPECT_EQ(stats.bytes_copied_out, kGranule);
  EXPECT_EQ(stats.clean_drops, 0u);
  EXPECT_EQ(stats.swap_ins, 0u);
  EXPECT_EQ(stats.peak_resident_bytes, kCap);
  EXPECT_EQ(Used(), kCap);
  EXPECT_LE(Peak(), kCap);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  EXPECT_TRUE(mm->Owns(a));
  Write(*mm, 4, d, 4);  // D is now the most recently used

  // A's next use: B (least recently used now) goes out, A comes back in.
  ClearLog();
  ExpectData(*mm, 1, a, 1);
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1:copy"));
  EXPECT_EQ(Lines().back(), R"({"type":"swap_in","id":1,"bytes":2097152,)"
                            R"("copy":true,"device":0})");
  stats = mm->stats();
  EXPECT_EQ(stats.swap_ins, 1u);
  EXPECT_EQ(stats.bytes_copied_in, kGranule);
  EXPECT_EQ(stats.swap_outs_copied, 2u);
  EXPECT_EQ(Used(), kCap);
  EXPECT_LE(Peak(), kCap);

  // Every buffer keeps its data however often it moves. A is clean now (its
  // host copy is current), so it makes room for B without a copy (S403).
  ClearLog();
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 4, d, 4);
  EXPECT_THAT(Records(), ElementsAre("drop_clean:1", "swap_in:2:copy"));
  EXPECT_LE(Peak(), kCap);

  FreeAll(*mm, {a, b, c, d});
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// --- S403 --------------------------------------------------------------------

struct CleanOutcome {
  std::vector<std::string> records;  // of allocating E only
  SwapStats stats;                   // right after allocating E
};

class CleanScenarioTest : public MemoryManagerTest {
 public:
  // A, B, C fill the cap; D swaps A out; A is read back in (B goes out), so
  // A is clean: its host copy is current. Then E needs room. With
  // `clean_is_lru`, C and D are used after A so that A is also the least
  // recently used. Afterwards every buffer's data is checked.
  CleanOutcome Run(const std::string& policy, bool clean_is_lru) {
    CleanOutcome out;
    auto mm = Make("6MiB", policy);
    if (mm == nullptr) return out;
    CUdeviceptr a, b, c, d;
    FillAndSwapOutA(*mm, &a, &b, &c, &d);
    ClearLog();
    ExpectData(*mm, 1, a, 1);
    EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1:copy"));
    if (clean_is_lru) {
      ExpectData(*mm, 3, c, 3);
      ExpectData(*mm, 4, d, 4);
    }
    ClearLog();
    CUdeviceptr e = Alloc(*mm, 5);
    out.records = Records();
    out.stats = mm->stats();
    Write(*mm, 5, e, 5);
    ExpectData(*mm, 1, a, 1);
    ExpectData(*mm, 2, b, 2);
    ExpectData(*mm, 3, c, 3);
    ExpectData(*mm, 4, d, 4);
    ExpectData(*mm, 5, e, 5);
    EXPECT_LE(Peak(), kCap);
    FreeAll(*mm, {a, b, c, d, e});
    ClearLog();
    return out;
  }
};

// S403: under `version`, a buffer swapped out and back in without a write
// since is clean, and room is made by dropping its device copy: no transfer.
TEST_F(CleanScenarioTest, S403CleanBufferIsDroppedWithoutCopy) {
  CleanOutcome out = Run("version", /*clean_is_lru=*/true);
  EXPECT_THAT(out.records, ElementsAre("drop_clean:1"));
  EXPECT_EQ(out.stats.clean_drops, 1u);
  EXPECT_EQ(out.stats.bytes_dropped, kGranule);
  EXPECT_EQ(out.stats.swap_outs_copied, 2u);  // A and B, once each
  EXPECT_EQ(out.stats.bytes_copied_out, 2 * kGranule);
}

// S403 comes before S405: the clean buffer goes first even when it is the
// most recently used and dirty ones are older.
TEST_F(CleanScenarioTest, S403CleanBufferGoesBeforeOlderDirtyOnes) {
  CleanOutcome out = Run("version", /*clean_is_lru=*/false);
  EXPECT_THAT(out.records, ElementsAre("drop_clean:1"));
  EXPECT_EQ(out.stats.clean_drops, 1u);
  EXPECT_EQ(out.stats.bytes_copied_out, 2 * kGranule);
}

// The baseline: `lru` has no version control, so the same scenario copies
// the clean buffer out again (or, when it is not the oldest, the oldest
// dirty one): more bytes go to the host than under `version`.
TEST_F(CleanScenarioTest, S403UnderLruTheSameScenarioCopies) {
  CleanOutcome version = Run("version", /*clean_is_lru=*/true);
  CleanOutcome lru = Run("lru", /*clean_is_lru=*/true);
  EXPECT_THAT(lru.records, ElementsAre("swap_out:1"));
  EXPECT_EQ(lru.stats.clean_drops, 0u);
  EXPECT_EQ(lru.stats.swap_outs_copied, 3u);
  EXPECT_EQ(lru.stats.bytes_copied_out, 3 * kGranule);
  EXPECT_GT(lru.stats.bytes_copied_out, version.stats.bytes_copied_out);

  CleanOutcome lru_mru = Run("lru", /*clean_is_lru=*/false);
  EXPECT_THAT(lru_mru.records, ElementsAre("swap_out:3"));
  EXPECT_EQ(lru_mru.stats.clean_drops, 0u);
  EXPECT_GT(lru_mru.stats.bytes_copied_out, version.stats.bytes_copied_out);
}

// A write makes a clean buffer dirty (its device version moves past its host
// copy's): its next eviction copies again. A write that was not submitted
// changes nothing.
TEST_F(MemoryManagerTest, WriteMakesBufferDirtyAgain) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ExpectData(*mm, 1, a, 1);  // back in, clean (B went out)
  // A write that failed to submit leaves A clean.
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, nullptr));
  mm->Finish(ids, ids, nullptr, /*submitted=*/false);
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 4, d, 4);
  ClearLog();
  CUdeviceptr e = Alloc(*mm, 5);
  EXPECT_THAT(Records(), ElementsAre("drop_clean:1"));
  Write(*mm, 5, e, 5);

  // A comes back clean (C goes out), then is written: dirty.
  ClearLog();
  Write(*mm, 1, a, 11);
  EXPECT_THAT(Records(), ElementsAre("swap_out:3", "swap_in:1:copy"));
  ExpectData(*mm, 4, d, 4);
  ExpectData(*mm, 5, e, 5);  // A is the least recently used again
  SwapStats before = mm->stats();
  ClearLog();
  CUdeviceptr f = Alloc(*mm, 6);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  SwapStats after = mm->stats();
  EXPECT_EQ(after.clean_drops, before.clean_drops);
  EXPECT_EQ(after.swap_outs_copied, before.swap_outs_copied + 1);
  EXPECT_EQ(after.bytes_copied_out, before.bytes_copied_out + kGranule);
  Write(*mm, 6, f, 6);

  ExpectData(*mm, 1, a, 11);  // the written contents, not the old copy
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, c, 3);
  FreeAll(*mm, {a, b, c, d, e, f});
}

// An operation with unknown accesses (a kernel the driver cannot describe,
// a graph launch) may have written anything: no host copy is trusted after
// it, so the clean buffer is copied out instead of dropped.
TEST_F(MemoryManagerTest, UnknownWritesMakeEveryBufferDirty) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ExpectData(*mm, 1, a, 1);  // back in, clean (B went out)
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 4, d, 4);
  mm->MarkAllWritten(nullptr);
  ASSERT_CU(cuCtxSynchronize());  // its barrier event has completed
  ClearLog();
  CUdeviceptr e = Alloc(*mm, 5);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));  // not drop_clean
  Write(*mm, 5, e, 5);
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d, e});
}

// Allocations the driver makes itself (pitched, stream-ordered) are counted
// against the cap: room is made for them, and their charge goes with them.
TEST_F(MemoryManagerTest, ExternalAllocationsCountAgainstTheCap) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  ClearLog();
  ASSERT_CU(mm->ReserveExternal(kGranule));  // evicts A to make room
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  CUdeviceptr ext = 0;
  ASSERT_CU(cuMemAlloc_v2(&ext, kGranule));  // stands in for the driver's own
  mm->AdoptExternal(ext, kGranule);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  mm->ForgetExternal(ext);
  ASSERT_CU(cuMemFree_v2(ext));
  EXPECT_EQ(FreeBytes(*mm), kGranule);
  ASSERT_CU(mm->ReserveExternal(kGranule));
  mm->UnreserveExternal(kGranule);  // the driver failed: nothing charged
  EXPECT_EQ(FreeBytes(*mm), kGranule);
  FreeAll(*mm, {a, b, c});
}

// --- S404 --------------------------------------------------------------------

// WaitForWriters waits for the streams that used the buffer, not for the
// context: with another stream held, a wait for a buffer written on an
// open stream returns; one for a buffer written on the held stream returns
// only once it opens. Not the manager's: CUDA_ERROR_NOT_FOUND.
TEST_F(MemoryManagerTest, WaitForWritersWaitsForTheBuffersStreamsOnly) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  CUdeviceptr b = Alloc(*mm, 2);
  HeldStream held_a, held_b;
  MemsetOn(*mm, 1, a, held_a.get());
  MemsetOn(*mm, 2, b, held_b.get());
  // Waits for buffer `id` on a thread of its own: not done while `held`
  // is, done once it opens. (A wait for the other stream too would hang:
  // the test times out.)
  auto expect_waits_for = [&](uint64_t id, HeldStream& held) {
    std::atomic<bool> waited{false};
    std::thread waiter([&] {
      EXPECT_CU(mm->WaitForWriters(id));
      waited.store(true);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(waited.load()) << id << ": returned while its stream was held";
    held.Open();
    waiter.join();
    EXPECT_TRUE(waited.load());
  };
  expect_waits_for(1, held_a);  // held_b still held
  expect_waits_for(2, held_b);
  EXPECT_EQ(mm->WaitForWriters(99), CUDA_ERROR_NOT_FOUND);
  EXPECT_CU(mm->Free(a));
  EXPECT_CU(mm->Free(b));
}

// A writer whose event cannot tell (its synchronisation fails) is waited for
// with the context: the wait still ends only after the write, never before.
TEST_F(MemoryManagerTest, AWriterWaitWhoseEventFailsWaitsForTheContext) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());
  fakecuda_fail_call("cuEventSynchronize", 1, CUDA_ERROR_UNKNOWN);
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&ctx));
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    EXPECT_CU(cuCtxSetCurrent(ctx));  // as the application's thread has
    EXPECT_CU(mm->WaitForWriters(1));
    waited.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(waited.load()) << "returned while the write was held";
  held.Open();
  waiter.join();
  fakecuda_clear_failures();
  uint32_t word = 0;
  ASSERT_CU(cuMemcpyDtoH_v2(&word, a, sizeof(word)));
  EXPECT_EQ(word, 0xdeadbeefu);
  EXPECT_CU(mm->Free(a));
}

// S404: a buffer freed while work using it is still queued (a memset on a
// held stream) stays charged as garbage. When room is needed, the garbage is
// released before anything is evicted, waiting for its work: the wait is
// logged (evict_wait) and nothing is swapped out.
// A use on one stream says nothing about a use on another: a buffer still
// in use on a held stream, though its latest use (on another stream) has
// completed, is not taken for idle. Its swap-out is queued behind that use
// on the swap stream, without a host wait: Allocate returns while the stream
// is still held. The device memory it frees goes to D at once, and D's first
// user waits for A's copy on the device, so neither's data is mixed up.
TEST_F(MemoryManagerTest, SwapOutIsQueuedBehindUsesOnEveryStream) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());  // A's last write, still queued
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, other));
  mm->Finish(ids, {}, other, /*submitted=*/true);
  ASSERT_CU(cuStreamSynchronize(other));
  // A is now the most recently used; make it the only candidate left.
  Ids others = {2, 3};
  ASSERT_CU(mm->Prepare(others, {}, nullptr));
  ClearLog();
  // Opens the stream after a long while if the host blocked on it (the
  // test then fails instead of hanging).
  std::atomic<bool> done{false}, opened_late{false};
  std::thread opener([&] {
    for (int i = 0; i < 1000 && !done.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!done.load()) {
      opened_late.store(true);
      held.Open();
    }
  });
  CUdeviceptr d = Alloc(*mm, 4);
  // D's first write, on a stream of its own: ordered after A's copy.
  Ids dids = {4};
  CUstream third;
  ASSERT_CU(cuStreamCreate(&third, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(mm->Prepare(dids, {}, third));
  CUresult r = cuMemsetD32Async(d, 0x12345678, kGranule / 4, third);
  mm->Finish(dids, dids, third, r == CUDA_SUCCESS);
  ASSERT_CU(r);
  done.store(true);
  opener.join();
  EXPECT_FALSE(opened_late.load()) << "the host waited for the held stream";
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(mm->stats().async_evictions, 1u);
  EXPECT_EQ(mm->stats().wait_program_seconds, 0.0);
  held.Open();
  mm->Finish(others, {}, nullptr, /*submitted=*/true);
  ASSERT_CU(cuStreamSynchronize(third));
  std::vector<uint64_t> got = Read(*mm, 1, a);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0xdeadbeefdeadbeefull) << "A, word " << i;
  }
  got = Read(*mm, 4, d);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0x1234567812345678ull) << "D, word " << i;
  }
  ASSERT_CU(cuStreamDestroy(other));
  ASSERT_CU(cuStreamDestroy(third));
  FreeAll(*mm, {a, b, c, d});
}

// Was: uses were kept per stream handle, and the per-thread stream is one
// handle for a stream of each thread's own: a second thread's use of a
// buffer replaced the first's, so the buffer counted as idle while the
// first thread's write was still queued, and was swapped out under it.
// Before the cap presses, operations on a stream share a record every few
// (MarkOperation) on the current context's own streams: their uses are
// noted ahead of it. A free must never see such a use done early. Same
// thread, the NULL stream held: the free settles the uses (the stream is
// busy: a record now), and the buffer is released only once it ran. Another thread's per-thread
// stream, held: nothing this thread can record names that stream, so the buffer waits for that
// thread's next record, never less.
TEST_F(MemoryManagerTest, UsesNotedAheadOfTheirRecordAreNeverSeenDoneEarly) {
  auto mm = Make("64MiB");  // three granules of 32: the cap does not press
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  {
    std::atomic<bool> open{false};
    HoldStream(nullptr, &open);
    for (int i = 0; i < 5; ++i) MemsetOn(*mm, 1, a, nullptr);  // the last ones ahead
    ASSERT_CU(mm->Free(a));
    ASSERT_TRUE(mm->Find(a).has_value());
    EXPECT_TRUE(mm->Find(a)->freed);  // still in use: garbage
    size_t free_bytes = 0, total = 0;
    mm->MemInfo(0, &free_bytes, &total);  // looks for garbage again
    EXPECT_TRUE(mm->Find(a).has_value());
    open.store(true);
    ASSERT_CU(cuStreamSynchronize(nullptr));
    mm->MemInfo(0, &free_bytes, &total);
    EXPECT_FALSE(mm->Find(a).has_value());  // ran: released
  }
  std::atomic<bool> open{false};
  std::atomic<int> step{0};
  std::thread user([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    HoldStream(CU_STREAM_PER_THREAD, &open);
    for (int i = 0; i < 5; ++i) MemsetOn(*mm, 2, b, CU_STREAM_PER_THREAD);
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
    ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    // More work on its stream: its next record covers the noted uses.
    const CUdeviceptr c = Alloc(*mm, 3);
    for (int i = 0; i < MemoryManager::kDeferredRecords; ++i) {
      MemsetOn(*mm, 3, c, CU_STREAM_PER_THREAD);
    }
    ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    EXPECT_CU(mm->Free(c));
  });
  while (step.load() != 1) std::this_thread::yield();
  ASSERT_CU(mm->Free(b));
  size_t free_bytes = 0, total = 0;
  for (int i = 0; i < 20; ++i) {
    mm->MemInfo(0, &free_bytes, &total);
    ASSERT_TRUE(mm->Find(b).has_value()) << "released under its pending work";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  open.store(true);
  step.store(2);
  user.join();
  mm->MemInfo(0, &free_bytes, &total);
  EXPECT_FALSE(mm->Find(b).has_value());
  EXPECT_EQ(mm->stats().driver_errors, 0u);
}

TEST_F(MemoryManagerTest, PerThreadStreamUsesOfTwoThreadsAreKeptApart) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  std::atomic<bool> open{false};
  std::atomic<int> step{0};
  // Thread 1: its own per-thread stream held, A's write queued behind it.
  // It lives on until the end (its stream lives with it).
  std::thread first([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    HoldStream(CU_STREAM_PER_THREAD, &open);
    MemsetOn(*mm, 1, a, CU_STREAM_PER_THREAD);
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
    ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  });
  while (step.load() != 1) std::this_thread::yield();
  // Thread 2: a use of A on its own per-thread stream, complete.
  std::thread second([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    Ids ids = {1};
    ASSERT_CU(mm->Prepare(ids, {}, CU_STREAM_PER_THREAD));
    mm->Finish(ids, {}, CU_STREAM_PER_THREAD, /*submitted=*/true);
    ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  });
  second.join();
  // A is the only candidate; D needs its room. Its eviction must follow
  // thread 1's write, however it is ordered (queued or waited for).
  Ids others = {2, 3};
  ASSERT_CU(mm->Prepare(others, {}, nullptr));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    open.store(true);
  });
  CUdeviceptr d = Alloc(*mm, 4);
  opener.join();
  step.store(2);
  first.join();
  mm->Finish(others, {}, nullptr, /*submitted=*/true);
  std::vector<uint64_t> got = Read(*mm, 1, a);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0xdeadbeefdeadbeefull) << "A, word " << i;
  }
  FreeAll(*mm, {a, b, c, d});
}

// Opens a held stream after a long while unless Done() came first, so that
// a test whose host blocked on the stream fails instead of hanging.
class OpenIfStuck {
 public:
  explicit OpenIfStuck(HeldStream& held)
      : thread_([this, &held] {
          for (int i = 0; i < 1000 && !done_.load(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          if (!done_.load()) {
            stuck_.store(true);
            held.Open();
          }
        }) {}
  ~OpenIfStuck() { Done(); }
  // True when the host had to be let go (it waited for the stream).
  bool Done() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
    return stuck_.load();
  }

 private:
  std::atomic<bool> done_{false}, stuck_{false};
  std::thread thread_;
};

// The physical pool: cycling four buffers through a cap of three swaps one
// out and one in at every access, and after the first round every swap-in
// maps the memory the swap-out before it released: no cuMemCreate or
// cuMemRelease of device memory in steady state, and every byte right.
// (Under `lru`, so that every access misses; `version` would keep the two
// dirty buffers and cycle the clean ones.)
TEST_F(MemoryManagerTest, PoolServesSwapInsWithoutCreatingMemory) {
  auto mm = Make("6MiB", "lru");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  CUdeviceptr p[] = {a, b, c, d};
  for (int i = 0; i < 4; ++i) ExpectData(*mm, i + 1, p[i], i + 1);  // warm-up round
  SwapStats before = mm->stats();
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) ExpectData(*mm, i + 1, p[i], i + 1);
  }
  SwapStats after = mm->stats();
  EXPECT_GE(after.swap_ins - before.swap_ins, 12u);
  EXPECT_EQ(after.physical_creates, before.physical_creates);
  EXPECT_EQ(after.physical_releases, before.physical_releases);
  EXPECT_GE(after.pool_hits - before.pool_hits, 12u);
  EXPECT_LE(Peak(), kCap);
  FreeAll(*mm, {a, b, c, d});
}

// Granule chunks: memory freed or swapped out by buffers of one size
// serves buffers of another. Under a cap of three granules, a two-granule
// buffer and two one-granule buffers take turns (each swap-in evicts
// buffers of other sizes), and per-step temporaries of both sizes come and
// go: after the first round, nothing is created or released, and every
// byte is right. (An exact-size pool misses at every turn here.)
TEST_F(MemoryManagerTest, PoolChunksServeEverySize) {
  auto mm = Make("6MiB", "lru");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr big = Alloc(*mm, 1, 2 * kGranule);
  Write(*mm, 1, big, 1, 2 * kGranule);
  CUdeviceptr a = Alloc(*mm, 2), b = Alloc(*mm, 3);  // big goes out
  Write(*mm, 2, a, 2);
  Write(*mm, 3, b, 3);
  SwapStats before{};
  for (int round = 0; round < 4; ++round) {
    if (round == 1) before = mm->stats();
    ExpectData(*mm, 1, big, 1, 2 * kGranule);  // a and b out
    ExpectData(*mm, 2, a, 2);                  // big out
    ExpectData(*mm, 3, b, 3);
    // A temporary of each size, written and freed within the round.
    for (uint64_t granules : {uint64_t{2}, uint64_t{1}}) {
      const uint64_t id = 10 + 10 * round + granules;
      CUdeviceptr t = Alloc(*mm, id, granules * kGranule);
      ASSERT_NE(t, 0u);
      Write(*mm, id, t, id, granules * kGranule);
      ExpectData(*mm, id, t, id, granules * kGranule);
      FreeAll(*mm, {t});
    }
  }
  SwapStats after = mm->stats();
  EXPECT_GE(after.swap_ins - before.swap_ins, 9u);
  EXPECT_EQ(after.physical_creates, before.physical_creates);
  EXPECT_EQ(after.physical_releases, before.physical_releases);
  EXPECT_EQ(after.ooms, 0u);
  EXPECT_LE(Peak(), kCap);
  FreeAll(*mm, {big, a, b});
}

// Chunks as large as their buffers: on a GPU each handle mapped costs its
// own access setting and unmapping (docs/gpu.md), so a four-granule buffer
// is made of one handle (with host-located VMM, of four pieces of one
// each), and two of them taking turns under a cap that holds one swap
// each into the other's chunks: one chunk per swap-in, nothing created or
// released once warm, every byte right.
TEST_F(MemoryManagerTest, ABufferMapsOneHandleOfItsSize) {
  auto mm = Make("8MiB", "lru");
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kBig = 4 * kGranule;
  const uint64_t handles = HostVmm() ? 4 : 1;
  CUdeviceptr a = Alloc(*mm, 1, kBig);
  EXPECT_EQ(mm->stats().physical_creates, handles);
  Write(*mm, 1, a, 1, kBig);
  CUdeviceptr b = Alloc(*mm, 2, kBig);  // a goes out
  Write(*mm, 2, b, 2, kBig);
  ExpectData(*mm, 1, a, 1, kBig);  // b goes out, a comes in
  const SwapStats before = mm->stats();
  for (int round = 0; round < 3; ++round) {
    ExpectData(*mm, 2, b, 2, kBig);
    ExpectData(*mm, 1, a, 1, kBig);
  }
  const SwapStats after = mm->stats();
  const uint64_t swap_ins = after.swap_ins - before.swap_ins;
  EXPECT_EQ(swap_ins, 6 * handles);
  EXPECT_EQ(after.pool_hits - before.pool_hits, swap_ins);  // one chunk each
  EXPECT_EQ(after.physical_creates, before.physical_creates);
  EXPECT_EQ(after.physical_releases, before.physical_releases);
  EXPECT_LE(Peak(), 8u << 20);
  FreeAll(*mm, {a, b});
}

// A chunk too large for what is asked serves nothing (a handle maps whole):
// under a full cap it is released and the need made afresh, never evicting
// for room the pool holds. A four-granule buffer freed, then two of two.
// (With host-located VMM every chunk is one granule, of a piece: each one
// serves again, and nothing is released.)
TEST_F(MemoryManagerTest, APooledChunkTooLargeIsReleasedForRoom) {
  auto mm = Make("8MiB", "lru");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr big = Alloc(*mm, 1, 4 * kGranule);
  Write(*mm, 1, big, 1, 4 * kGranule);
  FreeAll(*mm, {big});
  ASSERT_EQ(mm->stats().pooled_bytes, 4 * kGranule);
  CUdeviceptr a = Alloc(*mm, 2, 2 * kGranule);
  Write(*mm, 2, a, 2, 2 * kGranule);
  CUdeviceptr b = Alloc(*mm, 3, 2 * kGranule);
  Write(*mm, 3, b, 3, 2 * kGranule);
  const SwapStats s = mm->stats();
  EXPECT_EQ(s.swap_outs_copied, 0u);  // both fit: nothing evicted
  EXPECT_EQ(s.pooled_bytes, 0u);
  if (HostVmm()) {
    EXPECT_EQ(s.physical_releases, 0u);
    EXPECT_EQ(s.physical_creates, 4u);
  } else {
    EXPECT_GE(s.physical_releases, 1u);
  }
  EXPECT_EQ(s.ooms, 0u);
  EXPECT_LE(Peak(), 8u << 20);
  ExpectData(*mm, 2, a, 2, 2 * kGranule);
  ExpectData(*mm, 3, b, 3, 2 * kGranule);
  FreeAll(*mm, {a, b});
}

// A training step's temporaries under a cap: a small one the driver serves
// (below half a granule), a granule one that is swapped out before it is
// freed, and a half-granule one (mapped on a whole chunk). After a warm-up
// round nothing is created or released on the device or the host: the host
// copy of a freed buffer serves the next one of its size.
TEST_F(MemoryManagerTest, SteadyTemporariesCreateAndReleaseNothingOnceWarm) {
  fakecuda_count_calls(1);
  auto mm = Make("6MiB", "lru");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  constexpr uint64_t kSmall = 100000 - 100000 % 8, kHalf = kGranule / 2;
  unsigned long long creates = 0, releases = 0;
  for (int round = 0; round < 5; ++round) {
    if (round == 2) {
      creates = fakecuda_call_count("cuMemCreate");
      releases = fakecuda_call_count("cuMemRelease");
    }
    const uint64_t id = 100 + 10 * round;
    CUdeviceptr s = Alloc(*mm, id, kSmall);
    Write(*mm, id, s, id, kSmall);
    CUdeviceptr t = Alloc(*mm, id + 1);  // the cap is full: a or b goes out
    Write(*mm, id + 1, t, id + 1);
    ExpectData(*mm, 1, a, 1);  // t goes out (a host copy) or b
    ExpectData(*mm, 2, b, 2);
    CUdeviceptr h = Alloc(*mm, id + 2, kHalf);
    Write(*mm, id + 2, h, id + 2, kHalf);
    ExpectData(*mm, id + 1, t, id + 1);
    ExpectData(*mm, id, s, id, kSmall);
    ExpectData(*mm, id + 2, h, id + 2, kHalf);
    FreeAll(*mm, {s, t, h});
  }
  EXPECT_EQ(fakecuda_call_count("cuMemCreate"), creates);
  EXPECT_EQ(fakecuda_call_count("cuMemRelease"), releases);
  EXPECT_GT(mm->stats().swap_outs_copied, 4u);  // the loop did swap
  EXPECT_EQ(mm->stats().ooms, 0u);
  EXPECT_LE(Peak(), kCap);
  fakecuda_count_calls(0);
  FreeAll(*mm, {a, b});
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// The transformer's pattern: a temporary of more than half a granule (a
// few per step, freed before the step's widest kernel) and a launch that
// needs the whole cap at once. Driver memory for the temporary would leave
// its share of the cap unused at that launch, where only a new chunk can
// serve it, and take that share back next step by releasing a pooled chunk:
// a cuMemCreate and a cuMemRelease every step. Mapped on a whole chunk, the
// temporary's memory serves the launch's buffers itself.
TEST_F(MemoryManagerTest, HalfGranuleTemporaryMapsAChunkSoNoStepCreatesOne) {
  auto mm = Make("6MiB", "lru");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  constexpr uint64_t kHalf = kGranule / 2 + 4096;
  SwapStats before{};
  for (int round = 0; round < 5; ++round) {
    if (round == 2) before = mm->stats();
    const uint64_t id = 100 + 10 * round;
    CUdeviceptr h = Alloc(*mm, id, kHalf);
    Write(*mm, id, h, id, kHalf);
    ExpectData(*mm, id, h, id, kHalf);
    FreeAll(*mm, {h});
    CUdeviceptr t = Alloc(*mm, id + 1);
    Write(*mm, id + 1, t, id + 1);
    const Ids all = {1, 2, id + 1};  // the whole cap at once
    ASSERT_CU(mm->Prepare(all, {}, nullptr));
    mm->Finish(all, {}, nullptr, true);
    ExpectData(*mm, id + 1, t, id + 1);
    FreeAll(*mm, {t});
  }
  const SwapStats after = mm->stats();
  EXPECT_EQ(after.physical_creates, before.physical_creates);
  EXPECT_EQ(after.physical_releases, before.physical_releases);
  EXPECT_EQ(after.ooms, 0u);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  EXPECT_LE(Peak(), kCap);
  FreeAll(*mm, {a, b});
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// A kept host copy serves a never-written buffer's eviction only once it is
// zeroed: the address of a swapped-out buffer reads its host copy, which
// must hold what fresh memory holds, not the bytes of the buffer that had
// the copy before. When that zeroing cannot be queued (the memset fails), a
// fresh copy is made instead: the program sees no error and the same bytes.
TEST_F(MemoryManagerTest, KeptHostCopyOfAnotherBufferReadsZerosWhenNeverWritten) {
  int host_vmm = 0;
  ASSERT_CU(cuDeviceGetAttribute(
      &host_vmm, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev_));
  for (bool fail_zeroing : {false, true}) {
    SCOPED_TRACE(fail_zeroing ? "memset fails" : "no fault");
    auto mm = Make("6MiB");  // version: a never-written buffer goes without a copy
    ASSERT_NE(mm, nullptr);
    CUdeviceptr a, b, c, d;
    FillAndSwapOutA(*mm, &a, &b, &c, &d);  // A has a host copy holding its data
    FreeAll(*mm, {a, d});                  // the copy is kept; D's chunk pooled
    CUdeviceptr e = Alloc(*mm, 5);         // never written
    Read(*mm, 2, b);
    Read(*mm, 3, c);
    ClearLog();
    // The first memset from here on is the kept copy's zeroing (the chunk
    // e leaves is zeroed for f after it), with host-located VMM.
    if (fail_zeroing) fakecuda_fail_call("cuMemsetD8Async", 1, CUDA_ERROR_UNKNOWN);
    CUdeviceptr f = Alloc(*mm, 6);  // evicts e: nothing to copy
    fakecuda_clear_failures();
    EXPECT_NE(f, 0u);
    EXPECT_THAT(Records(), ElementsAre("drop_unwritten:5"));
    // (Without host-located VMM the failed memset is the zeroing of f's
    // reused chunk, which falls back to fresh memory likewise.)
    EXPECT_EQ(mm->stats().driver_errors, fail_zeroing ? 1u : 0u);
    Write(*mm, 6, f, 6);
    ASSERT_CU(cuCtxSynchronize());
    std::vector<uint64_t> words(kWords, 1);
    // (Without host-located VMM a never-written buffer gets no host copy.)
    EXPECT_EQ(mm->ReadFromHostCopy(5, 0, words.data(), kGranule), host_vmm != 0);
    if (host_vmm != 0) {
      EXPECT_EQ(std::count(words.begin(), words.end(), uint64_t{0}), static_cast<long>(kWords));
    }
    words = Read(*mm, 5, e);
    EXPECT_EQ(std::count(words.begin(), words.end(), uint64_t{0}), static_cast<long>(kWords));
    ExpectData(*mm, 6, f, 6);
    FreeAll(*mm, {b, c, e, f});
  }
}

// A kept host copy is found by the granules it covers, so one left by a
// buffer of 0.6 granule may serve a buffer of a whole granule: it must be
// as large as its key (a pinned one was allocated at the smaller buffer's
// size, and the next copy-out wrote past its end).
TEST_F(MemoryManagerTest, KeptPinnedCopyServesAWholeGranuleBuffer) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  const uint64_t small = kGranule * 6 / 10 / sizeof(uint64_t) * sizeof(uint64_t);
  CUdeviceptr a = Alloc(*mm, 1, small);
  Write(*mm, 1, a, 1, small);
  CUdeviceptr b = Alloc(*mm, 2), c = Alloc(*mm, 3);
  Write(*mm, 2, b, 2);
  Write(*mm, 3, c, 3);
  CUdeviceptr d = Alloc(*mm, 4);  // swaps A out: its copy is made
  Write(*mm, 4, d, 4);
  FreeAll(*mm, {a});              // A's copy is kept
  CUdeviceptr e = Alloc(*mm, 5);  // swaps B out into the kept copy
  Write(*mm, 5, e, 5);
  ExpectData(*mm, 2, b, 2);  // B back from it, whole
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 4, d, 4);
  ExpectData(*mm, 5, e, 5);
  FreeAll(*mm, {b, c, d, e});
}

// Prefetch brings a swapped-out buffer in on the swap stream before any
// operation asks for it; the operation then finds it resident (no second
// swap-in) and waits for the copy on the device.
TEST_F(MemoryManagerTest, PrefetchBringsABufferInBeforeItsUse) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ClearLog();
  EXPECT_EQ(mm->Prefetch(1), CUDA_SUCCESS);  // evicts B (LRU) for it
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1:copy"));
  EXPECT_EQ(mm->Prefetch(1), CUDA_SUCCESS);  // resident: nothing to do
  ExpectData(*mm, 1, a, 1);
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1:copy"));
  EXPECT_EQ(mm->Prefetch(99), CUDA_ERROR_NOT_FOUND);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c, d});
}

// STENSOR_HOST_LIMIT: a swap-out needs a host copy within the limit. Once
// the live copies fill it, no room can be made on the device and an
// allocation is refused (an oom record naming the host), nothing lost.
// Copies kept from a freed buffer then make the room: taken as they are
// where their size fits (host-located VMM: one-granule pieces), else freed
// for it (pinned memory: A's one 4 MiB copy).
TEST_F(MemoryManagerTest, TheHostLimitRefusesOnlyWhenNoKeptCopyCanMakeRoom) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"},
                         {"STENSOR_HOST_LIMIT", "4MiB"},
                         {"STENSOR_POLICY", "version"}});
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1, 2 * kGranule);
  CUdeviceptr b = Alloc(*mm, 2);
  Write(*mm, 1, a, 1, 2 * kGranule);
  Write(*mm, 2, b, 2);
  std::vector<CUdeviceptr> more;
  uint64_t id = 3;
  CUresult r = CUDA_SUCCESS;
  for (; id < 8; ++id) {  // each swaps the least recently used out
    ClearLog();
    CUdeviceptr p = 0;
    r = mm->Allocate(kGranule, &p, [id](CUdeviceptr) { return id; });
    if (r != CUDA_SUCCESS) break;
    more.push_back(p);
    Write(*mm, id, p, id);
  }
  ASSERT_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(id, 5u);  // A's copies fill the limit: B cannot go
  bool host_oom = false;
  for (const std::string& line : Lines()) {
    host_oom |= line.find("\"type\":\"oom\",\"what\":\"host\"") != std::string::npos;
  }
  EXPECT_TRUE(host_oom);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a});  // swapped out: its copies are kept, still counted
  more.push_back(Alloc(*mm, id));
  ASSERT_NE(more.back(), 0u);
  Write(*mm, id, more.back(), id);
  ExpectData(*mm, 2, b, 2);
  for (size_t i = 0; i < more.size(); ++i) ExpectData(*mm, 3 + i, more[i], 3 + i);
  EXPECT_EQ(mm->stats().driver_errors, 0u);
  Settle();
  for (CUdeviceptr p : more) EXPECT_CU(mm->Free(p));
  EXPECT_CU(mm->Free(b));
}

// Prefetch never blocks the host: with work of unknown accesses pending
// (nothing may be evicted until it completed) there is no room without a
// wait, so the answer is "not now" and the buffer stays swapped out; once
// the work completed the same prefetch goes ahead.
TEST_F(MemoryManagerTest, PrefetchAnswersNotNowInsteadOfWaiting) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  HeldStream held;
  mm->MarkAllWritten(held.get());  // as after an unknown kernel on `held`
  ClearLog();
  {
    OpenIfStuck guard(held);
    EXPECT_EQ(mm->Prefetch(1), CUDA_ERROR_NOT_READY);
    EXPECT_FALSE(guard.Done()) << "Prefetch waited for the held stream";
  }
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(mm->stats().swap_ins, 0u);
  held.Open();
  ASSERT_CU(cuStreamSynchronize(held.get()));
  EXPECT_EQ(mm->Prefetch(1), CUDA_SUCCESS);
  EXPECT_EQ(mm->stats().swap_ins, 1u);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 4, d, 4);
  FreeAll(*mm, {a, b, c, d});
}

// EvictAsync: a planned swap-out of a buffer still being written on a held
// stream is queued behind that write without a host wait; its copy holds
// the write. Pinned by an operation being prepared, it cannot go ("not now").
TEST_F(MemoryManagerTest, EvictAsyncQueuesBehindTheBuffersWork) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  Ids ids = {2};
  ASSERT_CU(mm->Prepare(ids, {}, nullptr));
  EXPECT_EQ(mm->EvictAsync(2), CUDA_ERROR_NOT_READY);
  mm->Finish(ids, {}, nullptr, /*submitted=*/false);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());
  ClearLog();
  {
    OpenIfStuck guard(held);
    EXPECT_EQ(mm->EvictAsync(1), CUDA_SUCCESS);
    EXPECT_FALSE(guard.Done()) << "EvictAsync waited for the held stream";
  }
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(mm->stats().async_evictions, 1u);
  EXPECT_EQ(mm->stats().wait_program_seconds, 0.0);
  EXPECT_EQ(mm->EvictAsync(1), CUDA_SUCCESS);  // out already
  held.Open();
  ASSERT_CU(cuStreamSynchronize(held.get()));
  std::vector<uint64_t> got = Read(*mm, 1, a);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0xdeadbeefdeadbeefull) << "word " << i;
  }
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c});
}

// A swap-in of a buffer whose swap-out is still queued (its copy waiting
// behind a held stream) takes its device memory back, which still holds
// the data: no copy in, no host wait, and the new operation waits on the
// device for the queued copy that reads that memory.
TEST_F(MemoryManagerTest, SwapInOfAQueuedSwapOutTakesItsMemoryBack) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());
  ASSERT_EQ(mm->EvictAsync(1), CUDA_SUCCESS);
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  ClearLog();
  {
    OpenIfStuck guard(held);
    MemsetOn(*mm, 1, a, other);  // the same value, after the held one
    EXPECT_FALSE(guard.Done()) << "the swap-in waited for the held stream";
  }
  EXPECT_THAT(Records(), ElementsAre("swap_in:1:nocopy"));
  EXPECT_EQ(mm->stats().swap_outs_cancelled, 1u);
  EXPECT_EQ(mm->stats().swap_ins, 0u);
  held.Open();
  ASSERT_CU(cuStreamSynchronize(other));
  std::vector<uint64_t> got = Read(*mm, 1, a);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0xdeadbeefdeadbeefull) << "word " << i;
  }
  ASSERT_CU(cuStreamDestroy(other));
  FreeAll(*mm, {a, b, c});
}

// A swap-in into memory at rest does not queue behind a swap-out still
// waiting for the program's work (a held stream): it runs on the fetch
// stream, while the swap stream waits. Here C was swapped out and its memory
// is idle in the pool; B's swap-out waits behind a held memset. C comes in
// and is read on another stream, which completes while B's stream is held;
// with one swap stream for both, C's copy (and its reader) waited for B's.
TEST_F(MemoryManagerTest, SwapInIntoIdleMemoryDoesNotQueueBehindAHeldSwapOut) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  ASSERT_EQ(mm->EvictAsync(3), CUDA_SUCCESS);
  Settle();  // C's copy done: its chunk is idle once that is seen
  HeldStream held;
  MemsetOn(*mm, 2, b, held.get());
  ASSERT_EQ(mm->EvictAsync(2), CUDA_SUCCESS);  // queued behind the held memset
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  std::vector<uint64_t> got(kWords);
  ClearLog();
  {
    OpenIfStuck guard(held);
    Ids ids = {3};
    ASSERT_CU(mm->Prepare(ids, {}, other));
    CUresult r = cuMemcpyDtoHAsync_v2(got.data(), c, kGranule, other);
    mm->Finish(ids, {}, other, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    ASSERT_CU(cuStreamSynchronize(other));
    EXPECT_FALSE(guard.Done()) << "C's swap-in waited for B's held swap-out";
  }
  EXPECT_THAT(Records(), ElementsAre("swap_in:3:copy"));
  EXPECT_EQ(Mismatch(got, 3), "");
  held.Open();
  ExpectData(*mm, 1, a, 1);
  got = Read(*mm, 2, b);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0xdeadbeefdeadbeefull) << "B, word " << i;
  }
  ExpectData(*mm, 3, c, 3);
  ASSERT_CU(cuStreamDestroy(other));
  FreeAll(*mm, {a, b, c});
}

// The wait for in-flight work happens without the manager's lock: here the
// work waited for (a held stream) is released only after another thread has
// launched through the manager, as with kernels that wait on each other
// across threads. Holding the lock while waiting would deadlock.
TEST_F(MemoryManagerTest, WaitingForWorkDoesNotBlockOtherThreads) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  Ids ida = {1};
  ASSERT_CU(mm->Prepare(ida, {}, held.get()));
  mm->Finish(ida, {}, held.get(), /*submitted=*/true);  // A busy until opened
  Ids others = {2, 3};
  ASSERT_CU(mm->Prepare(others, {}, nullptr));  // A is the only candidate
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Ids idc = {3};
    EXPECT_CU(mm->Prepare(idc, {}, nullptr));  // needs the lock
    mm->Finish(idc, {}, nullptr, /*submitted=*/true);
    held.Open();
  });
  CUdeviceptr d = Alloc(*mm, 4);  // waits for A's use
  other.join();
  mm->Finish(others, {}, nullptr, /*submitted=*/true);
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d});
}

// A swap-in started for one stream orders every other stream that uses the
// buffer before its copy completed.
TEST_F(MemoryManagerTest, SecondStreamWaitsForAnotherStreamsSwapIn) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);  // A is out
  CUstream first, second;
  ASSERT_CU(cuStreamCreate(&first, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&second, CU_STREAM_NON_BLOCKING));
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, first));  // swap-in copy, first waits for it
  mm->Finish(ids, {}, first, /*submitted=*/false);
  ASSERT_CU(mm->Prepare(ids, {}, second));  // resident: second must wait too
  std::vector<uint64_t> got(kWords);
  ASSERT_CU(cuMemcpyDtoHAsync_v2(got.data(), a, kGranule, second));
  mm->Finish(ids, {}, second, /*submitted=*/true);
  ASSERT_CU(cuStreamSynchronize(second));
  EXPECT_EQ(Mismatch(got, 1), "");
  ASSERT_CU(cuStreamDestroy(first));
  ASSERT_CU(cuStreamDestroy(second));
  FreeAll(*mm, {a, b, c, d});
}

// S404 in stream order: garbage still in use is memory becoming free. The
// next allocation of its size takes it over whole (its address and chunks)
// at once, with no host wait and no eviction: that allocation's zeroing
// runs on the swap stream after the freed buffer's last use (here a memset
// held back on its stream), so it reads zeros, not what that memset wrote.
TEST_F(MemoryManagerTest, S404GarbageInUseIsHandedOnInStreamOrder) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());
  ASSERT_EQ(cuStreamQuery(held.get()), CUDA_ERROR_NOT_READY);

  EXPECT_CU(mm->Free(a));
  EXPECT_TRUE(mm->Owns(a));                          // deferred: still held
  EXPECT_EQ(mm->Free(a), CUDA_ERROR_INVALID_VALUE);  // freed twice
  EXPECT_EQ(Used(), kCap);  // still charged, on the device and under the cap
  EXPECT_EQ(mm->stats().garbage_released, 0u);

  ClearLog();
  CUdeviceptr d = Alloc(*mm, 4);
  ASSERT_NE(d, 0u);
  // B, the least recently used, was not touched, and nothing was waited for.
  EXPECT_THAT(Records(), IsEmpty());
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.swap_outs_copied, 0u);
  EXPECT_EQ(stats.clean_drops, 0u);
  EXPECT_EQ(stats.host_wait_seconds, 0.0);
  EXPECT_EQ(Used(), kCap);
  held.Open();
  std::vector<uint64_t> got = Read(*mm, 4, d);
  EXPECT_EQ(std::count(got.begin(), got.end(), uint64_t{0}),
            static_cast<std::ptrdiff_t>(got.size()));  // zeros: after a's memset
  EXPECT_EQ(FreeBytes(*mm), 0u);
  EXPECT_EQ(d, a);
  EXPECT_EQ(mm->stats().garbage_taken_over, 1u);
  EXPECT_EQ(mm->stats().garbage_released, 0u);
  EXPECT_LE(Peak(), kCap);
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, c, 3);
  EXPECT_THAT(Records(), IsEmpty());  // both resident

  FreeAll(*mm, {b, c, d});
}

// S404 without waiting: garbage whose work has completed (and garbage freed
// while pinned, between Prepare and Finish) serves the next need for room
// (released, or taken over whole by an allocation of its size) with no
// wait and no eviction.
TEST_F(MemoryManagerTest, S404CompletedGarbageIsReleasedWithoutWaiting) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());
  EXPECT_CU(mm->Free(a));
  EXPECT_TRUE(mm->Owns(a));
  held.Open();
  ASSERT_CU(cuStreamSynchronize(held.get()));

  ClearLog();
  CUdeviceptr d = Alloc(*mm, 4);
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(mm->stats().garbage_released + mm->stats().garbage_taken_over, 1u);
  EXPECT_EQ(mm->stats().swap_outs_copied, 0u);
  if (d != a) {  // D may reuse A's address
    EXPECT_FALSE(mm->Owns(a));
  }
  Write(*mm, 4, d, 4);

  // Freed while pinned: deferred until Finish, released at the next need.
  Ids pin = {2};
  ASSERT_CU(mm->Prepare(pin, {}, nullptr));
  EXPECT_CU(mm->Free(b));
  EXPECT_TRUE(mm->Owns(b));
  mm->Finish(pin, {}, nullptr, /*submitted=*/true);
  Settle();
  CUdeviceptr e = Alloc(*mm, 5);
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(mm->stats().garbage_released + mm->stats().garbage_taken_over, 2u);
  EXPECT_EQ(mm->stats().swap_outs_copied, 0u);
  if (e != b) {
    EXPECT_FALSE(mm->Owns(b));
  }
  EXPECT_LE(Peak(), kCap);

  ExpectData(*mm, 3, c, 3);
  FreeAll(*mm, {c, d, e});
}

// --- Pinned buffers and out of memory ----------------------------------------

// Buffers between Prepare and Finish are never evicted, even when least
// recently used; when only pinned buffers remain, Allocate fails with
// CUDA_ERROR_OUT_OF_MEMORY and logs an oom record.
// Another thread's operation holds every buffer while it is prepared and
// submitted: an allocation waits for it to finish, then evicts, instead of
// refusing what fits once that operation is done. (Pins of the allocating
// thread's own operation are never waited for: the test above.)
TEST_F(MemoryManagerTest, AllocationWaitsForAnotherThreadsOperation) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  Ids pin_all = {1, 2, 3};
  std::atomic<bool> pinned{false};
  std::thread op([&] {
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(mm->Prepare(pin_all, {}, nullptr), CUDA_SUCCESS);
    pinned = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mm->Finish(pin_all, {}, nullptr, /*submitted=*/true);
  });
  while (!pinned) std::this_thread::yield();
  CUdeviceptr d = 0;
  EXPECT_EQ(mm->Allocate(kGranule, &d, kUntracked), CUDA_SUCCESS);
  op.join();
  EXPECT_EQ(mm->stats().ooms, 0u);
  EXPECT_GE(mm->stats().swap_outs_copied, 1u);
  if (d != 0) {
    EXPECT_CU(mm->Free(d));
  }
  Settle();
}

TEST_F(MemoryManagerTest, PinnedBuffersAreNeverEvictedOomWhenNothingIsLeft) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  Ids pin_a = {1};
  ASSERT_CU(mm->Prepare(pin_a, {}, nullptr));
  CUdeviceptr d = Alloc(*mm, 4);
  EXPECT_THAT(Records(), ElementsAre("swap_out:2"));  // not A
  mm->Finish(pin_a, {}, nullptr, /*submitted=*/true);
  Write(*mm, 4, d, 4);

  Ids pin_all = {1, 3, 4};
  ASSERT_CU(mm->Prepare(pin_all, {}, nullptr));
  size_t used = Used();
  ClearLog();
  CUdeviceptr e = 0;
  uint64_t ooms = 0;
  if (HostVmm()) {
    // No room on the device: born in host memory (served from there), not
    // refused; nothing charged.
    ASSERT_CU(mm->Allocate(kGranule, &e, kUntracked));
    EXPECT_NE(e, 0u);
    EXPECT_THAT(Lines(), ElementsAre(R"({"type":"alloc_host","bytes":2097152,)"
                                     R"("device":0,"cap":6291456})"));
    EXPECT_CU(mm->Free(e));
    e = 0;
  } else {
    EXPECT_EQ(mm->Allocate(kGranule, &e, kUntracked), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(e, 0u);
    EXPECT_THAT(Lines(), ElementsAre(R"({"type":"oom","device":0,)"
                                     R"("bytes":2097152,"used":6291456,)"
                                     R"("cap":6291456})"));
    ooms = 1;
  }
  EXPECT_EQ(mm->stats().ooms, ooms);
  EXPECT_EQ(mm->stats().swap_outs_copied, 1u);
  EXPECT_EQ(Used(), used);
  // A small allocation likewise: a granule born in host memory, or refused.
  if (HostVmm()) {
    ASSERT_CU(mm->Allocate(1000, &e, kUntracked));
    EXPECT_CU(mm->Free(e));
    e = 0;
    EXPECT_EQ(mm->stats().ooms, ooms);
  } else {
    EXPECT_EQ(mm->Allocate(1000, &e, kUntracked), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(mm->stats().ooms, ooms + 1);
  }
  EXPECT_EQ(Used(), used);
  mm->Finish(pin_all, {}, nullptr, /*submitted=*/true);
  Settle();

  // Unpinned, they are candidates again (equal last use: lowest id first).
  ClearLog();
  e = Alloc(*mm, 5);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_LE(Peak(), kCap);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c, d, e});
}

// The device itself full below the cap (cuMemCreate out of memory once):
// Allocate evicts the least recently used buffer (S405) and retries.
TEST_F(MemoryManagerTest, DeviceFullBelowTheCapEvictsAndRetries) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  CUdeviceptr b = Alloc(*mm, 2);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  EXPECT_EQ(FreeBytes(*mm), kGranule);
  fakecuda_fail_call("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr c = Alloc(*mm, 3);
  EXPECT_NE(c, 0u);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(mm->stats().ooms, 0u);
  EXPECT_EQ(Held(*mm), 2 * kGranule);
  EXPECT_EQ(FreeBytes(*mm), kGranule);
  Write(*mm, 3, c, 3);
  ExpectData(*mm, 1, a, 1);  // room under the cap: nothing else moves
  EXPECT_THAT(Records(), ElementsAre("swap_out:1", "swap_in:1:copy"));
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c});
}

// --- Swap-in without a copy, host copies -------------------------------------

// A swapped-out buffer about to be overwritten whole comes back without its
// old contents being copied in.
TEST_F(MemoryManagerTest, OverwrittenBufferComesBackWithoutCopy) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ClearLog();
  Write(*mm, 1, a, 21, kGranule, /*overwritten=*/true);
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1:nocopy"));
  EXPECT_EQ(Lines().back(), R"({"type":"swap_in","id":1,"bytes":2097152,)"
                            R"("copy":false,"device":0})");
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.swap_ins_without_copy, 1u);
  EXPECT_EQ(stats.swap_ins, 0u);
  EXPECT_EQ(stats.bytes_copied_in, 0u);
  ExpectData(*mm, 1, a, 21);
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 4, d, 4);
  FreeAll(*mm, {a, b, c, d});
}

// The overwrite belongs to the operation it was brought in for. Another
// thread's operation holding the buffer between that one's copy and its
// Finish (a launch ordered after the copy by the program's events) may have
// to let go and try again (no room while the first holds the rest) or not
// be submitted: neither puts the old contents back over the new ones, nor
// ends the first one's claim (whose own failure still restores them).
TEST_F(MemoryManagerTest, AnotherOperationLeavesAPendingOverwriteAlone) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  const Ids one = {1}, mine = {1, 3, 4};
  for (bool retries : {true, false}) {
    SCOPED_TRACE(retries ? "the other lets go and retries" : "the other is not submitted");
    const uint64_t seed = retries ? 31 : 32;
    ASSERT_CU(mm->Prepare(mine, one, nullptr));  // 2 goes out, 1 comes in without a copy
    std::vector<uint64_t> data = Pattern(seed);
    ASSERT_CU(cuMemcpyHtoD_v2(a, data.data(), kGranule));  // landed, not yet Finished
    std::thread other([&] {
      ASSERT_CU(cuCtxSetCurrent(ctx_));
      // With 1, 3 and 4 held there is no room for 2: refused until the
      // wait for them ends, then 2 is served from its host copy.
      const Ids ids = retries ? Ids{1, 2} : one;
      ASSERT_CU(mm->Prepare(ids, {}, nullptr));
      mm->Finish(ids, {}, nullptr, /*submitted=*/retries);
    });
    other.join();
    // Each try the other let go of found no room, but none was refused.
    EXPECT_EQ(mm->stats().ooms, 0u);
    mm->Finish(mine, one, nullptr, /*submitted=*/true);
    Settle();
    ExpectData(*mm, 1, a, seed);
    Write(*mm, 2, b, 2);
    Write(*mm, 3, c, 3);
    Write(*mm, 4, d, 4);  // 1 out again, holding `seed`
  }
  // Its own operation not submitted: the host copy's contents come back.
  ASSERT_CU(mm->Prepare(one, one, nullptr));
  mm->Finish(one, one, nullptr, /*submitted=*/false);
  Settle();
  ExpectData(*mm, 1, a, 32);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c, d});
}

// A device-to-host copy from a swapped-out buffer is served from its host
// copy, without a swap-in; a resident buffer is refused.
TEST_F(MemoryManagerTest, ReadFromHostCopyServesSwappedOutBuffersOnly) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ClearLog();
  std::vector<uint64_t> got(kWords);
  EXPECT_TRUE(mm->ReadFromHostCopy(1, 0, got.data(), kGranule));
  EXPECT_EQ(Mismatch(got, 1), "");
  uint64_t words[4] = {};
  EXPECT_TRUE(mm->ReadFromHostCopy(1, 8 * 1000, words, sizeof(words)));
  std::vector<uint64_t> want = Pattern(1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(words[i], want[1000 + i]);
  EXPECT_FALSE(mm->ReadFromHostCopy(1, kGranule - 8, words, 16));   // past end
  EXPECT_FALSE(mm->ReadFromHostCopy(1, 8, words, UINT64_MAX - 4));  // wraps past end
  EXPECT_FALSE(mm->ReadFromHostCopy(1, UINT64_MAX, words, 2));
  EXPECT_FALSE(mm->ReadFromHostCopy(2, 0, words, 8));   // resident
  EXPECT_FALSE(mm->ReadFromHostCopy(99, 0, words, 8));  // unknown
  EXPECT_EQ(mm->stats().reads_served_from_host, 2u);
  EXPECT_EQ(mm->stats().swap_ins, 0u);
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(FreeBytes(*mm), 0u);
  FreeAll(*mm, {a, b, c, d});
}

// Freeing a swapped-out buffer transfers nothing and releases its address
// and host copy. (Its device memory went at the swap-out: the fake's use
// dropped then, and stays where it is at the free.)
TEST_F(MemoryManagerTest, FreeOfSwappedOutBufferReleasesWithoutTransfer) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  fakecuda_reset_peak_bytes(0);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  EXPECT_EQ(Used(), kCap);  // B, C, D: A's device memory is gone
  EXPECT_LE(Peak(), kCap);

  // The host copy is what A's address maps now.
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(a)));
  EXPECT_CU(cuMemRelease(h));

  SwapStats before = mm->stats();
  ClearLog();
  Settle();
  EXPECT_CU(mm->Free(a));
  EXPECT_FALSE(mm->Owns(a));
  SwapStats after = mm->stats();
  EXPECT_EQ(after.swap_outs_copied, before.swap_outs_copied);
  EXPECT_EQ(after.bytes_copied_out, before.bytes_copied_out);
  EXPECT_EQ(after.swap_ins, before.swap_ins);
  EXPECT_EQ(after.bytes_copied_in, before.bytes_copied_in);
  EXPECT_EQ(after.swap_ins_without_copy, before.swap_ins_without_copy);
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(Used(), kCap);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  uint64_t word = 0;
  EXPECT_FALSE(mm->ReadFromHostCopy(1, 0, &word, sizeof(word)));
  EXPECT_NE(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(a)), CUDA_SUCCESS);

  FreeAll(*mm, {b, c, d});
  EXPECT_EQ(Held(*mm), 0u);
}

// Never fault: with host-located VMM (the fake's default), a swapped-out
// buffer's address is mapped onto its host copy, so memory reached through
// a pointer stensor cannot see still reads the buffer's data. (With
// FAKECUDA_HOST_VMM=0 the address is unmapped and this read would fault, so
// that case is not run in-process.)
TEST_F(MemoryManagerTest, SwappedOutAddressReadsTheHostCopy) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  // Such a read is work of unknown accesses (a kernel stensor cannot see
  // into), bracketed as the tracker brackets it: by then the address shows
  // the host copy, not the device memory A's swap-out handed on to D.
  int device = mm->BeginUnknown(nullptr);
  std::vector<uint64_t> want = Pattern(1);
  const volatile uint64_t* words = reinterpret_cast<const volatile uint64_t*>(a);
  EXPECT_EQ(words[0], want[0]);
  EXPECT_EQ(words[12345], want[12345]);
  EXPECT_EQ(words[kWords - 1], want[kWords - 1]);
  // The driver sees a mapped range there too.
  uint64_t word = 0;
  EXPECT_CU(cuMemcpyDtoH_v2(&word, a + 8 * 777, sizeof(word)));
  EXPECT_EQ(word, want[777]);
  mm->MarkAllWritten(nullptr);
  mm->EndUnknown(device);
  EXPECT_EQ(mm->stats().swap_ins, 0u);
  FreeAll(*mm, {a, b, c, d});
}

// --- Threads -----------------------------------------------------------------

// Four threads allocate, write, read back and free their own buffers under
// one shared cap of four granules, two buffers each, so buffers are swapped
// all the time. Each thread pins one buffer at a time, so three pinned
// granules at most leave one to evict: no allocation may fail. Every read
// must return the thread's last write, and the fake never holds more than
// the cap. Each buffer has its id from its allocation on (registered under
// the manager's lock, as in Tracker::AllocateCapped), so no other thread
// ever sees one without it.
TEST_F(MemoryManagerTest, ThreadsShareOneCapKeepingTheirData) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 300;
  constexpr uint64_t kSharedCap = 4 * kGranule;
  auto mm = Make("8MiB");
  ASSERT_NE(mm, nullptr);
  fakecuda_reset_peak_bytes(0);
  std::atomic<uint64_t> next_id{100};
  std::atomic<int> failures{0};
  Mutex first_mu;
  std::string first_failure;
  auto fail = [&](std::string what) {
    if (failures.fetch_add(1) == 0) {
      MutexLock lock(&first_mu);
      first_failure = std::move(what);
    }
  };

  auto worker = [&](int t) {
    if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return fail("cuCtxSetCurrent");
    struct Slot {
      uint64_t id = 0;
      CUdeviceptr p = 0;
      uint64_t seed = 0;
    };
    Slot slots[2];
    std::vector<uint64_t> host(kWords);
    auto check = [&](const Slot& s) {
      Ids ids = {s.id};
      CUresult r = mm->Prepare(ids, {}, nullptr);
      if (r != CUDA_SUCCESS) return fail(absl::StrCat("Prepare: ", r));
      r = cuMemcpyDtoH_v2(host.data(), s.p, kGranule);
      mm->Finish(ids, {}, nullptr, r == CUDA_SUCCESS);
      if (r != CUDA_SUCCESS) return fail(absl::StrCat("DtoH: ", r));
      if (std::string m = Mismatch(host, s.seed); !m.empty()) {
        fail(absl::StrCat("thread ", t, " buffer ", s.id, ": ", m));
      }
    };
    for (int it = 0; it < kIterations; ++it) {
      Slot& s = slots[it % 2];
      if (s.p != 0) {
        check(s);
        if (it % 3 == 0) {
          if (mm->Free(s.p) != CUDA_SUCCESS) fail("Free");
          s = Slot{};
        }
      }
      if (s.p == 0) {
        const uint64_t id = next_id.fetch_add(1);
        CUresult r = mm->Allocate(kGranule, &s.p, [id](CUdeviceptr) { return id; });
        if (r != CUDA_SUCCESS) {
          s.p = 0;
          fail(absl::StrCat("Allocate: ", r));
          continue;
        }
        s.id = id;
      }
      s.seed = (uint64_t{1} + t) * 100000 + it;
      host = Pattern(s.seed);
      Ids ids = {s.id};
      bool whole = it % 4 < 2;  // half the writes say "overwritten"
      CUresult r = mm->Prepare(ids, whole ? ids : Ids{}, nullptr);
      if (r != CUDA_SUCCESS) {
        fail(absl::StrCat("Prepare for write: ", r));
        continue;
      }
      r = cuMemcpyHtoD_v2(s.p, host.data(), kGranule);
      mm->Finish(ids, ids, nullptr, r == CUDA_SUCCESS);
      if (r != CUDA_SUCCESS) fail(absl::StrCat("HtoD: ", r));
    }
    for (Slot& s : slots) {
      if (s.p == 0) continue;
      check(s);
      cuCtxSynchronize();  // the last use completed: freed at once
      if (mm->Free(s.p) != CUDA_SUCCESS) fail("final Free");
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();

  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_LE(Peak(), kSharedCap);
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.ooms, 0u);
  EXPECT_GT(stats.swap_outs_copied, 0u);
  EXPECT_GT(stats.swap_ins, 0u);
  EXPECT_LE(stats.peak_resident_bytes, kSharedCap);
  // Frees deferred mid-run are garbage until something needs room.
  ReleaseGarbage(*mm, kSharedCap);
  EXPECT_EQ(mm->stats().swap_outs_copied, stats.swap_outs_copied);
  EXPECT_EQ(Held(*mm), 0u);
}

// --- Failure paths (regressions) ---------------------------------------------
//
// Each test below failed before the fix of the bug its comment describes;
// the comment says what went wrong, and the test checks it no longer does.

// Was: SwapIn mapped device memory and charged it, then returned when the
// copy from the host copy failed, leaving the buffer
// "resident" (device_handle set) with uninitialised memory while its
// location still said cpu-only. The next Prepare saw it resident and did
// not swap it in again, so the application read zeros: its data was lost
// (and the next eviction copied the zeros over the host copy).
TEST_F(MemoryManagerTest, FailedSwapInCopyKeepsTheDataSwappedOut) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  FreeAll(*mm, {d});  // room: the swap-in evicts nothing
  fakecuda_fail_call("cuMemcpyDtoDAsync_v2", 1, CUDA_ERROR_LAUNCH_FAILED);
  Ids ids = {1};
  EXPECT_NE(mm->Prepare(ids, {}, nullptr), CUDA_SUCCESS);
  fakecuda_clear_failures();
  uint64_t word = 0;
  EXPECT_TRUE(mm->ReadFromHostCopy(1, 0, &word, sizeof(word)))
      << "after a failed swap-in the buffer should still be swapped out";
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c});
}

// A buffer served from its host copy to work still in flight is served to
// the next operation too: bringing it in would remap its address under that
// work, so it would wait for it on the host, even with room to make. Once
// that work is done it comes in, every byte its own.
TEST_F(MemoryManagerTest, ABufferServedToWorkInFlightIsServedAgainWithoutAHostWait) {
  if (!HostVmm()) GTEST_SKIP() << "no host-located VMM";
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  // B, C and D held by an operation: A, written on a held stream, is
  // served from its host copy, the write in flight through it.
  CUdeviceptr a, b, c, d;
  ASSERT_NO_FATAL_FAILURE(HoldAllButSwappedOutA(*mm, &a, &b, &c, &d));
  const Ids& others = kOthers;
  const Ids& ids = kServed;
  HeldStream stream;
  ASSERT_CU(mm->Prepare(ids, {}, stream.get()));
  EXPECT_EQ(mm->stats().served_from_host, 1u);
  CUresult r = cuMemsetD32Async(a, 0x5eed, kGranule / 4, stream.get());
  mm->Finish(ids, ids, stream.get(), r == CUDA_SUCCESS);
  ASSERT_CU(r);
  mm->Finish(others, {}, nullptr, /*submitted=*/true);  // room can be made now
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  OpenIfStuck opener(stream);
  ASSERT_CU(mm->Prepare(ids, {}, other));
  EXPECT_FALSE(opener.Done()) << "the host waited for the work in flight";
  EXPECT_EQ(mm->stats().served_from_host, 2u);
  mm->Finish(ids, {}, other, /*submitted=*/true);
  stream.Open();
  ASSERT_CU(cuStreamSynchronize(stream.get()));
  ASSERT_CU(cuStreamSynchronize(other));
  ASSERT_CU(cuStreamDestroy_v2(other));
  // Idle now: brought in, holding what the served write wrote.
  std::vector<uint32_t> words(kGranule / 4);
  ASSERT_CU(mm->Prepare(ids, {}, nullptr));
  EXPECT_EQ(mm->stats().served_from_host, 2u);
  ASSERT_CU(cuMemcpyDtoH_v2(words.data(), a, kGranule));
  mm->Finish(ids, {}, nullptr, /*submitted=*/true);
  EXPECT_TRUE(std::all_of(words.begin(), words.end(), [](uint32_t w) { return w == 0x5eed; }));
  FreeAll(*mm, {a, b, c, d});
}

// Was: an operation that failed unwound every buffer it had pinned as if
// it had served it, so a buffer another operation was serving (between its
// Prepare and its Finish) lost that count when the failure came from a
// buffer listed before it; the next operation then brought it in, remapping
// its address under the work still reaching its host copy.
TEST_F(MemoryManagerTest, AFailedOperationLeavesAnotherOperationsServingAlone) {
  if (!HostVmm()) GTEST_SKIP() << "no host-located VMM";
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  // A served to an operation that has not finished (B, C and D held).
  CUdeviceptr a, b, c, d;
  ASSERT_NO_FATAL_FAILURE(HoldAllButSwappedOutA(*mm, &a, &b, &c, &d));
  const Ids& served = kServed;
  ASSERT_CU(mm->Prepare(served, {}, nullptr));
  ASSERT_EQ(mm->stats().served_from_host, 1u);
  mm->Finish(kOthers, {}, nullptr, /*submitted=*/true);
  // E swaps B out: B's next swap-in copies, and that copy fails.
  ClearLog();
  CUdeviceptr e = Alloc(*mm, 5);
  ASSERT_THAT(Records(), ElementsAre("swap_out:2"));
  fakecuda_fail_call("cuMemcpyDtoDAsync_v2", 1, CUDA_ERROR_LAUNCH_FAILED);
  Ids failing = {2, 1};
  EXPECT_EQ(mm->Prepare(failing, {}, nullptr), CUDA_ERROR_LAUNCH_FAILED);
  fakecuda_clear_failures();
  // A is still served to the first operation: the next one is served too.
  const uint64_t swap_ins = mm->stats().swap_ins;
  ASSERT_CU(mm->Prepare(served, {}, nullptr));
  EXPECT_EQ(mm->stats().served_from_host, 2u);
  EXPECT_EQ(mm->stats().swap_ins, swap_ins) << "A was brought in while served";
  mm->Finish(served, {}, nullptr, /*submitted=*/true);
  mm->Finish(served, {}, nullptr, /*submitted=*/true);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c, d, e});
}

// Was: an operation on another thread waited, without the lock, in a
// buffer's swap-in (for work of unknown accesses, then for the buffer's
// last use through its host copy); meanwhile a first operation was served
// that buffer, and the swap-in, finding it served, gave up: the launch
// failed with CUDA_ERROR_NOT_READY. It is served too, like any operation
// reaching a buffer another one is being served.
TEST_F(MemoryManagerTest, ASwapInFindingTheBufferServedMeanwhileServesItToo) {
  if (!HostVmm()) GTEST_SKIP() << "no host-located VMM";
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  ASSERT_NO_FATAL_FAILURE(HoldAllButSwappedOutA(*mm, &a, &b, &c, &d));
  // A served to an operation on a held stream: swapped out, in use there.
  HeldStream a_user;
  ASSERT_CU(mm->Prepare(kServed, {}, a_user.get()));
  mm->Finish(kServed, {}, a_user.get(), /*submitted=*/true);
  mm->Finish(kOthers, {}, nullptr, /*submitted=*/true);
  ASSERT_EQ(mm->stats().served_from_host, 1u);
  ClearLog();
  CUdeviceptr e = Alloc(*mm, 5);  // B out
  ASSERT_THAT(Records(), ElementsAre("swap_out:2"));
  HeldStream unknown;
  mm->MarkAllWritten(unknown.get());  // a kernel of unknown accesses, queued
  CUstream first_stream, second_stream;
  ASSERT_CU(cuStreamCreate(&first_stream, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&second_stream, CU_STREAM_NON_BLOCKING));
  // The first operation (B, then A) waits in B's swap-in for the unknown
  // work; the second (A alone), started meanwhile, may not serve A (the
  // first holds buffers) and waits in A's swap-in.
  const Ids first_ids = {2, 1};
  std::atomic<CUresult> first{CUDA_ERROR_UNKNOWN};
  std::thread first_thread([&] { first = mm->Prepare(first_ids, {}, first_stream); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::atomic<CUresult> second{CUDA_ERROR_UNKNOWN};
  std::thread second_thread([&] { second = mm->Prepare(kServed, {}, second_stream); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The first brings B in and is served A (still in use through its host
  // copy); the second waits for that use.
  unknown.Open();
  first_thread.join();
  ASSERT_CU(first.load());
  a_user.Open();
  second_thread.join();
  // (A second thread scheduled only after the first was served A is
  // served A on arrival: the same end, without the race.)
  EXPECT_CU(second.load());
  EXPECT_EQ(mm->stats().served_from_host, 3u);
  mm->Finish(first_ids, {}, first_stream, /*submitted=*/true);
  if (second.load() == CUDA_SUCCESS) mm->Finish(kServed, {}, second_stream, /*submitted=*/true);
  ASSERT_CU(cuStreamDestroy_v2(first_stream));
  ASSERT_CU(cuStreamDestroy_v2(second_stream));
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c, d, e});
}

// A buffer served to an operation that has not finished, exported by
// another thread meanwhile (cuIpcGetMemHandle): the export waits for that
// operation, then brings the buffer in for good. (It failed with
// CUDA_ERROR_NOT_READY.)
TEST_F(MemoryManagerTest, ExportingABufferBeingServedWaitsForItsOperation) {
  if (!HostVmm()) GTEST_SKIP() << "no host-located VMM";
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  ASSERT_NO_FATAL_FAILURE(HoldAllButSwappedOutA(*mm, &a, &b, &c, &d));
  ASSERT_CU(mm->Prepare(kServed, {}, nullptr));
  ASSERT_EQ(mm->stats().served_from_host, 1u);
  mm->Finish(kOthers, {}, nullptr, /*submitted=*/true);
  std::atomic<bool> finished{false};
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished.store(true);
    mm->Finish(kServed, {}, nullptr, /*submitted=*/true);
  });
  CUresult r = CUDA_ERROR_UNKNOWN;
  EXPECT_TRUE(mm->PinExported(a, "cuIpcGetMemHandle", &r));
  EXPECT_TRUE(finished.load()) << "brought in under the operation it was served to";
  finisher.join();
  EXPECT_CU(r);
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d});
}

// A buffer born on the host in a kept host copy is zeroed on the swap
// stream. Served to an operation before that zeroing ran, the operation's
// stream waits for it; when that wait cannot be queued (cuStreamWaitEvent
// fails), the host waits instead: the operation's write lands after the
// zeros, every byte, and the buffer is brought in afterwards (its serving
// ended with the operation).
TEST_F(MemoryManagerTest, AServedBufferWhoseZeroingCannotBeWaitedOnTheDeviceIsWaitedOnTheHost) {
  if (!HostVmm()) GTEST_SKIP() << "no host-located VMM";
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  CUdeviceptr d = Alloc(*mm, 4);  // A out (copied: it was written)
  Write(*mm, 4, d, 4);
  CUdeviceptr e = Alloc(*mm, 5);  // B out
  Write(*mm, 5, e, 5);
  FreeAll(*mm, {a, b});  // their two host copies kept
  HeldStream held;
  MemsetOn(*mm, 3, c, held.get());  // C's last write, held
  for (uint64_t id : {4, 5}) {      // used since (no synchronisation: C's is held)
    Ids touched = {id};
    ASSERT_CU(mm->Prepare(touched, {}, nullptr));
    mm->Finish(touched, {}, nullptr, /*submitted=*/true);
  }
  // X takes C's room: C's swap-out waits behind the held write on the swap
  // stream, and everything after it there waits too.
  CUdeviceptr x = Alloc(*mm, 6);
  Ids resident = {4, 5, 6};
  ASSERT_CU(mm->Prepare(resident, {}, nullptr));
  // No room for Y: born on the host, in the other kept copy, zeroed behind
  // C's swap-out.
  CUdeviceptr y = Alloc(*mm, 7);
  ClearLog();
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    held.Open();
  });
  fakecuda_fail_call("cuStreamWaitEvent", 1, CUDA_ERROR_UNKNOWN);
  Ids ids = {7};
  CUresult r = mm->Prepare(ids, {}, other);
  fakecuda_clear_failures();
  opener.join();
  ASSERT_CU(r);
  EXPECT_EQ(mm->stats().served_from_host, 1u);
  const std::vector<std::string> lines = Lines();
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return Summarize(l) == "swap_wait:7";
  })) << "no host wait for Y's zeroing";
  r = cuMemsetD32Async(y, 0x77777777, kGranule / 8, other);  // its first half
  mm->Finish(ids, ids, other, r == CUDA_SUCCESS);
  ASSERT_CU(r);
  ASSERT_CU(cuStreamSynchronize(other));
  ASSERT_CU(cuStreamDestroy_v2(other));
  mm->Finish(resident, {}, nullptr, /*submitted=*/true);
  // Brought in now: its serving is over.
  const uint64_t swap_ins = mm->stats().swap_ins;
  std::vector<uint32_t> words(kGranule / 4);
  ASSERT_CU(mm->Prepare(ids, {}, nullptr));
  ASSERT_CU(cuMemcpyDtoH_v2(words.data(), y, kGranule));
  mm->Finish(ids, {}, nullptr, /*submitted=*/true);
  EXPECT_GT(mm->stats().swap_ins, swap_ins) << "Y still served";
  for (size_t i = 0; i < words.size(); ++i) {
    ASSERT_EQ(words[i], i < words.size() / 2 ? 0x77777777u : 0u) << "word " << i;
  }
  std::vector<uint32_t> c_words(kGranule / 4);
  Ids c_ids = {3};
  ASSERT_CU(mm->Prepare(c_ids, {}, nullptr));
  ASSERT_CU(cuMemcpyDtoH_v2(c_words.data(), c, kGranule));
  mm->Finish(c_ids, {}, nullptr, /*submitted=*/true);
  EXPECT_TRUE(
      std::all_of(c_words.begin(), c_words.end(), [](uint32_t w) { return w == 0xdeadbeef; }));
  FreeAll(*mm, {c, d, e, x, y});
}

// Was: SwapIn unmapped the host copy from the buffer's address before
// MapDevice; when MapDevice then failed (the device full with nothing
// evictable), the address was left unmapped, so the "never fault" guarantee
// was lost: a kernel reaching the buffer through a pointer would fault. (The fake's copy reports
// the unmapped range as invalid.)
TEST_F(MemoryManagerTest, FailedSwapInKeepsTheHostCopyMappedAtTheAddress) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  FreeAll(*mm, {d});
  // As before an operation of unknown accesses: A's address shows its host
  // copy from now on (not the device memory its swap-out handed on).
  mm->EndUnknown(mm->BeginUnknown(nullptr));
  uint64_t word = 0;
  ASSERT_CU(cuMemcpyDtoH_v2(&word, a, sizeof(word)));  // mapped before
  // D's memory is pooled, so the swap-in creates nothing: its map fails.
  fakecuda_fail_call("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY);
  Ids ids = {1, 2, 3};  // B and C pinned: nothing to evict
  if (HostVmm()) {
    // Not refused: A is served from its host copy at its address.
    EXPECT_CU(mm->Prepare(ids, {}, nullptr));
    EXPECT_EQ(mm->stats().served_from_host, 1u);
    mm->Finish(ids, {}, nullptr, /*submitted=*/true);
  } else {
    EXPECT_EQ(mm->Prepare(ids, {}, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  }
  fakecuda_clear_failures();
  word = 0;
  EXPECT_CU(cuMemcpyDtoH_v2(&word, a, sizeof(word)));
  EXPECT_EQ(word, Pattern(1)[0]);
  ExpectData(*mm, 1, a, 1);  // an explicit swap-in still works
  FreeAll(*mm, {a, b, c});
}

// A map that fails and whose undo fails too leaves memory mapped, which
// cuMemRelease would not free: it stays charged, so the cap still bounds
// what the device really holds, until a later retry unmaps it.
TEST_F(MemoryManagerTest, MemoryLeftMappedByAFailedUndoStaysCharged) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  // A granule in the pool: the next buffer of two maps it and a new chunk.
  CUdeviceptr pooled = 0;
  ASSERT_CU(mm->Allocate(kGranule, &pooled, kUntracked));
  ASSERT_CU(mm->Free(pooled));
  ASSERT_EQ(mm->stats().pooled_bytes, kGranule);
  fakecuda_fail_call("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY);  // the second chunk
  fakecuda_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);      // and its undo
  CUdeviceptr a = 0;
  // Stream-ordered: one buffer, never pieces, so one map takes both chunks.
  const CUstream stream = nullptr;
  EXPECT_EQ(mm->Allocate(2 * kGranule, &a, kUntracked, &stream), CUDA_ERROR_OUT_OF_MEMORY);
  fakecuda_clear_failures();
  EXPECT_GT(Used(), 0u);  // the first chunk is still mapped
  EXPECT_GE(kCap - FreeBytes(*mm), Used());
  // The next time room is made, the mapping is undone and its memory
  // released: nothing is lost for good.
  CUdeviceptr b = 0;
  ASSERT_CU(mm->Allocate(3 * kGranule, &b, kUntracked));
  EXPECT_LE(Used(), kCap);
  EXPECT_CU(mm->Free(b));
}

// Was: Prepare with the buffer in `overwritten` swapped it in without a
// copy and recorded it cpu-gpu with equal versions; when the operation was
// then not submitted, Finish changed nothing, so the buffer counted as
// resident and clean while its device memory held nothing of its data. The
// application's copy failed, yet its buffer read zeros.
TEST_F(MemoryManagerTest, UnsubmittedOverwriteKeepsTheOldData) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  FreeAll(*mm, {d});
  Ids ids = {1};
  ClearLog();
  ASSERT_CU(mm->Prepare(ids, ids, nullptr));
  EXPECT_THAT(Records(), ElementsAre("swap_in:1:nocopy"));
  mm->Finish(ids, ids, nullptr, /*submitted=*/false);  // the copy failed
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c});
}

// Was: Free deferred a buffer whose last use was in flight (S404), but
// nothing released it when that work completed, as the header promises
// ("else when that work completed"): only MakeRoom did, the next time the
// cap was short. Until then MemInfo, which is what cuMemGetInfo returns to
// the application, and the device still counted the freed buffer. Finish
// records the last-use event after the operation, so even a buffer freed
// right after a synchronous copy is usually deferred this way.
TEST_F(MemoryManagerTest, CompletedGarbageIsNotCountedAsUsed) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());
  EXPECT_CU(mm->Free(a));
  EXPECT_EQ(FreeBytes(*mm), 0u);  // in use: still charged
  held.Open();
  ASSERT_CU(cuStreamSynchronize(held.get()));
  EXPECT_EQ(FreeBytes(*mm), kGranule) << "freed, and its work completed";
  EXPECT_EQ(Held(*mm), 2 * kGranule);
  FreeAll(*mm, {b, c});
  ReleaseGarbage(*mm, kCap);
}

// Was: when the device was full below the cap and nothing could be
// evicted, MapDevice returned CUDA_ERROR_OUT_OF_MEMORY to the caller without
// the oom record and stats().ooms count that MakeRoom gives the same outcome
// under the cap, so STENSOR_STATS and the access log missed out-of-memory
// errors the application saw.
TEST_F(MemoryManagerTest, DeviceFullWithNothingToEvictIsLoggedAsOom) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  fakecuda_fail_call("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr p = 0;
  if (HostVmm()) {
    // Born in host memory instead: no refusal, nothing charged.
    ASSERT_CU(mm->Allocate(kGranule, &p, kUntracked));
    EXPECT_THAT(Records(), ElementsAre("alloc_host"));
    EXPECT_EQ(mm->stats().ooms, 0u);
    EXPECT_EQ(Used(), 0u);
    EXPECT_CU(mm->Free(p));
    return;
  }
  EXPECT_EQ(mm->Allocate(kGranule, &p, kUntracked), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(FreeBytes(*mm), kCap);
  EXPECT_THAT(Records(), ElementsAre("oom"));
  EXPECT_EQ(mm->stats().ooms, 1u);
}

// Buffers the registry could not track all have id 0; eviction must still
// pick among the resident ones (once, EvictByPolicy looked the chosen id up
// among all buffers and could "evict" one already swapped out, mapping past
// the cap).
TEST_F(MemoryManagerTest, UnboundBuffersStayUnderTheCap) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  fakecuda_reset_peak_bytes(0);
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 5; ++i) {
    CUdeviceptr p = 0;
    EXPECT_CU(mm->Allocate(kGranule, &p, kUntracked));  // untracked: id 0
    ptrs.push_back(p);
  }
  EXPECT_LE(Peak(), kCap);
  EXPECT_LE(Used(), kCap);
  EXPECT_EQ(kCap - FreeBytes(*mm), Used()) << "the manager's count of use";
  Settle();
  for (CUdeviceptr p : ptrs) EXPECT_CU(mm->Free(p));
}

// --- STENSOR_VERIFY ------------------------------------------------------------

// Managers under a 6 MiB cap with STENSOR_VERIFY=copy and =hash.
class VerifyTest : public MemoryManagerTest, public ::testing::WithParamInterface<const char*> {
 protected:
  std::unique_ptr<MemoryManager> Make() {
    return MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"}, {"STENSOR_VERIFY", GetParam()}});
  }
};

// A write the manager was not told about (as when a kernel writes through a
// pointer it declares const) makes the "clean" buffer differ from its host
// copy: the drop is caught, logged and turned into a copy; the data lives.
TEST_P(VerifyTest, HiddenWriteTurnsACleanDropIntoACopy) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ExpectData(*mm, 1, a, 1);  // B out, A back: A is clean
  std::vector<uint64_t> hidden = Pattern(99);
  ASSERT_CU(cuMemcpyHtoD_v2(a, hidden.data(), kGranule));  // behind its back
  Settle();
  ClearLog();
  ExpectData(*mm, 2, b, 2);  // room for B: A would be dropped as clean
  EXPECT_THAT(Records(), ElementsAre("verify_mismatch:1", "swap_out:1", "swap_in:2:copy"));
  EXPECT_THAT(Lines()[0], testing::HasSubstr(absl::StrCat("\"mode\":\"", GetParam(), "\"")));
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.verify_checks, 1u);
  EXPECT_EQ(stats.verify_mismatches, 1u);
  EXPECT_EQ(stats.verify_errors, 0u);
  EXPECT_EQ(stats.clean_drops, 0u);
  ExpectData(*mm, 1, a, 99);
  EXPECT_THAT(mm->StatsText(), testing::HasSubstr("verify mismatches           1"));
  FreeAll(*mm, {a, b, c, d});
}

// An honest clean drop is checked and goes ahead without a copy.
TEST_P(VerifyTest, MatchingCleanDropGoesAhead) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ExpectData(*mm, 1, a, 1);
  ClearLog();
  ExpectData(*mm, 2, b, 2);
  EXPECT_THAT(Records(), ElementsAre("drop_clean:1", "swap_in:2:copy"));
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.verify_checks, 1u);
  EXPECT_EQ(stats.verify_mismatches, 0u);
  EXPECT_EQ(stats.clean_drops, 1u);
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d});
}

// A check that cannot be made (its device-to-host read fails) is never an
// unchecked drop: the buffer is copied.
TEST_P(VerifyTest, ACheckThatFailsCopiesInstead) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  ExpectData(*mm, 1, a, 1);
  ClearLog();
  // In hash mode the hash's result copy fails, and so does the byte
  // comparison it falls back to.
  fakecuda_fail_call("cuMemcpyDtoHAsync_v2", 1, CUDA_ERROR_UNKNOWN);
  fakecuda_fail_call("cuMemcpyDtoHAsync_v2", 2, CUDA_ERROR_UNKNOWN);
  ExpectData(*mm, 2, b, 2);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1", "swap_in:2:copy"));
  EXPECT_EQ(mm->stats().verify_errors, 1u);
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d});
}

INSTANTIATE_TEST_SUITE_P(Modes, VerifyTest, testing::Values("copy", "hash"));

// --- Never-written buffers ---------------------------------------------------

bool HostVmm() {
  int supported = 0;
  cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
  return supported != 0;
}

// A buffer no operation has written since allocation holds what fresh
// memory holds (zeros on the fake, as cuMemAlloc's): under `version` it is
// evicted and brought back without any copy, counted apart, and still reads
// zeros. A write makes it an ordinary buffer, copied out when evicted.
TEST_F(MemoryManagerTest, NeverWrittenBufferMovesNothing) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  CUdeviceptr b = Alloc(*mm, 2);
  CUdeviceptr c = Alloc(*mm, 3);
  Write(*mm, 2, b, 2);
  Write(*mm, 3, c, 3);
  ClearLog();
  CUdeviceptr d = Alloc(*mm, 4);  // A goes: never written, so first and free
  EXPECT_THAT(Records(), ElementsAre("drop_unwritten:1"));
  SwapStats stats = mm->stats();
  EXPECT_EQ(stats.never_written_drops, 1u);
  EXPECT_EQ(stats.bytes_never_written_dropped, kGranule);
  EXPECT_EQ(stats.bytes_copied_out, 0u);
  EXPECT_EQ(stats.clean_drops, 0u);
  EXPECT_EQ(stats.swap_outs_copied, 0u);
  if (HostVmm()) {
    // Never fault: the address reads a (fresh, zero) host copy meanwhile.
    const volatile uint64_t* words = reinterpret_cast<const volatile uint64_t*>(a);
    EXPECT_EQ(words[0], 0u);
    EXPECT_EQ(words[kWords - 1], 0u);
  }
  Write(*mm, 4, d, 4);

  // Back in without a copy (B, the least recently used, is dirty: copied
  // out to make room).
  ClearLog();
  std::vector<uint64_t> got = Read(*mm, 1, a);
  EXPECT_EQ(got, std::vector<uint64_t>(kWords, 0));
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1:nocopy"));
  stats = mm->stats();
  EXPECT_EQ(stats.swap_ins_never_written, 1u);
  EXPECT_EQ(stats.swap_ins, 0u);
  EXPECT_EQ(stats.bytes_copied_in, 0u);
  EXPECT_EQ(stats.swap_ins_without_copy, 0u);
  EXPECT_NE(mm->StatsText().find("never-written drops"), std::string::npos);
  EXPECT_NE(mm->StatsText().find("swap-ins, never written"), std::string::npos);

  // Reads are not writes: A is still free to drop, and goes first again.
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 4, d, 4);
  ClearLog();
  ExpectData(*mm, 2, b, 2);
  EXPECT_THAT(Records(), ElementsAre("drop_unwritten:1", "swap_in:2:copy"));

  // Written once (a part of it), it is copied out like any other buffer.
  std::vector<uint64_t> want(kWords, 0);
  want[0] = 77;
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, nullptr));
  ASSERT_CU(cuMemcpyHtoD_v2(a, &want[0], sizeof(uint64_t)));
  mm->Finish(ids, ids, nullptr, true);
  FreeAll(*mm, {b, c, d});
  ClearLog();
  CUdeviceptr x = Alloc(*mm, 5);
  Write(*mm, 5, x, 5);
  CUdeviceptr y = Alloc(*mm, 6);
  Write(*mm, 6, y, 6);
  uint64_t copied = mm->stats().bytes_copied_out;
  CUdeviceptr z = Alloc(*mm, 7);  // A, the least recently used, goes
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(mm->stats().bytes_copied_out, copied + kGranule);
  EXPECT_EQ(Read(*mm, 1, a), want);
  FreeAll(*mm, {a, x, y, z});
}

// Under `lru` (no version control) every eviction copies, as documented,
// never-written buffers too; an operation of unknown accesses counts as a
// write, so under `version` a never-written buffer is copied after one.
TEST_F(MemoryManagerTest, NeverWrittenCopiedUnderLruAndAfterUnknownWrites) {
  for (const char* policy : {"lru", "version"}) {
    SCOPED_TRACE(policy);
    auto mm = Make("6MiB", policy);
    ASSERT_NE(mm, nullptr);
    CUdeviceptr a = Alloc(*mm, 1);
    CUdeviceptr b = Alloc(*mm, 2);
    CUdeviceptr c = Alloc(*mm, 3);
    if (std::string(policy) == "version") {
      mm->MarkAllWritten(nullptr);
      Settle();
    }
    ClearLog();
    CUdeviceptr d = Alloc(*mm, 4);
    EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
    EXPECT_EQ(mm->stats().never_written_drops, 0u);
    EXPECT_EQ(mm->stats().bytes_copied_out, kGranule);
    EXPECT_EQ(Read(*mm, 1, a), std::vector<uint64_t>(kWords, 0));
    EXPECT_EQ(mm->stats().swap_ins, 1u);
    FreeAll(*mm, {a, b, c, d});
  }
}

// --- No window without memory ------------------------------------------------

// Work of unknown accesses (MarkAllWritten after a kernel stensor cannot
// describe) still queued on one stream blocks every eviction on the device,
// even after another such operation on another stream completed: each
// stream's last one is waited for. (With one event for the device, the
// second record replaced the first, and A was evicted under the first.)
TEST_F(MemoryManagerTest, NoEvictionUnderPendingUnknownWorkOnAnyStream) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  mm->MarkAllWritten(held.get());  // an unknown kernel, still queued
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  mm->MarkAllWritten(other);  // another, completed
  ASSERT_CU(cuStreamSynchronize(other));
  ClearLog();
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    opened.store(true);
    held.Open();
  });
  CUdeviceptr d = Alloc(*mm, 4);
  EXPECT_TRUE(opened.load()) << "evicted while unknown work was pending";
  opener.join();
  EXPECT_THAT(Records(), ElementsAre("evict_wait:1", "swap_out:1"));
  EXPECT_GE(mm->stats().host_wait_seconds, 0.05);
  ExpectData(*mm, 1, a, 1);
  ASSERT_CU(cuStreamDestroy(other));
  FreeAll(*mm, {a, b, c, d});
}

// Between the submission of an operation of unknown accesses and the
// record of its completion (MarkAllWritten), BeginUnknown holds off every
// eviction of the device: another thread's allocation waits for EndUnknown.
TEST_F(MemoryManagerTest, NoEvictionWhileAnUnknownOperationIsBeingSubmitted) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  const int device = mm->BeginUnknown(nullptr);
  ASSERT_EQ(device, 0);
  ClearLog();
  std::atomic<bool> ended{false};
  std::thread submitter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ended.store(true);
    mm->MarkAllWritten(nullptr);  // its completion, recorded
    mm->EndUnknown(device);
  });
  CUdeviceptr d = Alloc(*mm, 4);
  EXPECT_TRUE(ended.load()) << "evicted while an unknown operation was being submitted";
  submitter.join();
  // Every host copy distrusted: the eviction copies.
  EXPECT_THAT(Records(), ::testing::Contains("swap_out:1"));
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d});
}

struct Reader {
  CUdeviceptr address = 0;
  uint64_t want = 0;
  std::atomic<bool> ok{false};
};

void CUDA_CB ReadThroughAddress(void* arg) {
  auto* r = static_cast<Reader*>(arg);
  r->ok.store(*reinterpret_cast<const volatile uint64_t*>(r->address) == r->want);
}

// With host-located VMM, a swapped-out buffer's address maps its host copy,
// and a kernel of unknown accesses may read it there: a swap-in waits for
// such work before it takes the host copy off the address (here the
// "kernel" is a host function behind a gate reading the address; had the
// address been unmapped under it, it would fault).
TEST_F(MemoryManagerTest, HostVmmSwapInWaitsForUnknownWorkBeforeUnmapping) {
  if (!HostVmm()) GTEST_SKIP() << "the address is unmapped while swapped out";
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  FreeAll(*mm, {d});  // room: the swap-in evicts nothing
  HeldStream held;
  Reader reader;
  reader.address = a + 8 * 5;
  reader.want = Pattern(1)[5];
  ASSERT_CU(cuLaunchHostFunc(held.get(), &ReadThroughAddress, &reader));
  mm->MarkAllWritten(held.get());
  ClearLog();
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    opened.store(true);
    held.Open();
  });
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, nullptr));
  EXPECT_TRUE(opened.load()) << "host copy unmapped while unknown work was pending";
  mm->Finish(ids, {}, nullptr, true);
  opener.join();
  ASSERT_CU(cuStreamSynchronize(held.get()));
  EXPECT_TRUE(reader.ok.load());
  EXPECT_THAT(Records(), ElementsAre("unknown_wait:1", "swap_in:1:copy"));
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c});
}

// --- Driver failures, one at a time -----------------------------------------

// A cuMemUnmap that fails while A is swapped out (the only candidate) leaves
// A resident and usable: the allocation gets the driver's error, and a
// retry works. The copy made before the unmap was committed consistently:
// A is clean now, so the retry drops it without copying again.
TEST_F(MemoryManagerTest, FailedUnmapLeavesTheBufferUsableAndARetryWorks) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c, d;
  FillAndSwapOutA(*mm, &a, &b, &c, &d);
  FreeAll(*mm, {d});
  ExpectData(*mm, 1, a, 1);  // back in, clean: its next eviction is a drop
  Ids others = {2, 3};
  ASSERT_CU(mm->Prepare(others, {}, nullptr));  // B and C pinned
  ClearLog();
  SwapStats before = mm->stats();
  fakecuda_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  d = 0;
  EXPECT_EQ(mm->Allocate(kGranule, &d, kUntracked), CUDA_ERROR_UNKNOWN);
  fakecuda_clear_failures();
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(mm->stats().swap_outs_copied, before.swap_outs_copied);
  EXPECT_EQ(mm->stats().driver_errors, before.driver_errors + 1);
  EXPECT_EQ(Held(*mm), kCap);
  ExpectData(*mm, 1, a, 1);  // resident, intact
  ClearLog();
  d = Alloc(*mm, 4);
  EXPECT_THAT(Records(), ElementsAre("drop_clean:1"));
  EXPECT_EQ(mm->stats().swap_outs_copied, before.swap_outs_copied);
  mm->Finish(others, {}, nullptr, true);
  Write(*mm, 4, d, 4);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, c, 3);
  FreeAll(*mm, {a, b, c, d});
}

// A swap-out queued behind work still in flight keeps the buffer's address
// mapped until its copy is done; an unmap of that old mapping that fails is
// retried at a later call, and the data stays right throughout.
TEST_F(MemoryManagerTest, FailedUnmapOfAnOldMappingIsRetried) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  HeldStream held;
  MemsetOn(*mm, 1, a, held.get());  // A's last write, held back
  CUdeviceptr d = Alloc(*mm, 4);    // A's swap-out queued behind it
  EXPECT_EQ(mm->stats().async_evictions, 1u);
  held.Open();
  Settle();
  ASSERT_CU(cuStreamSynchronize(held.get()));
  SwapStats before = mm->stats();
  fakecuda_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  Write(*mm, 4, d, 4);  // Prepare ends old mappings: this unmap fails
  fakecuda_clear_failures();
  EXPECT_EQ(mm->stats().driver_errors, before.driver_errors + 1);
  Write(*mm, 3, c, 3);  // ... and this one retries it
  std::vector<uint64_t> got = Read(*mm, 1, a);
  for (size_t i = 0; i < kWords; ++i) {
    ASSERT_EQ(got[i], 0xdeadbeefdeadbeefull) << "word " << i;
  }
  ExpectData(*mm, 4, d, 4);
  ExpectData(*mm, 3, c, 3);
  ExpectData(*mm, 2, b, 2);
  FreeAll(*mm, {a, b, c, d});
}

// An event query that fails is no observation: the buffer is not known
// idle, so its swap-out is ordered after its use on the device and its
// address kept mapped, instead of taking the error for "complete".
TEST_F(MemoryManagerTest, FailedEventQueryIsNotTakenForIdle) {
  auto mm = Make("6MiB");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  ClearLog();
  for (int nth = 1; nth <= 20; ++nth) {
    fakecuda_fail_call("cuEventQuery", nth, CUDA_ERROR_UNKNOWN);
  }
  CUdeviceptr d = Alloc(*mm, 4);
  fakecuda_clear_failures();
  // Not taken for idle: queued behind the use's event on the swap stream,
  // its device memory unmapped only once the copy is seen done.
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(mm->stats().async_evictions, 1u);
  Write(*mm, 4, d, 4);
  ExpectData(*mm, 1, a, 1);
  FreeAll(*mm, {a, b, c, d});
}

// --- Fault sweeps -------------------------------------------------------------
//
// A short program of writes, partial memsets on a second stream, reads,
// operations of unknown accesses, a free and a new allocation, under a cap
// of three granules for five buffers, so that buffers are swapped all the
// time. Each driver call the swap path makes is failed at each of its first
// occurrences in turn; every byte of every buffer is then checked against a
// host reference, and the codes the program saw are asserted: none where
// stensor can work around the failure, else only the injected error or
// CUDA_ERROR_OUT_OF_MEMORY. Run with host-located VMM (memory_manager_test)
// and without (memory_manager_no_host_vmm_test).

struct ProgramOutcome {
  std::vector<CUresult> errors;  // what the program's calls returned, if not success
  std::string mismatch;          // the first data mismatch, "" if none
  SwapStats stats;
};

class FaultSweepTest : public MemoryManagerTest {
 protected:
  static constexpr int kBuffers = 5;  // the last one is never written

  ProgramOutcome Run(const std::string& policy, const char* fail = nullptr, int nth = 0,
                     CUresult injected = CUDA_ERROR_UNKNOWN) {
    ProgramOutcome out;
    auto mm = Make("6MiB", policy);
    if (mm == nullptr) return out;
    CUstream side = nullptr;
    EXPECT_CU(cuStreamCreate(&side, CU_STREAM_DEFAULT));  // ordered with the legacy stream
    CUdeviceptr p[kBuffers] = {};
    uint64_t id[kBuffers] = {};
    std::vector<std::vector<uint64_t>> ref(kBuffers, std::vector<uint64_t>(kWords, 0));
    uint64_t next_id = 1;
    for (int i = 0; i < kBuffers; ++i) {
      id[i] = next_id++;
      p[i] = Alloc(*mm, id[i]);
    }
    auto seen = [&](CUresult r) {
      if (r != CUDA_SUCCESS) out.errors.push_back(r);
    };
    auto mismatch = [&](int i, const std::vector<uint64_t>& got) {
      if (!out.mismatch.empty()) return;
      for (size_t w = 0; w < kWords; ++w) {
        if (got[w] != ref[i][w]) {
          out.mismatch =
              absl::StrCat("buffer ", i, " word ", w, ": got ", got[w], ", want ", ref[i][w]);
          return;
        }
      }
    };
    auto write = [&](int i, uint64_t seed, bool whole) {
      if (p[i] == 0) return;
      std::vector<uint64_t> data = Pattern(seed);
      Ids ids = {id[i]};
      CUresult r = mm->Prepare(ids, whole ? ids : Ids{}, nullptr);
      if (r == CUDA_SUCCESS) {
        r = cuMemcpyHtoD_v2(p[i], data.data(), kGranule);
        mm->Finish(ids, ids, nullptr, r == CUDA_SUCCESS);
        if (r == CUDA_SUCCESS) ref[i] = std::move(data);
      }
      seen(r);
    };
    auto memset_part = [&](int i, uint32_t value) {  // the first eighth, on `side`
      if (p[i] == 0) return;
      Ids ids = {id[i]};
      CUresult r = mm->Prepare(ids, {}, side);
      if (r == CUDA_SUCCESS) {
        r = cuMemsetD32Async(p[i], value, kGranule / 32, side);
        mm->Finish(ids, ids, side, r == CUDA_SUCCESS);
        if (r == CUDA_SUCCESS) {
          for (size_t w = 0; w < kWords / 8; ++w) ref[i][w] = value * 0x100000001ull;
        }
      }
      seen(r);
    };
    auto check = [&](int i) {
      if (p[i] == 0) return;
      std::vector<uint64_t> got(kWords);
      Ids ids = {id[i]};
      CUresult r = mm->Prepare(ids, {}, nullptr);
      if (r == CUDA_SUCCESS) {
        r = cuMemcpyDtoH_v2(got.data(), p[i], kGranule);
        mm->Finish(ids, {}, nullptr, r == CUDA_SUCCESS);
        if (r == CUDA_SUCCESS) mismatch(i, got);
      }
      seen(r);
    };

    if (fail != nullptr) fakecuda_fail_call(fail, nth, injected);
    for (int step = 0; step < 9; ++step) {
      int i = step % 4;
      write(i, 100 * step + i, step % 3 == 0);
      memset_part((i + 1) % 4, 0x1000 + step);
      if (step % 4 == 3) mm->MarkAllWritten(side);  // as after an unknown kernel
      check((i + 2) % 4);
      if (step % 5 == 2) check(4);  // never written: zeros
      if (step == 6 || (step > 6 && p[0] == 0)) {
        if (p[0] != 0) {
          seen(mm->Free(p[0]));  // its memset may be in flight: garbage
          p[0] = 0;
        }
        id[0] = next_id++;
        CUresult r = mm->Allocate(kGranule, &p[0], [&](CUdeviceptr) { return id[0]; });
        seen(r);
        if (r == CUDA_SUCCESS) {
          ref[0].assign(kWords, 0);  // fresh memory
        } else {
          p[0] = 0;
        }
      }
    }
    fakecuda_clear_failures();
    for (int i = 0; i < kBuffers; ++i) check(i);
    out.stats = mm->stats();
    EXPECT_CU(cuCtxSynchronize());
    for (int i = 0; i < kBuffers; ++i) {
      if (p[i] != 0) {
        EXPECT_CU(mm->Free(p[i]));
      }
    }
    EXPECT_CU(cuStreamDestroy(side));
    return out;
  }
};

TEST_F(FaultSweepTest, ProgramIsCorrectWithoutFaults) {
  for (const char* policy : {"version", "lru"}) {
    SCOPED_TRACE(policy);
    ProgramOutcome out = Run(policy);
    EXPECT_THAT(out.errors, IsEmpty());
    EXPECT_EQ(out.mismatch, "");
    EXPECT_GT(out.stats.swap_outs_copied, 0u);
    EXPECT_GT(out.stats.swap_ins, 0u);
    EXPECT_EQ(out.stats.driver_errors, 0u);
    EXPECT_LE(Peak(), kCap);
  }
}

TEST_F(FaultSweepTest, EveryFailedDriverCallKeepsEveryByte) {
  // Occurrences failed per call: the first few under `version`, the
  // default, and the first under `lru` (the suite's time is bounded).
  const std::pair<const char*, int> kPolicies[] = {{"version", 3}, {"lru", 1}};
  fakecuda_count_calls(1);
  int fired = 0;
  for (const auto& [policy, first] : kPolicies) {
    for (const testing_support::SwapPathCall& call : testing_support::kSwapPathCalls) {
      for (int nth = 1; nth <= first; ++nth) {
        SCOPED_TRACE(absl::StrCat(policy, " ", call.name, " #", nth));
        unsigned long long before = fakecuda_call_count(call.name);
        ProgramOutcome out = Run(policy, call.name, nth, CUDA_ERROR_UNKNOWN);
        bool hit = fakecuda_call_count(call.name) - before >= static_cast<unsigned>(nth);
        fired += hit;
        if (hit) {
          std::printf("fault %s %s #%d: %zu errors seen, %llu driver errors counted\n", policy,
                      call.name, nth, out.errors.size(),
                      static_cast<unsigned long long>(out.stats.driver_errors));
        }
        EXPECT_EQ(out.mismatch, "");
        testing_support::ExpectErrorsAllowed(call, out.errors);
        EXPECT_LE(Peak(), kCap);
        if (!hit) break;  // fewer occurrences than that
      }
    }
  }
  fakecuda_count_calls(0);
  EXPECT_GE(fired, 40) << "too few injected failures reached the swap path";
}

}  // namespace
}  // namespace stensor
