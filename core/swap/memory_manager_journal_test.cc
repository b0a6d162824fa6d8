// Tests for the operation journal in core/swap/memory_manager
// (OperationJournal): before the cap presses, an operation of known
// accesses is let through without a look at its buffers, and what it leaves
// (each buffer's last use on its stream, its LRU tick, the version of what
// it wrote) is applied before anything reads it. Each test below loses data
// or evicts the wrong buffer where that bookkeeping is skipped rather than
// deferred, on the fake CUDA driver (2 MiB granules).
#include <cuda.h>

#include <atomic>
#include <cstdint>
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
using testing_support::kGranule;
using testing_support::Mismatch;
using testing_support::Pattern;

class JournalTest : public testing_support::ManagerBufferTest {
 protected:
  // The tracker's way into an operation of known accesses: journaled where
  // the manager lets it, else prepared in full. True when journaled.
  bool Begin(MemoryManager& mm, const Ids& ids, const Ids& written, CUstream stream,
             MemoryManager::OpTicket* ticket) {
    if (mm.Journal(ids, ticket)) return true;
    MemoryManager::Operation op;
    op.key = 1;
    op.written = written;
    op.ticket = ticket;
    EXPECT_CU(mm.Prepare(ids, {}, stream, &op));
    return false;
  }
  // Pattern(seed) copied into buffer `id` on `stream`, through Begin.
  bool CopyIn(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint64_t seed, CUstream stream,
              std::vector<uint64_t>* keep) {
    *keep = Pattern(seed);
    const Ids ids = {id};
    MemoryManager::OpTicket ticket;
    const bool journaled = Begin(mm, ids, ids, stream, &ticket);
    const CUresult r = cuMemcpyHtoDAsync_v2(p, keep->data(), kGranule, stream);
    mm.Finish(ids, ids, stream, r == CUDA_SUCCESS, ticket.journal);
    EXPECT_CU(r);
    return journaled;
  }
  // Under a 16 MiB cap holding one granule: seven more (ids 2-8), each
  // written (none droppable), fill it, and a ninth (id 9) makes the first
  // eviction.
  std::vector<CUdeviceptr> FillPastTheCap(MemoryManager& mm) {
    std::vector<CUdeviceptr> more;
    for (uint64_t id = 2; id <= 8; ++id) {
      more.push_back(Alloc(mm, id));
      Write(mm, id, more.back(), id);
    }
    more.push_back(Alloc(mm, 9));
    Settle();
    return more;
  }
  // The ids of the swap_out and drop records in the log, in order.
  std::vector<uint64_t> Evicted() {
    std::vector<uint64_t> ids;
    for (const std::string& line : Lines()) {
      if (line.find("\"type\":\"swap_out\"") == std::string::npos &&
          line.find("\"type\":\"drop_") == std::string::npos) {
        continue;
      }
      const size_t at = line.find("\"id\":");
      if (at != std::string::npos) ids.push_back(std::stoull(line.substr(at + 5)));
    }
    return ids;
  }
};

// A buffer written only by a journaled operation, then evicted once the cap
// presses: copied out (its write known), never dropped as never written.
TEST_F(JournalTest, AJournaledWriteIsCopiedOutAtTheFirstEviction) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}, {"STENSOR_POLICY", "version"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1);
  std::vector<uint64_t> data;
  EXPECT_TRUE(CopyIn(*mm, 1, a, 11, nullptr, &data));  // below half the cap: journaled
  Settle();
  // The ninth granule evicts the least recently used, `a`.
  const std::vector<CUdeviceptr> more = FillPastTheCap(*mm);
  EXPECT_EQ(Evicted(), Ids{1});
  EXPECT_EQ(mm->stats().never_written_drops, 0u);
  ExpectData(*mm, 1, a, 11);
  for (CUdeviceptr p : more) ASSERT_CU(mm->Free(p));
  ASSERT_CU(mm->Free(a));
}

// Journaled operations touch `a` then `b`: `c`, written before them, is now
// the least recently used and the one the first eviction takes.
TEST_F(JournalTest, LeastRecentlyUsedOrderIncludesJournaledOperations) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}, {"STENSOR_POLICY", "lru"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), c = Alloc(*mm, 3);
  std::vector<uint64_t> da, db, dc;
  EXPECT_TRUE(CopyIn(*mm, 3, c, 3, nullptr, &dc));
  EXPECT_TRUE(CopyIn(*mm, 1, a, 1, nullptr, &da));
  EXPECT_TRUE(CopyIn(*mm, 2, b, 2, nullptr, &db));
  Settle();
  std::vector<CUdeviceptr> more;
  for (uint64_t id = 4; id <= 9; ++id) more.push_back(Alloc(*mm, id));
  Settle();
  EXPECT_EQ(Evicted(), Ids{3});
  ExpectData(*mm, 1, a, 1);
  ExpectData(*mm, 2, b, 2);
  ExpectData(*mm, 3, c, 3);
  for (CUdeviceptr p : more) ASSERT_CU(mm->Free(p));
  for (CUdeviceptr p : {a, b, c}) ASSERT_CU(mm->Free(p));
}

