#include "core/swap/operation_journal.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

std::vector<uint64_t> Of(absl::Span<const uint64_t> s) { return {s.begin(), s.end()}; }

TEST(OperationJournalTest, FindsTheSlotsInFlightForTheirOwnerOnly) {
  int a = 0, b = 0;  // two owners
  OperationJournal::Slot& mine = OperationJournal::ThisThread();
  EXPECT_EQ(&mine, &OperationJournal::ThisThread());  // one a thread
  mine.count = 2;
  mine.ids[0] = 7;
  mine.ids[1] = 8;
  mine.owner.store(&a);
  // Another thread's operation in flight for `b`, held there until looked at.
  std::atomic<bool> published{false}, looked{false};
  std::thread other([&] {
    OperationJournal::Slot& theirs = OperationJournal::ThisThread();
    EXPECT_NE(&theirs, &mine);
    theirs.count = 1;
    theirs.ids[0] = 9;
    theirs.owner.store(&b);
    published = true;
    while (!looked) std::this_thread::yield();
    theirs.owner.store(nullptr);
  });
  while (!published) std::this_thread::yield();
  std::vector<std::vector<uint64_t>> seen;
  auto collect = [&](OperationJournal::Slot& slot) { seen.push_back(Of(slot.named())); };
  OperationJournal::ForEachInFlight(&a, collect);
  EXPECT_EQ(seen, (std::vector<std::vector<uint64_t>>{{7, 8}}));
  seen.clear();
  OperationJournal::ForEachInFlight(&b, collect);
  EXPECT_EQ(seen, (std::vector<std::vector<uint64_t>>{{9}}));
  looked = true;
  other.join();
  // Its thread gone, its slot is no longer listed; none in flight for `b`.
  seen.clear();
  OperationJournal::ForEachInFlight(&b, collect);
  EXPECT_TRUE(seen.empty());
  mine.owner.store(nullptr);
  OperationJournal::ForEachInFlight(&a, collect);
  EXPECT_TRUE(seen.empty());
}

TEST(OperationJournalTest, RecordsKeepTheirIdsWrittenTickAndUseInOrder) {
  OperationJournal journal;
  EXPECT_TRUE(journal.empty());
  OperationJournal::Use use;
  use.stream = reinterpret_cast<CUstream>(0x10);
  use.gen = 5;
  journal.Add({1, 2}, {2}, 100, use);
  use.gen = 6;
  journal.Add({3}, {}, 102, use);
  journal.Add({}, {}, 103, use);  // an operation naming nothing
  ASSERT_EQ(journal.records().size(), 3u);
  const auto& first = journal.records()[0];
  EXPECT_EQ(Of(journal.ids(first)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(Of(journal.written(first)), (std::vector<uint64_t>{2}));
  EXPECT_EQ(first.tick, 100u);
  EXPECT_EQ(first.use.gen, 5u);
  const auto& second = journal.records()[1];
  EXPECT_EQ(Of(journal.ids(second)), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(journal.written(second).empty());
  EXPECT_EQ(second.use.gen, 6u);
  EXPECT_TRUE(journal.ids(journal.records()[2]).empty());
  journal.Clear();
  EXPECT_TRUE(journal.empty());
  journal.Add({9}, {9}, 200, use);
  EXPECT_EQ(Of(journal.ids(journal.records()[0])), (std::vector<uint64_t>{9}));
  journal.Release();
  EXPECT_TRUE(journal.empty());
}

// The same buffers, writes and stream as the latest record: it takes that
// record's place (its tick and use), since applied newest first the older
// one would change nothing. Anything else differing is a record of its own.
TEST(OperationJournalTest, AnOperationLikeTheLatestTakesItsPlace) {
  OperationJournal journal;
  OperationJournal::Use use;
  use.stream = reinterpret_cast<CUstream>(0x10);
  use.gen = 1;
  journal.Add({1, 2}, {2}, 10, use);
  use.gen = 2;
  journal.Add({1, 2}, {2}, 12, use);
  ASSERT_EQ(journal.records().size(), 1u);
  EXPECT_EQ(journal.records()[0].tick, 12u);
  EXPECT_EQ(journal.records()[0].use.gen, 2u);
  journal.Add({1, 2}, {}, 14, use);  // writes differ
  journal.Add({2, 1}, {}, 16, use);  // buffers in another order
  use.thread = 3;
  journal.Add({2, 1}, {}, 18, use);  // another thread's stream
  use.thread = 0;
  use.stream = reinterpret_cast<CUstream>(0x20);
  journal.Add({2, 1}, {}, 20, use);  // another stream
  EXPECT_EQ(journal.records().size(), 5u);
}

TEST(OperationJournalTest, IsFullAtItsBound) {
  OperationJournal journal;
  OperationJournal::Use use;
  // Each unlike the one before (else it would take its place).
  for (size_t i = 0; i + 1 < OperationJournal::kMaxRecords; ++i) journal.Add({i}, {}, i, use);
  EXPECT_FALSE(journal.full());
  journal.Add({0}, {}, 0, use);
  EXPECT_TRUE(journal.full());
}

}  // namespace
}  // namespace stensor
