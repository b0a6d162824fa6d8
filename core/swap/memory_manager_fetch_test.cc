// The fetch stream: swap-ins into memory at rest run beside the swap stream
// (core/swap/memory_manager_uses.cc, FetchStreamFor). Races a hostile program makes
// with those copies, and every driver call on that path failed in turn; the
// *Slow* tests run with a slow link (FAKECUDA_LINK) so that copies are still
// in flight when the next call comes. And whether a swapped-out buffer is
// fetched at all, or served from host (ChooseReach, policy/reach.h).
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/swap/memory_manager.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::HeldStream;
using testing_support::Ids;
using testing_support::kCap;
using testing_support::kGranule;
using testing_support::kWords;
using testing_support::Mismatch;
using testing_support::Pattern;

class FetchStreamTest : public testing_support::ManagerBufferTest {
 protected:
  std::unique_ptr<MemoryManager> Make(const char* policy = "version") {
    return MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"}, {"STENSOR_POLICY", policy}});
  }
  // Read on `stream` (async), then synchronise that stream only.
  std::vector<uint64_t> ReadOn(MemoryManager& mm, uint64_t id, CUdeviceptr p, CUstream s,
                               CUresult* err = nullptr) {
    std::vector<uint64_t> got(kWords, 0x1111);
    Ids ids = {id};
    CUresult r = mm.Prepare(ids, {}, s);
    if (r == CUDA_SUCCESS) {
      r = cuMemcpyDtoHAsync_v2(got.data(), p, kGranule, s);
      mm.Finish(ids, {}, s, r == CUDA_SUCCESS);
      if (r == CUDA_SUCCESS) r = cuStreamSynchronize(s);
    }
    if (err != nullptr) *err = r;
    EXPECT_CU(r);
    return got;
  }
  // 0xdeadbeef into every word of buffer `id` at `p`, on `s` (async).
  void SetOn(MemoryManager& mm, uint64_t id, CUdeviceptr p, CUstream s) {
    Ids ids = {id};
    ASSERT_CU(mm.Prepare(ids, {}, s));
    CUresult r = cuMemsetD32Async(p, 0xdeadbeef, kGranule / 4, s);
    mm.Finish(ids, ids, s, r == CUDA_SUCCESS);
    ASSERT_CU(r);
  }
  // FillThree, then C swapped out (its copy done) and prefetched: its copy
  // back is in flight on the fetch stream (for ~200 ms on the slow link).
  void FillThreeAndPrefetchC(MemoryManager& mm, CUdeviceptr* a, CUdeviceptr* b, CUdeviceptr* c) {
    FillThree(mm, a, b, c);
    ASSERT_CU(mm.EvictAsync(3));
    ASSERT_CU(cuCtxSynchronize());
    ASSERT_CU(mm.Prefetch(3));
  }
};

// An export (cuIpcGetMemHandle) waits for the buffer's copies on stensor's
// streams without the lock, while another thread adds uses on new streams,
// which reallocates the buffer's list of uses: the wait must not walk that
// list afterwards (it did once: heap-use-after-free in PinLocked, seen under
// --config=asan).
TEST_F(FetchStreamTest, ExportWaitsWhileOtherThreadsAddUses) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThree(*mm, &a, &b, &c);
  // B: uses [legacy]. Swap it out and back in so that its swap-stream entry
  // is not its last one: [legacy, swap, fetch].
  ASSERT_CU(mm->EvictAsync(2));
  ASSERT_CU(cuCtxSynchronize());
  CUstream s0;
  ASSERT_CU(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(Mismatch(ReadOn(*mm, 2, b, s0), Pattern(2)), "");
  HeldStream held;
  SetOn(*mm, 2, b, held.get());
  // [legacy, swap, fetch, held]; the swap-out queues behind the held memset.
  ASSERT_CU(mm->EvictAsync(2));
  std::atomic<bool> pinned{false};
  CUresult pin_result = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx_));  // a program's exporting thread has one
    ASSERT_TRUE(mm->PinExported(b, "cuIpcGetMemHandle", &pin_result));
    pinned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(pinned.load()) << "the pin did not wait for the swap-out copy";
  std::vector<CUstream> more(4);
  for (CUstream& s : more) {
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    Ids ids = {2};
    ASSERT_CU(mm->Prepare(ids, {}, s));
    mm->Finish(ids, {}, s, true);  // b.uses grows: reallocated
  }
  held.Open();
  t.join();
  EXPECT_CU(pin_result);
  ASSERT_CU(cuCtxSynchronize());
  std::vector<uint64_t> got = ReadOn(*mm, 2, b, s0);
  EXPECT_EQ(got[0], 0xdeadbeefdeadbeefull);
  for (CUstream s : more) cuStreamDestroy(s);
  cuStreamDestroy(s0);
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {a, b, c}) EXPECT_CU(mm->Free(p));
}

