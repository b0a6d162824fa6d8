#include "core/swap/external_allocations.h"

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/swap/memory_manager.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::FakeDeviceTest;
using testing_support::kCap;
using testing_support::kGranule;

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(PitchAllocationChargeTest, RowsRoundedUpTo512Bytes) {
  EXPECT_EQ(PitchAllocationCharge(1, 1), 512u);
  EXPECT_EQ(PitchAllocationCharge(512, 3), 1536u);
  EXPECT_EQ(PitchAllocationCharge(513, 2), 2048u);
  EXPECT_EQ(PitchAllocationCharge(0, 5), 0u);
  EXPECT_EQ(PitchAllocationCharge(100, 0), 0u);
  EXPECT_EQ(PitchAllocationCharge(UINT64_MAX - 511, 1), UINT64_MAX - 511);
}

TEST(PitchAllocationChargeTest, OverflowHasNoCharge) {
  EXPECT_EQ(PitchAllocationCharge(UINT64_MAX - 510, 1), std::nullopt);  // rounding
  EXPECT_EQ(PitchAllocationCharge(UINT64_MAX, 1), std::nullopt);
  EXPECT_EQ(PitchAllocationCharge(uint64_t{1} << 40, uint64_t{1} << 40), std::nullopt);
}

class ExternalAllocationsTest : public FakeDeviceTest {
 protected:
  void SetUp() override {
    FakeDeviceTest::SetUp();
    memory_ = MakeManager({{"STENSOR_MEMORY_LIMIT", "6MiB"}});
    ASSERT_NE(memory_, nullptr);
  }
  void TearDown() override {
    memory_.reset();
    FakeDeviceTest::TearDown();
  }
  // What cuMemGetInfo reports free under the cap.
  size_t Free() {
    size_t free_bytes = 0, total = 0;
    CappedMemInfo(*memory_, driver_, &free_bytes, &total);
    EXPECT_EQ(total, kCap);
    return free_bytes;
  }
  // The fake's cuMemAlloc, counting its calls.
  CUresult DriverAlloc(CUdeviceptr* dptr, uint64_t bytes) {
    ++driver_calls_;
    return driver_.cuMemAlloc_v2(dptr, bytes);
  }

  std::unique_ptr<MemoryManager> memory_;
  int driver_calls_ = 0;
};

