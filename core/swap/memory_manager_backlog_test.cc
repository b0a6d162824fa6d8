// Tests for pending frees in core/memory_manager (S404): buffers freed while
// work using them is still queued, by a program that never synchronises,
// on the fake CUDA driver (2 MiB granules). The work is held back on a
// stream (HeldStream) for the whole loop, so that nothing completes and
// every bound below holds whatever the machine's speed:
//   - a loop of allocate, write on a stream, free (LIVE buffers alive at
//     once) creates the working set's chunks and no more, reserves and maps
//     nothing once they exist (the fake's calls counted), and costs the same
//     number of event queries per iteration at its end as at its start,
//     uncapped and under a cap;
//   - the memory of a pending free reaches its next owner in stream order:
//     the new owner's work on another stream runs after the old owner's
//     (and after the zeroing), with no host wait;
//   - buffers of other sizes are served from pending frees' chunks before
//     any chunk is created;
//   - a pending free whose host copy its queued work still uses keeps that
//     host copy until the work ran (its device memory is handed on);
//   - a stream held back holds back only its own pending frees: another
//     stream's are released once that stream passed them;
//   - a driver call of that path failed once (each of them, at each of its
//     first occurrences) never lets memory reach a new owner under its old
//     owner's work, and what was freed is still released.
// Every iteration copies what it wrote to a record of its own, on the
// stream, before its buffer is freed: each record must hold its
// iteration's value once the stream ran.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/base/config.h"
#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::HeldStream;
using testing_support::kGranule;
using Ids = std::vector<uint64_t>;

constexpr uint64_t kTail = 4096;  // bytes each iteration writes and reads

// The fake driver's calls so far: what a phase of the loop cost.
struct Phase {
  unsigned long long queries = 0;   // cuEventQuery
  unsigned long long creates = 0;   // cuMemCreate: chunks
  unsigned long long maps = 0;      // cuMemMap: a chunk mapped at an address
  unsigned long long reserves = 0;  // cuMemAddressReserve
  unsigned long long frees = 0;     // cuMemAddressFree

  Phase operator-(const Phase& o) const {
    return {queries - o.queries, creates - o.creates, maps - o.maps, reserves - o.reserves,
            frees - o.frees};
  }
};