// A failed driver call on the fetch path (the stream's create, the copy's
// event record, the consumer's wait, the query) is worked around: no error,
// data intact. C comes in on `other` into memory at rest.
TEST_F(FetchStreamTest, FetchPathFailuresAreWorkedAround) {
  for (const char* call : {"cuStreamCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventQuery",
                           "cuEventSynchronize", "cuEventCreate"}) {
    for (int nth = 1; nth <= 2; ++nth) {
      SCOPED_TRACE(std::string(call) + " #" + std::to_string(nth));
      auto mm = Make();
      ASSERT_NE(mm, nullptr);
      CUdeviceptr a, b, c;
      FillThree(*mm, &a, &b, &c);
      ASSERT_CU(mm->EvictAsync(3));
      ASSERT_CU(cuCtxSynchronize());
      CUstream other;
      ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
      fakecuda_fail_call(call, nth, CUDA_ERROR_UNKNOWN);
      CUresult r;
      EXPECT_EQ(Mismatch(ReadOn(*mm, 3, c, other, &r), Pattern(3)), "");
      // Evict it again and bring it back: still right.
      CUresult e = mm->EvictAsync(3);  // NOT_READY: a use not observable without a host wait
      EXPECT_TRUE(e == CUDA_SUCCESS || e == CUDA_ERROR_NOT_READY) << e;
      EXPECT_EQ(Mismatch(ReadOn(*mm, 3, c, other, &r), Pattern(3)), "");
      fakecuda_clear_failures();
      cuStreamDestroy(other);
      ASSERT_CU(cuCtxSynchronize());
      for (CUdeviceptr p : {a, b, c}) EXPECT_CU(mm->Free(p));
    }
  }
}

// --- With a slow link (FAKECUDA_LINK in the Slow target): a fetch copy
// stays in flight ~200 ms.

// Prefetched C (fetch copy in flight) is dropped clean at once; its chunk,
// shadowed, goes to a new allocation D, which must read zeros (the zeroing
// memset on the swap stream must come after the fetch copy's writes).
TEST_F(FetchStreamTest, SlowDropDuringFetchThenNewOwnerReadsZeros) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThreeAndPrefetchC(*mm, &a, &b, &c);
  ASSERT_CU(mm->EvictAsync(3));  // clean: a drop behind the fetch copy
  CUdeviceptr d = Alloc(*mm, 4);
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  std::vector<uint64_t> got = ReadOn(*mm, 4, d, other);
  EXPECT_EQ(Mismatch(got, std::vector<uint64_t>(kWords, 0)), "") << "new allocation not zero";
  EXPECT_CU(mm->Free(d));
  EXPECT_EQ(Mismatch(ReadOn(*mm, 3, c, other), Pattern(3)), "");
  cuStreamDestroy(other);
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {a, b, c}) EXPECT_CU(mm->Free(p));
}

// Prefetched C freed while its fetch copy is in flight: garbage, its chunk
// handed on (QueueGarbage) to D, which must read zeros.
TEST_F(FetchStreamTest, SlowFreeDuringFetchThenNewOwnerReadsZeros) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a, b, c;
  FillThreeAndPrefetchC(*mm, &a, &b, &c);
  ASSERT_CU(mm->Free(c));
  CUdeviceptr d = Alloc(*mm, 4);
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  std::vector<uint64_t> got = ReadOn(*mm, 4, d, other);
  EXPECT_EQ(Mismatch(got, std::vector<uint64_t>(kWords, 0)), "") << "new allocation not zero";
  cuStreamDestroy(other);
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {a, b, d}) EXPECT_CU(mm->Free(p));
}

