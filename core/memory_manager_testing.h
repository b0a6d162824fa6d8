// What the MemoryManager tests share: a fixture on the fake driver (device
// 0's primary context, the real-driver table loaded from the fake, a check
// that no device memory is left in use), a manager built from STENSOR_*
// values that logs into the fixture, and a stream held by a host function
// so that work stays in flight without relying on timing.
//
// Thread-safety: the log capture is thread-safe; the rest is the test's.
#ifndef STENSOR_CORE_MEMORY_MANAGER_TESTING_H_
#define STENSOR_CORE_MEMORY_MANAGER_TESTING_H_

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda.h>

#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/config.h"
#include "core/driver.h"
#include "core/memory_manager.h"
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

}  // namespace testing_support
}  // namespace stensor

#endif  // STENSOR_CORE_MEMORY_MANAGER_TESTING_H_
