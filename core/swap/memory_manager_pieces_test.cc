// Allocations larger than a granule where the device maps host memory: made
// of pieces of one granule (MemoryManager::PieceGroup), each resident,
// swapped out or served on its own. What goes out for room is what the room
// needs, not the whole allocation; an operation naming the allocation pins
// and versions every piece, so no write is lost and no piece moves under it;
// the program still sees one allocation (its address, size, free, reads).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/swap/memory_manager.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::Ids;
using testing_support::kGranule;
using testing_support::kWords;
using testing_support::Mismatch;
using testing_support::Pattern;

class PiecesTest : public testing_support::ManagerBufferTest {
 protected:
  void SetUp() override {
    ManagerBufferTest::SetUp();
    int host_vmm = 0;
    ASSERT_CU(cuDeviceGetAttribute(
        &host_vmm, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    if (host_vmm == 0) GTEST_SKIP() << "pieces need host-located VMM";
  }

  std::unique_ptr<MemoryManager> Make(const std::string& limit,
                                      const std::string& policy = "version") {
    auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", limit}, {"STENSOR_POLICY", policy}});
    EXPECT_NE(mm, nullptr);
    return mm;
  }

  // A kernel-like operation over `ids` that writes every word of
  // [p, p + bytes) through the device address (a host-to-device copy
  // standing in for it) while the manager holds them.
  void WriteWhileHeld(MemoryManager& mm, const Ids& ids, const Ids& written, CUdeviceptr p,
                      uint64_t seed, uint64_t bytes) {
    ASSERT_CU(mm.Prepare(ids, {}, nullptr));
    std::vector<uint64_t> data = Pattern(seed, bytes / sizeof(uint64_t));
    const CUresult r = cuMemcpyHtoD_v2(p, data.data(), bytes);
    mm.Finish(ids, written, nullptr, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    Settle();
  }
};

// Room for two granules takes two granules of the least recently used
// allocation, not all six of it; the rest of it stays resident.
TEST_F(PiecesTest, RoomForTwoGranulesMovesTwo) {
  auto mm = Make("8MiB", "lru");
  const uint64_t big_bytes = 3 * kGranule;
  CUdeviceptr big = Alloc(*mm, 1, big_bytes);
  Write(*mm, 1, big, 1, big_bytes);
  CUdeviceptr b = Alloc(*mm, 2, 2 * kGranule);  // one granule free: one piece goes
  Write(*mm, 2, b, 2, 2 * kGranule);
  SwapStats s = mm->stats();
  EXPECT_EQ(s.swap_outs_copied, 1u);
  EXPECT_EQ(s.bytes_copied_out, kGranule);
  EXPECT_EQ(s.ooms, 0u);
  ExpectData(*mm, 1, big, 1, big_bytes);  // one piece back, one of b out
  ExpectData(*mm, 2, b, 2, 2 * kGranule);
  s = mm->stats();
  EXPECT_LE(s.peak_resident_bytes, 8u << 20);
  EXPECT_LE(s.bytes_copied_out + s.bytes_dropped, 4 * kGranule);
  ASSERT_CU(mm->Free(big));
  ASSERT_CU(mm->Free(b));
}

// An operation over more than the cap holds: the pieces that fit are
// brought in, the others reached in host memory at their addresses (never
// refused), and what it writes through either lands.
TEST_F(PiecesTest, AnOperationLargerThanTheCapIsServedInPart) {
  auto mm = Make("6MiB");
  const uint64_t bytes = 5 * kGranule / 2;  // three pieces, the last half used
  CUdeviceptr a = Alloc(*mm, 1, bytes);
  CUdeviceptr b = Alloc(*mm, 2, 2 * kGranule);
  Write(*mm, 1, a, 1, bytes);
  Write(*mm, 2, b, 2, 2 * kGranule);
  // Both at once: 5 granules under a cap of 3.
  const Ids both = {1, 2};
  ASSERT_CU(mm->Prepare(both, {}, nullptr));
  EXPECT_GT(mm->stats().served_from_host, 0u);
  std::vector<uint64_t> data = Pattern(3, bytes / sizeof(uint64_t));
  ASSERT_CU(cuMemcpyHtoD_v2(a, data.data(), bytes));
  std::vector<uint64_t> other = Pattern(4, 2 * kGranule / sizeof(uint64_t));
  ASSERT_CU(cuMemcpyHtoD_v2(b, other.data(), 2 * kGranule));
  mm->Finish(both, both, nullptr, /*submitted=*/true);
  Settle();
  EXPECT_EQ(mm->stats().ooms, 0u);
  EXPECT_LE(mm->stats().peak_resident_bytes, 6u << 20);
  ExpectData(*mm, 1, a, 3, bytes);
  ExpectData(*mm, 2, b, 4, 2 * kGranule);
  ASSERT_CU(mm->Free(a));
  ASSERT_CU(mm->Free(b));
}

// A write through the allocation may reach any piece: every resident piece
// becomes dirty, so none is dropped as clean afterwards, and the data that
// comes back is the written one.
TEST_F(PiecesTest, AWriteDirtiesEveryPiece) {
  auto mm = Make("6MiB");
  const uint64_t bytes = 3 * kGranule;
  CUdeviceptr a = Alloc(*mm, 1, bytes);
  Write(*mm, 1, a, 1, bytes);
  CUdeviceptr b = Alloc(*mm, 2, 3 * kGranule);  // all of a goes out, copied
  Write(*mm, 2, b, 2, 3 * kGranule);
  ExpectData(*mm, 1, a, 1, bytes);  // a back (b out, copied); a clean now
  const SwapStats before = mm->stats();
  ExpectData(*mm, 2, b, 2, 3 * kGranule);  // a dropped clean: no copy
  const SwapStats clean = mm->stats();
  EXPECT_EQ(clean.clean_drops - before.clean_drops, 3u);
  // Only a word of the first granule is written, through the address of
  // the allocation: every piece counts as written.
  ExpectData(*mm, 1, a, 1, bytes);
  const uint64_t word = 42;
  WriteWhileHeld(*mm, {1}, {1}, a, 5, sizeof(word));
  const SwapStats written = mm->stats();
  ExpectData(*mm, 2, b, 2, 3 * kGranule);  // a copied out whole
  const SwapStats after = mm->stats();
  EXPECT_EQ(after.clean_drops, written.clean_drops);
  EXPECT_EQ(after.bytes_copied_out - written.bytes_copied_out, bytes);
  std::vector<uint64_t> want = Pattern(1, bytes / sizeof(uint64_t));
  want[0] = Pattern(5, 1)[0];
  EXPECT_EQ(Mismatch(Read(*mm, 1, a, bytes), want), "");
  ASSERT_CU(mm->Free(a));
  ASSERT_CU(mm->Free(b));
}

// The program sees one allocation: its size for exact-size questions and
// range checks, its base for a free (an address inside it is no
// allocation), and a read-back across pieces some of which are swapped out.
TEST_F(PiecesTest, TheProgramSeesOneAllocation) {
  auto mm = Make("6MiB", "lru");
  const uint64_t bytes = 3 * kGranule - 4096;
  CUdeviceptr a = Alloc(*mm, 7, bytes);
  Write(*mm, 7, a, 7, bytes - bytes % 8);
  std::optional<MemoryManager::BufferView> v = mm->Find(a + kGranule + 8);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->base, a);
  EXPECT_EQ(v->size, bytes);
  EXPECT_EQ(v->reserved, 3 * kGranule);
  EXPECT_EQ(v->id, 7u);
  EXPECT_EQ(mm->CheckRange(a + kGranule, bytes - kGranule), CUDA_SUCCESS);
  EXPECT_EQ(mm->CheckRange(a + kGranule, bytes - kGranule + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(mm->Owns(a));
  EXPECT_FALSE(mm->Owns(a + kGranule));
  EXPECT_EQ(mm->Free(a + kGranule), CUDA_ERROR_INVALID_VALUE);
  // Two pieces go for another buffer: a read-back spanning all three reads
  // the host copies of two and the device memory of one.
  CUdeviceptr b = Alloc(*mm, 8, 2 * kGranule);
  Write(*mm, 8, b, 8, 2 * kGranule);
  EXPECT_EQ(mm->stats().bytes_copied_out, 2 * kGranule);
  const uint64_t from = kGranule / 2, n = 2 * kGranule;
  std::vector<uint64_t> got(n / sizeof(uint64_t));
  ASSERT_CU(mm->ReadBack(7, from, got.data(), n));
  std::vector<uint64_t> all = Pattern(7, (bytes - bytes % 8) / sizeof(uint64_t));
  std::vector<uint64_t> want(all.begin() + from / 8, all.begin() + (from + n) / 8);
  EXPECT_EQ(Mismatch(got, want), "");
  ASSERT_CU(mm->Free(a));
  EXPECT_EQ(mm->Free(a), CUDA_ERROR_INVALID_VALUE);  // freed twice
  ASSERT_CU(mm->Free(b));
}

// Freed with every piece in a different state (resident, swapped out,
// served): all of its memory, device and host, is given back, and its
// range with it.
TEST_F(PiecesTest, AFreeReleasesEveryPiece) {
  auto mm = Make("6MiB", "lru");
  for (int round = 0; round < 4; ++round) {
    CUdeviceptr a = Alloc(*mm, 10 + round, 3 * kGranule);
    Write(*mm, 10 + round, a, round, 3 * kGranule);
    CUdeviceptr b = Alloc(*mm, 20 + round, kGranule);
    Write(*mm, 20 + round, b, round, kGranule);
    ASSERT_CU(mm->Free(a));
    ASSERT_CU(mm->Free(b));
    Settle();
  }
  size_t free_bytes = 0, total = 0;
  mm->MemInfo(0, &free_bytes, &total);
  EXPECT_EQ(free_bytes, total);
  EXPECT_EQ(mm->stats().ooms, 0u);
}

// A copy or memset reaches exactly its range (MemoryManager::Narrow): it
// holds and writes only the pieces there, so the others stay clean and go
// without a copy, and a piece it covers whole comes back without one.
TEST_F(PiecesTest, AnOperationOfExactExtentTouchesOnlyItsPieces) {
  auto mm = Make("6MiB");
  const uint64_t bytes = 3 * kGranule;
  CUdeviceptr a = Alloc(*mm, 1, bytes);
  Write(*mm, 1, a, 1, bytes);
  CUdeviceptr b = Alloc(*mm, 2, bytes);
  Write(*mm, 2, b, 2, bytes);       // a out, copied
  ExpectData(*mm, 1, a, 1, bytes);  // a back (b out): every piece clean
  auto memset_range = [&](uint64_t from, uint32_t value, size_t want_pieces) {
    MemoryManager::Keys ids, covered;
    ASSERT_TRUE(mm->Narrow(1, from, kGranule, &ids, &covered));
    EXPECT_EQ(ids.size(), want_pieces);
    EXPECT_EQ(covered.size(), want_pieces == 1 ? 1u : 0u);
    ASSERT_CU(mm->Prepare(ids, covered, nullptr));
    const CUresult r = cuMemsetD32_v2(a + from, value, kGranule / 4);
    mm->Finish(ids, ids, nullptr, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    Settle();
  };
  memset_range(0, 9, 1);  // the first piece only
  SwapStats before = mm->stats();
  ExpectData(*mm, 2, b, 2, bytes);  // a out: one piece copied, two dropped clean
  SwapStats after = mm->stats();
  EXPECT_EQ(after.bytes_copied_out - before.bytes_copied_out, kGranule);
  EXPECT_EQ(after.clean_drops - before.clean_drops, 2u);
  // Covering the second piece whole while it is out: back without a copy.
  before = mm->stats();
  memset_range(kGranule, 5, 1);
  after = mm->stats();
  EXPECT_EQ(after.swap_ins_without_copy - before.swap_ins_without_copy, 1u);
  EXPECT_EQ(after.bytes_copied_in, before.bytes_copied_in);
  // Across two pieces: both held, neither covered.
  memset_range(kGranule / 2, 3, 2);
  std::vector<uint64_t> want = Pattern(1, bytes / sizeof(uint64_t));
  auto fill = [&](uint64_t from, uint64_t n, uint32_t value) {
    std::fill(want.begin() + from / 8, want.begin() + (from + n) / 8, value * 0x100000001ull);
  };
  fill(0, kGranule, 9);
  fill(kGranule, kGranule, 5);
  fill(kGranule / 2, kGranule, 3);
  EXPECT_EQ(Mismatch(Read(*mm, 1, a, bytes), want), "");
  // A whole buffer is not narrowed: its id stands for it.
  MemoryManager::Keys ids;
  CUdeviceptr c = Alloc(*mm, 3, kGranule);
  EXPECT_FALSE(mm->Narrow(3, 0, kGranule, &ids, nullptr));
  EXPECT_TRUE(ids.empty());
  ASSERT_CU(mm->Free(a));
  ASSERT_CU(mm->Free(b));
  ASSERT_CU(mm->Free(c));
}

// A kernel's pointer into a segment likely reaches only up to the next
// tensor bound seen there: of a swapped-out segment, only the pieces its
// pointers reach are fetched; the others it holds are served from host,
// their bytes there at the address, and a write through them lands in the
// host copy, which stays the newest.
TEST_F(PiecesTest, PiecesAKernelsPointersDoNotReachAreServedNotFetched) {
  auto mm = Make("8MiB", "lru");
  const uint64_t bytes = 4 * kGranule;
  CUdeviceptr seg = Alloc(*mm, 1, bytes);
  Write(*mm, 1, seg, 1, bytes);
  CUdeviceptr other = Alloc(*mm, 2, bytes);
  Write(*mm, 2, other, 2, bytes);  // the segment out, every piece
  // Nothing known of the segment's tensors: a pointer reaches to its end.
  MemoryManager::Keys far;
  ASSERT_TRUE(mm->FarPieces(1, Ids{seg + 100}, &far));
  EXPECT_TRUE(far.empty());
  // A copy showed a tensor at [kGranule, 2 kGranule): a pointer at 100 now
  // reaches the first piece only, and two pointers of one launch their own.
  MemoryManager::Keys narrowed;
  ASSERT_TRUE(mm->Narrow(1, kGranule, kGranule, &narrowed, nullptr));
  ASSERT_TRUE(mm->FarPieces(1, Ids{seg + 100}, &far));
  EXPECT_EQ(far.size(), 3u);
  far.clear();
  ASSERT_TRUE(mm->FarPieces(1, Ids{seg + 2 * kGranule + 8, seg}, &far));
  EXPECT_EQ(far.size(), 1u);                       // the second piece: a bound at either end
  EXPECT_FALSE(mm->FarPieces(3, Ids{seg}, &far));  // no such allocation
  // A launch naming the segment through `seg` alone: one piece copied in,
  // three served.
  far.clear();
  ASSERT_TRUE(mm->FarPieces(1, Ids{seg}, &far));
  ASSERT_EQ(far.size(), 3u);
  std::sort(far.begin(), far.end());
  const SwapStats before = mm->stats();
  MemoryManager::OpTicket ticket;
  MemoryManager::Operation op;
  op.key = 42;
  op.ticket = &ticket;
  op.far = far;
  const Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, nullptr, &op));
  SwapStats held = mm->stats();
  EXPECT_EQ(held.bytes_copied_in - before.bytes_copied_in, kGranule);
  EXPECT_EQ(held.served_far - before.served_far, 3u);
  // The kernel reaches past its tensor after all: the bytes are there, and
  // its write lands.
  std::vector<uint64_t> want = Pattern(1, bytes / sizeof(uint64_t));
  std::vector<uint64_t> got(kGranule / sizeof(uint64_t));
  ASSERT_CU(cuMemcpyDtoH_v2(got.data(), seg + 2 * kGranule, kGranule));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 2 * kGranule / 8));
  const std::vector<uint64_t> data = Pattern(7, kGranule / sizeof(uint64_t));
  const CUresult r = cuMemcpyHtoD_v2(seg + 3 * kGranule, data.data(), kGranule);
  mm->Finish(ids, ids, nullptr, r == CUDA_SUCCESS, ticket.journal);
  mm->EndOperation(ticket, nullptr, r == CUDA_SUCCESS);
  ASSERT_CU(r);
  Settle();
  std::copy(data.begin(), data.end(), want.begin() + 3 * kGranule / 8);
  ExpectData(*mm, 2, other, 2, bytes);  // the segment's resident piece out
  EXPECT_EQ(Mismatch(Read(*mm, 1, seg, bytes), want), "");
  ASSERT_CU(mm->Free(seg));
  ASSERT_CU(mm->Free(other));
}

// An allocation whose second piece cannot be mapped is undone; its first
// piece took a pooled chunk whose zeroing is queued on the swap stream
// behind work that has not run. That memory is let go only once the
// zeroing ran: unmapped before, the zeroing would write where nothing is
// mapped (on the fake, a crash; on a GPU, a fault).
TEST_F(PiecesTest, AnUndoneAllocationWaitsForTheZeroingOfItsMemory) {
  auto mm = Make("6MiB");
  CUdeviceptr pooled = Alloc(*mm, 1, kGranule);
  ASSERT_CU(mm->Free(pooled));  // a granule in the pool
  // The swap stream held behind the program's work: a buffer written on a
  // held stream, evicted in stream order.
  testing_support::HeldStream held;
  CUdeviceptr a = Alloc(*mm, 2, kGranule);
  const Ids ids = {2};
  ASSERT_CU(mm->Prepare(ids, {}, held.get()));
  ASSERT_CU(cuMemsetD32Async(a, 7, kGranule / 4, held.get()));
  mm->Finish(ids, ids, held.get(), /*submitted=*/true);
  ASSERT_CU(mm->EvictAsync(2));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    held.Open();
  });
  fakecuda_fail_call("cuMemMap", 2, CUDA_ERROR_UNKNOWN);  // the second piece
  CUdeviceptr b = 0;
  EXPECT_EQ(mm->Allocate(2 * kGranule, &b, [](CUdeviceptr) { return 3; }), CUDA_ERROR_UNKNOWN);
  fakecuda_clear_failures();
  opener.join();
  ASSERT_CU(cuCtxSynchronize());
  std::vector<uint64_t> want(kGranule / sizeof(uint64_t), 7 * 0x100000001ull);
  EXPECT_EQ(Mismatch(Read(*mm, 2, a, kGranule), want), "");
  ASSERT_CU(mm->Free(a));
}