// C comes back into memory still mapped at A's address, A's copy out in
// flight: the copy in waits on the device for A's copy out only, not behind
// everything queued on the swap stream (here B's swap-out, held behind the
// program's work until the end), so copies in and out run side by side.
// Every byte of A, B and C is kept, also when a wait on the device fails
// (then the copy in queues behind everything, and is not timed).
TEST_F(FetchStreamTest, SlowSwapInIntoHandedOnMemoryWaitsOnlyForItsOldOwner) {
  for (int nth = 0; nth <= 3; ++nth) {
    SCOPED_TRACE(nth == 0 ? "no failure" : "cuStreamWaitEvent #" + std::to_string(nth) + " failed");
    auto mm = Make();
    ASSERT_NE(mm, nullptr);
    CUdeviceptr a, b, c;
    FillThree(*mm, &a, &b, &c);
    ASSERT_CU(mm->EvictAsync(3));
    ASSERT_CU(cuCtxSynchronize());
    CUdeviceptr d = Alloc(*mm, 4);  // takes C's memory at rest: the device is full again
    Write(*mm, 4, d, 4);
    auto held = std::make_unique<HeldStream>();
    SetOn(*mm, 2, b, held->get());
    if (nth > 0) fakecuda_fail_call("cuStreamWaitEvent", nth, CUDA_ERROR_UNKNOWN);
    ASSERT_CU(mm->EvictAsync(1));    // A's copy out, first on the swap stream
    CUresult e = mm->EvictAsync(2);  // behind the held memset (NOT_READY: its wait failed)
    EXPECT_TRUE(e == CUDA_SUCCESS || (nth > 0 && e == CUDA_ERROR_NOT_READY)) << e;
    CUstream other;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    std::atomic<bool> read{false};
    std::vector<uint64_t> got;
    std::thread t([&] {
      ASSERT_CU(cuCtxSetCurrent(ctx_));
      got = ReadOn(*mm, 3, c, other);
      read = true;
    });
    if (nth == 0) {
      // Ample for two copies on the slow link (~200 ms each); never reached
      // when the copy in waits for the held swap-out.
      for (int i = 0; i < 500 && !read.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_TRUE(read.load()) << "the swap-in waited for a swap-out of other memory";
    }
    held.reset();  // opened
    t.join();
    fakecuda_clear_failures();
    EXPECT_EQ(Mismatch(got, Pattern(3)), "");
    EXPECT_EQ(Mismatch(ReadOn(*mm, 1, a, other), Pattern(1)), "");
    EXPECT_EQ(ReadOn(*mm, 2, b, other)[0], 0xdeadbeefdeadbeefull);
    EXPECT_EQ(Mismatch(ReadOn(*mm, 4, d, other), Pattern(4)), "");
    cuStreamDestroy(other);
    ASSERT_CU(cuCtxSynchronize());
    for (CUdeviceptr p : {a, b, c, d}) EXPECT_CU(mm->Free(p));
  }
}

// Host reads (ReadBack), exports (pin) and unknown work right after a
// prefetch whose copy is in flight see the data.
TEST_F(FetchStreamTest, SlowHostReadPinAndUnknownAfterPrefetch) {
  for (int mode = 0; mode < 4; ++mode) {
    SCOPED_TRACE(mode);
    auto mm = Make();
    ASSERT_NE(mm, nullptr);
    CUdeviceptr a, b, c;
    FillThreeAndPrefetchC(*mm, &a, &b, &c);
    std::vector<uint64_t> got(kWords, 0x1111);
    CUstream other;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    if (mode == 0) {
      ASSERT_CU(mm->ReadBack(3, 0, got.data(), kGranule));
    } else if (mode == 1) {
      CUresult r;
      ASSERT_TRUE(mm->PinExported(c, "cuIpcGetMemHandle", &r));
      ASSERT_CU(r);
      // Whoever holds the handle reads directly now (no stream order).
      std::memcpy(got.data(), reinterpret_cast<void*>(c), kGranule);
    } else if (mode == 3) {
      got = ReadOn(*mm, 3, c, other);  // a use on another stream after the prefetch
    } else {
      int dev = mm->BeginUnknown(other);
      CUresult r = cuMemcpyDtoHAsync_v2(got.data(), c, kGranule, other);
      mm->MarkAllWritten(other);
      mm->EndUnknown(dev);
      ASSERT_CU(r);
      ASSERT_CU(cuStreamSynchronize(other));
    }
    EXPECT_EQ(Mismatch(got, Pattern(3)), "");
    cuStreamDestroy(other);
    ASSERT_CU(cuCtxSynchronize());
    for (CUdeviceptr p : {a, b, c}) EXPECT_CU(mm->Free(p));
  }
}

// Belady with bypass, on a repeating program under a cap of two buffers:
// A, B read, X written, A, B read again. Once the planner predicts next uses,
// X (needed next in the next iteration) is served where its room would
// displace B (needed two operations later), rather than brought in, written
// back and fetched again; what it writes there is kept, every byte. Under
// `version`, which predicts nothing, X is always brought in.
class BypassTest : public testing_support::ManagerBufferTest {
 protected:
  // One operation on buffer `id`, noted with its Prepare as a launch is:
  // read, or written whole with Pattern(seed) when `seed` is not 0.
  void Op(MemoryManager& mm, uint64_t key, uint64_t id, CUdeviceptr p, uint64_t seed) {
    Ids ids = {id};
    Ids written = seed != 0 ? ids : Ids{};
    MemoryManager::OpTicket ticket;
    MemoryManager::Operation op;
    op.key = key;
    op.written = written;
    op.ticket = &ticket;
    ASSERT_CU(mm.Prepare(ids, {}, nullptr, &op));
    std::vector<uint64_t> data = Pattern(seed);
    CUresult r = seed != 0 ? cuMemcpyHtoD_v2(p, data.data(), kGranule)
                           : cuMemcpyDtoH_v2(data.data(), p, kGranule);
    mm.Finish(ids, written, nullptr, r == CUDA_SUCCESS, ticket.journal);
    mm.EndOperation(ticket, nullptr, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    Settle();
  }
  SwapStats Run(const char* policy) {
    auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "4MiB"},
                           {"STENSOR_POLICY", policy},
                           {"STENSOR_PREFETCH", "off"}});
    EXPECT_NE(mm, nullptr);
    if (mm == nullptr) return {};
    ClearLog();
    const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), x = Alloc(*mm, 3);
    Write(*mm, 1, a, 1);
    Write(*mm, 2, b, 2);
    constexpr int kIterations = 12;
    for (int i = 0; i < kIterations; ++i) {
      Op(*mm, 10, 1, a, 0);
      Op(*mm, 11, 2, b, 0);
      Op(*mm, 12, 3, x, 100 + i);
      Op(*mm, 13, 1, a, 0);
      Op(*mm, 14, 2, b, 0);
    }
    ExpectData(*mm, 1, a, 1);
    ExpectData(*mm, 2, b, 2);
    ExpectData(*mm, 3, x, 100 + kIterations - 1);
    SwapStats stats = mm->stats();
    // Each one logged as such (serve_host with by_choice).
    uint64_t logged = 0;
    for (const std::string& line : Lines()) {
      logged += line.find("\"type\":\"serve_host\"") != std::string::npos &&
                line.find("\"by_choice\":true") != std::string::npos;
    }
    EXPECT_EQ(logged, stats.served_by_choice);
    for (CUdeviceptr p : {a, b, x}) EXPECT_CU(mm->Free(p));
    return stats;
  }
};

