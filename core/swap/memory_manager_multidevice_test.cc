// Two fake devices (FAKECUDA_DEVICES=2 in BUILD): each device's buffers are
// charged and capped on their own, swapped on that device's own streams,
// made in that device's context whatever context the program has current,
// with the program's context current again after every call, failures
// included (core/swap/memory_manager_uses.cc, ContextScope and CreateOwnStream).
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/swap/memory_manager.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::kGranule;
constexpr size_t kWords = kGranule / sizeof(uint64_t);
using Ids = std::vector<uint64_t>;

std::vector<uint64_t> Pattern(uint64_t seed) {
  std::vector<uint64_t> d(kWords);
  for (size_t i = 0; i < kWords; ++i) d[i] = (seed << 40) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0xA5A5ull;
  return d;
}

// The first differing word, or "" when `got` is `want`.
std::string Mismatch(const std::vector<uint64_t>& got, const std::vector<uint64_t>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return "word " + std::to_string(i) + ": " + std::to_string(got[i]);
  }
  return "";
}

CUcontext Current() {
  CUcontext c = nullptr;
  EXPECT_CU(cuCtxGetCurrent(&c));
  return c;
}

// The current context's device, for tests that fail cuCtxGetCurrent.
int CurrentDevice() {
  CUdevice d = -1;
  EXPECT_CU(cuCtxGetDevice(&d));
  return d;
}

