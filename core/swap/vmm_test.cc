// Vmm and HostCopy on the fake driver: chunks mapped at consecutive offsets
// read as one buffer; every failed call is undone (or left for Release) and
// counted; a host copy round-trips a buffer's bytes.
#include "core/swap/vmm.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/swap/host_copy.h"
#include "core/swap/stream_use.h"
#include "tests/fakecuda/fakecuda.h"

namespace stensor {
namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr

constexpr uint64_t kGranule = 2u << 20;

class VmmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    CUdevice dev = 0;
    ASSERT_CU(cuDeviceGet(&dev, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(handle, nullptr) << dlerror();
    ASSERT_GT(LoadDriver(handle, &dlsym, &driver_), 0);
    baseline_ = fakecuda_used_bytes(0);
  }
  void TearDown() override {
    fakecuda_clear_failures();
    EXPECT_EQ(fakecuda_used_bytes(0), baseline_) << "device memory left in use";
    cuDevicePrimaryCtxRelease_v2(0);
  }

  // Chunks of the given sizes in granules.
  std::vector<PhysicalChunk> Chunks(std::vector<uint64_t> granules) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    std::vector<PhysicalChunk> chunks;
    for (uint64_t g : granules) {
      PhysicalChunk c{0, g * kGranule};
      EXPECT_CU(cuMemCreate(&c.handle, c.bytes, &prop, 0));
      chunks.push_back(c);
    }
    return chunks;
  }
  void Release(const std::vector<PhysicalChunk>& chunks) {
    for (const PhysicalChunk& c : chunks) EXPECT_CU(cuMemRelease(c.handle));
  }

  Driver driver_;
  CUcontext ctx_ = nullptr;
  uint64_t errors_ = 0;
  Vmm vmm_{&driver_, &errors_};
  size_t baseline_ = 0;
};

// Chunks of different sizes (2, 1 and 3 granules) side by side.
TEST_F(VmmTest, ChunksMapAtConsecutiveOffsetsAsOneBuffer) {
  auto chunks = Chunks({2, 1, 3});
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 6 * kGranule, 0, 0, 0));
  bool mapped = false;
  ASSERT_CU(vmm_.Map(va, chunks, 0, &mapped));
  EXPECT_TRUE(mapped);
  std::vector<unsigned char> data(6 * kGranule), back(6 * kGranule);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i / 4096 + i);
  ASSERT_CU(cuMemcpyHtoD_v2(va, data.data(), data.size()));  // crosses both seams
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va, back.size()));
  EXPECT_EQ(back, data);
  ASSERT_CU(vmm_.Unmap(va, 6 * kGranule));  // one call for all three
  EXPECT_EQ(errors_, 0u);
  EXPECT_CU(cuMemAddressFree(va, 6 * kGranule));
  Release(chunks);
}

// A failed cuMemMap of any chunk, or a failed cuMemSetAccess, leaves
// nothing mapped (the range can be mapped afresh), and counts one error.
TEST_F(VmmTest, EveryFailedStepIsUndone) {
  auto chunks = Chunks({1, 1, 1});
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 3 * kGranule, 0, 0, 0));
  struct Case {
    const char* call;
    int nth;
  };
  for (Case c :
       {Case{"cuMemMap", 1}, Case{"cuMemMap", 2}, Case{"cuMemMap", 3}, Case{"cuMemSetAccess", 1}}) {
    SCOPED_TRACE(std::string(c.call) + " #" + std::to_string(c.nth));
    errors_ = 0;
    fakecuda_fail_call(c.call, c.nth, CUDA_ERROR_UNKNOWN);
    bool mapped = true;
    EXPECT_EQ(vmm_.Map(va, chunks, 0, &mapped), CUDA_ERROR_UNKNOWN);
    fakecuda_clear_failures();
    EXPECT_FALSE(mapped);
    EXPECT_EQ(errors_, 1u);
    ASSERT_CU(vmm_.Map(va, chunks, 0, &mapped));  // nothing was left
    ASSERT_CU(vmm_.Unmap(va, 3 * kGranule));
  }
  // The undo failing too leaves the mapping, and says so.
  fakecuda_fail_call("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
  fakecuda_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  bool mapped = false;
  EXPECT_EQ(vmm_.Map(va, chunks, 0, &mapped), CUDA_ERROR_UNKNOWN);
  fakecuda_clear_failures();
  EXPECT_TRUE(mapped);
  ASSERT_CU(vmm_.Unmap(va, 3 * kGranule));
  EXPECT_CU(cuMemAddressFree(va, 3 * kGranule));
  Release(chunks);
}