// Two threads, each repeating its own loop of that shape on its own three
// buffers under a cap of four, prefetch on: their operations are predicted,
// committed and prepared interleaved (one's Predict commits the other's
// between its unlocked waits), buffers are served by choice, fetched and
// evicted under each other; every read sees the last write, every byte.
TEST_F(BypassTest, TwoThreadsInterleavedKeepEveryByte) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "8MiB"}, {"STENSOR_POLICY", "belady"}});
  ASSERT_NE(mm, nullptr);
  std::atomic<int> mismatches{0};
  auto loop = [&](uint64_t first_id, uint64_t key_base) {
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    CUdeviceptr p[3];
    for (int k = 0; k < 3; ++k) p[k] = Alloc(*mm, first_id + k);
    for (int k = 0; k < 2; ++k) Write(*mm, first_id + k, p[k], first_id + k);
    auto read = [&](int k, uint64_t key, uint64_t seed) {
      Ids ids = {first_id + k};
      MemoryManager::OpTicket ticket;
      MemoryManager::Operation op;
      op.key = key;
      op.ticket = &ticket;
      ASSERT_CU(mm->Prepare(ids, {}, nullptr, &op));
      std::vector<uint64_t> got(kWords);
      CUresult r = cuMemcpyDtoH_v2(got.data(), p[k], kGranule);
      mm->Finish(ids, {}, nullptr, r == CUDA_SUCCESS, ticket.journal);
      mm->EndOperation(ticket, nullptr, r == CUDA_SUCCESS);
      ASSERT_CU(r);
      if (!Mismatch(got, seed).empty()) ++mismatches;
    };
    for (int i = 0; i < 10; ++i) {
      const uint64_t seed = first_id * 1000 + i + 1;
      read(0, key_base, first_id);
      read(1, key_base + 1, first_id + 1);
      Op(*mm, key_base + 2, first_id + 2, p[2], seed);
      read(2, key_base + 3, seed);
      read(0, key_base + 4, first_id);
      read(1, key_base + 5, first_id + 1);
    }
    for (CUdeviceptr q : p) EXPECT_CU(mm->Free(q));
  };
  std::thread t1(loop, 1, 100), t2(loop, 11, 200);
  t1.join();
  t2.join();
  EXPECT_EQ(mismatches.load(), 0);
  // Six buffers under a cap of four: the loops did swap or serve.
  EXPECT_GT(mm->stats().bytes_copied_in + mm->stats().bytes_served_from_host, 0u);
}

