#include "core/inference/pointer_tables.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

using State = PointerTables::State;

class PointerTablesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = Add(0x100000, 4096);
    b_ = Add(0x200000, 4096);
    table_ = Add(0x300000, 256);
    other_ = Add(0x400000, 256);
  }
  Buffer Add(uint64_t base, uint64_t size) {
    Buffer b;
    b.base = base;
    b.size = size;
    b.id = *registry_.Add(base, size, 0, BufferKind::kDeviceAlloc);
    return b;
  }
  std::vector<uint64_t> Words(uint64_t id, State* state = nullptr) {
    std::vector<uint64_t> w;
    State s = tables_.Get(id, &w, nullptr);
    if (state != nullptr) *state = s;
    return w;
  }

  BufferRegistry registry_;
  PointerTables tables_;
  Buffer a_, b_, table_, other_;
};

TEST_F(PointerTablesTest, HostCopyRecordsWordsThatPointIntoBuffers) {
  EXPECT_TRUE(tables_.empty());
  // An interior pointer, a scalar, a pointer past every buffer, and the
  // start of another.
  uint64_t host[4] = {a_.base + 100, 42, 0x900000, b_.base};
  EXPECT_EQ(tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_), 2u);
  EXPECT_FALSE(tables_.empty());
  State state;
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{a_.base + 100, b_.base}));
  EXPECT_EQ(state, State::kKnown);
}

TEST_F(PointerTablesTest, DataWithoutPointersRecordsNothing) {
  std::vector<float> data(64, 1.5f);
  EXPECT_EQ(tables_.OnHostWrite(table_, table_.base, data.data(), 256, true, registry_), 0u);
  EXPECT_TRUE(tables_.empty());
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kNone);
}

TEST_F(PointerTablesTest, EntriesSitAtAlignedDeviceAddressesWhateverTheSourceAlignment) {
  // The copy lands at table+4 from an odd host address: the word at device
  // table+8 is host bytes [4, 12) of the copy.
  std::vector<unsigned char> bytes(64 + 1, 0);
  unsigned char* src = bytes.data() + 1;
  const uint64_t p = a_.base + 8;
  std::memcpy(src + 4, &p, 8);
  EXPECT_EQ(tables_.OnHostWrite(table_, table_.base + 4, src, 64, true, registry_), 1u);
  EXPECT_EQ(Words(table_.id), (std::vector<uint64_t>{p}));
  // The same pointer at a misaligned device address is no entry.
  PointerTables other;
  std::memcpy(src, &p, 8);
  EXPECT_EQ(other.OnHostWrite(table_, table_.base + 4, src, 12, true, registry_), 0u);
}

TEST_F(PointerTablesTest, RewritingARangeReplacesItsEntriesOnly) {
  uint64_t first[4] = {a_.base, a_.base + 8, b_.base, b_.base + 8};
  tables_.OnHostWrite(table_, table_.base, first, sizeof(first), true, registry_);
  // Entries 1 and 2 rewritten: one to data, one to another buffer.
  uint64_t second[2] = {7, other_.base};
  tables_.OnHostWrite(table_, table_.base + 8, second, sizeof(second), true, registry_);
  EXPECT_EQ(Words(table_.id), (std::vector<uint64_t>{a_.base, b_.base + 8, other_.base}));
  // A memset clears its range; clearing everything forgets the table.
  tables_.OnClear(table_, table_.base, 16);
  EXPECT_EQ(Words(table_.id), (std::vector<uint64_t>{b_.base + 8, other_.base}));
  tables_.OnClear(table_, table_.base, table_.size);
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kNone);
  EXPECT_TRUE(tables_.empty());
}

TEST_F(PointerTablesTest, ADeviceWriteMakesEntriesStaleUntilReadBack) {
  uint64_t host[1] = {a_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnDeviceWrite({table_.id});
  State state;
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{a_.base}));  // last known
  EXPECT_EQ(state, State::kStale);
  // A partial host write does not vouch for the rest.
  uint64_t more[1] = {b_.base};
  tables_.OnHostWrite(table_, table_.base + 8, more, sizeof(more), true, registry_);
  Words(table_.id, &state);
  EXPECT_EQ(state, State::kStale);
  // Read back whole: known again, with what the device holds now.
  std::vector<uint64_t> device(table_.size / 8, 0);
  device[5] = other_.base + 16;
  EXPECT_EQ(tables_.Rescan(table_, device.data(), tables_.Changes(), registry_), 1u);
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{other_.base + 16}));
  EXPECT_EQ(state, State::kKnown);
  // A whole-buffer host write is as good.
  tables_.OnDeviceWrite({table_.id});
  std::vector<uint64_t> whole(table_.size / 8, 0);
  whole[0] = a_.base;
  tables_.OnHostWrite(table_, table_.base, whole.data(), table_.size, true, registry_);
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{a_.base}));
  EXPECT_EQ(state, State::kKnown);
}