class PendingFreeTest : public testing_support::FakeDeviceTest {
 protected:
  // A buffer the loop left alive.
  struct Held {
    uint64_t id;
    CUdeviceptr p;
    uint64_t bytes;
  };
  void SetUp() override {
    FakeDeviceTest::SetUp();
    fakecuda_count_calls(1);
  }
  void TearDown() override {
    fakecuda_count_calls(0);
    for (void* block : record_blocks_) EXPECT_CU(cuMemFreeHost(block));
    FakeDeviceTest::TearDown();
  }
  std::unique_ptr<MemoryManager> Make(const std::string& limit) {
    return MakeManager({{"STENSOR_MEMORY_LIMIT", limit}, {"STENSOR_LOG_LEVEL", "error"}});
  }
  CUdeviceptr Alloc(MemoryManager& mm, uint64_t id, uint64_t bytes = kGranule) {
    CUdeviceptr p = 0;
    EXPECT_CU(mm.Allocate(bytes, &p, [id](CUdeviceptr) { return id; }));
    return p;
  }
  // Frees buffer 1 at `a` (one granule, its work held on `held`) and
  // allocates buffer 2 in its place, whose tail is written on `other`: that
  // write waits on the device for the held work (and the zeroing), the host
  // for nothing, and the memory then holds zeros and the write, not the old
  // owner's. Returns buffer 2's address; `held` is open after.
  CUdeviceptr TakeOverAfterHeldWork(MemoryManager& mm, CUdeviceptr a, HeldStream& held,
                                    CUstream other) {
    EXPECT_CU(mm.Free(a));
    CUdeviceptr b = Alloc(mm, 2);
    EXPECT_EQ(b, a);
    SetTail(mm, 2, b, kGranule, 0xbbbbbbbb, other);
    EXPECT_EQ(cuStreamQuery(other), CUDA_ERROR_NOT_READY);  // behind the held work
    EXPECT_EQ(mm.stats().host_wait_seconds, 0.0);
    held.Open();
    EXPECT_CU(cuStreamSynchronize(other));
    EXPECT_TRUE(All(ReadAt(mm, 2, b, kGranule - kTail), 0xbbbbbbbb));
    EXPECT_TRUE(All(ReadAt(mm, 2, b, 0), 0u));
    EXPECT_CU(cuCtxSynchronize());
    return b;
  }
  // A memset of the last kTail bytes of buffer `id` (`bytes` long) on
  // `stream`, wrapped as the tracker wraps one.
  void SetTail(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint64_t bytes, uint32_t value,
               CUstream stream) {
    Ids ids = {id};
    ASSERT_CU(mm.Prepare(ids, {}, stream));
    CUresult r = cuMemsetD32Async(p + bytes - kTail, value, kTail / 4, stream);
    mm.Finish(ids, ids, stream, r == CUDA_SUCCESS);
    ASSERT_CU(r);
  }
  // Buffer `id`'s words at [offset, offset + kTail), read as the tracker
  // would (the caller synchronised with the work that wrote them).
  std::vector<uint32_t> ReadAt(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint64_t offset) {
    std::vector<uint32_t> words(kTail / 4);
    Ids ids = {id};
    EXPECT_CU(mm.Prepare(ids, {}, nullptr));
    CUresult r = cuMemcpyDtoH_v2(words.data(), p + offset, kTail);
    mm.Finish(ids, {}, nullptr, r == CUDA_SUCCESS);
    EXPECT_CU(r);
    return words;
  }
  static bool All(const std::vector<uint32_t>& words, uint32_t value) {
    for (uint32_t w : words) {
      if (w != value) return false;
    }
    return true;
  }
  // After the stream ran: the iterations whose record does not hold their
  // value (each one's own, not a later owner's nor zeros).
  int BadRecords() {
    int bad = 0;
    for (size_t i = 0; i < records_.size(); ++i) {
      if (records_[i] == nullptr) continue;
      if (!All(std::vector<uint32_t>(records_[i], records_[i] + kTail / 4),
               static_cast<uint32_t>(i + 1))) {
        ++bad;
      }
    }
    return bad;
  }
  // Once the stream may run: every record holds its iteration's value, and
  // each buffer still alive its own tail, after zeros (its memset ran after
  // its zeroing, which ran after the old owner's work); then frees them.
  void CheckAndFree(MemoryManager& mm, const std::deque<Held>& held) {
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_EQ(BadRecords(), 0);
    for (const Held& h : held) {
      EXPECT_TRUE(All(ReadAt(mm, h.id, h.p, h.bytes - kTail), static_cast<uint32_t>(h.id)))
          << "buffer " << h.id << ": its memset did not run after the old owner's";
      EXPECT_TRUE(All(ReadAt(mm, h.id, h.p, 0), 0u)) << "buffer " << h.id << " not zeroed";
      EXPECT_CU(mm.Free(h.p));
    }
  }
  static Phase Now() {
    return Phase{fakecuda_call_count("cuEventQuery"), fakecuda_call_count("cuMemCreate"),
                 fakecuda_call_count("cuMemMap"), fakecuda_call_count("cuMemAddressReserve"),
                 fakecuda_call_count("cuMemAddressFree")};
  }