TEST_F(ExternalAllocationsTest, NoCapJustCallsTheDriver) {
  CUdeviceptr p = 0;
  EXPECT_EQ(ChargedAllocation(nullptr, &p, 4 * kMiB, [&] { return DriverAlloc(&p, 4 * kMiB); }),
            CUDA_SUCCESS);
  EXPECT_EQ(driver_calls_, 1);
  EXPECT_EQ(Free(), kCap);  // the manager saw nothing
  EXPECT_EQ(ChargedAllocation(nullptr, &p, 1, [] { return CUDA_ERROR_INVALID_VALUE; }),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(driver_.cuMemFree_v2(p));
}

TEST_F(ExternalAllocationsTest, ChargedUntilFreedAndRefusedWhenItCannotFit) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(
      ChargedAllocation(memory_.get(), &a, 4 * kMiB, [&] { return DriverAlloc(&a, 4 * kMiB); }),
      CUDA_SUCCESS);
  EXPECT_EQ(Free(), kCap - 4 * kMiB);
  // Nothing of stensor's to evict: out of memory, and the driver is never
  // asked.
  EXPECT_EQ(
      ChargedAllocation(memory_.get(), &b, 4 * kMiB, [&] { return DriverAlloc(&b, 4 * kMiB); }),
      CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(driver_calls_, 1);
  EXPECT_EQ(Free(), kCap - 4 * kMiB);
  // Charged in 4 KiB pages.
  ASSERT_EQ(ChargedAllocation(memory_.get(), &b, 1000, [&] { return DriverAlloc(&b, 1000); }),
            CUDA_SUCCESS);
  EXPECT_EQ(Free(), kCap - 4 * kMiB - 4096);
  // Freed by the program: the hooks' cuMemFree then releases the charge.
  EXPECT_CU(driver_.cuMemFree_v2(a));
  memory_->ForgetExternal(a);
  EXPECT_EQ(Free(), kCap - 4096);
  EXPECT_CU(driver_.cuMemFree_v2(b));
  memory_->ForgetExternal(b);
  EXPECT_EQ(Free(), kCap);
  memory_->ForgetExternal(b);  // twice: nothing more to release
  EXPECT_EQ(Free(), kCap);
}

TEST_F(ExternalAllocationsTest, AFailedDriverCallKeepsNoCharge) {
  CUdeviceptr p = 0;
  fakecuda_fail_call("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(
      ChargedAllocation(memory_.get(), &p, 4 * kMiB, [&] { return DriverAlloc(&p, 4 * kMiB); }),
      CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Free(), kCap);
  // A success without a pointer to adopt: nothing can free it by address.
  EXPECT_EQ(ChargedAllocation(memory_.get(), nullptr, 4 * kMiB, [] { return CUDA_SUCCESS; }),
            CUDA_SUCCESS);
  EXPECT_EQ(Free(), kCap);
}

TEST_F(ExternalAllocationsTest, RoomIsMadeByEvictingStensorsBuffers) {
  // Two granules of stensor's own, swappable.
  CUdeviceptr own[2] = {};
  uint64_t next_id = 1;
  for (CUdeviceptr& p : own) {
    ASSERT_CU(memory_->Allocate(kGranule, &p, [&](CUdeviceptr) { return next_id++; }));
  }
  EXPECT_EQ(Free(), kCap - 2 * kGranule);
  CUdeviceptr ext = 0;
  ASSERT_EQ(ChargedAllocation(memory_.get(), &ext, 2 * kGranule,
                              [&] { return DriverAlloc(&ext, 2 * kGranule); }),
            CUDA_SUCCESS);
  // One of stensor's buffers left the device (never written: without a copy).
  const SwapStats stats = memory_->stats();
  EXPECT_EQ(stats.swap_outs_copied + stats.clean_drops + stats.never_written_drops, 1u);
  EXPECT_LE(Used(), kCap);
  EXPECT_EQ(Free(), 0u);
  EXPECT_CU(driver_.cuMemFree_v2(ext));
  memory_->ForgetExternal(ext);
  for (CUdeviceptr p : own) EXPECT_CU(memory_->Free(p));
}

TEST_F(ExternalAllocationsTest, PitchAllocationsAreChargedTheirGuess) {
  CUdeviceptr p = 0;
  size_t pitch = 0;
  ASSERT_EQ(ChargedPitchAllocation(memory_.get(), &p, 1000, 1024,
                                   [&] {
                                     ++driver_calls_;
                                     return driver_.cuMemAllocPitch_v2(&p, &pitch, 1000, 1024, 4);
                                   }),
            CUDA_SUCCESS);
  EXPECT_EQ(Free(), kCap - 1024 * 1024);  // 1000 rounded to 1024, times 1024 rows
  EXPECT_CU(driver_.cuMemFree_v2(p));
  memory_->ForgetExternal(p);
  // A request whose charge overflows goes to the driver uncharged, which
  // answers it.
  CUresult r = ChargedPitchAllocation(memory_.get(), &p, UINT64_MAX, 2, [&] {
    ++driver_calls_;
    return driver_.cuMemAllocPitch_v2(&p, &pitch, SIZE_MAX, 2, 4);
  });
  EXPECT_NE(r, CUDA_SUCCESS);
  EXPECT_EQ(driver_calls_, 2);
  EXPECT_EQ(Free(), kCap);
}

TEST_F(ExternalAllocationsTest, MemInfoWithoutAContextIsTheDriversAnswer) {
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  size_t free_bytes = 11, total = 22;
  CappedMemInfo(*memory_, driver_, &free_bytes, &total);
  EXPECT_EQ(free_bytes, 11u);
  EXPECT_EQ(total, 22u);
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  CappedMemInfo(*memory_, driver_, nullptr, &total);  // either may be null
  EXPECT_EQ(total, kCap);
}

// cuMemFreeAsync: the driver frees in stream order, so the charge stays
// until the stream passed the free; an allocation that needs the room
// waits for that rather than failing or evicting.
TEST_F(ExternalAllocationsTest, AStreamOrderedFreeIsChargedUntilItRan) {
  testing_support::HeldStream held;
  CUdeviceptr a = 0;
  ASSERT_EQ(ChargedAllocation(memory_.get(), &a, 4 * kMiB,
                              [&] { return driver_.cuMemAllocAsync(&a, 4 * kMiB, held.get()); }),
            CUDA_SUCCESS);
  ASSERT_CU(driver_.cuMemFreeAsync(a, held.get()));
  memory_->ForgetExternalAsync(a, held.get());
  EXPECT_EQ(Free(), kCap - 4 * kMiB) << "the free has not run yet";
  // 4 MiB more fit only once the free ran: the reservation waits for it.
  std::thread open([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held.Open();
  });
  EXPECT_CU(memory_->ReserveExternal(4 * kMiB));
  open.join();
  EXPECT_EQ(Free(), kCap - 4 * kMiB);
  memory_->UnreserveExternal(4 * kMiB);
  EXPECT_EQ(Free(), kCap);
  // Not an external allocation: nothing.
  memory_->ForgetExternalAsync(0x1234, held.get());
  EXPECT_EQ(Free(), kCap);
}

// Opens `held` when the manager first waits on the host for work (an event,
// a stream or its context), then waits as the driver does: the stream runs
// only if stensor waits for it, with no timing involved.
class OpenedByAHostWait {
 public:
  OpenedByAHostWait(Driver* driver, testing_support::HeldStream* held)
      : driver_(driver), saved_(*driver) {
    held_ = held;
    opened_ = false;
    driver->cuEventSynchronize = [](CUevent e) { return Open(), ::cuEventSynchronize(e); };
    driver->cuStreamSynchronize = [](CUstream s) { return Open(), ::cuStreamSynchronize(s); };
    driver->cuCtxSynchronize = [] { return Open(), ::cuCtxSynchronize(); };
  }
  ~OpenedByAHostWait() {
    *driver_ = saved_;
    held_ = nullptr;
  }
  OpenedByAHostWait(const OpenedByAHostWait&) = delete;
  OpenedByAHostWait& operator=(const OpenedByAHostWait&) = delete;

  static bool opened() { return opened_.load(); }

 private:
  static void Open() {
    if (held_ != nullptr) held_->Open();
    opened_ = true;
  }
  static inline testing_support::HeldStream* held_ = nullptr;
  static inline std::atomic<bool> opened_{false};
  Driver* driver_;
  Driver saved_;
};

// The cap bounds the device memory the driver holds for a stream-ordered
// allocation short of room while a free of its pool is queued on its
// stream: the driver reserves fresh memory for it until that free has run
// (the fake's pool always; a GPU's wherever the freed block does not fit
// the new allocation), so the free's charge stays until it is observed
// run, and the allocation waits for it on the host. Taking the queued
// free's charge over instead let torchlike_train per-tensor at 100 % of its
// working set hold 256 KiB above the cap.
TEST_F(ExternalAllocationsTest, AFreeQueuedOnItsStreamStaysChargedUntilItRan) {
  for (uint64_t next : {4 * kMiB, 3 * kMiB, 5 * kMiB}) {
    testing_support::HeldStream held;
    OpenedByAHostWait opens(&driver_, &held);
    CUdeviceptr a = 0, b = 0;
    ASSERT_EQ(ChargedAllocation(
                  memory_.get(), &a, 4 * kMiB,
                  [&] { return driver_.cuMemAllocAsync(&a, 4 * kMiB, held.get()); },
                  MemoryManager::ExternalSource::kDefaultPool),
              CUDA_SUCCESS);
    ASSERT_CU(driver_.cuMemFreeAsync(a, held.get()));
    memory_->ForgetExternalAsync(a, held.get());
    // 4 MiB queued, `next` more: above the 6 MiB cap until the free ran.
    ASSERT_EQ(
        ChargedAllocation(
            memory_.get(), &b, next, [&] { return driver_.cuMemAllocAsync(&b, next, held.get()); },
            MemoryManager::ExternalSource::kDefaultPool),
        CUDA_SUCCESS);
    EXPECT_TRUE(OpenedByAHostWait::opened()) << next << " bytes: no wait for the queued free";
    EXPECT_LE(Peak(), kCap) << next << " bytes after a queued free of 4 MiB";
    EXPECT_EQ(Free(), kCap - next);
    ASSERT_CU(driver_.cuMemFreeAsync(b, held.get()));
    memory_->ForgetExternalAsync(b, held.get());
    held.Open();
    ASSERT_CU(cuStreamSynchronize(held.get()));
    EXPECT_EQ(Free(), kCap);
  }
}

// A queued free too small to make the room is not waited for on the host:
// an eviction is needed anyway, and the free settles by itself later
// (transformer_train at 50 % waited for a 128 KiB free a few times a step,
// then evicted all the same).
TEST_F(ExternalAllocationsTest, AQueuedFreeTooSmallToHelpIsNotWaitedFor) {
  // A written buffer: S403 cannot drop it, so the wait comes before S405.
  CUdeviceptr big = 0, next = 0, small = 0;
  ASSERT_CU(memory_->Allocate(2 * kGranule, &big, [](CUdeviceptr) { return 1; }));
  uint64_t ids[1] = {1};
  ASSERT_CU(memory_->Prepare(ids, {}, nullptr));
  std::vector<char> data(2 * kGranule, 7);
  const CUresult copied = cuMemcpyHtoD_v2(big, data.data(), data.size());
  memory_->Finish(ids, ids, nullptr, copied == CUDA_SUCCESS);
  ASSERT_CU(copied);
  ASSERT_CU(cuCtxSynchronize());
  CUdeviceptr kept = 0;
  ASSERT_EQ(ChargedAllocation(memory_.get(), &kept, 128 * 1024,
                              [&] { return DriverAlloc(&kept, 128 * 1024); }),
            CUDA_SUCCESS);
  auto held = std::make_unique<testing_support::HeldStream>();  // its free never runs
  ASSERT_EQ(
      ChargedAllocation(memory_.get(), &small, 128 * 1024,
                        [&] { return driver_.cuMemAllocAsync(&small, 128 * 1024, held->get()); }),
      CUDA_SUCCESS);
  ASSERT_CU(driver_.cuMemFreeAsync(small, held->get()));
  memory_->ForgetExternalAsync(small, held->get());
  // 4 MiB + 128 KiB + 128 KiB queued + 2 MiB more: the queued free alone
  // cannot make room; only evicting (a granule of) `big` does.
  ASSERT_CU(memory_->Allocate(kGranule, &next, [](CUdeviceptr) { return 2; }));
  EXPECT_EQ(memory_->stats().wait_program_seconds, 0.0);
  EXPECT_EQ(memory_->stats().swap_outs_copied, 1u);
  ASSERT_CU(memory_->Free(next));
  ASSERT_CU(memory_->Free(big));
  held.reset();  // before a cuMemFree, which waits for every stream
  ASSERT_CU(driver_.cuMemFree_v2(kept));
  memory_->ForgetExternal(kept);
}

// A driver allocation freed in stream order whose free has run gives its
// room back before a pooled chunk is released for a new one: otherwise the
// chunk is released now and created again at the next swap-in or
// allocation (transformer_train's small stream-ordered temporaries cost a
// cuMemCreate and a cuMemRelease a step).
TEST_F(ExternalAllocationsTest, ACompletedStreamOrderedFreeMakesRoomBeforeThePool) {
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  // A granule in the pool: allocated by stensor, freed.
  CUdeviceptr pooled = 0;
  ASSERT_CU(memory_->Allocate(kGranule, &pooled, [](CUdeviceptr) { return 1; }));
  ASSERT_CU(memory_->Free(pooled));
  // The rest of the cap in a driver allocation, freed on the stream; the
  // free has run, but nothing has settled it yet.
  CUdeviceptr a = 0;
  const uint64_t rest = kCap - kGranule;
  ASSERT_EQ(ChargedAllocation(memory_.get(), &a, rest,
                              [&] { return driver_.cuMemAllocAsync(&a, rest, s); }),
            CUDA_SUCCESS);
  ASSERT_CU(driver_.cuMemFreeAsync(a, s));
  memory_->ForgetExternalAsync(a, s);
  // The free has run (and anything queued for the pooled chunk).
  ASSERT_CU(cuCtxSynchronize());
  fakecuda_count_calls(1);
  const auto releases = fakecuda_call_count("cuMemRelease");
  const auto creates = fakecuda_call_count("cuMemCreate");
  EXPECT_CU(memory_->ReserveExternal(4096));
  EXPECT_EQ(memory_->stats().pooled_bytes, kGranule) << "the chunk left the pool";
  // The pooled chunk serves the next buffer: nothing created either.
  CUdeviceptr next = 0;
  ASSERT_CU(memory_->Allocate(kGranule, &next, [](CUdeviceptr) { return 2; }));
  EXPECT_EQ(fakecuda_call_count("cuMemRelease"), releases);
  EXPECT_EQ(fakecuda_call_count("cuMemCreate"), creates);
  fakecuda_count_calls(0);
  ASSERT_CU(memory_->Free(next));
  memory_->UnreserveExternal(4096);
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// Pending stream-ordered frees are settled as more come, without a need
// for room: their events do not pile up.
TEST_F(ExternalAllocationsTest, CompletedStreamOrderedFreesAreSettledAsMoreCome) {
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  fakecuda_count_calls(1);
  const auto created0 = fakecuda_call_count("cuEventCreate");
  const auto destroyed0 = fakecuda_call_count("cuEventDestroy_v2");
  for (int i = 0; i < 100; ++i) {
    CUdeviceptr a = 0;
    ASSERT_EQ(ChargedAllocation(memory_.get(), &a, 4096,
                                [&] { return driver_.cuMemAllocAsync(&a, 4096, s); }),
              CUDA_SUCCESS);
    ASSERT_CU(driver_.cuMemFreeAsync(a, s));
    memory_->ForgetExternalAsync(a, s);
    ASSERT_CU(cuStreamSynchronize(s));
  }
  // Each free's event is destroyed once a batch is settled: at most a
  // batch (32) alive, never all 100.
  const auto created = fakecuda_call_count("cuEventCreate") - created0;
  const auto destroyed = fakecuda_call_count("cuEventDestroy_v2") - destroyed0;
  fakecuda_count_calls(0);
  EXPECT_EQ(created, 100u);
  EXPECT_GE(destroyed, 100u - 32u);
  // None still charged once cuMemGetInfo looks.
  EXPECT_EQ(Free(), kCap);
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// Memory of the program's own that the driver creates (cuMemCreate,
// cuMemAllocPitch, another pool's cuMemAllocFromPoolAsync) is fresh device
// memory: a completed stream-ordered free of the default pool is settled
// (no longer charged) while that pool keeps its memory reserved until a
// synchronisation, so the pool gives it back first.
TEST_F(ExternalAllocationsTest, FreshDriverMemoryComesAfterTheDefaultPoolsKeptMemory) {
  enum Kind { kAppHandle, kPitch, kOtherPool };
  for (Kind kind : {kAppHandle, kPitch, kOtherPool}) {
    fakecuda_reset_peak_bytes(0);
    CUstream s;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a = 0;
    ASSERT_EQ(
        ChargedAllocation(
            memory_.get(), &a, 4 * kMiB, [&] { return driver_.cuMemAllocAsync(&a, 4 * kMiB, s); },
            MemoryManager::ExternalSource::kDefaultPool),
        CUDA_SUCCESS);
    ASSERT_CU(driver_.cuMemFreeAsync(a, s));
    memory_->ForgetExternalAsync(a, s);
    CUevent ran;
    ASSERT_CU(cuEventCreate(&ran, CU_EVENT_DEFAULT));
    ASSERT_CU(cuEventRecord(ran, s));
    while (cuEventQuery(ran) == CUDA_ERROR_NOT_READY) std::this_thread::yield();  // no sync
    EXPECT_EQ(Free(), kCap) << kind << ": the free is settled";
    EXPECT_EQ(Used(), 4 * kMiB) << kind << ": the pool still holds it";
    if (kind == kAppHandle) {
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = 0;
      CUmemGenericAllocationHandle h = 0;
      ASSERT_CU(memory_->CreateAppMemory(&h, 2 * kGranule, &prop, 0));
      EXPECT_LE(Peak(), kCap) << "cuMemCreate";
      ASSERT_CU(driver_.cuMemRelease(h));
      memory_->OnAppRelease(h);
    } else if (kind == kPitch) {
      CUdeviceptr p = 0;
      size_t pitch = 0;
      ASSERT_EQ(ChargedPitchAllocation(
                    memory_.get(), &p, 4096, 1024,
                    [&] { return driver_.cuMemAllocPitch_v2(&p, &pitch, 4096, 1024, 4); }),
                CUDA_SUCCESS);
      EXPECT_LE(Peak(), kCap) << "cuMemAllocPitch";
      ASSERT_CU(driver_.cuMemFree_v2(p));
      memory_->ForgetExternal(p);
    } else {
      CUmemPoolProps props{};
      props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      props.location.id = 0;
      CUmemoryPool pool;
      ASSERT_CU(cuMemPoolCreate(&pool, &props));
      CUdeviceptr p = 0;
      ASSERT_EQ(
          ChargedAllocation(memory_.get(), &p, 4 * kMiB,
                            [&] { return driver_.cuMemAllocFromPoolAsync(&p, 4 * kMiB, pool, s); }),
          CUDA_SUCCESS);
      EXPECT_LE(Peak(), kCap) << "cuMemAllocFromPoolAsync";
      ASSERT_CU(driver_.cuMemFreeAsync(p, s));
      memory_->ForgetExternalAsync(p, s);
      ASSERT_CU(cuStreamSynchronize(s));
      ASSERT_CU(cuMemPoolDestroy(pool));
    }
    ASSERT_CU(cuEventDestroy_v2(ran));
    ASSERT_CU(cuStreamSynchronize(s));
    ASSERT_CU(cuStreamDestroy_v2(s));
    EXPECT_EQ(Free(), kCap);
  }
}

}  // namespace
}  // namespace stensor
