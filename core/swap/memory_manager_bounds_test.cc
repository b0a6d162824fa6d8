// Tests for the parts of core/memory_manager that make stensor's buffers look
// like the driver's own, on the fake CUDA driver with 2 MiB granules and a
// cap of three granules:
//   - exact sizes: a buffer's range is the size asked for, not the granules
//     reserved behind it (Find, CheckRange), resident or swapped out; size
//     arithmetic never wraps (SIZE_MAX is out of memory);
//   - cuMemFreeAsync: freed in stream order, its memory reused only after
//     the stream passed the free; on a stream the driver refuses, its error
//     and nothing freed;
//   - the program's own VMM memory counts against the cap from cuMemCreate
//     until released and unmapped, and makes room first (S403-S405);
//   - buffers whose handles leave stensor's control are resident and never
//     evicted again, logged once.
// The manager's log sink captures the JSON records, summarised as in
// memory_manager_test ("swap_out:1", "pin:1", "oom").
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/config.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

// The register_id of an allocation the registry could not track.
constexpr auto kUntracked = [](CUdeviceptr) -> uint64_t { return 0; };

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;

using testing_support::HeldStream;
using testing_support::kCap;
using testing_support::kGranule;
using Ids = std::vector<uint64_t>;

std::string Summarize(const std::string& json) {
  static const std::regex kType("\"type\":\"([a-z_]+)\"");
  static const std::regex kId("\"id\":([0-9]+)");
  std::smatch m;
  if (!std::regex_search(json, m, kType)) return "unparsed:" + json;
  std::string out = m[1];
  if (std::regex_search(json, m, kId)) out += ":" + m[1].str();
  return out;
}

class BoundsTest : public testing_support::FakeDeviceTest {
 protected:
  std::unique_ptr<MemoryManager> Make(const std::string& limit = "6MiB") {
    return MakeManager({{"STENSOR_MEMORY_LIMIT", limit}, {"STENSOR_LOG_LEVEL", "error"}});
  }
  std::vector<std::string> Records() {
    std::vector<std::string> out;
    for (const std::string& line : Lines()) {
      // Host waits for the swap stream depend on how fast its copies run.
      std::string record = Summarize(line);
      if (record.rfind("swap_wait", 0) != 0) out.push_back(std::move(record));
    }
    return out;
  }
  CUdeviceptr Alloc(MemoryManager& mm, uint64_t id, uint64_t bytes = kGranule) {
    CUdeviceptr p = 0;
    EXPECT_CU(mm.Allocate(bytes, &p, [id](CUdeviceptr) { return id; }));
    return p;
  }
  // A whole-buffer write of `seed`, wrapped as the tracker wraps a copy.
  void Write(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint8_t seed,
             uint64_t bytes = kGranule) {
    std::vector<uint8_t> data(bytes, seed);
    Ids ids = {id};
    ASSERT_CU(mm.Prepare(ids, {}, nullptr));
    CUresult r = cuMemcpyHtoD_v2(p, data.data(), bytes);
    mm.Finish(ids, ids, nullptr, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    ASSERT_CU(cuCtxSynchronize());
  }
  // Whether the buffer holds `seed` throughout (read as the tracker would).
  bool Holds(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint8_t seed,
             uint64_t bytes = kGranule) {
    std::vector<uint8_t> data(bytes);
    Ids ids = {id};
    EXPECT_CU(mm.Prepare(ids, {}, nullptr));
    CUresult r = cuMemcpyDtoH_v2(data.data(), p, bytes);
    mm.Finish(ids, {}, nullptr, r == CUDA_SUCCESS);
    EXPECT_CU(r);
    for (uint8_t v : data) {
      if (v != seed) return false;
    }
    return true;
  }
  size_t FreeBytes(MemoryManager& mm) {
    size_t free_bytes = 0, total = 0;
    mm.MemInfo(0, &free_bytes, &total);
    return free_bytes;
  }
  // The program's own device memory: cuMemCreate through the manager.
  CUmemGenericAllocationHandle Create(MemoryManager& mm, CUresult want = CUDA_SUCCESS,
                                      CUmemLocationType where = CU_MEM_LOCATION_TYPE_DEVICE) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = where;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    EXPECT_EQ(mm.CreateAppMemory(&h, kGranule, &prop, 0), want);
    return h;
  }
};