  // `iterations` of: allocate buffer i (`sizes[i % sizes.size()]` granules),
  // set its tail to i + 1 on `stream` and copy it to record i, free the
  // buffer allocated `live` - 1 iterations before (this one when `live` is
  // 1) with that work still queued (cuMemFree, or every other one a
  // stream-ordered free on `stream`). Returns the cost of the first and of
  // the last `phase` iterations; `*held` are the buffers still alive, oldest
  // first, with their ids and sizes.
  std::pair<Phase, Phase> Loop(MemoryManager& mm, int iterations, int live,
                               const std::vector<uint64_t>& sizes, CUstream stream, int phase,
                               std::deque<Held>* held) {
    records_.assign(iterations, nullptr);
    // Freed at the end of the test: freeing pinned memory synchronises.
    void* records_host = nullptr;
    EXPECT_CU(cuMemAllocHost_v2(&records_host, iterations * kTail));
    record_blocks_.push_back(records_host);
    Phase start = Now(), first, before_last;
    for (int i = 0; i < iterations; ++i) {
      if (i == iterations - phase) before_last = Now();
      const uint64_t id = i + 1, bytes = sizes[i % sizes.size()] * kGranule;
      CUdeviceptr p = Alloc(mm, id, bytes);
      if (p == 0) break;
      SetTail(mm, id, p, bytes, static_cast<uint32_t>(id), stream);
      uint32_t* record = static_cast<uint32_t*>(records_host) + i * kTail / 4;
      Ids ids = {id};
      EXPECT_CU(mm.Prepare(ids, {}, stream));
      CUresult r = cuMemcpyDtoHAsync_v2(record, p + bytes - kTail, kTail, stream);
      mm.Finish(ids, {}, stream, r == CUDA_SUCCESS);
      EXPECT_CU(r);
      records_[i] = record;
      held->push_back({id, p, bytes});
      if (static_cast<int>(held->size()) == live) {
        const Held& old = held->front();
        EXPECT_CU(old.id % 2 == 0 ? mm.FreeAsync(old.p, stream) : mm.Free(old.p));
        held->pop_front();
      }
      if (i + 1 == phase) first = Now();
    }
    Phase end = Now();
    return {first - start, end - before_last};
  }

 private:
  std::vector<void*> record_blocks_;  // pinned: the copies are asynchronous
  std::vector<const uint32_t*> records_;
};

class BacklogTest : public PendingFreeTest, public ::testing::WithParamInterface<const char*> {};

// The loop of a program that frees its 2 MiB temporaries while their work
// is queued and never synchronises, uncapped (the device's 16 GiB) and under
// a 1 GiB cap, one buffer alive at a time or four (an 8 MiB working set).
// Each allocation takes over a pending free whole: the working set's chunks
// are the only ones created, nothing is mapped or reserved as the loop runs,
// and an iteration at the end costs the event queries one at the start did.
// Nothing is waited for on the host. Once the stream runs, each buffer holds
// its own value: its memory was not handed on before its work ran.
TEST_P(BacklogTest, PendingFreesOfOneSizeAreTakenOverWhole) {
  for (int live : {1, 4}) {
    SCOPED_TRACE(testing::Message() << "live " << live);
    auto mm = Make(GetParam());
    ASSERT_NE(mm, nullptr);
    auto held_stream = std::make_unique<HeldStream>();
    constexpr int kIterations = 2000, kPhase = 500;
    std::deque<Held> held;
    const Phase start = Now();
    auto [first, last] = Loop(*mm, kIterations, live, {1}, held_stream->get(), kPhase, &held);
    ASSERT_EQ(held.size(), static_cast<size_t>(live - 1));
    const SwapStats stats = mm->stats();
    // The working set: `live` buffers at each allocation, one of them a
    // pending free taken over.
    EXPECT_LE(stats.physical_creates, static_cast<uint64_t>(live));
    EXPECT_EQ(last.creates, 0u);
    // Nothing reserved or mapped once the working set exists, and no more
    // address ranges held than buffers alive.
    EXPECT_EQ(last.maps, 0u);
    EXPECT_EQ(last.reserves, 0u);
    const Phase all = Now() - start;
    EXPECT_LE(all.reserves - all.frees, static_cast<uint64_t>(live));
    // A constant per iteration (a handful), not one per pending free.
    EXPECT_LE(last.queries, first.queries + kPhase);
    EXPECT_LE(last.queries, 16u * kPhase);
    EXPECT_EQ(stats.host_wait_seconds, 0.0);
    EXPECT_EQ(stats.driver_errors, 0u);

    held_stream->Open();
    CheckAndFree(*mm, held);
  }
}