TEST_F(PointerTablesTest, DeviceWritesToOtherBuffersChangeNothing) {
  uint64_t host[1] = {a_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnDeviceWrite({a_.id});
  tables_.OnDeviceWrite({other_.id});
  State state;
  Words(table_.id, &state);
  EXPECT_EQ(state, State::kKnown);
  EXPECT_EQ(tables_.Get(other_.id, nullptr, nullptr), State::kNone);
}

TEST_F(PointerTablesTest, DeviceCopiesCarryEntries) {
  uint64_t host[4] = {0, a_.base, b_.base, 0};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  // Entries 1..2 copied to other+64.
  tables_.OnDeviceCopy(other_, other_.base + 64, &table_, table_.base + 8, 16);
  State state;
  EXPECT_EQ(Words(other_.id, &state), (std::vector<uint64_t>{a_.base, b_.base}));
  EXPECT_EQ(state, State::kKnown);
  // Copying plain device data over them removes them, and since that data
  // was written on the device it may hold pointers stensor never saw.
  tables_.OnDeviceCopy(other_, other_.base + 64, &a_, a_.base, 8);
  EXPECT_EQ(Words(other_.id, &state), (std::vector<uint64_t>{b_.base}));
  EXPECT_EQ(state, State::kStale);
  // From memory stensor does not track: stale too.
  tables_.OnDeviceCopy(table_, table_.base, nullptr, 0x900000, 8);
  Words(table_.id, &state);
  EXPECT_EQ(state, State::kStale);
  // Plain data onto plain data records nothing.
  tables_.OnDeviceCopy(b_, b_.base, &a_, a_.base, 64);
  EXPECT_EQ(tables_.Get(b_.id, nullptr, nullptr), State::kNone);
}

TEST_F(PointerTablesTest, ATableOverwrittenWholeOnTheDeviceStaysATable) {
  uint64_t host[2] = {a_.base, b_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  // Every entry overwritten by device data: nothing known, but a kernel
  // that reads it as a table must read it back.
  tables_.OnDeviceCopy(table_, table_.base, &other_, other_.base, 16);
  State state;
  EXPECT_TRUE(Words(table_.id, &state).empty());
  EXPECT_EQ(state, State::kStale);
  tables_.OnDeviceCopy(table_, table_.base, nullptr, 0x900000, 16);
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kStale);
  // Only a memset or a host write of the whole buffer says what it holds.
  tables_.OnClear(table_, table_.base, table_.size);
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kNone);
}

TEST_F(PointerTablesTest, ACopyFromAStaleTableIsStale) {
  uint64_t host[1] = {a_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnDeviceWrite({table_.id});
  tables_.OnDeviceCopy(other_, other_.base, &table_, table_.base, 8);
  State state;
  EXPECT_EQ(Words(other_.id, &state), (std::vector<uint64_t>{a_.base}));
  EXPECT_EQ(state, State::kStale);
}

// A read-back races with a host copy submitted meanwhile (another stream,
// another thread): what it read may be older, so the newer entries stay and
// nothing is vouched for.
TEST_F(PointerTablesTest, ARescanOlderThanAChangeKeepsTheNewerEntries) {
  uint64_t host[1] = {a_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnDeviceWrite({table_.id});
  const uint64_t since = tables_.Changes();
  uint64_t newer[1] = {b_.base};  // submitted during the read-back
  tables_.OnHostWrite(table_, table_.base + 8, newer, sizeof(newer), true, registry_);
  std::vector<uint64_t> device(table_.size / 8, 0);
  device[2] = other_.base;  // what the device held when read
  tables_.Rescan(table_, device.data(), since, registry_);
  State state;
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{a_.base, b_.base, other_.base}));
  EXPECT_EQ(state, State::kStale);
}

TEST_F(PointerTablesTest, UnknownWorkMakesEveryTableStale) {
  uint64_t host[1] = {a_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnHostWrite(other_, other_.base, host, sizeof(host), true, registry_);
  tables_.MarkAllStale();
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kStale);
  EXPECT_EQ(tables_.Get(other_.id, nullptr, nullptr), State::kStale);
}