class MultiDeviceTest : public testing_support::FakeDeviceTest {
 protected:
  void SetUp() override {
    FakeDeviceTest::SetUp();
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx1_, 1));
    baseline1_ = fakecuda_used_bytes(1);
    fakecuda_reset_peak_bytes(1);
  }
  void TearDown() override {
    EXPECT_EQ(fakecuda_used_bytes(1), baseline1_) << "device 1 memory left in use";
    cuDevicePrimaryCtxRelease_v2(1);
    FakeDeviceTest::TearDown();
  }

  // A granule-sized buffer named `id`, allocated with `ctx` current (its
  // device's), which stays current after.
  CUdeviceptr AllocIn(MemoryManager& mm, CUcontext ctx, uint64_t id) {
    EXPECT_CU(cuCtxSetCurrent(ctx));
    CUdeviceptr p = 0;
    EXPECT_CU(mm.Allocate(kGranule, &p, [id](CUdeviceptr) { return id; }));
    return p;
  }
  // Writes Pattern(seed) with whatever context is current: on `s`, or on the
  // current context's NULL stream (unified addressing: any device's buffer).
  void Write(MemoryManager& mm, uint64_t id, CUdeviceptr p, uint64_t seed, CUstream s = nullptr) {
    std::vector<uint64_t> data = Pattern(seed);
    Ids ids = {id};
    ASSERT_CU(mm.Prepare(ids, ids, s));
    CUresult r = s == nullptr ? cuMemcpyHtoD_v2(p, data.data(), kGranule)
                              : cuMemcpyHtoDAsync_v2(p, data.data(), kGranule, s);
    mm.Finish(ids, ids, s, r == CUDA_SUCCESS);
    ASSERT_CU(r);
    if (s != nullptr) {
      ASSERT_CU(cuStreamSynchronize(s));
    }
  }
  std::vector<uint64_t> Read(MemoryManager& mm, uint64_t id, CUdeviceptr p, CUstream s = nullptr) {
    std::vector<uint64_t> got(kWords, 0x1111);
    Ids ids = {id};
    CUresult r = mm.Prepare(ids, {}, s);
    EXPECT_CU(r);
    if (r != CUDA_SUCCESS) return got;
    r = s == nullptr ? cuMemcpyDtoH_v2(got.data(), p, kGranule)
                     : cuMemcpyDtoHAsync_v2(got.data(), p, kGranule, s);
    mm.Finish(ids, {}, s, r == CUDA_SUCCESS);
    EXPECT_CU(r);
    if (s != nullptr && r == CUDA_SUCCESS) {
      EXPECT_CU(cuStreamSynchronize(s));
    }
    return got;
  }
  size_t Peak1() const { return fakecuda_peak_bytes(1) - baseline1_; }
  // The program's call `end` that ends `ctx` (`ends`: when it succeeds), as
  // the hooks wrap it (Tracker::DestroyContext, EndPrimaryContext).
  template <typename End>
  CUresult EndContext(MemoryManager& mm, CUcontext ctx, End&& end, bool ends = true) {
    mm.BeforeContextEnds(ctx);
    const CUresult r = end();
    mm.AfterContextEnds(ctx, ends && r == CUDA_SUCCESS);
    return r;
  }
  // StreamsAreMadeAgainAfterTheirContextIsDestroyed, below; `fail_wait`
  // fails the wait for the context's work before its end.
  void DestroyTheContextOfTheStreams(bool fail_wait) {
    auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "0=6MiB"}});
    ASSERT_NE(mm, nullptr);
    CUcontext created = nullptr;
    ASSERT_CU(cuCtxCreate_v4(&created, nullptr, 0, 0));
    CUdeviceptr c[4];
    for (uint64_t id = 1; id <= 4; ++id) {
      c[id - 1] = AllocIn(*mm, created, id);
      Write(*mm, id, c[id - 1], id);
    }
    EXPECT_EQ(Mismatch(Read(*mm, 1, c[0]), Pattern(1)), "");  // swapped back in
    CUdeviceptr kept = AllocIn(*mm, ctx_, 9);                 // the primary context's
    Write(*mm, 9, kept, 9);
    ASSERT_CU(cuCtxSetCurrent(created));
    for (CUdeviceptr b : c) ASSERT_CU(mm->Free(b));
    ASSERT_CU(mm->EvictAsync(9));  // queued on the created context's swap stream
    fakecuda_count_calls(1);
    const unsigned long long stream_waits = fakecuda_call_count("cuStreamSynchronize");
    if (fail_wait) fakecuda_fail_call("cuCtxSynchronize", 1, CUDA_ERROR_UNKNOWN);
    ASSERT_CU(EndContext(*mm, created, [&] { return cuCtxDestroy_v2(created); }));
    // The swap stream, and the fetch stream if it was made.
    const unsigned long long waited = fakecuda_call_count("cuStreamSynchronize") - stream_waits;
    if (fail_wait) {
      EXPECT_GE(waited, 1u);
    } else {
      EXPECT_EQ(waited, 0u);
    }
    fakecuda_clear_failures();
    fakecuda_count_calls(0);
    ASSERT_EQ(Current(), ctx_);
    EXPECT_EQ(Mismatch(Read(*mm, 9, kept), Pattern(9)), "");
    SixRoundsOfEvictions(*mm, ctx_);
    EXPECT_EQ(Mismatch(Read(*mm, 9, kept), Pattern(9)), "");
    EXPECT_GE(mm->stats().swap_outs_copied, 6u);
    EXPECT_EQ(mm->stats().driver_errors, fail_wait ? 1u : 0u);
    ASSERT_CU(mm->Free(kept));
  }
  // Six rounds of four buffers of device 0 under a cap of three, with
  // `ctx` current: every allocation past the third evicts; each buffer is
  // written, read back after the others (a swap-in) and freed.
  void SixRoundsOfEvictions(MemoryManager& mm, CUcontext ctx) {
    for (uint64_t round = 0; round < 6; ++round) {
      SCOPED_TRACE(round);
      const uint64_t first = 100 + 10 * round;
      CUdeviceptr p[4];
      for (uint64_t i = 0; i < 4; ++i) {
        p[i] = AllocIn(mm, ctx, first + i);
        ASSERT_NE(p[i], 0u);
        Write(mm, first + i, p[i], first + i);
      }
      for (uint64_t i = 0; i < 4; ++i) {
        EXPECT_EQ(Mismatch(Read(mm, first + i, p[i]), Pattern(first + i)), "") << "buffer " << i;
      }
      for (CUdeviceptr b : p) ASSERT_CU(mm.Free(b));
    }
  }

  CUcontext ctx1_ = nullptr;
  size_t baseline1_ = 0;
};

