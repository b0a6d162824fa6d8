// Small allocations in slabs (STENSOR_SLABS=on, core/swap/slab_pool.h): each
// is an allocation of its own to the program (its id, its address range),
// swapped with its slab under the cap, and no byte of a neighbour is lost
// to an overwrite or a reuse.
#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/swap/memory_manager.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::HeldStream;
using testing_support::Ids;
using testing_support::kCap;
using testing_support::kGranule;

bool HostVmm() { return testing_support::HostVmmSupported(); }

class SlabTest : public testing_support::ManagerBufferTest {
 protected:
  std::unique_ptr<MemoryManager> Make(const char* slabs = "on") {
    return MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"},
                        {"STENSOR_POLICY", "version"},
                        {"STENSOR_SLABS", slabs}});
  }
  void FreeAll(MemoryManager& mm, const std::vector<CUdeviceptr>& ptrs) {
    Settle();
    for (CUdeviceptr p : ptrs) EXPECT_CU(mm.Free(p));
  }
};

TEST_F(SlabTest, SmallAllocationsShareASlabEachAnAllocationOfItsOwn) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 100000;
  std::vector<CUdeviceptr> p;
  for (uint64_t id = 1; id <= 8; ++id) p.push_back(Alloc(*mm, id, kSmall));
  if (!HostVmm()) {
    EXPECT_EQ(mm->stats().slab_allocations, 0u) << "slabs only where host memory can stand in";
    FreeAll(*mm, p);
    return;
  }
  EXPECT_EQ(mm->stats().slab_allocations, 8u);
  EXPECT_EQ(mm->stats().slabs_made, 1u);
  EXPECT_EQ(Used(), kGranule);
  for (uint64_t id = 1; id <= 8; ++id) {
    const CUdeviceptr at = p[id - 1];
    EXPECT_EQ(at % SlabPool::kAlign, 0u);
    EXPECT_TRUE(mm->Owns(at));
    EXPECT_FALSE(mm->Owns(at + 8)) << "inside, not the start of an allocation";
    std::optional<MemoryManager::BufferView> v = mm->Find(at + kSmall - 1);
    ASSERT_TRUE(v);
    EXPECT_EQ(v->base, at);
    EXPECT_EQ(v->size, kSmall);
    EXPECT_EQ(v->id, id);
    EXPECT_FALSE(v->freed);
    EXPECT_EQ(mm->CheckRange(at, kSmall), CUDA_SUCCESS);
    EXPECT_EQ(mm->CheckRange(at + 8, kSmall), CUDA_ERROR_INVALID_VALUE) << "past its end";
    Write(*mm, id, at, id, kSmall);
  }
  for (uint64_t id = 1; id <= 8; ++id) ExpectData(*mm, id, p[id - 1], id, kSmall);
  // Beyond the last block: free space, no allocation.
  std::optional<MemoryManager::BufferView> past = mm->Find(p.back() + 200000);
  ASSERT_TRUE(past);
  EXPECT_TRUE(past->freed);
  EXPECT_EQ(mm->Free(p[0] + 8), CUDA_ERROR_INVALID_VALUE);
  FreeAll(*mm, p);
  EXPECT_FALSE(mm->Owns(p[0]));
  EXPECT_EQ(mm->Free(p[0]), CUDA_ERROR_INVALID_VALUE) << "freed twice";
}

TEST_F(SlabTest, WithoutSlabsSmallAllocationsAreTheDriversAsBefore) {
  auto mm = Make("off");
  ASSERT_NE(mm, nullptr);
  CUdeviceptr p = Alloc(*mm, 1, 100000);
  EXPECT_EQ(mm->stats().slab_allocations, 0u);
  EXPECT_FALSE(mm->Find(p)) << "a driver allocation";
  FreeAll(*mm, {p});
}

// STENSOR_SLABS=auto: a device keeps its small allocations the driver's
// until those it holds reach an eighth of its cap (6 MiB / 8 = 768 KiB, eight
// of 100,000 bytes, each counted at 100,352), then packs every new one for
// good; a free counts too, so a program that frees what it allocates never
// gets there.
TEST_F(SlabTest, AutoPacksOnceTheSmallAllocationsHeldReachAnEighthOfTheCap) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make("auto");
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 100000;
  std::vector<CUdeviceptr> p;
  for (uint64_t id = 1; id <= 7; ++id) p.push_back(Alloc(*mm, id, kSmall));
  FreeAll(*mm, p);
  p.clear();
  for (uint64_t id = 11; id <= 17; ++id) p.push_back(Alloc(*mm, id, kSmall));
  EXPECT_EQ(mm->stats().slab_allocations, 0u) << "seven held, the first seven freed";
  p.push_back(Alloc(*mm, 18, kSmall));
  EXPECT_EQ(mm->stats().slab_allocations, 0u) << "the eighth reaches the share, as the driver's";
  EXPECT_FALSE(mm->Find(p.back()));
  p.push_back(Alloc(*mm, 19, kSmall));
  EXPECT_EQ(mm->stats().slab_allocations, 1u);
  ASSERT_TRUE(mm->Find(p.back()));
  EXPECT_EQ(mm->Find(p.back())->id, 19u);
  FreeAll(*mm, p);
  p.clear();
  p.push_back(Alloc(*mm, 20, kSmall));
  EXPECT_EQ(mm->stats().slab_allocations, 2u) << "for good, whatever is freed";
  FreeAll(*mm, p);
}