TEST_F(PointerTablesTest, AMisalignedDeviceCopyCarriesNoEntries) {
  uint64_t host[2] = {a_.base, b_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnDeviceCopy(other_, other_.base + 4, &table_, table_.base, 16);
  State state;
  EXPECT_TRUE(Words(other_.id, &state).empty());
  EXPECT_EQ(state, State::kStale);
}

TEST_F(PointerTablesTest, FreeForgetsTheTable) {
  uint64_t host[1] = {a_.base};
  tables_.OnHostWrite(table_, table_.base, host, sizeof(host), true, registry_);
  tables_.OnFree(table_.id);
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kNone);
  EXPECT_TRUE(tables_.empty());
}

TEST_F(PointerTablesTest, LargeCopiesAreScannedWhole) {
  // More words than one scan batch, the only pointer in the last one.
  std::vector<uint64_t> host(5000, 3);
  host.back() = b_.base + 4095;
  Buffer big = Add(0x10000000, host.size() * 8);
  EXPECT_EQ(tables_.OnHostWrite(big, big.base, host.data(), host.size() * 8, true, registry_), 1u);
  EXPECT_EQ(Words(big.id), (std::vector<uint64_t>{b_.base + 4095}));
}

// A source that queued work may still rewrite (a host function, a kernel
// through mapped memory): what it holds at submission is only a guess, so
// the table is stale until read back, even over the whole buffer; a buffer
// without a record and without pointers in the guess stays no table.
TEST_F(PointerTablesTest, AnUnsettledSourceLeavesTheTableStale) {
  uint64_t host[2] = {a_.base, 0};
  EXPECT_EQ(tables_.OnHostWrite(table_, table_.base, host, sizeof(host), false, registry_), 1u);
  State state;
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{a_.base}));
  EXPECT_EQ(state, State::kStale);
  // Read back after the copy ran: what landed is known.
  std::vector<uint64_t> device(table_.size / 8, 0);
  device[0] = b_.base;
  tables_.Rescan(table_, device.data(), tables_.Changes(), registry_);
  EXPECT_EQ(Words(table_.id, &state), (std::vector<uint64_t>{b_.base}));
  EXPECT_EQ(state, State::kKnown);
  // A later unsettled upload over the whole buffer with no pointers now.
  std::vector<uint64_t> zeros(table_.size / 8, 0);
  EXPECT_EQ(tables_.OnHostWrite(table_, table_.base, zeros.data(), table_.size, false, registry_),
            0u);
  EXPECT_EQ(tables_.Get(table_.id, nullptr, nullptr), State::kStale);
  EXPECT_EQ(tables_.OnHostWrite(other_, other_.base, zeros.data(), other_.size, false, registry_),
            0u);
  EXPECT_EQ(tables_.Get(other_.id, nullptr, nullptr), State::kNone);
}

// A caching allocator's segment: a table of two entries uploaded into a
// block in the middle, data tensors before and after it.
class TableRangesTest : public PointerTablesTest {
 protected:
  void SetUp() override {
    PointerTablesTest::SetUp();
    segment_ = Add(0x1000000, 64 * 1024);
    at_ = segment_.base + 4096;
    uint64_t host[2] = {a_.base, b_.base};
    tables_.OnHostWrite(segment_, at_, host, sizeof(host), true, registry_);
  }
  std::vector<PointerTables::Found> Reached(uint64_t from) {
    std::vector<PointerTables::Found> found;
    PointerTables::Reach r{segment_.id, from};
    tables_.Collect(absl::MakeConstSpan(&r, 1), &found);
    return found;
  }
  void Write(uint64_t from, PointerTables::Mark mark = nullptr) {
    PointerTables::Reach r{segment_.id, from};
    tables_.OnDeviceWrite(absl::MakeConstSpan(&r, 1), [&] { return mark; });
  }
  static PointerTables::Mark NewMark() { return std::make_shared<int>(0); }

  Buffer segment_;
  uint64_t at_ = 0;
};

TEST_F(TableRangesTest, AWriteThroughAPointerPastTheTableLeavesItCurrent) {
  Write(segment_.base + 8192);
  Write(at_ + 16);  // the first byte after the table
  EXPECT_EQ(tables_.Get(segment_.id, nullptr, nullptr), State::kKnown);
  EXPECT_EQ(tables_.Ranges(segment_.id),
            (std::vector<std::array<uint64_t, 3>>{{at_, at_ + 16, 0}}));
}