// --- Exact sizes ---------------------------------------------------------------

// A buffer of a granule and a bit reserves two granules, but its range is
// what was asked for: the tail past it belongs to no allocation, and a
// transfer running into it is refused, resident or swapped out.
TEST_F(BoundsTest, RangeIsTheRequestedSizeResidentOrSwappedOut) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  const uint64_t size = kGranule + 1000;
  CUdeviceptr a = Alloc(*mm, 1, size);
  std::optional<MemoryManager::BufferView> v = mm->Find(a + size + 10);  // in the tail
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->base, a);
  EXPECT_EQ(v->size, size);
  EXPECT_EQ(v->reserved, 2 * kGranule);
  EXPECT_EQ(v->id, 1u);
  EXPECT_EQ(v->context, ctx_);
  EXPECT_FALSE(v->freed);
  EXPECT_FALSE(mm->Find(a + 2 * kGranule).has_value());
  EXPECT_FALSE(mm->Find(a - 1).has_value());

  auto check = [&] {
    EXPECT_CU(mm->CheckRange(a, size));
    EXPECT_CU(mm->CheckRange(a + size - 1, 1));
    EXPECT_CU(mm->CheckRange(a + size, 0));  // nothing touched
    EXPECT_EQ(mm->CheckRange(a, size + 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(mm->CheckRange(a + size, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(mm->CheckRange(a + 8, UINT64_MAX), CUDA_ERROR_INVALID_VALUE);
    EXPECT_CU(mm->CheckRange(a + 2 * kGranule, 1 << 20));  // not ours: the driver's call
  };
  check();
  // A granule more than the cap holds: `a` (least recently used) goes out.
  Write(*mm, 1, a, 7, size);
  CUdeviceptr b = Alloc(*mm, 2);
  Write(*mm, 2, b, 8);
  CUdeviceptr c = Alloc(*mm, 3);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  check();
  ASSERT_TRUE(mm->Find(a).has_value());
  EXPECT_EQ(mm->Find(a)->size, size);

  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(b));
  EXPECT_CU(mm->Free(c));
  EXPECT_TRUE(Holds(*mm, 1, a, 7, size));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(a));
  EXPECT_FALSE(mm->Find(a).has_value());
}

// From half a granule up, a buffer below a granule maps a whole chunk: its
// range is still what was asked for (the rest of the chunk is a tail no
// transfer may reach), it is swapped like any other, and it keeps its
// bytes. Just below half a granule it is the driver's allocation, as before
// (not a buffer Find or CheckRange answers for).
TEST_F(BoundsTest, HalfGranuleBufferMapsAChunkAndKeepsItsRange) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  const uint64_t size = kGranule / 2;
  CUdeviceptr a = Alloc(*mm, 1, size);
  std::optional<MemoryManager::BufferView> v = mm->Find(a + size + 10);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->base, a);
  EXPECT_EQ(v->size, size);
  EXPECT_EQ(v->reserved, kGranule);
  EXPECT_EQ(a % kGranule, 0u);
  EXPECT_CU(mm->CheckRange(a, size));
  EXPECT_EQ(mm->CheckRange(a, size + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(mm->CheckRange(a + size, 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FreeBytes(*mm), 2 * kGranule);  // charged as the chunk it maps

  CUdeviceptr small = Alloc(*mm, 2, size - 1);
  EXPECT_TRUE(mm->Owns(small));
  EXPECT_FALSE(mm->Find(small).has_value());  // the driver's, not a VMM range
  EXPECT_EQ(FreeBytes(*mm), 2 * kGranule - size);

  Write(*mm, 1, a, 7, size);
  CUdeviceptr b = Alloc(*mm, 3);
  Write(*mm, 3, b, 8);
  ClearLog();
  CUdeviceptr c = Alloc(*mm, 4);  // no room for c beside a, b and small: a goes
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(mm->Find(a)->size, size);
  EXPECT_EQ(mm->CheckRange(a, size + 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(c));
  EXPECT_TRUE(Holds(*mm, 1, a, 7, size));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(a));
  EXPECT_CU(mm->Free(b));
  EXPECT_CU(mm->Free(small));
  EXPECT_FALSE(mm->Find(a).has_value());
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

bool HostVmm() {
  int supported = 0;
  cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
  return supported != 0;
}

// No size arithmetic wraps: SIZE_MAX is out of memory at once, nothing
// evicted; the charge stays as it was. Above the cap but not absurd: born
// in host memory with host-located VMM (nothing evicted either), else out
// of memory.
TEST_F(BoundsTest, SizeMaxIsOutOfMemoryWithoutEvicting) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  Write(*mm, 1, a, 1);
  ClearLog();
  for (uint64_t bytes :
       {uint64_t{SIZE_MAX}, uint64_t{SIZE_MAX} - kGranule + 2, kCap + 1, uint64_t{1} << 63}) {
    CUdeviceptr p = 0;
    if (bytes == kCap + 1 && HostVmm()) {
      EXPECT_CU(mm->Allocate(bytes, &p, kUntracked));
      EXPECT_NE(p, 0u);
      EXPECT_CU(mm->Free(p));
    } else {
      EXPECT_EQ(mm->Allocate(bytes, &p, kUntracked), CUDA_ERROR_OUT_OF_MEMORY) << bytes;
      EXPECT_EQ(p, 0u);
    }
    EXPECT_EQ(mm->ReserveExternal(bytes), CUDA_ERROR_OUT_OF_MEMORY) << bytes;
  }
  EXPECT_THAT(Records(), Not(Contains("swap_out:1")));
  EXPECT_EQ(FreeBytes(*mm), kCap - kGranule);
  EXPECT_TRUE(Holds(*mm, 1, a, 1));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(a));
}

// --- cuMemFreeAsync ---------------------------------------------------------------

// A stream-ordered free of a buffer the stream still uses: garbage until the
// stream passed the free. An allocation that needs its memory waits for
// that (S404) and gets it only then; the other buffers keep their data.
TEST_F(BoundsTest, FreeAsyncReleasesInStreamOrder) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), c = Alloc(*mm, 3);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  Write(*mm, 3, c, 3);
  auto held = std::make_unique<HeldStream>();
  // A use of `a` queued on the held stream, then its free in stream order.
  Ids ids = {1};
  ASSERT_CU(mm->Prepare(ids, {}, held->get()));
  CUresult r = cuMemsetD8Async(a, 9, kGranule, held->get());
  mm->Finish(ids, ids, held->get(), r == CUDA_SUCCESS);
  ASSERT_CU(r);
  ClearLog();
  ASSERT_CU(mm->FreeAsync(a, held->get()));
  EXPECT_EQ(mm->FreeAsync(a, held->get()), CUDA_ERROR_INVALID_VALUE);  // freed twice
  ASSERT_TRUE(mm->Find(a).has_value());
  EXPECT_TRUE(mm->Find(a)->freed);
  EXPECT_EQ(mm->CheckRange(a, 1), CUDA_ERROR_INVALID_VALUE);  // use after free
  // Not released while the stream has not reached the free.
  EXPECT_EQ(FreeBytes(*mm), 0u);
  EXPECT_EQ(Used(), kCap);

  // a's granule reaches d at once, in stream order: no host wait, and d's
  // zeroing runs after the held memset (d reads zeros, not 9s).
  CUdeviceptr d = Alloc(*mm, 4);  // needs a's granule
  ASSERT_NE(d, 0u);
  EXPECT_THAT(Records(), IsEmpty());
  EXPECT_EQ(mm->stats().host_wait_seconds, 0.0);
  held->Open();
  EXPECT_TRUE(Holds(*mm, 4, d, 0))
      << "the freed memory was reused before the stream passed the free";
  EXPECT_LE(Peak(), kCap);
  EXPECT_TRUE(Holds(*mm, 2, b, 2));
  EXPECT_TRUE(Holds(*mm, 3, c, 3));
  held.reset();
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {b, c, d}) EXPECT_CU(mm->Free(p));
}