TEST_F(BypassTest, ABufferNeededAfterWhatItWouldDisplaceIsServed) {
  const SwapStats belady = Run("belady");
  const SwapStats version = Run("version");
  EXPECT_GE(belady.served_by_choice, 5u);
  EXPECT_EQ(version.served_by_choice, 0u);
  // Served, X is not fetched (and `version` keeps it, dropping clean A and
  // B, which then come back): fewer copies in.
  EXPECT_LT(belady.bytes_copied_in, version.bytes_copied_in);
}

// An optimizer's moment M, read and written at the start of each iteration;
// later a temporary T is allocated, used and freed, and its room forces out
// M (needed the farthest off). When M is needed next there is room again:
// brought in, it would only be forced out again (copied out, since it is
// written) before its next use, so once the planner predicts next uses it is
// served in place, and T finds room without forcing anything out.
TEST_F(BypassTest, OneTheCapForcesOutBeforeEachUseIsServedThoughItFits) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"},
                         {"STENSOR_POLICY", "belady"},
                         {"STENSOR_PREFETCH", "off"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), m = Alloc(*mm, 3);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  Write(*mm, 3, m, 3);
  constexpr int kIterations = 16;
  for (int i = 0; i < kIterations; ++i) {
    const uint64_t seed = 100 + i;
    Op(*mm, 10, 3, m, seed);
    Op(*mm, 11, 1, a, 0);
    Op(*mm, 12, 2, b, 0);
    const CUdeviceptr t = Alloc(*mm, 50 + i);
    Op(*mm, 13, 50 + i, t, seed + 1000);
    Op(*mm, 14, 50 + i, t, 0);
    EXPECT_CU(mm->Free(t));
    Op(*mm, 15, 1, a, 0);
    Op(*mm, 16, 2, b, 0);
  }
  const SwapStats stats = mm->stats();
  // Before next uses are known M is brought back each time; after, it is
  // served at least every other iteration.
  EXPECT_GE(stats.served_by_choice, 4u);
  EXPECT_LT(stats.bytes_copied_in, uint64_t{kIterations} * kGranule);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, m, 100 + kIterations - 1);
  for (CUdeviceptr p : {a, b, m}) EXPECT_CU(mm->Free(p));
}