// Device 0's buffers swapped while a context of device 1 is current: its
// swap and fetch streams, and the events of their uses, are device 0's.
// Were they made in the current context, the first event made there would
// be recorded on device 0's swap stream (CUDA_ERROR_INVALID_HANDLE: a
// driver error and host waits), and once that context is destroyed, device
// 0's streams made in it would be gone with it.
TEST_F(MultiDeviceTest, DeviceStreamsAndEventsLiveInTheDevicesContext) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "0=8MiB,1=4MiB"}});
  ASSERT_NE(mm, nullptr);
  CUdeviceptr p[4];
  for (uint64_t id = 1; id <= 4; ++id) {
    p[id - 1] = AllocIn(*mm, ctx_, id);
    Write(*mm, id, p[id - 1], id);
  }
  // A context of device 1 of the program's own, current while device 0's
  // buffers go out and come back for the first time.
  CUcontext created = nullptr;
  ASSERT_CU(cuCtxCreate_v2(&created, 0, 1));
  ASSERT_EQ(Current(), created);
  ASSERT_CU(mm->EvictAsync(1));
  ASSERT_EQ(Current(), created);
  EXPECT_EQ(Mismatch(Read(*mm, 1, p[0]), Pattern(1)), "");  // swap-in
  ASSERT_CU(mm->EvictAsync(2));
  ASSERT_CU(mm->EvictAsync(3));
  EXPECT_EQ(Mismatch(Read(*mm, 2, p[1]), Pattern(2)), "");
  EXPECT_EQ(Current(), created);
  EXPECT_EQ(mm->stats().driver_errors, 0u);

  // Gone, and device 0 still swaps (its streams were never the created
  // context's; the events of the uses made with it current end with it);
  // the destroy pops it, leaving device 0's context current.
  ASSERT_CU(EndContext(*mm, created, [&] { return cuCtxDestroy_v2(created); }));
  ASSERT_EQ(Current(), ctx_);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_CU(mm->EvictAsync(id));
  for (uint64_t id = 1; id <= 4; ++id) {
    EXPECT_EQ(Mismatch(Read(*mm, id, p[id - 1]), Pattern(id)), "") << "buffer " << id;
  }
  EXPECT_EQ(mm->stats().driver_errors, 0u);
  EXPECT_GT(mm->stats().swap_outs_copied, 0u);
  for (CUdeviceptr b : p) ASSERT_CU(mm->Free(b));
}

// The context stensor made device 0's streams and events in (the first
// buffer's, a created one) is destroyed once its buffers were freed (some
// still in use on those streams), with a swap-out of a buffer of another
// context queued there: that copy completes first, and afterwards every
// allocation that needs an eviction works, on streams made anew in the live
// context, six rounds, every byte kept, no failed driver call. (Handles of
// a destroyed context are invalid: kept, they fail every swap with
// CUDA_ERROR_CONTEXT_IS_DESTROYED, and garbage is never idle.)
TEST_F(MultiDeviceTest, StreamsAreMadeAgainAfterTheirContextIsDestroyed) {
  DestroyTheContextOfTheStreams(/*fail_wait=*/false);
}

// The wait for the context's work failing (cuCtxSynchronize): stensor's
// own streams there are waited for one by one instead, the failure counted.
TEST_F(MultiDeviceTest, AFailedWaitBeforeTheEndWaitsForStensorsOwnStreams) {
  DestroyTheContextOfTheStreams(/*fail_wait=*/true);
}

// The same when the context is device 0's primary one and the program
// resets it (it ends whatever its count), then retains it again: the same
// handle, a new context, whose streams stensor makes anew.
TEST_F(MultiDeviceTest, StreamsAreMadeAgainAfterAPrimaryContextReset) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "0=6MiB"}});
  ASSERT_NE(mm, nullptr);
  CUdeviceptr p[4];
  for (uint64_t id = 1; id <= 4; ++id) {
    p[id - 1] = AllocIn(*mm, ctx_, id);
    Write(*mm, id, p[id - 1], id);
  }
  EXPECT_EQ(Mismatch(Read(*mm, 1, p[0]), Pattern(1)), "");
  for (CUdeviceptr b : p) ASSERT_CU(mm->Free(b));
  ASSERT_CU(EndContext(*mm, ctx_, [&] { return cuDevicePrimaryCtxReset_v2(0); }));
  CUcontext again = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&again, 0));  // the fixture's reference, reset
  ASSERT_EQ(again, ctx_);
  SixRoundsOfEvictions(*mm, again);
  EXPECT_EQ(mm->stats().driver_errors, 0u);
}

