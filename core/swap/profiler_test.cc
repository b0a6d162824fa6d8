// Profiler on the fake driver: the bandwidth probe and event timings, which
// never wait for the device.
#include "core/swap/profiler.h"

#include <cuda.h>
#include <dlfcn.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::FakeDeviceTest;
using testing_support::HeldStream;

Config WithBandwidth(const char* value) {
  absl::StatusOr<Config> config = Config::Parse([value](const char* name) -> const char* {
    return std::string(name) == "STENSOR_BANDWIDTH" ? value : nullptr;
  });
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Config();
}

void CUDA_CB Sleep20ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

class ProfilerTest : public FakeDeviceTest {};

TEST_F(ProfilerTest, ConfiguredBandwidthIsNotProbed) {
  fakecuda_count_calls(1);
  uint64_t allocs = fakecuda_call_count("cuMemAllocHost_v2");
  absl::StatusOr<Bandwidth> b = Profiler::MeasureBandwidth(WithBandwidth("25,12.5"), &driver_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(b->h2d, 25e9);
  EXPECT_DOUBLE_EQ(b->d2h, 12.5e9);
  EXPECT_EQ(fakecuda_call_count("cuMemAllocHost_v2"), allocs);
  // The probe itself does call it: the count above can tell.
  ASSERT_TRUE(Profiler::MeasureBandwidth(Config(), &driver_, 1 << 20).ok());
  EXPECT_EQ(fakecuda_call_count("cuMemAllocHost_v2"), allocs + 1);
  fakecuda_count_calls(0);
}

TEST_F(ProfilerTest, ProbeMeasuresBothDirectionsAndFreesEverything) {
  absl::StatusOr<Bandwidth> b = Profiler::MeasureBandwidth(Config(), &driver_, 4 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(b->h2d, 0);
  EXPECT_GT(b->d2h, 0);
  // TearDown checks that no device memory is left in use.
}

TEST_F(ProfilerTest, AFailedProbeCallIsAnErrorAndLeaksNothing) {
  for (const char* call : {"cuMemAlloc_v2", "cuMemAllocHost_v2", "cuStreamCreate",
                           "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuStreamSynchronize"}) {
    SCOPED_TRACE(call);
    fakecuda_fail_call(call, 1, CUDA_ERROR_UNKNOWN);  // the next call
    absl::StatusOr<Bandwidth> b = Profiler::MeasureBandwidth(Config(), &driver_, 1 << 20);
    EXPECT_FALSE(b.ok());
    fakecuda_clear_failures();
    EXPECT_EQ(Used(), 0u);
  }
}

TEST_F(ProfilerTest, TimesALaunchWithoutWaitingForIt) {
  Profiler profiler(&driver_);
  HeldStream held;
  int token = profiler.BeginTiming(held.get());
  ASSERT_GE(token, 0);
  ASSERT_EQ(cuLaunchHostFunc(held.get(), &Sleep20ms, nullptr), CUDA_SUCCESS);
  profiler.EndTiming(token, held.get(), /*op=*/7, /*submitted=*/true);
  // The stream is held: nothing completed, and asking does not block.
  EXPECT_TRUE(profiler.TakeCompleted().empty());
  EXPECT_EQ(profiler.pending(), 1u);
  held.Open();
  ASSERT_EQ(cuStreamSynchronize(held.get()), CUDA_SUCCESS);
  auto done = profiler.TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first, 7u);
  EXPECT_GE(done[0].second, 0.015);
  EXPECT_EQ(profiler.pending(), 0u);
}

TEST_F(ProfilerTest, OpenTimingsAreKeptAndFailedOnesDropped) {
  Profiler profiler(&driver_);
  CUstream stream;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  int open = profiler.BeginTiming(stream);
  int failed = profiler.BeginTiming(stream);
  int fine = profiler.BeginTiming(stream);
  ASSERT_GE(open, 0);
  ASSERT_GE(failed, 0);
  ASSERT_GE(fine, 0);
  profiler.EndTiming(failed, stream, 1, /*submitted=*/false);
  profiler.EndTiming(fine, stream, 2, /*submitted=*/true);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  auto done = profiler.TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first, 2u);
  EXPECT_EQ(profiler.pending(), 1u);  // `open` is still being launched
  profiler.EndTiming(open, stream, 3, /*submitted=*/true);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  done = profiler.TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first, 3u);
  // A failed record is an untimed launch, not an error.
  fakecuda_fail_call("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(profiler.BeginTiming(stream), -1);
  fakecuda_clear_failures();
  ASSERT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

}  // namespace
}  // namespace stensor

namespace stensor {
namespace {

// Timing events kept for reuse belong to the context they were made in:
// once it ended, the one record that finds them dead drops them, and the
// next timing makes a pair in the current context (not -1 for ever).
TEST_F(ProfilerTest, EventsOfAnEndedContextAreNotReused) {
  Profiler profiler(&driver_);
  CUcontext home = nullptr, other = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&home), CUDA_SUCCESS);
  CUdevice dev = 0;
  ASSERT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate_v4(&other, nullptr, 0, dev), CUDA_SUCCESS);
  CUstream s_other;
  ASSERT_EQ(cuStreamCreate(&s_other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  int token = profiler.BeginTiming(s_other);
  ASSERT_GE(token, 0);
  profiler.EndTiming(token, s_other, 1, /*submitted=*/true);
  ASSERT_EQ(cuStreamSynchronize(s_other), CUDA_SUCCESS);
  ASSERT_EQ(profiler.TakeCompleted().size(), 1u);  // its pair kept for reuse
  ASSERT_EQ(cuCtxDestroy_v2(other), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(home), CUDA_SUCCESS);
  CUstream s_home;
  ASSERT_EQ(cuStreamCreate(&s_home, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  int first = profiler.BeginTiming(s_home);
  if (first >= 0) profiler.EndTiming(first, s_home, 2, /*submitted=*/true);
  int second = profiler.BeginTiming(s_home);
  EXPECT_GE(second, 0);
  if (second >= 0) profiler.EndTiming(second, s_home, 3, /*submitted=*/true);
  ASSERT_EQ(cuStreamSynchronize(s_home), CUDA_SUCCESS);
  (void)profiler.TakeCompleted();
  ASSERT_EQ(cuStreamDestroy_v2(s_home), CUDA_SUCCESS);
}

}  // namespace
}  // namespace stensor
