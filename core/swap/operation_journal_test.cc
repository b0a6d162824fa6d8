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

// Records on one stream and thread share a key number; another stream or
// thread has its own. Numbers start again after Clear.
TEST(OperationJournalTest, NumbersEachStreamAndThreadOnce) {
  OperationJournal journal;
  OperationJournal::Use a, b, c;
  a.stream = reinterpret_cast<CUstream>(0x10);
  b.stream = reinterpret_cast<CUstream>(0x20);
  c.stream = a.stream;
  c.thread = 7;
  journal.Add({1}, {}, 1, a);
  journal.Add({2}, {}, 2, b);
  journal.Add({3}, {}, 3, a);
  journal.Add({4}, {}, 4, a);
  journal.Add({5}, {}, 5, c);
  std::vector<uint32_t> keys;
  for (const auto& r : journal.records()) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<uint32_t>{0, 1, 0, 0, 2}));
  journal.Clear();
  journal.Add({6}, {}, 6, b);
  EXPECT_EQ(journal.records()[0].key, 0u);
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

// Records of many ids (a launch naming many pieces): the words grow past
// their first allocation and every record keeps its own.
TEST(OperationJournalTest, RecordsOfManyIdsKeepTheirWords) {
  OperationJournal journal;
  OperationJournal::Use use;
  std::vector<uint64_t> ids(100);
  for (uint64_t r = 0; r < 1000; ++r) {
    for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = r * 1000 + i;
    journal.Add(ids, {ids[r % 100]}, r, use);
  }
  ASSERT_EQ(journal.records().size(), 1000u);
  for (uint64_t r : {uint64_t{0}, uint64_t{654}, uint64_t{999}}) {
    const auto& rec = journal.records()[r];
    for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = r * 1000 + i;
    EXPECT_EQ(Of(journal.ids(rec)), ids);
    EXPECT_EQ(Of(journal.written(rec)), (std::vector<uint64_t>{ids[r % 100]}));
  }
}

}  // namespace
}  // namespace stensor