// Buffers of 2, 4 and 6 MiB in turn, two alive: a pending free's memory
// serves a buffer of another size, handed on in stream order, so the chunks
// created stay within a small multiple of the working set (12 MiB, six
// chunks) however long the stream stays held.
TEST_P(BacklogTest, PendingFreesServeOtherSizesBeforeAnyChunkIsCreated) {
  auto mm = Make(GetParam());
  ASSERT_NE(mm, nullptr);
  auto held_stream = std::make_unique<HeldStream>();
  constexpr int kIterations = 600, kPhase = 150;
  std::deque<Held> held;
  auto [first, last] = Loop(*mm, kIterations, 2, {1, 2, 3}, held_stream->get(), kPhase, &held);
  const SwapStats stats = mm->stats();
  EXPECT_LE(stats.physical_creates, 12u);
  EXPECT_EQ(last.creates, 0u);
  EXPECT_EQ(stats.host_wait_seconds, 0.0);
  EXPECT_EQ(stats.driver_errors, 0u);
  held_stream->Open();
  CheckAndFree(*mm, held);
}

INSTANTIATE_TEST_SUITE_P(Caps, BacklogTest, ::testing::Values("16GiB", "1GiB"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param == std::string("1GiB") ? "Capped"
                                                                                : "Uncapped");
                         });

// A pending free taken over by a buffer used on another stream: that use
// waits on the device for the old owner's work (held) and the zeroing, and
// the host for nothing. Its memory then holds zeros and its own write, not
// the old owner's.
TEST_F(PendingFreeTest, TakenOverMemoryIsUsedAfterTheOldOwnersWork) {
  auto mm = Make("64MiB");
  ASSERT_NE(mm, nullptr);
  auto held = std::make_unique<HeldStream>();
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = Alloc(*mm, 1);
  SetTail(*mm, 1, a, kGranule, 0xaaaaaaaa, held->get());
  {
    // The old owner's write at the head too.
    Ids ids = {1};
    ASSERT_CU(mm->Prepare(ids, {}, held->get()));
    CUresult r = cuMemsetD32Async(a, 0xaaaaaaaa, kTail / 4, held->get());
    mm->Finish(ids, ids, held->get(), r == CUDA_SUCCESS);
    ASSERT_CU(r);
  }
  const CUdeviceptr b = TakeOverAfterHeldWork(*mm, a, *held, other);
  EXPECT_CU(mm->Free(b));
  ASSERT_CU(cuStreamDestroy(other));
}

// The same when the old owner's use shares its event record with other
// buffers' (one record per operation) and the stream ran on far enough
// since for that record's event to be recorded again, behind the held
// work: the use is still not done, and the new owner still waits for it.
TEST_F(PendingFreeTest, TakenOverMemoryWaitsForAUseWhoseEventWasRecordedAgain) {
  auto mm = Make("64MiB");
  ASSERT_NE(mm, nullptr);
  auto held = std::make_unique<HeldStream>();
  CUstream other;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = Alloc(*mm, 1);
  CUdeviceptr c = Alloc(*mm, 3, 2 * kGranule);  // another size: never a's
  {
    Ids ids = {1, 3};
    ASSERT_CU(mm->Prepare(ids, {}, held->get()));
    CUresult r = cuMemsetD32Async(a, 0xaaaaaaaa, kGranule / 4, held->get());
    mm->Finish(ids, ids, held->get(), r == CUDA_SUCCESS);
    ASSERT_CU(r);
  }
  // Every event of the stream's ring taken, and a's taken again.
  for (size_t i = 0; i < MemoryManager::kMaxMarksPerStream + 8; ++i) {
    SetTail(*mm, 3, c, 2 * kGranule, static_cast<uint32_t>(i), held->get());
  }
  const CUdeviceptr b = TakeOverAfterHeldWork(*mm, a, *held, other);
  EXPECT_TRUE(All(ReadAt(*mm, 3, c, 2 * kGranule - kTail),
                  static_cast<uint32_t>(MemoryManager::kMaxMarksPerStream + 7)));
  EXPECT_CU(mm->Free(b));
  EXPECT_CU(mm->Free(c));
  ASSERT_CU(cuStreamDestroy(other));
}