// The cap presses while a journaled operation on `a` is between its Prepare
// and its Finish: its buffer is pinned for it as its Prepare would have,
// so the eviction takes another one, and after its Finish it may go.
TEST_F(JournalTest, AnOperationInFlightWhenTheCapPressesKeepsItsBuffer) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}, {"STENSOR_POLICY", "lru"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  const Ids ids = {1};
  MemoryManager::OpTicket ticket;
  ASSERT_TRUE(Begin(*mm, ids, ids, nullptr, &ticket));
  std::vector<CUdeviceptr> more;
  for (uint64_t id = 3; id <= 9; ++id) more.push_back(Alloc(*mm, id));  // the ninth evicts
  const std::vector<uint64_t> data = Pattern(21);
  const CUresult r = cuMemcpyHtoD_v2(a, data.data(), kGranule);
  mm->Finish(ids, ids, nullptr, r == CUDA_SUCCESS, ticket.journal);
  ASSERT_CU(r);
  Settle();
  EXPECT_EQ(Evicted(), Ids{2});  // `a`, least recently used, was held
  // Finished, it may go like any other.
  ASSERT_CU(mm->EvictAsync(1));
  Settle();
  EXPECT_EQ(Evicted(), (Ids{2, 1}));
  ExpectData(*mm, 1, a, 21);
  for (CUdeviceptr p : more) ASSERT_CU(mm->Free(p));
  for (CUdeviceptr p : {a, b}) ASSERT_CU(mm->Free(p));
}

// A buffer freed after a journaled operation on it that has not run yet:
// its memory is released only once that operation completed.
TEST_F(JournalTest, AFreeWaitsForTheJournaledOperationsOnItsBuffer) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1);
  auto held = std::make_unique<HeldStream>();
  std::vector<uint64_t> data;
  EXPECT_TRUE(CopyIn(*mm, 1, a, 5, held->get(), &data));
  const size_t before = Used();
  ASSERT_CU(mm->Free(a));
  mm->ReleaseIdlePooled(0, 0);  // what is idle goes back to the driver
  EXPECT_EQ(Used(), before) << "released under queued work";
  held->Open();
  held.reset();
  Settle();
  mm->ReleaseIdlePooled(0, 0);
  EXPECT_EQ(Used(), 0u);
}

// Journaled uses of one buffer on two streams, then again on the first:
// the apply (newest first) keeps each stream's latest, the second stream's
// included, so the free waits for that stream's queued work too.
TEST_F(JournalTest, AFreeWaitsForEachStreamsJournaledUse) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1);
  auto first = std::make_unique<HeldStream>();
  auto second = std::make_unique<HeldStream>();
  std::vector<uint64_t> one, two, three;
  EXPECT_TRUE(CopyIn(*mm, 1, a, 5, first->get(), &one));
  EXPECT_TRUE(CopyIn(*mm, 1, a, 5, second->get(), &two));
  EXPECT_TRUE(CopyIn(*mm, 1, a, 5, first->get(), &three));
  first->Open();
  first.reset();
  const size_t before = Used();
  ASSERT_CU(mm->Free(a));
  mm->ReleaseIdlePooled(0, 0);
  EXPECT_EQ(Used(), before) << "released under the second stream's queued work";
  second->Open();
  second.reset();
  Settle();
  mm->ReleaseIdlePooled(0, 0);
  EXPECT_EQ(Used(), 0u);
}

// A registry id too large for the manager's dense index (DenseIdMap) is
// still found: its operations are journaled and applied, and it is
// evicted and brought back with its data.
TEST_F(JournalTest, ABufferWithAHugeIdIsFoundLikeAnyOther) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}, {"STENSOR_POLICY", "version"}});
  ASSERT_NE(mm, nullptr);
  const uint64_t huge = uint64_t{1} << 40;
  const CUdeviceptr h = Alloc(*mm, huge);
  std::vector<uint64_t> data;
  EXPECT_TRUE(CopyIn(*mm, huge, h, 9, nullptr, &data));
  Settle();
  // The ninth granule evicts the least recently used, the huge one, copied
  // out since its journaled write is known.
  const std::vector<CUdeviceptr> more = FillPastTheCap(*mm);
  EXPECT_EQ(Evicted(), Ids{huge});
  EXPECT_EQ(mm->stats().never_written_drops, 0u);
  ExpectData(*mm, huge, h, 9);
  for (CUdeviceptr p : more) ASSERT_CU(mm->Free(p));
  ASSERT_CU(mm->Free(h));
}