// A stream-ordered free whose stream has nothing pending is released once
// the stream reached it (MemInfo collects it); if its event cannot be
// recorded it waits for the stream instead and releases at once.
TEST_F(BoundsTest, FreeAsyncOfAnIdleBufferReleasesAtOnce) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  ASSERT_CU(mm->FreeAsync(a, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(FreeBytes(*mm), kCap - kGranule);
  EXPECT_FALSE(mm->Owns(a));
  // A free whose place in the stream could not be recorded is still in
  // stream order: released only once a host wait observed the stream (here
  // when its room is needed), and never waited for under the manager's lock.
  fakecuda_fail_call("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  ASSERT_CU(mm->FreeAsync(b, nullptr));
  EXPECT_EQ(mm->FreeAsync(b, nullptr), CUDA_ERROR_INVALID_VALUE);  // freed already
  CUdeviceptr c = Alloc(*mm, 3, kCap);                             // all of the cap: b's room too
  ASSERT_NE(c, 0u);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  // c reuses b's pooled chunks, zeroed on the swap stream: released at
  // once when that is done.
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(mm->Free(c));
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// A stream the driver refuses (destroyed, never a stream, the NULL stream
// with no context current): its error, asked before anything is freed, as
// the driver checks it; the buffer stays as it was, live and with its data
// through a swap-out and back.
TEST_F(BoundsTest, FreeAsyncOnAStreamTheDriverRefusesKeepsTheBuffer) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  Write(*mm, 1, a, 7);
  CUstream gone;
  ASSERT_CU(cuStreamCreate(&gone, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamDestroy_v2(gone));
  const CUstream bogus = reinterpret_cast<CUstream>(uintptr_t{0x5eed1});
  EXPECT_EQ(mm->FreeAsync(a, gone), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(mm->FreeAsync(a, bogus), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  EXPECT_EQ(mm->FreeAsync(a, nullptr), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(mm->FreeAsync(a, CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  ASSERT_TRUE(mm->Find(a).has_value());
  EXPECT_FALSE(mm->Find(a)->freed);
  EXPECT_CU(mm->CheckRange(a, kGranule));
  // Three more buffers under the cap of three: `a` goes out and comes back.
  CUdeviceptr b = Alloc(*mm, 2), c = Alloc(*mm, 3), d = Alloc(*mm, 4);
  Write(*mm, 2, b, 2);
  Write(*mm, 3, c, 3);
  Write(*mm, 4, d, 4);
  EXPECT_GE(mm->stats().swap_outs_copied, 1u);
  EXPECT_TRUE(Holds(*mm, 1, a, 7));
  EXPECT_EQ(mm->stats().driver_errors, 0u);
  ASSERT_CU(mm->FreeAsync(a, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {b, c, d}) EXPECT_CU(mm->Free(p));
}

// The caller's `forget` (the tracker drops the buffer's range there) runs
// once, for a free the manager took, never for one it refused.
TEST_F(BoundsTest, FreeAsyncForgetsOnlyWhatItFrees) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  int forgotten = 0;
  auto forget = [&] { ++forgotten; };
  EXPECT_EQ(mm->FreeAsync(a, reinterpret_cast<CUstream>(uintptr_t{0x5eed1}), forget),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(forgotten, 0);
  ASSERT_CU(mm->FreeAsync(a, nullptr, forget));
  EXPECT_EQ(forgotten, 1);
  EXPECT_EQ(mm->FreeAsync(a, nullptr, forget), CUDA_ERROR_INVALID_VALUE);  // freed twice
  EXPECT_EQ(forgotten, 1);
  ASSERT_CU(cuCtxSynchronize());
}

// --- The program's own VMM memory ----------------------------------------------

// Device-located cuMemCreate is charged against the cap and shown by
// MemInfo; when it does not fit, stensor's buffers make room (swapped out,
// data kept) and only with nothing left to evict is it out of memory. The
// fake's peak never exceeds the cap. Host-located memory is not charged.
TEST_F(BoundsTest, AppVmmCountsAgainstTheCapAndMakesRoom) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  ClearLog();
  CUmemGenericAllocationHandle h1 = Create(*mm);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  EXPECT_THAT(Records(), IsEmpty());  // it fitted
  CUmemGenericAllocationHandle h2 = Create(*mm);
  CUmemGenericAllocationHandle h3 = Create(*mm);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1", "swap_out:2"));
  EXPECT_EQ(FreeBytes(*mm), 0u);
  Create(*mm, CUDA_ERROR_OUT_OF_MEMORY);  // nothing left to evict
  EXPECT_THAT(Records(), Contains("oom"));
  CUmemGenericAllocationHandle host = Create(*mm, CUDA_SUCCESS, CU_MEM_LOCATION_TYPE_HOST);
  EXPECT_EQ(FreeBytes(*mm), 0u);
  EXPECT_LE(Peak(), kCap);
  EXPECT_EQ(Used(), kCap);

  // Released: the charge ends and the buffers come back with their data.
  for (auto h : {h1, h2, h3, host}) {
    ASSERT_CU(cuMemRelease(h));
    mm->OnAppRelease(h);
  }
  EXPECT_EQ(FreeBytes(*mm), kCap);
  EXPECT_TRUE(Holds(*mm, 1, a, 1));
  EXPECT_TRUE(Holds(*mm, 2, b, 2));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(a));
  EXPECT_CU(mm->Free(b));
}

// The charge follows the physical memory's life in the driver: a handle
// released while mapped lives until unmapped; a retained handle needs its
// own release. A failed cuMemCreate charges nothing.
TEST_F(BoundsTest, AppVmmChargeEndsWhenTheMemoryIsGone) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUmemGenericAllocationHandle h = Create(*mm);
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * kGranule, 0, 0, 0));
  ASSERT_CU(cuMemMap(va, kGranule, 0, h, 0));
  mm->OnAppMap(va, kGranule, h);
  CUmemGenericAllocationHandle retained = 0;
  ASSERT_CU(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va)));
  EXPECT_EQ(retained, h);
  mm->OnAppRetain(retained);
  ASSERT_CU(cuMemRelease(h));
  mm->OnAppRelease(h);
  EXPECT_EQ(FreeBytes(*mm), kCap - kGranule);  // retained and mapped
  ASSERT_CU(cuMemRelease(retained));
  mm->OnAppRelease(retained);
  EXPECT_EQ(FreeBytes(*mm), kCap - kGranule);  // still mapped: still alive
  EXPECT_EQ(Used(), kGranule);
  ASSERT_CU(cuMemUnmap(va, kGranule));
  mm->OnAppUnmap(va, kGranule);
  EXPECT_EQ(FreeBytes(*mm), kCap);
  EXPECT_EQ(Used(), 0u);
  ASSERT_CU(cuMemAddressFree(va, 2 * kGranule));

  fakecuda_fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN);
  Create(*mm, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(FreeBytes(*mm), kCap);
  // Not a whole number of granules: the driver's error, nothing charged.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle bad = 0;
  EXPECT_EQ(mm->CreateAppMemory(&bad, 1000, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(mm->CreateAppMemory(&bad, SIZE_MAX - SIZE_MAX % kGranule, &prop, 0),
            CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(FreeBytes(*mm), kCap);
}

// The device itself full below the cap (cuMemCreate out of memory once):
// a buffer is evicted and the creation retried.
TEST_F(BoundsTest, AppVmmOnAFullDeviceEvictsAndRetries) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  Write(*mm, 1, a, 1);
  ClearLog();
  fakecuda_fail_call("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  CUmemGenericAllocationHandle h = Create(*mm);
  EXPECT_THAT(Records(), ElementsAre("swap_out:1"));
  EXPECT_EQ(FreeBytes(*mm), kCap - kGranule);
  ASSERT_CU(cuMemRelease(h));
  mm->OnAppRelease(h);
  // Nothing left to evict: the driver's out of memory, nothing charged.
  fakecuda_fail_call("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  Create(*mm, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(FreeBytes(*mm), kCap);
  EXPECT_TRUE(Holds(*mm, 1, a, 1));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(a));
}

// --- Handles that leave stensor's control ---------------------------------------

// Pinning a swapped-out buffer brings it back, synchronously, with its
// data; from then on it is never evicted (others are, then out of memory),
// and the pin is logged once.
TEST_F(BoundsTest, ExportedBufferIsResidentAndNeverEvicted) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), c = Alloc(*mm, 3);
  Write(*mm, 1, a, 1);
  Write(*mm, 2, b, 2);
  Write(*mm, 3, c, 3);
  CUdeviceptr d = Alloc(*mm, 4);
  Write(*mm, 4, d, 4);
  ClearLog();
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(mm->PinExported(a + 12345, "cuIpcGetMemHandle", &r));  // an interior address
  EXPECT_CU(r);
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1", "pin:1"));
  // Resident now: its bytes are on the device, read without any swap.
  std::vector<uint8_t> direct(kGranule);
  ASSERT_CU(cuMemcpyDtoH_v2(direct.data(), a, kGranule));
  EXPECT_EQ(direct.front(), 1);
  EXPECT_EQ(direct.back(), 1);
  ASSERT_TRUE(mm->PinExported(a, "cuMemRetainAllocationHandle", &r));
  EXPECT_CU(r);
  EXPECT_THAT(Records(), ElementsAre("swap_out:2", "swap_in:1", "pin:1"));  // once

  // Everything else cycles through the cap; `a` never goes.
  for (int round = 0; round < 3; ++round) {
    EXPECT_TRUE(Holds(*mm, 2, b, 2));
    EXPECT_TRUE(Holds(*mm, 3, c, 3));
    EXPECT_TRUE(Holds(*mm, 4, d, 4));
  }
  for (const std::string& rec : Records()) {
    EXPECT_NE(rec, "swap_out:1");
    EXPECT_NE(rec, "drop_clean:1");
  }
  EXPECT_TRUE(Holds(*mm, 1, a, 1));
  EXPECT_LE(Peak(), kCap);
  // Its handle is the current device memory: found by handle as well.
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(a)));
  EXPECT_TRUE(mm->PinExportedHandle(h, "cuMemExportToShareableHandle"));
  EXPECT_FALSE(mm->PinExportedHandle(h + 1, "cuMemExportToShareableHandle"));
  ASSERT_CU(cuMemRelease(h));
  EXPECT_FALSE(mm->PinExported(a + 3 * kGranule, "cuIpcGetMemHandle", &r));  // not ours
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {a, b, c, d}) EXPECT_CU(mm->Free(p));
}