// The default pool's small allocations (cuMemAllocAsync that stensor leaves
// to the driver) count alike, and their frees, synchronous or in stream
// order, uncount them.
TEST_F(SlabTest, AutoCountsTheDefaultPoolsSmallAllocations) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make("auto");
  ASSERT_NE(mm, nullptr);
  using Source = MemoryManager::ExternalSource;
  constexpr uint64_t kSmall = 100000;
  auto adopt = [&](CUdeviceptr base) {
    ASSERT_CU(mm->ReserveExternal(kSmall, Source::kDefaultPool));
    mm->AdoptExternal(base, kSmall, Source::kDefaultPool);
  };
  constexpr CUdeviceptr kBase = 0x7000000;  // never dereferenced
  for (CUdeviceptr i = 0; i < 7; ++i) adopt(kBase + i * kSmall);
  for (CUdeviceptr i = 0; i < 3; ++i) mm->ForgetExternal(kBase + i * kSmall);
  for (CUdeviceptr i = 3; i < 7; ++i) mm->ForgetExternalAsync(kBase + i * kSmall, nullptr);
  EXPECT_FALSE(mm->Swappable(kSmall)) << "all freed: none held";
  for (CUdeviceptr i = 0; i < 7; ++i) adopt(kBase + i * kSmall);
  EXPECT_FALSE(mm->Swappable(kSmall));
  adopt(kBase + 7 * kSmall);
  EXPECT_TRUE(mm->Swappable(kSmall)) << "eight held: the next one goes to a slab";
  // A cuMemAlloc of the same size now goes to a slab too.
  CUdeviceptr p = Alloc(*mm, 1, kSmall);
  EXPECT_EQ(mm->stats().slab_allocations, 1u);
  FreeAll(*mm, {p});
  for (CUdeviceptr i = 0; i < 8; ++i) mm->ForgetExternal(kBase + i * kSmall);
}

// 16 MB of small tensors under a 6 MiB cap: without slabs they would stay
// on the device (or each take a granule on the host); in slabs they are
// swapped like any buffer, every byte kept.
TEST_F(SlabTest, SmallAllocationsBeyondTheCapAreSwappedWithTheirSlabs) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 400 * 1024;
  std::vector<CUdeviceptr> p;
  for (uint64_t id = 1; id <= 40; ++id) {
    p.push_back(Alloc(*mm, id, kSmall));
    Write(*mm, id, p.back(), id, kSmall);
  }
  EXPECT_EQ(mm->stats().slabs_made, 8u);  // five to a slab
  EXPECT_GT(mm->stats().swap_outs_copied, 0u);
  for (uint64_t id = 1; id <= 40; ++id) ExpectData(*mm, id, p[id - 1], id, kSmall);
  for (uint64_t id = 40; id >= 1; --id) ExpectData(*mm, id, p[id - 1], id, kSmall);
  EXPECT_LE(Peak(), kCap);
  FreeAll(*mm, p);
}

// A copy that overwrites one block whole, while its slab is swapped out,
// brings the slab in with its contents: the neighbours' bytes stay.
TEST_F(SlabTest, AnOverwriteOfOneBlockKeepsItsNeighbours) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 256 * 1024;
  CUdeviceptr a = Alloc(*mm, 1, kSmall), b = Alloc(*mm, 2, kSmall);
  Write(*mm, 1, a, 1, kSmall);
  Write(*mm, 2, b, 2, kSmall);
  // Three granules fill the cap: the slab goes out.
  std::vector<CUdeviceptr> big;
  for (uint64_t id = 10; id < 13; ++id) {
    big.push_back(Alloc(*mm, id));
    Write(*mm, id, big.back(), id);
  }
  ASSERT_GT(mm->stats().swap_outs_copied, 0u);
  Write(*mm, 1, a, 11, kSmall, /*overwritten=*/true);
  ExpectData(*mm, 2, b, 2, kSmall);
  ExpectData(*mm, 1, a, 11, kSmall);
  big.push_back(a);
  big.push_back(b);
  FreeAll(*mm, big);
}