// A host copy (host-located VMM, or pinned memory) takes a buffer's bytes
// and gives them back; each failed call of its making is undone, and
// Release finishes what a failed release left.
TEST_F(VmmTest, HostCopyRoundTripsAndUndoesEveryFailure) {
  auto chunks = Chunks({1});
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, kGranule, 0, 0, 0));
  bool mapped = false;
  ASSERT_CU(vmm_.Map(va, chunks, 0, &mapped));
  std::vector<unsigned char> data(kGranule, 0x5a), back(kGranule, 0);
  data[7] = 1;
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (bool host_vmm : {true, false}) {
    SCOPED_TRACE(host_vmm ? "host-located VMM" : "pinned");
    for (const char* call : host_vmm
                                ? std::vector<const char*>{"cuMemCreate", "cuMemAddressReserve",
                                                           "cuMemMap", "cuMemSetAccess"}
                                : std::vector<const char*>{"cuMemHostAlloc"}) {
      SCOPED_TRACE(call);
      HostCopy failed;
      uint64_t held = 0;
      fakecuda_fail_call(call, 1, CUDA_ERROR_OUT_OF_MEMORY);
      EXPECT_EQ(failed.Create(vmm_, host_vmm, kGranule, kGranule, 0, &held),
                CUDA_ERROR_OUT_OF_MEMORY);
      fakecuda_clear_failures();
      EXPECT_FALSE(failed.exists());
      EXPECT_EQ(held, 0u);
      EXPECT_TRUE(failed.Release(vmm_, kGranule, &held));  // nothing left
    }
    HostCopy copy;
    uint64_t held = 0;
    ASSERT_CU(copy.Create(vmm_, host_vmm, kGranule, kGranule, 0, &held));
    EXPECT_TRUE(copy.exists());
    EXPECT_EQ(copy.vmm(), host_vmm);
    EXPECT_EQ(held, kGranule);
    ASSERT_CU(cuMemcpyHtoD_v2(va, data.data(), kGranule));
    ASSERT_CU(copy.CopyFromDevice(vmm_, va, kGranule, s));
    ASSERT_CU(cuStreamSynchronize(s));
    ASSERT_CU(cuMemsetD8Async(va, 0, kGranule, s));  // in order before the copy back
    ASSERT_CU(copy.CopyToDevice(vmm_, va, kGranule, s));
    ASSERT_CU(cuStreamSynchronize(s));
    ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va, kGranule));
    EXPECT_EQ(back, data);
    // A release that fails half-way is finished by the next one.
    fakecuda_fail_call(host_vmm ? "cuMemRelease" : "cuMemFreeHost", 1, CUDA_ERROR_UNKNOWN);
    EXPECT_FALSE(copy.Release(vmm_, kGranule, &held));
    fakecuda_clear_failures();
    EXPECT_TRUE(copy.Release(vmm_, kGranule, &held));
    EXPECT_FALSE(copy.exists());
    EXPECT_EQ(held, 0u);
  }
  EXPECT_CU(cuStreamDestroy_v2(s));
  ASSERT_CU(vmm_.Unmap(va, kGranule));
  EXPECT_CU(cuMemAddressFree(va, kGranule));
  Release(chunks);
}

// A stream held at a known point until Open() (no timing involved).
struct Gate {
  static void CUDA_CB Wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    while (!g->open.load()) std::this_thread::yield();
  }
  std::atomic<bool> open{false};
};

// A use is one event per stream, re-recorded at each use; it is observed
// complete only once its stream passed it, and a wait for it returns then.
// A failed record leaves it unobservable, and a wait falls back to the
// context (or the swap stream, for a use there).
TEST_F(VmmTest, StreamUsesAreObservedOnlyOnceTheStreamPassedThem) {
  CUstream s = nullptr, swap = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&swap, CU_STREAM_NON_BLOCKING));
  std::vector<StreamUse> uses;
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s, &Gate::Wait, &gate));
  RecordStreamUse(vmm_, &uses, s, 0);
  RecordStreamUse(vmm_, &uses, swap, 0);
  RecordStreamUse(vmm_, &uses, s, 0);  // the same entry, used again
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_EQ(uses[0].seq, 2u);
  EXPECT_TRUE(uses[0].recorded);
  EXPECT_FALSE(ObservedComplete(driver_, uses[0]));  // held
  EXPECT_CU(WaitForStreamUse(driver_, uses[1], swap));
  EXPECT_TRUE(ObservedComplete(driver_, uses[1]));
  gate.open.store(true);
  EXPECT_CU(WaitForStreamUse(driver_, uses[0], swap));
  EXPECT_TRUE(ObservedComplete(driver_, uses[0]));
  EXPECT_TRUE(uses[0].done);
  EXPECT_EQ(errors_, 0u);

  // A record that fails: not observable, counted; waits still end.
  fakecuda_fail_call("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  RecordStreamUse(vmm_, &uses, s, 0);
  fakecuda_clear_failures();
  EXPECT_FALSE(uses[0].recorded);
  EXPECT_FALSE(ObservedComplete(driver_, uses[0]));
  EXPECT_EQ(errors_, 1u);
  EXPECT_CU(WaitForStreamUse(driver_, uses[0], swap));  // the whole context
  fakecuda_fail_call("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  RecordStreamUse(vmm_, &uses, swap, 0);
  fakecuda_clear_failures();
  EXPECT_CU(WaitForStreamUse(driver_, uses[1], swap));  // the swap stream
  for (const StreamUse& u : uses) EXPECT_CU(cuEventDestroy_v2(u.event));
  EXPECT_CU(cuStreamDestroy_v2(s));
  EXPECT_CU(cuStreamDestroy_v2(swap));
}

}  // namespace
}  // namespace stensor