// A program that retained an exported buffer's handle may keep using that
// memory after cuMemFree (the driver keeps it alive for the handle): it is
// never pooled and handed to another buffer.
TEST_F(BoundsTest, FreedExportedMemoryIsNotHandedOn) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1);
  Write(*mm, 1, a, 1);
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(mm->PinExported(a, "cuMemRetainAllocationHandle", &r));
  EXPECT_CU(r);
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(a)));
  CUdeviceptr alias = 0;
  ASSERT_CU(cuMemAddressReserve(&alias, kGranule, 0, 0, 0));
  ASSERT_CU(cuMemMap(alias, kGranule, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(alias, kGranule, &access, 1));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_CU(mm->Free(a));

  CUdeviceptr e = Alloc(*mm, 2);
  Write(*mm, 2, e, 2);
  ASSERT_CU(cuMemsetD8_v2(alias, 0x77, kGranule));  // the program's own memory
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_TRUE(Holds(*mm, 2, e, 2));
  std::vector<uint8_t> mine(kGranule);
  ASSERT_CU(cuMemcpyDtoH_v2(mine.data(), alias, kGranule));
  EXPECT_EQ(mine.front(), 0x77);
  EXPECT_EQ(mine.back(), 0x77);
  ASSERT_CU(cuMemUnmap(alias, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(alias, kGranule));
  EXPECT_CU(mm->Free(e));
}

// With every other buffer pinned for good, a buffer that does not fit is
// out of memory (or born in host memory, with host-located VMM): pinned
// buffers are not evicted to make room.
TEST_F(BoundsTest, PinnedBuffersLeaveOutOfMemoryWhenNothingElseFits) {
  auto mm = Make();
  ASSERT_NE(mm, nullptr);
  CUdeviceptr a = Alloc(*mm, 1), b = Alloc(*mm, 2), c = Alloc(*mm, 3);
  for (CUdeviceptr p : {a, b, c}) {
    CUresult r;
    ASSERT_TRUE(mm->PinExported(p, "cuIpcGetMemHandle", &r));
    EXPECT_CU(r);
  }
  CUdeviceptr d = 0;
  if (HostVmm()) {
    EXPECT_CU(mm->Allocate(kGranule, &d, kUntracked));  // born in host memory
    EXPECT_CU(mm->Free(d));
  } else {
    EXPECT_EQ(mm->Allocate(kGranule, &d, kUntracked), CUDA_ERROR_OUT_OF_MEMORY);
  }
  ASSERT_CU(cuCtxSynchronize());
  for (CUdeviceptr p : {a, b, c}) EXPECT_CU(mm->Free(p));
}

}  // namespace
}  // namespace stensor