// A block freed while work queued before the free may still use it is not
// handed out again until that work is done; a free in stream order waits
// for its stream.
TEST_F(SlabTest, AFreedBlockIsReusedOnlyOnceTheWorkBeforeItsFreeIsDone) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 64 * 1024;
  for (bool in_stream_order : {false, true}) {
    SCOPED_TRACE(in_stream_order ? "cuMemFreeAsync" : "cuMemFree");
    HeldStream held;
    CUdeviceptr a = Alloc(*mm, 1, kSmall);
    Ids ids = {1};
    ASSERT_CU(mm->Prepare(ids, {}, held.get()));
    CUresult r = cuMemsetD8Async(a, 0x5a, kSmall, held.get());
    mm->Finish(ids, ids, held.get(), r == CUDA_SUCCESS);
    ASSERT_CU(r);
    if (in_stream_order) {
      ASSERT_CU(mm->FreeAsync(a, held.get(), [] {}));
    } else {
      ASSERT_CU(mm->Free(a));
    }
    CUdeviceptr b = Alloc(*mm, 2, kSmall);
    EXPECT_NE(b, a) << "handed out while the memset may still write it";
    held.Open();
    Settle();
    CUdeviceptr c = Alloc(*mm, 3, kSmall);
    EXPECT_EQ(c, a) << "the work is done: the space is the tightest fit again";
    FreeAll(*mm, {b, c});
  }
}

// Freed slabs beyond one go back; the one kept serves the next small one.
TEST_F(SlabTest, EmptySlabsBeyondOneAreFreed) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  std::vector<CUdeviceptr> p;
  for (uint64_t id = 1; id <= 6; ++id) p.push_back(Alloc(*mm, id, 900 * 1024));
  EXPECT_EQ(mm->stats().slabs_made, 3u);
  FreeAll(*mm, p);
  CUdeviceptr again = Alloc(*mm, 7, 900 * 1024);
  EXPECT_EQ(mm->stats().slabs_made, 3u) << "the kept slab serves it";
  // The other two went back (their memory to the manager's idle pool).
  size_t free_bytes = 0, total = 0;
  mm->MemInfo(0, &free_bytes, &total);
  EXPECT_EQ(free_bytes, kCap - kGranule);
  Write(*mm, 7, again, 7, 900 * 1024);
  ExpectData(*mm, 7, again, 7, 900 * 1024);
  FreeAll(*mm, {again});
}

// The empty slab kept for the next small allocation is the first room made
// when room is needed: released, not evicted (a program at a cap of its own
// working set is short by about a slab).
TEST_F(SlabTest, TheKeptEmptySlabIsReleasedWhenRoomIsNeeded) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 900 * 1024;  // two to a slab
  std::vector<CUdeviceptr> kept, freed;
  for (uint64_t id = 1; id <= 2; ++id) kept.push_back(Alloc(*mm, id, kSmall));
  for (uint64_t id = 3; id <= 4; ++id) freed.push_back(Alloc(*mm, id, kSmall));
  for (uint64_t id = 1; id <= 4; ++id) {
    Write(*mm, id, id <= 2 ? kept[id - 1] : freed[id - 3], id, kSmall);
  }
  FreeAll(*mm, freed);  // the second slab empty, kept
  EXPECT_EQ(mm->stats().slabs_made, 2u);
  CUdeviceptr big = Alloc(*mm, 10, 2 * kGranule);  // room: one granule short
  Write(*mm, 10, big, 10, 2 * kGranule);
  EXPECT_EQ(mm->stats().swap_outs_copied, 0u) << "room made without a copy";
  CUdeviceptr small = Alloc(*mm, 11, kSmall);  // no kept slab left: a new one
  EXPECT_EQ(mm->stats().slabs_made, 3u);
  for (uint64_t id = 1; id <= 2; ++id) ExpectData(*mm, id, kept[id - 1], id, kSmall);
  ExpectData(*mm, 10, big, 10, 2 * kGranule);
  FreeAll(*mm, {kept[0], kept[1], big, small});
}