TEST_F(TableRangesTest, AWriteThroughAPointerBeforeTheTableMayReachIt) {
  // The kernel's extent is unknown, and the program's allocator may have
  // coalesced the blocks in between: up to the end of the buffer.
  Write(segment_.base);
  EXPECT_EQ(tables_.Get(segment_.id, nullptr, nullptr), State::kStale);
  auto found = Reached(segment_.base);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].state, State::kStale);
  ASSERT_EQ(found[0].stale.size(), 1u);
  EXPECT_EQ(found[0].stale[0].start, at_);
  EXPECT_EQ(found[0].stale[0].end, at_ + 16);
  // Unknown writers (no mark): a read-back waits for everything.
  EXPECT_TRUE(found[0].stale[0].any);
}

TEST_F(TableRangesTest, AWriteIntoTheTableStalesWhatFollowsThePointerOnly) {
  Write(at_ + 8, NewMark());
  EXPECT_EQ(tables_.Ranges(segment_.id),
            (std::vector<std::array<uint64_t, 3>>{{at_, at_ + 8, 0}, {at_ + 8, at_ + 16, 1}}));
  auto found = Reached(at_);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].words, (std::vector<uint64_t>{a_.base, b_.base}));
  ASSERT_EQ(found[0].stale.size(), 1u);
  EXPECT_EQ(found[0].stale[0].start, at_ + 8);
  // A launch reaching only the first entry finds it current.
  found = Reached(at_ + 8);
  EXPECT_EQ(found[0].words, (std::vector<uint64_t>{b_.base}));
}

TEST_F(TableRangesTest, ALaunchWhosePointersLieAfterTheTableDoesNotReachIt) {
  Write(segment_.base);
  EXPECT_TRUE(Reached(at_ + 16).empty());
  EXPECT_EQ(Reached(at_ + 8).size(), 1u);
  EXPECT_EQ(Reached(0).size(), 1u);  // the whole buffer
}

TEST_F(TableRangesTest, AReadBackWaitsForTheWritersSinceTheRangeWasLearnt) {
  const PointerTables::Mark upload = NewMark(), k1 = NewMark(), k2 = NewMark();
  uint64_t host[2] = {a_.base, b_.base};
  tables_.OnHostWrite(segment_, at_, host, sizeof(host), true, registry_, upload);
  Write(segment_.base, k1);
  Write(segment_.base + 64, k2);
  auto found = Reached(segment_.base);
  ASSERT_EQ(found[0].stale.size(), 1u);
  // The upload may not have landed when the kernels ran on other streams.
  EXPECT_EQ(found[0].stale[0].marks, (std::vector<PointerTables::Mark>{upload, k1, k2}));
  EXPECT_FALSE(found[0].stale[0].any);
  // Read back (the stale range only): current, nothing to wait for.
  uint64_t device[2] = {other_.base, 0};
  const PointerTables::Window w{at_, at_ + 16, false};
  EXPECT_EQ(
      tables_.Rescan(segment_, absl::MakeConstSpan(&w, 1), device, tables_.Changes(), registry_),
      1u);
  found = Reached(segment_.base);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].state, State::kKnown);
  EXPECT_EQ(found[0].words, (std::vector<uint64_t>{other_.base}));
  EXPECT_EQ(upload.use_count(), 1);  // released by the range
}

TEST_F(TableRangesTest, TooManyWritersCountAsUnknownUnlessDone) {
  Write(segment_.base, NewMark());
  PointerTables::Mark done = std::make_shared<int>(1);
  tables_.SetMarkDone(
      [](const PointerTables::Mark& m) { return *static_cast<const int*>(m.get()) == 1; });
  Write(segment_.base, done);
  for (size_t i = 2; i < PointerTables::kMaxMarks; ++i) Write(segment_.base, NewMark());
  Write(segment_.base, NewMark());  // the completed one makes room
  auto found = Reached(segment_.base);
  EXPECT_FALSE(found[0].stale[0].any);
  EXPECT_EQ(found[0].stale[0].marks.size(), PointerTables::kMaxMarks);
  Write(segment_.base, NewMark());
  found = Reached(segment_.base);
  EXPECT_TRUE(found[0].stale[0].any);
  EXPECT_TRUE(found[0].stale[0].marks.empty());
}

