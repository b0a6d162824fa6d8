// What the MemoryManager tests share: a fixture on the fake driver (device
// 0's primary context, the real-driver table loaded from the fake, a check
// that no device memory is left in use), a manager built from STENSOR_*
// values that logs into the fixture, and a stream held by a host function
// so that work stays in flight without relying on timing.
//
// Thread-safety: the log capture is thread-safe; the rest is the test's.
#ifndef STENSOR_TESTS_SUPPORT_MEMORY_MANAGER_TESTING_H_
#define STENSOR_TESTS_SUPPORT_MEMORY_MANAGER_TESTING_H_

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/config.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "core/swap/memory_manager.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr

namespace stensor {
namespace testing_support {

constexpr uint64_t kGranule = uint64_t{2} << 20;  // the fake's granularity
constexpr uint64_t kCap = 3 * kGranule;           // "6MiB"

// A non-blocking stream held by a host function until Open() (the Gate of
// tests/fakecuda/fakecuda_test.cc). The destructor opens it and waits for
// it, so a test that stops early cannot leave the stream spinning.
class HeldStream {
 public:
  HeldStream() {
    EXPECT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    EXPECT_CU(cuLaunchHostFunc(stream_, &HeldStream::Wait, this));
  }
  ~HeldStream() {
    Open();
    cuStreamSynchronize(stream_);
    cuStreamDestroy_v2(stream_);
  }
  HeldStream(const HeldStream&) = delete;
  HeldStream& operator=(const HeldStream&) = delete;

  CUstream get() const { return stream_; }
  void Open() { open_.store(true); }

 private:
  static void CUDA_CB Wait(void* self) {
    auto* held = static_cast<HeldStream*>(self);
    while (!held->open_.load()) std::this_thread::yield();
  }

  CUstream stream_ = nullptr;
  std::atomic<bool> open_{false};
};

// Whether the device maps host memory (host-located VMM), as the fake says.
inline bool HostVmmSupported() {
  int supported = 0;
  cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
  return supported != 0;
}

class FakeDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&dev_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(handle, nullptr) << dlerror();
    ASSERT_GT(LoadDriver(handle, &dlsym, &driver_), 0);
    baseline_ = fakecuda_used_bytes(0);
    fakecuda_reset_peak_bytes(0);
  }
  void TearDown() override {
    fakecuda_clear_failures();
    cuCtxSynchronize();
    EXPECT_EQ(fakecuda_used_bytes(0), baseline_) << "device memory left in use";
    cuDevicePrimaryCtxRelease_v2(dev_);
  }