// Freed in stream order, a block's space is free at once for the next
// allocation in order on the same stream (what follows there runs after
// the free), never for another stream before the free has run.
TEST_F(SlabTest, SpaceFreedInStreamOrderServesTheSameStreamAtOnce) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 64 * 1024;
  HeldStream held, other;
  const CUstream s = held.get(), t = other.get();
  auto alloc_on = [&](CUstream stream, uint64_t id) {
    CUdeviceptr p = 0;
    EXPECT_CU(mm->Allocate(
        kSmall, &p, [id](CUdeviceptr) { return id; }, &stream));
    return p;
  };
  CUdeviceptr a = alloc_on(s, 1);
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, s));
  CUresult r = cuMemsetD8Async(a, 0x5a, kSmall, s);
  mm->Finish(ids, ids, s, r == CUDA_SUCCESS);
  ASSERT_CU(r);
  ASSERT_CU(mm->FreeAsync(a, s, [] {}));
  CUdeviceptr b = alloc_on(t, 2);
  EXPECT_NE(b, a) << "another stream, before the free ran";
  CUdeviceptr c = alloc_on(s, 3);
  EXPECT_EQ(c, a) << "the same stream: after the free in its order";
  held.Open();
  other.Open();
  Settle();
  ASSERT_CU(mm->FreeAsync(b, t, [] {}));
  ASSERT_CU(mm->FreeAsync(c, s, [] {}));
  Settle();
}

// A slab's swap copies carry its live blocks, not the granule: small
// tensors cost their size in copies.
TEST_F(SlabTest, ASwapCopiesTheLiveBlocksOfASlabOnly) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  constexpr uint64_t kSmall = 100000, kSpan = 100352;  // 196 units of 512
  CUdeviceptr a = Alloc(*mm, 1, kSmall), gone = Alloc(*mm, 2, kSmall), b = Alloc(*mm, 3, kSmall);
  Write(*mm, 1, a, 1, kSmall);
  Write(*mm, 3, b, 3, kSmall);
  FreeAll(*mm, {gone});
  std::vector<CUdeviceptr> big;
  for (uint64_t id = 10; id < 13; ++id) {
    big.push_back(Alloc(*mm, id));
    Write(*mm, id, big.back(), id);
  }
  const SwapStats s = mm->stats();
  EXPECT_EQ(s.swap_outs_copied, 1u);
  EXPECT_EQ(s.bytes_copied_out, 2 * kSpan) << "two live blocks, not the hole, not the granule";
  ExpectData(*mm, 1, a, 1, kSmall);
  ExpectData(*mm, 3, b, 3, kSmall);
  EXPECT_EQ(mm->stats().bytes_copied_in - s.bytes_copied_in, 2 * kSpan);
  big.push_back(a);
  big.push_back(b);
  FreeAll(*mm, big);
}

// The driver calls a slab's life makes on stensor's own behalf, each failed
// once: making a slab (its address range, its memory) fails that allocation
// with the driver's error and nothing else; a swap copy that fails leaves
// the slab where its bytes are. Every byte of every live allocation stays.
TEST_F(SlabTest, FailedDriverCallsOfASlabLoseNoByte) {
  if (!HostVmm()) GTEST_SKIP() << "slabs need host-located VMM";
  constexpr uint64_t kSmall = 256 * 1024;  // eight to a slab
  for (const char* call : {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                           "cuMemcpyDtoDAsync_v2", "cuEventRecord", "cuEventCreate"}) {
    for (int nth : {1, 2, 5}) {
      SCOPED_TRACE(absl::StrCat(call, " #", nth));
      auto mm = Make();
      ASSERT_NE(mm, nullptr);
      fakecuda_fail_call(call, nth, CUDA_ERROR_UNKNOWN);
      std::vector<CUdeviceptr> live;
      std::vector<uint64_t> ids;
      for (uint64_t id = 1; id <= 24; ++id) {  // three slabs, then a granule each
        CUdeviceptr p = 0;
        if (mm->Allocate(kSmall, &p, [id](CUdeviceptr) { return id; }) != CUDA_SUCCESS) continue;
        Ids one = {id};
        std::vector<uint64_t> data = testing_support::Pattern(id, kSmall / sizeof(uint64_t));
        if (mm->Prepare(one, {}, nullptr) != CUDA_SUCCESS) {
          Settle();
          EXPECT_CU(mm->Free(p));
          continue;
        }
        const CUresult r = cuMemcpyHtoD_v2(p, data.data(), kSmall);
        mm->Finish(one, one, nullptr, r == CUDA_SUCCESS);
        ASSERT_CU(r);
        live.push_back(p);
        ids.push_back(id);
      }
      for (uint64_t id = 10; id < 13; ++id) {  // the cap full: slabs go out
        CUdeviceptr p = 0;
        if (mm->Allocate(kGranule, &p, [id](CUdeviceptr) { return id + 100; }) == CUDA_SUCCESS) {
          live.push_back(p);
          ids.push_back(0);
        }
      }
      fakecuda_clear_failures();
      EXPECT_GE(live.size(), 20u);
      for (size_t i = 0; i < live.size(); ++i) {
        if (ids[i] != 0) ExpectData(*mm, ids[i], live[i], ids[i], kSmall);
      }
      FreeAll(*mm, live);
    }
  }
}

}  // namespace
}  // namespace stensor