// A buffer given reused memory is zeroed on stensor's stream, behind the
// freed owner's queued work: an operation on it right after must run after
// that zeroing, journaled or not, or its bytes would be zeroed under it.
TEST_F(JournalTest, AnOperationOnReusedMemoryRunsAfterItsZeroing) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr x = Alloc(*mm, 1);
  auto held = std::make_unique<HeldStream>();
  std::vector<uint64_t> old;
  CopyIn(*mm, 1, x, 1, held->get(), &old);
  ASSERT_CU(mm->Free(x));  // its memory handed on in stream order
  const CUdeviceptr y = Alloc(*mm, 2);
  std::vector<uint64_t> data;
  EXPECT_FALSE(CopyIn(*mm, 2, y, 7, nullptr, &data))
      << "journaled while stensor's own zeroing was queued";
  held->Open();
  held.reset();
  Settle();
  ExpectData(*mm, 2, y, 7);
  // The zeroing done, operations are journaled again.
  Settle();
  EXPECT_TRUE(CopyIn(*mm, 2, y, 8, nullptr, &data));
  Settle();
  ExpectData(*mm, 2, y, 8);
  ASSERT_CU(mm->Free(y));
}

// The record of a journaled operation's use fails: the use is kept as one
// only a host wait can tell done, so a free right after it releases nothing
// under the queued work, and the bytes it wrote are there.
TEST_F(JournalTest, AFailedRecordOfAJournaledUseKeepsTheBufferUntilAWait) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr a = Alloc(*mm, 1);
  auto held = std::make_unique<HeldStream>();
  std::vector<uint64_t> data;
  fakecuda_fail_call("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_TRUE(CopyIn(*mm, 1, a, 9, held->get(), &data));
  fakecuda_clear_failures();
  EXPECT_GE(mm->stats().driver_errors, 1u);
  const size_t before = Used();
  mm->ReleaseIdlePooled(0, 0);
  EXPECT_EQ(Used(), before);
  held->Open();
  held.reset();
  Settle();
  ExpectData(*mm, 1, a, 9);
  ASSERT_CU(mm->Free(a));
}

// The look at stensor's own streams fails: operations keep the full path
// (ordered after the zeroing) until a look succeeds; no byte is lost.
TEST_F(JournalTest, AFailedLookAtOwnStreamsKeepsTheFullPath) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "16MiB"}});
  ASSERT_NE(mm, nullptr);
  const CUdeviceptr x = Alloc(*mm, 1);
  std::vector<uint64_t> old;
  CopyIn(*mm, 1, x, 1, nullptr, &old);
  Settle();
  ASSERT_CU(mm->Free(x));
  const CUdeviceptr y = Alloc(*mm, 2);  // reused memory: zeroed on stensor's stream
  Settle();
  fakecuda_fail_call("cuStreamQuery", 1, CUDA_ERROR_UNKNOWN);
  std::vector<uint64_t> data;
  EXPECT_FALSE(CopyIn(*mm, 2, y, 4, nullptr, &data));
  fakecuda_clear_failures();
  Settle();
  ExpectData(*mm, 2, y, 4);
  EXPECT_TRUE(CopyIn(*mm, 2, y, 6, nullptr, &data));
  Settle();
  ExpectData(*mm, 2, y, 6);
  ASSERT_CU(mm->Free(y));
}

// Threads write and check their own buffers through journaled operations
// while another allocates until the cap presses and evicts: whenever the
// journaling ends, every byte written is where it was written.
TEST_F(JournalTest, ThreadsKeepTheirDataAcrossTheEndOfJournaling) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "24MiB"}});
  ASSERT_NE(mm, nullptr);
  constexpr int kThreads = 3;
  constexpr int kRounds = 40;
  std::vector<CUdeviceptr> own(kThreads);
  for (int t = 0; t < kThreads; ++t) own[t] = Alloc(*mm, 1 + t);
  std::atomic<int> started{0};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_CU(cuCtxSetCurrent(ctx_));
      CUstream stream = nullptr;
      ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
      ++started;
      const uint64_t id = 1 + t;
      std::vector<uint64_t> data, got(testing_support::kWords);
      for (int i = 0; i < kRounds; ++i) {
        const uint64_t seed = id * 1000 + i;
        CopyIn(*mm, id, own[t], seed, stream, &data);
        const Ids ids = {id};
        MemoryManager::OpTicket ticket;
        Begin(*mm, ids, {}, stream, &ticket);
        const CUresult r = cuMemcpyDtoHAsync_v2(got.data(), own[t], kGranule, stream);
        mm->Finish(ids, {}, stream, r == CUDA_SUCCESS, ticket.journal);
        EXPECT_CU(r);
        EXPECT_CU(cuStreamSynchronize(stream));
        if (!Mismatch(got, seed).empty()) ++bad;
      }
      EXPECT_CU(cuStreamDestroy_v2(stream));
    });
  }
  while (started < kThreads) std::this_thread::yield();
  // Twelve more granules: the cap (twelve) presses, then evicts.
  std::vector<CUdeviceptr> more;
  for (uint64_t id = 10; id < 22; ++id) {
    more.push_back(Alloc(*mm, id));
    std::this_thread::yield();
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  for (int t = 0; t < kThreads; ++t) ExpectData(*mm, 1 + t, own[t], (1 + t) * 1000 + kRounds - 1);
  for (CUdeviceptr p : more) ASSERT_CU(mm->Free(p));
  for (CUdeviceptr p : own) ASSERT_CU(mm->Free(p));
}

}  // namespace
}  // namespace stensor