TEST_F(TableRangesTest, CopiesAndMemsetsBesideTheTableLeaveItCurrent) {
  tables_.OnDeviceCopy(segment_, at_ + 16, &a_, a_.base, 64, NewMark);
  tables_.OnDeviceCopy(segment_, segment_.base, nullptr, 0x900000, 4096, NewMark);
  tables_.OnClear(segment_, at_ + 16, 1024);
  EXPECT_EQ(tables_.Get(segment_.id, nullptr, nullptr), State::kKnown);
  // A copy of plain data over half of it: that half is stale.
  tables_.OnDeviceCopy(segment_, at_, &a_, a_.base, 8, NewMark);
  EXPECT_EQ(tables_.Ranges(segment_.id),
            (std::vector<std::array<uint64_t, 3>>{{at_, at_ + 8, 1}, {at_ + 8, at_ + 16, 0}}));
}

TEST_F(TableRangesTest, ADeviceCopyCarriesRangesAndTheirState) {
  Write(at_ + 8, NewMark());
  const PointerTables::Mark copy = NewMark();
  tables_.OnDeviceCopy(other_, other_.base, &segment_, at_, 16, [&] { return copy; });
  EXPECT_EQ(tables_.Ranges(other_.id),
            (std::vector<std::array<uint64_t, 3>>{{other_.base, other_.base + 8, 0},
                                                  {other_.base + 8, other_.base + 16, 1}}));
  std::vector<PointerTables::Found> found;
  tables_.Collect({other_.id}, &found);
  // What landed is known once the copy ran.
  EXPECT_EQ(found[0].stale[0].marks, (std::vector<PointerTables::Mark>{copy}));
}

TEST_F(TableRangesTest, ALearningReadBackAddsARangeToItsLastEntry) {
  // A pointer-to-pointer parameter into bytes no range covers.
  std::vector<uint64_t> device(64, 0);
  device[3] = a_.base;
  const PointerTables::Window w{segment_.base + 8192, segment_.base + 8192 + 512, true};
  EXPECT_EQ(tables_.Rescan(segment_, absl::MakeConstSpan(&w, 1), device.data(), tables_.Changes(),
                           registry_),
            1u);
  EXPECT_TRUE(tables_.Covers(segment_.id, segment_.base + 8192));
  EXPECT_EQ(tables_.Ranges(segment_.id),
            (std::vector<std::array<uint64_t, 3>>{
                {at_, at_ + 16, 0}, {segment_.base + 8192, segment_.base + 8224, 0}}));
}

// A kernel storing pointers through a pointer-to-pointer parameter builds a
// table as far as the buffer goes: a range learnt from what the memory held
// before (old pointers left by an earlier table, to their last entry) may be
// shorter than what the kernel wrote, so the whole rest of the buffer is one
// stale range, waiting for the old range's writers and the kernel.
TEST_F(TableRangesTest, AKernelStoringPointersStalesTheBufferFromItsPointerOn) {
  const uint64_t at = segment_.base + 8192;
  const PointerTables::Window w{at, segment_.base + segment_.size, true};
  std::vector<uint64_t> read((w.end - w.start) / 8, 0);
  read[3] = a_.base;  // left over: the last entry of the table before
  tables_.Rescan(segment_, absl::MakeConstSpan(&w, 1), read.data(), tables_.Changes(), registry_);
  ASSERT_EQ(tables_.Ranges(segment_.id),
            (std::vector<std::array<uint64_t, 3>>{{at_, at_ + 16, 0}, {at, at + 32, 0}}));
  const PointerTables::Mark kernel = NewMark();
  Write(at, kernel);
  tables_.OnPointerWrite(segment_, at, kernel);
  EXPECT_EQ(tables_.Ranges(segment_.id),
            (std::vector<std::array<uint64_t, 3>>{{at_, at_ + 16, 0},
                                                  {at, segment_.base + segment_.size, 1}}));
  auto found = Reached(at);
  ASSERT_EQ(found.size(), 1u);
  ASSERT_EQ(found[0].stale.size(), 1u);
  EXPECT_EQ(found[0].stale[0].start, at);
  EXPECT_EQ(found[0].stale[0].end, segment_.base + segment_.size) << "read back to the end";
  EXPECT_EQ(found[0].stale[0].marks, (std::vector<PointerTables::Mark>{kernel}));
  EXPECT_EQ(found[0].words, (std::vector<uint64_t>{a_.base})) << "still worth keeping resident";
  // Outside any buffer, or before the buffer: nothing.
  tables_.OnPointerWrite(segment_, segment_.base + segment_.size, kernel);
  EXPECT_EQ(tables_.Ranges(segment_.id).size(), 2u);
}

}  // namespace
}  // namespace stensor