// The same program; once next uses are predicted, X is written whole
// (brought in without a copy) and evicted, and while its copy out is held
// queued behind the program's work B comes back into its memory (A, B and X read on another
// stream, with no host wait). X's next read is served by choice, as one whose
// host copy is at its address would be, once its copy out is done: brought
// in, it would wait for the same copy, then displace A or B and copy its
// bytes back. A driver call failing on that path (the wait for the copy, the
// end of the old mapping, the host mapping) loses no byte of A, B or X: the
// read either succeeds or sees the error, and read again, gets X's bytes.
TEST_F(BypassTest, OneWhoseCopyOutIsInFlightIsServedOnceItIsDone) {
  // Each driver call the read of X makes on stensor's behalf, failed once.
  const std::vector<std::pair<const char*, int>> failures = {
      {nullptr, 0},          {"cuEventSynchronize", 1},
      {"cuEventQuery", 1},   {"cuStreamSynchronize", 1},
      {"cuMemUnmap", 1},     {"cuMemMap", 1},
      {"cuMemSetAccess", 1}, {"cuEventRecord", 1}};
  for (const auto& [call, nth] : failures) {
    SCOPED_TRACE(call == nullptr ? "no failure" : std::string(call) + " #" + std::to_string(nth));
    auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "4MiB"},
                           {"STENSOR_POLICY", "belady"},
                           {"STENSOR_PREFETCH", "off"}});
    ASSERT_NE(mm, nullptr);
    const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), x = Alloc(*mm, 3);
    Write(*mm, 1, a, 1);
    Write(*mm, 2, b, 2);
    Write(*mm, 3, x, 3);
    for (int i = 0; i < 6; ++i) {
      Op(*mm, 10, 1, a, 0);
      Op(*mm, 11, 2, b, 0);
      Op(*mm, 12, 3, x, 0);
      Op(*mm, 13, 1, a, 0);
      Op(*mm, 14, 2, b, 0);
    }
    ASSERT_GT(mm->stats().served_by_choice, 0u) << "no next uses predicted";
    Op(*mm, 10, 1, a, 0);
    Op(*mm, 11, 2, b, 0);
    CUstream other;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    // Read on `other` into pinned memory: no host wait. The result of the
    // Prepare or the copy, and where the bytes land.
    std::vector<uint64_t*> got;
    auto read = [&](uint64_t key, uint64_t id, CUdeviceptr p) {
      Ids ids = {id};
      MemoryManager::OpTicket ticket;
      MemoryManager::Operation op;
      op.key = key;
      op.ticket = &ticket;
      void* pinned = nullptr;
      EXPECT_CU(cuMemAllocHost_v2(&pinned, kGranule));
      got.push_back(static_cast<uint64_t*>(pinned));
      CUresult r = mm->Prepare(ids, {}, other, &op);
      if (r != CUDA_SUCCESS) return r;
      r = cuMemcpyDtoHAsync_v2(got.back(), p, kGranule, other);
      mm->Finish(ids, {}, other, r == CUDA_SUCCESS, ticket.journal);
      mm->EndOperation(ticket, other, r == CUDA_SUCCESS);
      return r;
    };
    // X written whole behind the program's work on `held`, so that its copy
    // out stays queued until that stream opens.
    auto held = std::make_unique<HeldStream>();
    {
      Ids ids = {3};
      MemoryManager::OpTicket ticket;
      MemoryManager::Operation op;
      op.key = 12;
      op.written = ids;
      op.ticket = &ticket;
      ASSERT_CU(mm->Prepare(ids, ids, held->get(), &op));
      CUresult r = cuMemsetD32Async(x, 0xdeadbeef, kGranule / 4, held->get());
      mm->Finish(ids, ids, held->get(), r == CUDA_SUCCESS, ticket.journal);
      mm->EndOperation(ticket, held->get(), r == CUDA_SUCCESS);
      ASSERT_CU(r);
    }
    ASSERT_CU(mm->EvictAsync(3));
    ASSERT_CU(read(13, 1, a));
    ASSERT_CU(read(14, 2, b));
    ASSERT_CU(read(10, 1, a));
    ASSERT_CU(read(11, 2, b));
    const SwapStats before = mm->stats();
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      held.reset();  // opened
    });
    if (call != nullptr) fakecuda_fail_call(call, nth, CUDA_ERROR_UNKNOWN);
    // Without a failure, the calls the read makes are counted: the list
    // above must name calls that path does make.
    std::map<std::string, unsigned long long> calls_before;
    if (call == nullptr) {
      fakecuda_count_calls(1);
      for (const auto& [name, n] : failures) {
        if (name != nullptr) calls_before[name] = fakecuda_call_count(name);
      }
    }
    const CUresult first = read(12, 3, x);
    opener.join();
    fakecuda_clear_failures();
    if (call == nullptr) {
      ASSERT_CU(first);
      for (const auto& [name, count] : calls_before) {
        EXPECT_GT(fakecuda_call_count(name.c_str()), count) << name << " not called by the read";
      }
      fakecuda_count_calls(0);
      const SwapStats after = mm->stats();
      EXPECT_EQ(after.served_by_choice, before.served_by_choice + 1);
      EXPECT_EQ(after.swap_ins, before.swap_ins);
    } else if (first != CUDA_SUCCESS) {
      EXPECT_EQ(first, CUDA_ERROR_UNKNOWN);
      ASSERT_CU(read(12, 3, x));  // the program tries again
    }
    ASSERT_CU(cuStreamSynchronize(other));
    auto words = [](const uint64_t* p) { return std::vector<uint64_t>(p, p + kWords); };
    EXPECT_EQ(Mismatch(words(got[0]), Pattern(1)), "");
    EXPECT_EQ(Mismatch(words(got[1]), Pattern(2)), "");
    EXPECT_EQ(Mismatch(words(got.back()), std::vector<uint64_t>(kWords, 0xdeadbeefdeadbeefull)),
              "");
    // And once more, wherever X is now.
    ASSERT_CU(read(12, 3, x));
    ASSERT_CU(cuStreamSynchronize(other));
    EXPECT_EQ(Mismatch(words(got.back()), std::vector<uint64_t>(kWords, 0xdeadbeefdeadbeefull)),
              "");
    for (uint64_t* p : got) EXPECT_CU(cuMemFreeHost(p));
    cuStreamDestroy(other);
    ASSERT_CU(cuCtxSynchronize());
    ExpectData(*mm, 1, a, 1);
    ExpectData(*mm, 2, b, 2);
    for (CUdeviceptr p : {a, b, x}) EXPECT_CU(mm->Free(p));
  }
}