  // A manager configured by `env` (STENSOR_* names to values), logging
  // into this fixture; null (and a failure) when the values do not parse.
  std::unique_ptr<MemoryManager> MakeManager(const std::map<std::string, std::string>& env) {
    absl::StatusOr<Config> config = Config::Parse([&env](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return nullptr;
    return MemoryManager::Create(*config, &driver_, [this](std::string line) {
      MutexLock lock(&log_mu_);
      lines_.push_back(std::move(line));
    });
  }
  std::vector<std::string> Lines() {
    MutexLock lock(&log_mu_);
    return lines_;
  }
  void ClearLog() {
    MutexLock lock(&log_mu_);
    lines_.clear();
  }
  // The fake's device memory in use, and its high-water mark, since SetUp.
  size_t Used() const { return fakecuda_used_bytes(0) - baseline_; }
  size_t Peak() const { return fakecuda_peak_bytes(0) - baseline_; }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  Driver driver_;
  size_t baseline_ = 0;

 private:
  Mutex log_mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(log_mu_);
};

constexpr size_t kWords = kGranule / sizeof(uint64_t);  // a granule's words

// The driver calls of the swap path that fault sweeps fail in turn, and
// whether stensor can always work around a failure of each (then the
// program never sees it).
struct SwapPathCall {
  const char* name;
  bool recoverable;
};
inline constexpr SwapPathCall kSwapPathCalls[] = {
    {"cuEventCreate", true},        {"cuEventRecord", true},
    {"cuEventQuery", true},         {"cuEventSynchronize", true},
    {"cuStreamWaitEvent", true},    {"cuStreamQuery", true},
    {"cuStreamCreate", false},      {"cuMemcpyDtoDAsync_v2", false},
    {"cuMemcpyDtoHAsync_v2", true}, {"cuMemcpyHtoDAsync_v2", false},
    {"cuMemCreate", false},         {"cuMemMap", false},
    {"cuMemSetAccess", false},      {"cuMemUnmap", false},
    {"cuMemRelease", true},         {"cuMemAddressReserve", false},
    {"cuMemHostAlloc", true},       {"cuMemAddressFree", true},
    {"cuMemsetD8Async", true},
};

// What a fault sweep's program may see when `call` failed once: nothing
// where stensor can always work around it, else the injected error or out
// of memory.
inline void ExpectErrorsAllowed(const SwapPathCall& call, const std::vector<CUresult>& errors) {
  for (CUresult r : errors) {
    if (call.recoverable) {
      ADD_FAILURE() << "the program saw " << r << " where stensor could recover";
    } else {
      EXPECT_TRUE(r == CUDA_ERROR_UNKNOWN || r == CUDA_ERROR_OUT_OF_MEMORY) << r;
    }
  }
}

using Ids = std::vector<uint64_t>;

// The contents written with `seed`: distinct for every seed and word.
inline std::vector<uint64_t> Pattern(uint64_t seed, size_t words = kWords) {
  std::vector<uint64_t> data(words);
  for (size_t i = 0; i < words; ++i) {
    data[i] = (seed << 40) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0x5A5A5A5Aull;
  }
  return data;
}

// "" when `got` equals `want`, else where it first differs.
inline std::string Mismatch(const std::vector<uint64_t>& got, const std::vector<uint64_t>& want) {
  if (got.size() != want.size()) {
    return absl::StrCat("size: got ", got.size(), " words, want ", want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return absl::StrCat("word ", i, ": got ", got[i], ", want ", want[i]);
  }
  return "";
}

// "" when `got` holds Pattern(seed), else where it first differs.
inline std::string Mismatch(const std::vector<uint64_t>& got, uint64_t seed) {
  std::string m = Mismatch(got, Pattern(seed, got.size()));
  return m.empty() ? m : absl::StrCat(m, " (seed ", seed, ")");
}

// FakeDeviceTest plus the buffer operations of the manager's tests, each
// wrapped in Prepare/Finish as the tracker wraps the application's calls.
class ManagerBufferTest : public FakeDeviceTest {
 protected:
  // Allocate, registered with `id`, as the tracker does.
  CUdeviceptr Alloc(MemoryManager& mm, uint64_t id, uint64_t bytes = kGranule) {
    CUdeviceptr p = 0;
    EXPECT_CU(mm.Allocate(bytes, &p, [id](CUdeviceptr) { return id; }));
    return p;
  }

  // The application waits for its work, so the last-use event Finish
  // recorded has completed: which records an eviction logs (an evict_wait
  // or not) then does not depend on timing.
  void Settle() { EXPECT_CU(cuCtxSynchronize()); }

  // A whole-buffer host-to-device copy of Pattern(seed).
  void Write(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint64_t seed,
             uint64_t bytes = kGranule, bool overwritten = false) {
    std::vector<uint64_t> data = Pattern(seed, bytes / sizeof(uint64_t));
    Ids ids = {id};
    ASSERT_CU(mm.Prepare(ids, overwritten ? ids : Ids{}, nullptr));
    CUresult r = cuMemcpyHtoD_v2(p, data.data(), bytes);
    mm.Finish(ids, ids, nullptr, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    Settle();
  }

  // A device-to-host copy of the whole buffer.
  std::vector<uint64_t> Read(MemoryManager& mm, uint64_t id, CUdeviceptr p,
                             uint64_t bytes = kGranule) {
    std::vector<uint64_t> data(bytes / sizeof(uint64_t));
    Ids ids = {id};
    EXPECT_CU(mm.Prepare(ids, {}, nullptr));
    CUresult r = cuMemcpyDtoH_v2(data.data(), p, bytes);
    mm.Finish(ids, {}, nullptr, r == CUDA_SUCCESS);
    EXPECT_CU(r);
    Settle();
    return data;
  }

  void ExpectData(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint64_t seed,
                  uint64_t bytes = kGranule) {
    EXPECT_EQ(Mismatch(Read(mm, id, p, bytes), seed), "") << "buffer " << id;
  }

  // Allocates ids 1..3 (one granule each, filling a 6 MiB cap) and writes
  // Pattern(id) into each, in that order (so 1 is least recently used).
  void FillThree(MemoryManager& mm, CUdeviceptr* a, CUdeviceptr* b, CUdeviceptr* c) {
    *a = Alloc(mm, 1);
    *b = Alloc(mm, 2);
    *c = Alloc(mm, 3);
    Write(mm, 1, *a, 1);
    Write(mm, 2, *b, 2);
    Write(mm, 3, *c, 3);
  }
};

}  // namespace testing_support
}  // namespace stensor

#endif  // STENSOR_TESTS_SUPPORT_MEMORY_MANAGER_TESTING_H_