// A pending free whose host copy its queued work still uses (its swap-out
// copy, queued behind the held stream, then taken back by a use there)
// while device memory of its size is freed: its host copy is not let go
// before that work ran. With the spare host copies full (a 4 MiB one kept
// under a 4 MiB cap), letting it go would release its host memory under the
// queued copy into it. The allocation of its size is served from the pool
// meanwhile, nothing is released until the stream runs, and the use's
// record then holds the old owner's value.
TEST_F(PendingFreeTest, AHostCopyInUseIsNotLetGoWithItsPendingFree) {
  auto mm = Make("4MiB");
  ASSERT_NE(mm, nullptr);
  // A swapped-out buffer of 4 MiB freed idle: its host copy is kept, and
  // the spare host copies hold a cap's worth.
  CUdeviceptr c = Alloc(*mm, 1, 2 * kGranule);
  SetTail(*mm, 1, c, 2 * kGranule, 1, nullptr);
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(mm->EvictAsync(1));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(mm->Free(c));
  ASSERT_FALSE(mm->Owns(c));
  auto held = std::make_unique<HeldStream>();
  uint32_t* record = nullptr;
  ASSERT_CU(cuMemAllocHost_v2(reinterpret_cast<void**>(&record), kTail));
  // Written on the held stream, evicted behind that write (its copy into a
  // fresh host copy queued), taken back by a read on the held stream.
  CUdeviceptr a = Alloc(*mm, 2);
  SetTail(*mm, 2, a, kGranule, 2, held->get());
  ASSERT_CU(mm->EvictAsync(2));
  {
    Ids ids = {2};
    ASSERT_CU(mm->Prepare(ids, {}, held->get()));
    CUresult r = cuMemcpyDtoHAsync_v2(record, a + kGranule - kTail, kTail, held->get());
    mm->Finish(ids, {}, held->get(), r == CUDA_SUCCESS);
    ASSERT_CU(r);
  }
  EXPECT_EQ(mm->stats().swap_outs_cancelled, 1u);
  ASSERT_CU(mm->Free(a));
  const unsigned long long releases = fakecuda_call_count("cuMemRelease");
  CUdeviceptr b = Alloc(*mm, 3);
  ASSERT_NE(b, 0u);
  SetTail(*mm, 3, b, kGranule, 3, nullptr);
  EXPECT_EQ(fakecuda_call_count("cuMemRelease"), releases)
      << "memory released while the held stream's work may use it";
  EXPECT_EQ(mm->stats().host_wait_seconds, 0.0);
  held->Open();
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_TRUE(All(std::vector<uint32_t>(record, record + kTail / 4), 2u));
  EXPECT_TRUE(All(ReadAt(*mm, 3, b, kGranule - kTail), 3u));
  EXPECT_TRUE(All(ReadAt(*mm, 3, b, 0), 0u));
  EXPECT_CU(mm->Free(b));
  EXPECT_CU(cuMemFreeHost(record));
}