// The planner sleeps while nothing would ask it anything: under a cap the
// buffers fill less than half of, with nothing swapped out, operations are
// not fed to it (no planner is made, nothing is profiled); once a device
// holds half its cap, the operations after are, and the loop is profiled.
// Every byte stays as written either way.
TEST_F(BypassTest, ThePlannerWakesOnceADeviceHoldsHalfItsCap) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"},  // eight granules
                         {"STENSOR_POLICY", "belady"},
                         {"STENSOR_PREFETCH", "on"},
                         {"STENSOR_BANDWIDTH", "16"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), x = Alloc(*mm, 3);
  auto loop = [&](int iterations, uint64_t seed) {
    for (int i = 0; i < iterations; ++i) {
      Op(*mm, 10, 1, a, 0);
      Op(*mm, 11, 2, b, seed + i);
      Op(*mm, 12, 3, x, 0);
    }
  };
  loop(8, 100);  // three granules of eight
  SwapStats s = mm->stats();
  EXPECT_EQ(s.profiles, 0u);
  EXPECT_EQ(s.planner_bandwidth_h2d, 0.0);  // never made
  EXPECT_EQ(s.swap_outs_copied + s.clean_drops + s.never_written_drops, 0u);
  // A fourth granule: half the cap held.
  const CUdeviceptr y = Alloc(*mm, 4);
  loop(8, 200);
  s = mm->stats();
  EXPECT_GT(s.planner_bandwidth_h2d, 0.0);
  EXPECT_GE(s.profiles, 1u);
  EXPECT_EQ(s.profiled_period, 3u);
  ExpectData(*mm, 2, b, 200 + 7);
  for (CUdeviceptr p : {a, b, x, y}) EXPECT_CU(mm->Free(p));
}

// A buffer swapped out wakes it too, whatever the device holds: its next
// use is then the planner's to predict.
TEST_F(BypassTest, ThePlannerWakesOnceAnythingIsSwappedOut) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"},
                         {"STENSOR_POLICY", "belady"},
                         {"STENSOR_PREFETCH", "on"},
                         {"STENSOR_BANDWIDTH", "16"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  Op(*mm, 10, 1, a, 1);
  Op(*mm, 11, 2, b, 2);
  EXPECT_EQ(mm->stats().planner_bandwidth_h2d, 0.0);
  ASSERT_CU(mm->EvictAsync(1));
  Settle();
  for (int i = 0; i < 4; ++i) {
    Op(*mm, 10, 1, a, 0);
    Op(*mm, 11, 2, b, 0);
  }
  EXPECT_GT(mm->stats().planner_bandwidth_h2d, 0.0);
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  for (CUdeviceptr p : {a, b}) EXPECT_CU(mm->Free(p));
}

}  // namespace
}  // namespace stensor