// A release that leaves a reference ends nothing: stensor's streams are
// made again all the same, and the events of uses in the context, still
// valid, are kept.
TEST_F(MultiDeviceTest, AReleaseThatEndsNothingKeepsEverything) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "0=6MiB"}});
  ASSERT_NE(mm, nullptr);
  CUdeviceptr p[3];
  for (uint64_t id = 1; id <= 3; ++id) {
    p[id - 1] = AllocIn(*mm, ctx_, id);
    Write(*mm, id, p[id - 1], id);
  }
  ASSERT_CU(mm->EvictAsync(1));
  CUcontext again = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&again, 0));
  ASSERT_CU(EndContext(
      *mm, ctx_, [&] { return cuDevicePrimaryCtxRelease_v2(0); },
      /*ends=*/false));
  SixRoundsOfEvictions(*mm, ctx_);
  for (uint64_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(Mismatch(Read(*mm, id, p[id - 1]), Pattern(id)), "") << "buffer " << id;
  }
  EXPECT_EQ(mm->stats().driver_errors, 0u);
  for (CUdeviceptr b : p) ASSERT_CU(mm->Free(b));
}

// Both devices under caps of their own, 4 and 5 buffers' worth (each of the
// four threads has at most one buffer in use at a time), with 6 and 7
// buffers each: four threads, two with each device's context current, each
// writing, evicting and reading back buffers of both devices (a thread with
// device 1's context current works on device 0's buffers through unified
// addressing, on its NULL stream and on a stream of its own context). Every
// byte is checked at each read, and neither device ever uses more than its
// cap.
TEST_F(MultiDeviceTest, TwoDevicesUnderTheirOwnCapsFromSeveralThreads) {
  auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "0=8MiB,1=10MiB"}});
  ASSERT_NE(mm, nullptr);
  struct Buf {
    uint64_t id;
    CUdeviceptr p;
    uint64_t seed;
  };
  std::vector<Buf> bufs;
  for (uint64_t id = 1; id <= 6; ++id) bufs.push_back({id, AllocIn(*mm, ctx_, id), 0});
  for (uint64_t id = 11; id <= 17; ++id) bufs.push_back({id, AllocIn(*mm, ctx1_, id), 0});
  for (Buf& b : bufs) {
    b.seed = b.id;
    Write(*mm, b.id, b.p, b.seed);  // with device 1's context current
  }
  // Thread t works on the buffers with index % 4 == t, with `contexts[t]`
  // current: every thread has buffers of both devices; threads 1 and 3 have
  // device 1's context current, 0 and 2 device 0's.
  const CUcontext contexts[4] = {ctx_, ctx1_, ctx_, ctx1_};
  constexpr int kRounds = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_CU(cuCtxSetCurrent(contexts[t]));
      CUstream s = nullptr;
      ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      std::mt19937 rng(1000 + t);
      std::vector<Buf*> mine;
      for (size_t i = t; i < bufs.size(); i += 4) mine.push_back(&bufs[i]);
      for (int round = 0; round < kRounds; ++round) {
        Buf& b = *mine[rng() % mine.size()];
        CUstream on = rng() % 2 ? s : nullptr;
        switch (rng() % 3) {
          case 0:
            b.seed = 100 * (t + 1) + round;
            Write(*mm, b.id, b.p, b.seed, on);
            break;
          case 1:
            if (mm->EvictAsync(b.id) != CUDA_SUCCESS) ++failures;
            break;
          default: {
            std::string diff = Mismatch(Read(*mm, b.id, b.p, on), Pattern(b.seed));
            if (!diff.empty()) {
              ++failures;
              ADD_FAILURE() << "thread " << t << " buffer " << b.id << ": " << diff;
            }
          }
        }
        EXPECT_EQ(Current(), contexts[t]);
      }
      EXPECT_CU(cuStreamDestroy_v2(s));
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  for (const Buf& b : bufs) {
    EXPECT_EQ(Mismatch(Read(*mm, b.id, b.p), Pattern(b.seed)), "") << "buffer " << b.id;
  }
  EXPECT_LE(Peak(), 8u << 20) << "device 0 over its cap";
  EXPECT_LE(Peak1(), 10u << 20) << "device 1 over its cap";
  EXPECT_GT(mm->stats().swap_outs_copied, 0u);
  EXPECT_EQ(mm->stats().driver_errors, 0u);
  for (const Buf& b : bufs) ASSERT_CU(mm->Free(b.p));
}