// Pending frees queue per stream: one held back does not hold back the
// release of another stream's pending free once that stream passed it
// (released at the next call, by event queries only).
TEST_F(PendingFreeTest, AHeldStreamHoldsBackOnlyItsOwnPendingFrees) {
  auto mm = Make("64MiB");
  ASSERT_NE(mm, nullptr);
  auto held = std::make_unique<HeldStream>();
  auto other = std::make_unique<HeldStream>();  // opened first
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  SetTail(*mm, 1, a, kGranule, 1, held->get());
  SetTail(*mm, 2, b, kGranule, 2, other->get());
  ASSERT_CU(mm->Free(a));  // first: the oldest pending free
  ASSERT_CU(mm->Free(b));
  EXPECT_TRUE(mm->Owns(b));  // pending
  other->Open();
  ASSERT_CU(cuStreamSynchronize(other->get()));
  // A small allocation takes over nothing: only what completed is released.
  CUdeviceptr s = Alloc(*mm, 3, 4096);
  EXPECT_TRUE(mm->Owns(a));
  EXPECT_FALSE(mm->Owns(b));
  EXPECT_EQ(mm->stats().garbage_released, 1u);
  EXPECT_EQ(mm->stats().host_wait_seconds, 0.0);
  held->Open();
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(s));
  EXPECT_FALSE(mm->Owns(a));
  EXPECT_EQ(mm->stats().garbage_released, 2u);
}

// Each driver call of this path failed once, at each of its first three
// occurrences, in a loop of 2 and 4 MiB buffers (two alive) under a 64 MiB
// cap and uncapped: the program sees no error (stensor works around each
// one: a pending free it could not order or release stays one, retried),
// every record holds its own iteration's value, and under the cap an
// allocation of all of it still succeeds once the program synchronised and
// freed everything (what was freed was released, or is then). Where a
// failure leaves only a host wait (a stream that could not be made to wait
// for another), that wait needs the held stream to run: it is opened after
// the loop, or after 100 ms.
TEST_F(PendingFreeTest, AFailedCallNeverHandsOnMemoryUnderWork) {
  const char* const calls[] = {"cuEventRecord",   "cuEventQuery",    "cuStreamWaitEvent",
                               "cuEventCreate",   "cuMemsetD8Async", "cuMemUnmap",
                               "cuMemAddressFree"};
  int reached = 0;
  for (const char* limit : {"64MiB", "16GiB"}) {
    for (const char* call : calls) {
      for (int nth = 1; nth <= 3; ++nth) {
        SCOPED_TRACE(testing::Message() << limit << ", " << call << " #" << nth);
        auto mm = Make(limit);
        ASSERT_NE(mm, nullptr);
        auto held_stream = std::make_unique<HeldStream>();
        std::deque<Held> held;
        fakecuda_fail_call(call, nth, CUDA_ERROR_UNKNOWN);
        std::atomic<bool> looped{false};
        std::thread opener([&] {
          for (int ms = 0; ms < 100 && !looped.load(); ++ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          held_stream->Open();
        });
        Loop(*mm, 40, 2, {1, 2}, held_stream->get(), 10, &held);
        looped.store(true);
        opener.join();
        ASSERT_CU(cuCtxSynchronize());
        EXPECT_EQ(BadRecords(), 0);
        for (const Held& h : held) EXPECT_CU(mm->Free(h.p));
        if (std::string(limit) == "64MiB") {
          CUdeviceptr all = Alloc(*mm, 1000, 64 << 20);
          ASSERT_NE(all, 0u);
          ASSERT_CU(cuCtxSynchronize());
          EXPECT_CU(mm->Free(all));
        }
        fakecuda_clear_failures();
        if (mm->stats().driver_errors > 0) ++reached;
        held_stream.reset();
      }
    }
  }
  // Most injections hit a call of stensor's (some occurrences are never
  // reached, or are the fake's own).
  RecordProperty("injections_reaching_stensor", reached);
  EXPECT_GE(reached, 20);
}

}  // namespace
}  // namespace stensor