// A program over allocations of pieces under a cap smaller than the
// largest of them with another: whole writes, writes across piece
// boundaries on another stream, host reads, frees and new allocations,
// with one occurrence of a driver call failing. Every read sees what was
// last written, the program sees an error only where stensor could not work
// around the failure, the device never holds more than the cap, and once
// everything is freed nothing stays charged.
class PiecesFaultTest : public PiecesTest {
 protected:
  struct Outcome {
    std::vector<CUresult> errors;
    std::string mismatch;
  };

  Outcome Run(const char* fail, int nth) {
    Outcome out;
    auto mm = Make("6MiB");
    if (mm == nullptr) return out;
    CUstream side = nullptr;
    EXPECT_CU(cuStreamCreate(&side, CU_STREAM_DEFAULT));
    const uint64_t sizes[] = {3 * kGranule, 2 * kGranule, 5 * kGranule / 2, kGranule};
    constexpr int kCount = 4;
    CUdeviceptr p[kCount] = {};
    uint64_t id[kCount] = {};
    std::vector<std::vector<uint64_t>> ref(kCount);
    uint64_t next_id = 1;
    auto seen = [&](CUresult r) {
      if (r != CUDA_SUCCESS) out.errors.push_back(r);
    };
    auto allocate = [&](int i) {
      id[i] = next_id++;
      CUresult r = mm->Allocate(sizes[i], &p[i], [&](CUdeviceptr) { return id[i]; });
      seen(r);
      if (r != CUDA_SUCCESS) p[i] = 0;
      ref[i].assign(sizes[i] / sizeof(uint64_t), 0);  // fresh memory
    };
    auto write = [&](int i, uint64_t seed, uint64_t from, uint64_t bytes, CUstream stream) {
      if (p[i] == 0) return;
      std::vector<uint64_t> data = Pattern(seed, bytes / sizeof(uint64_t));
      Ids ids = {id[i]};
      const bool whole = from == 0 && bytes == sizes[i];
      CUresult r = mm->Prepare(ids, whole ? ids : Ids{}, stream);
      if (r == CUDA_SUCCESS) {
        r = cuMemcpyHtoDAsync_v2(p[i] + from, data.data(), bytes, stream);
        if (r == CUDA_SUCCESS) r = cuStreamSynchronize(stream);  // `data` outlives the copy
        mm->Finish(ids, ids, stream, r == CUDA_SUCCESS);
        if (r == CUDA_SUCCESS) std::copy(data.begin(), data.end(), ref[i].begin() + from / 8);
      }
      seen(r);
    };
    auto check = [&](int i) {
      if (p[i] == 0 || !out.mismatch.empty()) return;
      std::vector<uint64_t> got(sizes[i] / sizeof(uint64_t));
      Ids ids = {id[i]};
      CUresult r = mm->Prepare(ids, {}, nullptr);
      if (r == CUDA_SUCCESS) {
        r = cuMemcpyDtoH_v2(got.data(), p[i], sizes[i]);
        mm->Finish(ids, {}, nullptr, r == CUDA_SUCCESS);
        if (r == CUDA_SUCCESS) {
          std::string m = Mismatch(got, ref[i]);
          if (!m.empty()) out.mismatch = absl::StrCat("allocation ", i, ": ", m);
        }
      }
      seen(r);
    };
    for (int i = 0; i < kCount; ++i) allocate(i);
    if (fail != nullptr) fakecuda_fail_call(fail, nth, CUDA_ERROR_UNKNOWN);
    for (int step = 0; step < 8; ++step) {
      const int i = step % kCount;
      write(i, 10 * step + i, 0, sizes[i], nullptr);
      const int j = (i + 1) % kCount;
      // Across a piece boundary, on the side stream.
      write(j, 1000 + step, kGranule / 2, std::min(kGranule, sizes[j] - kGranule / 2), side);
      if (step % 3 == 2) mm->MarkAllWritten(side);
      check((i + 2) % kCount);
      if (step == 5 && p[0] != 0) {
        seen(mm->Free(p[0]));
        p[0] = 0;
        allocate(0);
      }
    }
    fakecuda_clear_failures();
    for (int i = 0; i < kCount; ++i) check(i);
    EXPECT_CU(cuCtxSynchronize());
    for (int i = 0; i < kCount; ++i) {
      if (p[i] != 0) {
        EXPECT_CU(mm->Free(p[i]));
      }
    }
    EXPECT_CU(cuCtxSynchronize());
    size_t free_bytes = 0, total = 0;
    mm->MemInfo(0, &free_bytes, &total);
    EXPECT_EQ(free_bytes, total) << "charged after every free";
    EXPECT_CU(cuStreamDestroy(side));
    return out;
  }
};