// Each driver call stensor makes to enter device 0's context, to leave it,
// and to make a stream or event there, failed at each of its first
// occurrences while device 1's context is current: every byte survives, and
// the program's context stack is as it was after every call.
TEST_F(MultiDeviceTest, FailedContextSwitchesAndCreatesKeepEveryByteAndTheContext) {
  // Each call, and how many of its first occurrences are failed in turn
  // (the manager makes two streams: swap and fetch).
  const std::pair<const char*, int> kCalls[] = {{"cuCtxPushCurrent_v2", 3},
                                                {"cuCtxPopCurrent_v2", 3},
                                                {"cuStreamCreate", 2},
                                                {"cuEventCreate", 3},
                                                {"cuCtxGetCurrent", 3}};
  fakecuda_count_calls(1);
  for (const auto& [call, occurrences] : kCalls) {
    for (int nth = 1; nth <= occurrences; ++nth) {
      SCOPED_TRACE(std::string(call) + " #" + std::to_string(nth));
      auto mm = MakeManager({{"STENSOR_MEMORY_LIMIT", "0=6MiB,1=4MiB"}});
      ASSERT_NE(mm, nullptr);
      CUdeviceptr p[3];
      for (uint64_t id = 1; id <= 3; ++id) {
        p[id - 1] = AllocIn(*mm, ctx_, id);
        Write(*mm, id, p[id - 1], id);
      }
      ASSERT_CU(cuCtxPushCurrent_v2(ctx1_));  // the program's: [ctx_, ctx1_]
      const unsigned long long before = fakecuda_call_count(call);
      fakecuda_fail_call(call, nth, CUDA_ERROR_UNKNOWN);
      // Failures may refuse a swap-out (the buffer stays resident) but
      // never lose a byte or leave another context current.
      for (uint64_t id = 1; id <= 3; ++id) {
        (void)mm->EvictAsync(id);
        ASSERT_EQ(CurrentDevice(), 1);
      }
      // The fetch stream is made by the first swap-in whose swap-out was
      // seen done: rounds go on (the swap-outs given time to finish) until
      // the failed occurrence was reached.
      for (int round = 0; round < 20; ++round) {
        if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        for (uint64_t id = 1; id <= 3; ++id) {
          EXPECT_EQ(Mismatch(Read(*mm, id, p[id - 1]), Pattern(id)), "") << "buffer " << id;
          ASSERT_EQ(CurrentDevice(), 1);
          (void)mm->EvictAsync(id);
          ASSERT_EQ(CurrentDevice(), 1);
        }
        if (fakecuda_call_count(call) >= before + nth) break;
      }
      EXPECT_GE(fakecuda_call_count(call), before + nth) << "the failure was never reached";
      fakecuda_clear_failures();
      for (uint64_t id = 1; id <= 3; ++id) {
        EXPECT_EQ(Mismatch(Read(*mm, id, p[id - 1]), Pattern(id)), "") << "buffer " << id;
      }
      CUcontext popped = nullptr;
      ASSERT_CU(cuCtxPopCurrent_v2(&popped));
      EXPECT_EQ(popped, ctx1_);
      EXPECT_EQ(Current(), ctx_) << "the stack lost or gained a context";
      EXPECT_GT(mm->stats().driver_errors, 0u);
      for (CUdeviceptr b : p) ASSERT_CU(mm->Free(b));
    }
  }
  fakecuda_count_calls(0);
}

}  // namespace
}  // namespace stensor