TEST_F(PiecesFaultTest, CorrectWithoutFaults) {
  Outcome out = Run(nullptr, 0);
  EXPECT_TRUE(out.errors.empty());
  EXPECT_EQ(out.mismatch, "");
  EXPECT_LE(Peak(), 6u << 20);
}

TEST_F(PiecesFaultTest, EveryFailedDriverCallKeepsEveryByte) {
  fakecuda_count_calls(1);
  int fired = 0;
  for (const testing_support::SwapPathCall& call : testing_support::kSwapPathCalls) {
    for (int nth = 1; nth <= 4; ++nth) {
      SCOPED_TRACE(absl::StrCat(call.name, " #", nth));
      const unsigned long long before = fakecuda_call_count(call.name);
      Outcome out = Run(call.name, nth);
      const bool hit = fakecuda_call_count(call.name) - before >= static_cast<unsigned>(nth);
      fired += hit;
      EXPECT_EQ(out.mismatch, "");
      testing_support::ExpectErrorsAllowed(call, out.errors);
      EXPECT_LE(Peak(), 6u << 20);
      if (!hit) break;
    }
  }
  fakecuda_count_calls(0);
  EXPECT_GE(fired, 25) << "too few injected failures reached the swap path";
}

}  // namespace
}  // namespace stensor
