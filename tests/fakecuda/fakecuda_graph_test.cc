// CUDA graphs and stream capture in the fake driver: capture (one stream,
// fork/join), the capture modes and what they prohibit, explicit graphs,
// introspection, instantiation snapshots and launches. Each expectation is
// what the CUDA Driver API reference or the programming guide's "Stream
// capture" section documents (see graph.cc and README.md).
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr

constexpr char kModule[] = "tests/fakecuda/test_kernels.so";
constexpr size_t kGranule = 2u << 20;

// Entry points the public header maps to newer names (or does not declare
// under their exported names), looked up as the CUDA runtime does.
template <typename Fn>
Fn Sym(const char* name) {
  static void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return reinterpret_cast<Fn>(dlsym(self, name));
}

// Blocks its stream until Open().
class Gate {
 public:
  static void CUDA_CB Wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    while (!g->open_.load()) std::this_thread::yield();
  }
  void Open() { open_.store(true); }

 private:
  std::atomic<bool> open_{false};
};

// Host nodes that append their tag to a shared list, in run order.
struct Order {
  std::mutex mu;
  std::vector<int> seen;
};
struct Tag {
  Order* order;
  int id;
};
void CUDA_CB Append(void* p) {
  auto* t = static_cast<Tag*>(p);
  std::lock_guard<std::mutex> lock(t->order->mu);
  t->order->seen.push_back(t->id);
}

class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&dev_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    ASSERT_CU(cuModuleLoad(&module_, kModule));
    ASSERT_CU(cuModuleGetFunction(&axpy_, module_, "_ZN5testk4axpyEfPKfPfi"));
    ASSERT_CU(cuModuleGetFunction(&fill_, module_, "_ZN5testk9slow_fillEPiiii"));
    ASSERT_CU(cuModuleGetFunction(&mixed_, module_, "_ZN5testk5mixedEcPds4Pair"));
    ASSERT_CU(cuStreamCreate(&s1_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuStreamCreate(&s2_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    cuCtxSynchronize();
    cuStreamDestroy(s1_);
    cuStreamDestroy(s2_);
    cuModuleUnload(module_);
    cuDevicePrimaryCtxRelease(dev_);
  }

  CUresult Axpy(CUstream s, float a, CUdeviceptr x, CUdeviceptr y, int n) {
    void* args[] = {&a, &x, &y, &n};
    return cuLaunchKernel(axpy_, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
  }
  CUresult Fill(CUstream s, CUdeviceptr out, int value, int n, int delay_ms) {
    void* args[] = {&out, &value, &n, &delay_ms};
    return cuLaunchKernel(fill_, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
  }
  std::vector<int> ReadInts(CUdeviceptr p, int n) {
    std::vector<int> v(n);
    EXPECT_CU(cuMemcpyDtoH_v2(v.data(), p, n * sizeof(int)));
    return v;
  }
  std::vector<float> ReadFloats(CUdeviceptr p, int n) {
    std::vector<float> v(n);
    EXPECT_CU(cuMemcpyDtoH_v2(v.data(), p, n * sizeof(float)));
    return v;
  }
  CUstreamCaptureStatus Status(CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    EXPECT_CU(cuStreamIsCapturing(s, &st));
    return st;
  }
  // Runs `fn` on a fresh thread (with the context current) and returns its
  // result.
  template <typename Fn>
  CUresult OnOtherThread(Fn fn) {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread t([&] {
      cuCtxSetCurrent(ctx_);
      r = fn();
    });
    t.join();
    return r;
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction axpy_ = nullptr, fill_ = nullptr, mixed_ = nullptr;
  CUstream s1_ = nullptr, s2_ = nullptr;
};

// Captured work does not run; the graph, launched three times, does what the
// same operations do when run directly three times.
TEST_F(GraphTest, CapturedKernelsCopiesAndMemsetsReplayLikeDirectRuns) {
  constexpr int n = 64;
  CUdeviceptr x, xd, y, yd;
  ASSERT_CU(cuMemAlloc_v2(&x, n * sizeof(float)));
  ASSERT_CU(cuMemAlloc_v2(&xd, n * sizeof(float)));
  ASSERT_CU(cuMemAlloc_v2(&y, n * sizeof(float)));
  ASSERT_CU(cuMemAlloc_v2(&yd, n * sizeof(float)));
  std::vector<float> init(n), out(n, -1), direct_out(n, -1);
  for (int i = 0; i < n; ++i) init[i] = static_cast<float>(i);
  ASSERT_CU(cuMemcpyHtoD_v2(y, init.data(), n * sizeof(float)));
  ASSERT_CU(cuMemcpyHtoD_v2(yd, init.data(), n * sizeof(float)));
  float one = 1.0f;
  unsigned one_bits;
  std::memcpy(&one_bits, &one, 4);

  auto ops = [&](CUstream s, CUdeviceptr xx, CUdeviceptr yy, float* host_out) {
    EXPECT_CU(cuMemsetD32Async(xx, one_bits, n, s));
    EXPECT_CU(Axpy(s, 2.0f, xx, yy, n));
    EXPECT_CU(cuMemcpyDtoDAsync_v2(xx, yy, n * sizeof(float), s));
    EXPECT_CU(Axpy(s, 0.5f, xx, yy, n));
    EXPECT_CU(cuMemcpyDtoHAsync_v2(host_out, yy, n * sizeof(float), s));
  };

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ops(s1_, x, y, out.data());
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s1_, &graph));
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
  // Nothing ran during capture.
  EXPECT_EQ(ReadFloats(y, n), init);
  EXPECT_EQ(out, std::vector<float>(n, -1));

  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) {
    ASSERT_CU(cuGraphLaunch(exec, s1_));
    ops(s2_, xd, yd, direct_out.data());
    ASSERT_CU(cuStreamSynchronize(s1_));
    ASSERT_CU(cuStreamSynchronize(s2_));
    EXPECT_EQ(out, direct_out) << "launch " << i;
  }
  EXPECT_EQ(ReadFloats(y, n), ReadFloats(yd, n));
  EXPECT_NE(ReadFloats(y, n), init);
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
  cuMemFree_v2(x);
  cuMemFree_v2(xd);
  cuMemFree_v2(y);
  cuMemFree_v2(yd);
}

// The fork/join pattern: an event recorded in the capture and waited for by
// another stream brings that stream into the capture; its nodes depend on
// the event's; waiting back joins it.
TEST_F(GraphTest, ForkJoinAcrossTwoStreams) {
  constexpr int n = 16;
  CUdeviceptr a, b, c;
  ASSERT_CU(cuMemAlloc_v2(&a, n * sizeof(int)));
  ASSERT_CU(cuMemAlloc_v2(&b, n * sizeof(int)));
  ASSERT_CU(cuMemAlloc_v2(&c, n * sizeof(int)));
  CUevent fork, join;
  ASSERT_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD32Async(a, 0, n, s1_));  // root
  ASSERT_CU(cuEventRecord(fork, s1_));
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cuuint64_t id1 = 0, id2 = 0;
  CUstreamCaptureStatus st;
  const CUgraphNode* deps = nullptr;
  size_t ndeps = 0;
  CUgraph g1 = nullptr, g2 = nullptr;
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id1, &g1, nullptr, nullptr, nullptr));
  ASSERT_CU(cuStreamGetCaptureInfo(s2_, &st, &id2, &g2, &deps, nullptr, &ndeps));
  EXPECT_EQ(id1, id2);
  EXPECT_EQ(g1, g2);
  ASSERT_EQ(ndeps, 1u);  // the memset
  CUgraphNode memset_node = deps[0];

  ASSERT_CU(Fill(s2_, b, 2, n, 20));  // side branch
  ASSERT_CU(Fill(s1_, a, 1, n, 20));  // main branch
  ASSERT_CU(cuEventRecord(join, s2_));
  ASSERT_CU(cuStreamWaitEvent(s1_, join, 0));
  ASSERT_CU(cuMemcpyDtoDAsync_v2(c, b, n * sizeof(int), s1_));  // after both
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s1_, &graph));
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE);

  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &count));
  EXPECT_EQ(count, 4u);  // event records and waits are not nodes
  size_t edges = 0;
  ASSERT_CU(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  EXPECT_EQ(edges, 4u);  // memset->fill b, memset->fill a, both->copy
  size_t roots = 1;
  CUgraphNode root = nullptr;
  ASSERT_CU(cuGraphGetRootNodes(graph, &root, &roots));
  EXPECT_EQ(roots, 1u);
  EXPECT_EQ(root, memset_node);

  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(ReadInts(a, n), std::vector<int>(n, 1));
  EXPECT_EQ(ReadInts(c, n), std::vector<int>(n, 2));
  cuGraphExecDestroy(exec);
  cuGraphDestroy(graph);
  cuEventDestroy_v2(fork);
  cuEventDestroy_v2(join);
  cuMemFree_v2(a);
  cuMemFree_v2(b);
  cuMemFree_v2(c);
}

TEST_F(GraphTest, UnjoinedForkFailsAndEndsTheCapture) {
  CUdeviceptr a;
  ASSERT_CU(cuMemAlloc_v2(&a, 64));
  CUevent fork;
  ASSERT_CU(cuEventCreate(&fork, 0));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  ASSERT_CU(cuMemsetD8Async(a, 1, 64, s2_));
  // Capture ends only on the stream that began it.
  CUgraph graph = reinterpret_cast<CUgraph>(1);
  EXPECT_EQ(cuStreamEndCapture(s2_, &graph), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  graph = reinterpret_cast<CUgraph>(1);
  EXPECT_EQ(cuStreamEndCapture(s1_, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE);

  // Without the unmatched end: unjoined.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  ASSERT_CU(cuMemsetD8Async(a, 1, 64, s2_));
  graph = reinterpret_cast<CUgraph>(1);
  EXPECT_EQ(cuStreamEndCapture(s1_, &graph), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE);
  // Nothing ran; both streams work normally again.
  ASSERT_CU(cuMemsetD8Async(a, 7, 64, s2_));
  ASSERT_CU(cuStreamSynchronize(s2_));
  unsigned char back[64];
  ASSERT_CU(cuMemcpyDtoH_v2(back, a, 64));
  EXPECT_EQ(back[0], 7);
  cuEventDestroy_v2(fork);
  cuMemFree_v2(a);
}

TEST_F(GraphTest, BeginAndEndCaptureRules) {
  // Not on the legacy stream, in any spelling.
  EXPECT_EQ(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamBeginCapture(s1_, static_cast<CUstreamCaptureMode>(7)),
            CUDA_ERROR_INVALID_VALUE);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
  EXPECT_EQ(cuStreamEndCapture(s1_, nullptr), CUDA_ERROR_INVALID_VALUE);
  // A non-relaxed capture ends on the thread that began it.
  EXPECT_EQ(OnOtherThread([&] { return cuStreamEndCapture(s1_, &g); }),
            CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  size_t count = 1;
  ASSERT_CU(cuGraphGetNodes(g, nullptr, &count));
  EXPECT_EQ(count, 0u);
  cuGraphDestroy(g);

  // A relaxed capture may end on another thread.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(OnOtherThread([&] { return cuStreamEndCapture(s1_, &g); }));
  cuGraphDestroy(g);

  // The per-thread default stream can capture; the old one-argument
  // entry point is GLOBAL.
  using Begin1 = CUresult (*)(CUstream);
  auto begin_ptsz = Sym<Begin1>("cuStreamBeginCapture_ptsz");
  auto end_ptsz = Sym<CUresult (*)(CUstream, CUgraph*)>("cuStreamEndCapture_ptsz");
  ASSERT_NE(begin_ptsz, nullptr);
  ASSERT_CU(begin_ptsz(nullptr));
  ASSERT_CU(end_ptsz(nullptr, &g));
  cuGraphDestroy(g);
  auto begin1 = Sym<Begin1>("cuStreamBeginCapture");
  ASSERT_CU(begin1(s1_));
  EXPECT_EQ(OnOtherThread([&] {
              CUdeviceptr p;
              return cuMemAlloc_v2(&p, 16);
            }),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);  // GLOBAL
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_F(GraphTest, GlobalCaptureProhibitsUnsafeCallsOnOtherThreads) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(OnOtherThread([&] {
              CUdeviceptr p;
              return cuMemAlloc_v2(&p, 256);
            }),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  // The capture that prohibited it is invalidated.
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g = reinterpret_cast<CUgraph>(1);
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(g, nullptr);

  // A thread in THREAD_LOCAL or RELAXED mode ignores other threads' captures.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (CUstreamCaptureMode m :
       {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED}) {
    EXPECT_CU(OnOtherThread([&] {
      CUstreamCaptureMode mode = m;
      EXPECT_CU(cuThreadExchangeStreamCaptureMode(&mode));
      EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);  // each thread's default
      CUdeviceptr p;
      if (CUresult r = cuMemAlloc_v2(&p, 256); r != CUDA_SUCCESS) return r;
      if (CUresult r = cuStreamSynchronize(s2_); r != CUDA_SUCCESS) return r;
      return cuMemFree_v2(p);
    }));
  }
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  cuGraphDestroy(g);
}

TEST_F(GraphTest, ThreadLocalCaptureProhibitsOnlyItsOwnThread) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_CU(OnOtherThread([&] {
    CUdeviceptr p;
    if (CUresult r = cuMemAlloc_v2(&p, 256); r != CUDA_SUCCESS) return r;
    return cuMemFree_v2(p);
  }));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUdeviceptr p;
  EXPECT_EQ(cuMemAlloc_v2(&p, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g;
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

// Each potentially unsafe call, made by the capturing thread in the default
// mode, fails and invalidates; in RELAXED thread mode it succeeds.
TEST_F(GraphTest, UnsafeCallsOnTheCapturingThreadDependOnTheThreadMode) {
  CUdeviceptr buf;
  ASSERT_CU(cuMemAlloc_v2(&buf, 4096));
  CUevent done;
  ASSERT_CU(cuEventCreate(&done, 0));
  ASSERT_CU(cuEventRecord(done, s2_));
  std::vector<unsigned char> host(4096);
  struct Call {
    const char* name;
    std::function<CUresult()> fn;
  };
  CUdeviceptr scratch = 0;
  std::vector<Call> calls = {
      {"cuMemAlloc", [&] { return cuMemAlloc_v2(&scratch, 64); }},
      {"cuMemFree", [&] { return cuMemFree_v2(scratch); }},
      {"cuMemcpyHtoD", [&] { return cuMemcpyHtoD_v2(buf, host.data(), 64); }},
      {"cuMemcpyDtoH", [&] { return cuMemcpyDtoH_v2(host.data(), buf, 64); }},
      {"cuMemsetD8", [&] { return cuMemsetD8_v2(buf, 0, 64); }},
      {"cuStreamSynchronize(other)", [&] { return cuStreamSynchronize(s2_); }},
      {"cuStreamQuery(other)", [&] { return cuStreamQuery(s2_); }},
      {"cuEventQuery", [&] { return cuEventQuery(done); }},
      {"cuEventSynchronize", [&] { return cuEventSynchronize(done); }},
  };
  for (const Call& c : calls) {
    ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_EQ(c.fn(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << c.name;
    EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED) << c.name;
    CUgraph g;
    EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT_CU(c.fn()) << c.name;
    ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
    EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE) << c.name;
    ASSERT_CU(cuStreamEndCapture(s1_, &g));
    cuGraphDestroy(g);
  }
  // A relaxed capture prohibits nothing.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (const Call& c : calls) EXPECT_CU(c.fn()) << c.name;
  CUgraph g;
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  cuGraphDestroy(g);
  cuEventDestroy_v2(done);
  cuMemFree_v2(buf);
}

// Querying or synchronising a capturing stream, its context or a captured
// event conflicts with capture in every mode.
TEST_F(GraphTest, NecessaryConflictsFailInEveryMode) {
  CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&relaxed));
  CUgraph g;
  for (int which = 0; which < 3; ++which) {
    ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUresult r = which == 0   ? cuStreamSynchronize(s1_)
                 : which == 1 ? cuStreamQuery(s1_)
                              : cuCtxSynchronize();
    EXPECT_EQ(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << which;
    EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED) << which;
    CUdeviceptr p = 0;
    CUdeviceptr q = 0;
    ASSERT_CU(cuMemAlloc_v2(&q, 64));
    EXPECT_EQ(cuMemsetD8Async(q, 0, 64, s1_), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    (void)p;
    cuMemFree_v2(q);
    EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    EXPECT_EQ(g, nullptr);
  }
  // An event last recorded in a capture cannot be queried or waited for,
  // even after the capture ends, until it is recorded again.
  CUevent e;
  ASSERT_CU(cuEventCreate(&e, 0));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuEventRecord(e, s1_));
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuEventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT);
  ASSERT_CU(cuEventRecord(e, s1_));
  EXPECT_CU(cuEventSynchronize(e));
  EXPECT_CU(cuEventQuery(e));
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&relaxed));
  EXPECT_EQ(relaxed, CU_STREAM_CAPTURE_MODE_RELAXED);
  cuEventDestroy_v2(e);
}

TEST_F(GraphTest, LegacyStreamUseWhileABlockingStreamCaptures) {
  CUstream blocking;
  ASSERT_CU(cuStreamCreate(&blocking, 0));
  CUdeviceptr p;
  ASSERT_CU(cuMemAlloc_v2(&p, 64));
  ASSERT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUstreamCaptureStatus st;
  // Querying the legacy stream's status is IMPLICIT and invalidates nothing.
  EXPECT_EQ(cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  EXPECT_EQ(Status(blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  // A non-blocking stream is unaffected.
  EXPECT_CU(cuMemsetD8Async(p, 1, 64, s2_));
  EXPECT_CU(cuStreamSynchronize(s2_));
  // Work pushed into the legacy stream would depend on the capture.
  EXPECT_EQ(cuMemsetD8Async(p, 1, 64, nullptr), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  EXPECT_EQ(Status(blocking), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g;
  EXPECT_EQ(cuStreamEndCapture(blocking, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // With a non-blocking stream capturing, the legacy stream is usable.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_CU(cuMemsetD8Async(p, 1, 64, nullptr));
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  cuGraphDestroy(g);
  cuStreamDestroy(blocking);
  cuMemFree_v2(p);
}

// What PyTorch's allocator relies on: VMM calls and work on other streams
// are not "potentially unsafe" and leave a GLOBAL capture going.
TEST_F(GraphTest, VmmAndOtherStreamsAreAllowedDuringGlobalCapture) {
  CUdeviceptr p;
  ASSERT_CU(cuMemAlloc_v2(&p, 64));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, kGranule, 0, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, kGranule, &prop, 0));
  ASSERT_CU(cuMemMap(va, kGranule, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(va, kGranule, &access, 1));
  ASSERT_CU(cuMemsetD8Async(va, 5, 64, s1_));  // captured
  ASSERT_CU(cuMemsetD8Async(p, 9, 64, s2_));   // runs
  ASSERT_CU(Fill(s2_, p, 3, 4, 0));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g;
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  ASSERT_CU(cuStreamSynchronize(s2_));
  EXPECT_EQ(ReadInts(p, 4), std::vector<int>(4, 3));
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  unsigned char b[64];
  ASSERT_CU(cuMemcpyDtoH_v2(b, va, 64));
  EXPECT_EQ(b[63], 5);
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, kGranule));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g2;
  ASSERT_CU(cuStreamEndCapture(s1_, &g2));
  cuGraphDestroy(g2);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
  cuMemFree_v2(p);
}

TEST_F(GraphTest, WaitingOnOtherEventsDuringCapture) {
  CUevent plain, captured;
  ASSERT_CU(cuEventCreate(&plain, 0));
  ASSERT_CU(cuEventCreate(&captured, 0));
  ASSERT_CU(cuEventRecord(plain, s2_));
  CUgraph g;
  // A non-captured event: the dependency would cross the capture boundary.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuStreamWaitEvent(s1_, plain, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // Two captures cannot merge.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamBeginCapture(s2_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(captured, s1_));
  EXPECT_EQ(cuStreamWaitEvent(s2_, captured, 0), CUDA_ERROR_STREAM_CAPTURE_MERGE);
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuStreamEndCapture(s2_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cuEventDestroy_v2(plain);
  cuEventDestroy_v2(captured);
}

// A diamond built node by node (edges added after the nodes) runs in
// dependency order, not in the order the nodes were added.
TEST_F(GraphTest, ExplicitDiamondRunsInDependencyOrder) {
  Order order;
  Tag tags[4] = {{&order, 0}, {&order, 1}, {&order, 2}, {&order, 3}};
  CUgraph g;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode n[4];
  // Added sink first: D(3), C(2), B(1), A(0).
  for (int i = 3; i >= 0; --i) {
    CUDA_HOST_NODE_PARAMS hp{Append, &tags[i]};
    ASSERT_CU(cuGraphAddHostNode(&n[i], g, nullptr, 0, &hp));
  }
  CUgraphNode from[] = {n[0], n[0], n[1], n[2]};
  CUgraphNode to[] = {n[1], n[2], n[3], n[3]};
  ASSERT_CU(cuGraphAddDependencies(g, from, to, nullptr, 4));
  CUgraphNode roots[2] = {};
  size_t nroots = 2;
  ASSERT_CU(cuGraphGetRootNodes(g, roots, &nroots));
  ASSERT_EQ(nroots, 1u);
  EXPECT_EQ(roots[0], n[0]);
  EXPECT_EQ(roots[1], nullptr);
  CUgraphNode deps[3];
  size_t ndeps = 3;
  ASSERT_CU(cuGraphNodeGetDependencies(n[3], deps, nullptr, &ndeps));
  ASSERT_EQ(ndeps, 2u);
  EXPECT_EQ(deps[0], n[1]);
  EXPECT_EQ(deps[1], n[2]);
  CUgraphNode ef[4], et[4];
  size_t nedges = 4;
  ASSERT_CU(cuGraphGetEdges(g, ef, et, nullptr, &nedges));
  EXPECT_EQ(nedges, 4u);
  // The old entry points read the same graph.
  auto get_edges1 =
      Sym<CUresult (*)(CUgraph, CUgraphNode*, CUgraphNode*, size_t*)>("cuGraphGetEdges");
  size_t nedges1 = 0;
  ASSERT_CU(get_edges1(g, nullptr, nullptr, &nedges1));
  EXPECT_EQ(nedges1, 4u);

  // A kernel reading what a memset wrote, after it.
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 16 * sizeof(int)));
  CUDA_MEMSET_NODE_PARAMS mp{};
  mp.dst = d;
  mp.value = 0x01010101;
  mp.elementSize = 4;
  mp.width = 16;
  mp.height = 1;
  CUgraphNode ms, k;
  ASSERT_CU(cuGraphAddMemsetNode(&ms, g, &n[3], 1, &mp, ctx_));
  int value = 5, count = 8, delay = 0;
  void* args[] = {&d, &value, &count, &delay};
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = fill_;
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = args;
  ASSERT_CU(cuGraphAddKernelNode(&k, g, &ms, 1, &kp));
  value = 99;  // the node holds its own copy

  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  for (int round = 0; round < 2; ++round) {
    order.seen.clear();
    ASSERT_CU(cuGraphLaunch(exec, s1_));
    ASSERT_CU(cuStreamSynchronize(s1_));
    ASSERT_EQ(order.seen.size(), 4u);
    EXPECT_EQ(order.seen.front(), 0);
    EXPECT_EQ(order.seen.back(), 3);
    std::vector<int> got = ReadInts(d, 16);
    EXPECT_EQ(got[0], 5);
    EXPECT_EQ(got[8], 0x01010101);
  }
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
  cuMemFree_v2(d);
}

// A captured graph reads back through the graph API: node types, a kernel
// node's arguments (the values at capture time), a memcpy node's pointers
// and size, a memset node's parameters, and the chain of dependencies.
TEST_F(GraphTest, CapturedGraphIsIntrospectable) {
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 4096));
  std::vector<unsigned char> host(4096, 3);
  struct Pair {
    int a;
    double b;
  };
  char c = 'x';
  double* out = reinterpret_cast<double*>(d + 1024);
  short sh = -7;
  Pair pair{11, 2.5};
  void* args[] = {&c, &out, &sh, &pair};
  Order order;
  Tag tag{&order, 42};

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD16Async(d, 0xabcd, 100, s1_));
  ASSERT_CU(cuMemcpyHtoDAsync_v2(d + 256, host.data(), 512, s1_));
  ASSERT_CU(cuLaunchKernel(mixed_, 2, 1, 1, 32, 1, 1, 0, s1_, args, nullptr));
  c = 'y';  // changed after capture: the node keeps 'x'
  pair.a = 0;
  ASSERT_CU(cuLaunchHostFunc(s1_, Append, &tag));
  ASSERT_CU(cuMemcpyDtoHAsync_v2(host.data(), d, 128, s1_));
  CUgraph g;
  ASSERT_CU(cuStreamEndCapture(s1_, &g));

  CUgraphNode nodes[5];
  size_t count = 5;
  ASSERT_CU(cuGraphGetNodes(g, nodes, &count));
  ASSERT_EQ(count, 5u);
  CUgraphNodeType want[] = {CU_GRAPH_NODE_TYPE_MEMSET, CU_GRAPH_NODE_TYPE_MEMCPY,
                            CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_HOST,
                            CU_GRAPH_NODE_TYPE_MEMCPY};
  for (int i = 0; i < 5; ++i) {
    CUgraphNodeType t;
    ASSERT_CU(cuGraphNodeGetType(nodes[i], &t));
    EXPECT_EQ(t, want[i]) << i;
    size_t nd = 0;
    CUgraphNode dep = nullptr;
    nd = 1;
    ASSERT_CU(cuGraphNodeGetDependencies(nodes[i], &dep, nullptr, &nd));
    EXPECT_EQ(nd, i == 0 ? 0u : 1u);
    if (i > 0) {
      EXPECT_EQ(dep, nodes[i - 1]);
    }
  }
  CUDA_MEMSET_NODE_PARAMS mp;
  ASSERT_CU(cuGraphMemsetNodeGetParams(nodes[0], &mp));
  EXPECT_EQ(mp.dst, d);
  EXPECT_EQ(mp.elementSize, 2u);
  EXPECT_EQ(mp.width, 100u);
  EXPECT_EQ(mp.height, 1u);
  EXPECT_EQ(mp.value, 0xabcdu);

  CUDA_MEMCPY3D cp;
  ASSERT_CU(cuGraphMemcpyNodeGetParams(nodes[1], &cp));
  EXPECT_EQ(cp.srcMemoryType, CU_MEMORYTYPE_HOST);
  EXPECT_EQ(cp.srcHost, host.data());
  EXPECT_EQ(cp.dstMemoryType, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(cp.dstDevice, d + 256);
  EXPECT_EQ(cp.WidthInBytes, 512u);
  EXPECT_EQ(cp.Height, 1u);
  EXPECT_EQ(cp.Depth, 1u);
  ASSERT_CU(cuGraphMemcpyNodeGetParams(nodes[4], &cp));
  EXPECT_EQ(cp.srcMemoryType, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(cp.srcDevice, d);
  EXPECT_EQ(cp.dstHost, host.data());
  EXPECT_EQ(cp.WidthInBytes, 128u);

  CUDA_KERNEL_NODE_PARAMS kp;
  ASSERT_CU(cuGraphKernelNodeGetParams(nodes[2], &kp));
  EXPECT_EQ(kp.func, mixed_);
  EXPECT_EQ(kp.gridDimX, 2u);
  EXPECT_EQ(kp.blockDimX, 32u);
  EXPECT_EQ(kp.extra, nullptr);
  EXPECT_EQ(kp.ctx, ctx_);
  ASSERT_NE(kp.kernelParams, nullptr);
  EXPECT_EQ(*static_cast<char*>(kp.kernelParams[0]), 'x');
  EXPECT_EQ(*static_cast<double**>(kp.kernelParams[1]), out);
  EXPECT_EQ(*static_cast<short*>(kp.kernelParams[2]), -7);
  Pair back;
  std::memcpy(&back, kp.kernelParams[3], sizeof(back));
  EXPECT_EQ(back.a, 11);
  EXPECT_EQ(back.b, 2.5);
  EXPECT_NE(kp.kernelParams[0], static_cast<void*>(&c));  // the driver's copy
  // The old form reads the same.
  CUDA_KERNEL_NODE_PARAMS_v1 kp1;
  auto get1 =
      Sym<CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1*)>("cuGraphKernelNodeGetParams");
  ASSERT_CU(get1(nodes[2], &kp1));
  EXPECT_EQ(*static_cast<short*>(kp1.kernelParams[2]), -7);
  CUDA_HOST_NODE_PARAMS hp;
  ASSERT_CU(cuGraphHostNodeGetParams(nodes[3], &hp));
  EXPECT_EQ(hp.userData, &tag);
  // Params of the wrong type.
  EXPECT_EQ(cuGraphKernelNodeGetParams(nodes[0], &kp), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphMemcpyNodeGetParams(nodes[2], &cp), CUDA_ERROR_INVALID_VALUE);

  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  double res[4];
  ASSERT_CU(cuMemcpyDtoH_v2(res, d + 1024, sizeof(res)));
  EXPECT_EQ(res[0], 'x');
  EXPECT_EQ(res[1], -7);
  EXPECT_EQ(res[2], 11);
  EXPECT_EQ(order.seen, std::vector<int>{42});
  unsigned short first;
  std::memcpy(&first, host.data(), 2);
  EXPECT_EQ(first, 0xabcd);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
  cuMemFree_v2(d);
}

TEST_F(GraphTest, CaptureInfoReportsTheDependencies) {
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 64));
  CUstreamCaptureStatus st;
  cuuint64_t id = 5;
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  const CUgraphNode* deps = nullptr;
  const CUgraphEdgeData* edges = nullptr;
  size_t n = 9;
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id, &g, &deps, &edges, &n));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(n, 0u);
  cuuint64_t first_id = id;
  ASSERT_CU(cuMemsetD8Async(d, 1, 64, s1_));
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id, &g, &deps, &edges, &n));
  ASSERT_EQ(n, 1u);
  CUgraphNode node = deps[0];
  EXPECT_EQ(edges[0].type, 0);
  CUgraphNode all[1];
  size_t count = 1;
  ASSERT_CU(cuGraphGetNodes(g, all, &count));
  EXPECT_EQ(all[0], node);
  EXPECT_EQ(cuStreamGetCaptureInfo(s1_, &st, &id, &g, nullptr, &edges, &n),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamGetCaptureInfo(s1_, nullptr, &id, &g, nullptr, nullptr, &n),
            CUDA_ERROR_INVALID_VALUE);
  // The v2 and v1 forms.
  using Info2 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                             const CUgraphNode**, size_t*);
  using Info1 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*);
  n = 0;
  ASSERT_CU(Sym<Info2>("cuStreamGetCaptureInfo_v2")(s1_, &st, &id, &g, &deps, &n));
  EXPECT_EQ(n, 1u);
  ASSERT_CU(Sym<Info1>("cuStreamGetCaptureInfo")(s1_, &st, &id));
  EXPECT_EQ(id, first_id);
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id, nullptr, nullptr, nullptr, nullptr));
  EXPECT_NE(id, first_id);  // unique per capture sequence
  CUgraph g2;
  ASSERT_CU(cuStreamEndCapture(s1_, &g2));
  cuGraphDestroy(g);
  cuGraphDestroy(g2);
  cuMemFree_v2(d);
}

// An exec is a snapshot: nodes added to the graph later, or the graph's
// destruction, do not change it.
TEST_F(GraphTest, ExecIsASnapshotOfTheGraph) {
  Order order;
  Tag a{&order, 1}, b{&order, 2};
  CUgraph g;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode na, nb;
  CUDA_HOST_NODE_PARAMS pa{Append, &a}, pb{Append, &b};
  ASSERT_CU(cuGraphAddHostNode(&na, g, nullptr, 0, &pa));
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphAddHostNode(&nb, g, &na, 1, &pb));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(order.seen, std::vector<int>{1});
  CUgraphExec exec2;
  ASSERT_CU(cuGraphInstantiate(&exec2, g, 0));
  ASSERT_CU(cuGraphDestroy(g));
  order.seen.clear();
  ASSERT_CU(cuGraphLaunch(exec2, s1_));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(order.seen, (std::vector<int>{1, 2, 1}));
  cuGraphExecDestroy(exec);
  cuGraphExecDestroy(exec2);
}

// A launch is ordered after the stream's earlier work and returns at once;
// launching again while one is in flight queues behind it.
TEST_F(GraphTest, LaunchIsStreamOrderedAndAsynchronous) {
  constexpr int n = 8;
  CUdeviceptr x, y;
  ASSERT_CU(cuMemAlloc_v2(&x, n * sizeof(float)));
  ASSERT_CU(cuMemAlloc_v2(&y, n * sizeof(float)));
  ASSERT_CU(cuMemsetD32_v2(y, 0, n));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpy(s1_, 1.0f, x, y, n));  // y += x
  CUgraph g;
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));

  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s2_, Gate::Wait, &gate));
  float three = 3.0f;
  unsigned bits;
  std::memcpy(&bits, &three, 4);
  ASSERT_CU(cuMemsetD32Async(x, bits, n, s2_));  // x = 3, after the gate
  ASSERT_CU(Fill(s2_, 0, 0, 0, 30));             // and a slow kernel
  ASSERT_CU(cuGraphLaunch(exec, s2_));
  ASSERT_CU(cuGraphLaunch(exec, s2_));  // again, while the first waits
  auto launch3 = Sym<CUresult (*)(CUgraphExec, CUstream)>("cuGraphLaunch_ptsz");
  ASSERT_CU(launch3(exec, s2_));
  EXPECT_EQ(cuStreamQuery(s2_), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(ReadFloats(y, n), std::vector<float>(n, 0.0f));  // held back
  gate.Open();
  ASSERT_CU(cuStreamSynchronize(s2_));
  EXPECT_EQ(ReadFloats(y, n), std::vector<float>(n, 9.0f));
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
  cuMemFree_v2(x);
  cuMemFree_v2(y);
}

TEST_F(GraphTest, ExecKernelNodeSetParamsChangesLaterLaunches) {
  constexpr int n = 4;
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, n * sizeof(int)));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Fill(s1_, d, 1, n, 0));
  CUgraph g;
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  CUgraphNode node;
  size_t count = 1;
  ASSERT_CU(cuGraphGetNodes(g, &node, &count));
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(ReadInts(d, n), std::vector<int>(n, 1));

  CUDA_KERNEL_NODE_PARAMS kp;
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &kp));
  int seven = 7;
  std::vector<void*> args(kp.kernelParams, kp.kernelParams + 4);
  args[1] = &seven;
  kp.kernelParams = args.data();
  ASSERT_CU(cuGraphExecKernelNodeSetParams(exec, node, &kp));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(ReadInts(d, n), std::vector<int>(n, 7));
  // The graph itself keeps its own parameters.
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &kp));
  EXPECT_EQ(*static_cast<int*>(kp.kernelParams[1]), 1);
  // The old form, and a node of another graph.
  auto set1 = Sym<CUresult (*)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v1*)>(
      "cuGraphExecKernelNodeSetParams");
  CUDA_KERNEL_NODE_PARAMS_v1 kp1{};
  kp1.func = fill_;
  kp1.gridDimX = kp1.gridDimY = kp1.gridDimZ = 1;
  kp1.blockDimX = kp1.blockDimY = kp1.blockDimZ = 1;
  kp1.kernelParams = args.data();
  EXPECT_CU(set1(exec, node, &kp1));
  CUgraph other;
  ASSERT_CU(cuGraphCreate(&other, 0));
  CUgraphNode foreign;
  ASSERT_CU(cuGraphAddKernelNode(&foreign, other, nullptr, 0, &kp));
  EXPECT_EQ(cuGraphExecKernelNodeSetParams(exec, foreign, &kp), CUDA_ERROR_INVALID_VALUE);
  cuGraphDestroy(other);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
  cuMemFree_v2(d);
}

TEST_F(GraphTest, ChildGraphNodeRunsAClone) {
  Order order;
  Tag a{&order, 1}, b{&order, 2};
  CUgraph child, parent;
  ASSERT_CU(cuGraphCreate(&child, 0));
  ASSERT_CU(cuGraphCreate(&parent, 0));
  CUgraphNode na, nc, nb;
  CUDA_HOST_NODE_PARAMS pa{Append, &a}, pb{Append, &b};
  ASSERT_CU(cuGraphAddHostNode(&na, child, nullptr, 0, &pa));
  ASSERT_CU(cuGraphAddChildGraphNode(&nc, parent, nullptr, 0, child));
  ASSERT_CU(cuGraphAddHostNode(&nb, parent, &nc, 1, &pb));
  ASSERT_CU(cuGraphDestroy(child));  // the node holds its own copy
  CUgraph embedded;
  ASSERT_CU(cuGraphChildGraphNodeGetGraph(nc, &embedded));
  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(embedded, nullptr, &count));
  EXPECT_EQ(count, 1u);
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, parent, 0));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(order.seen, (std::vector<int>{1, 2}));
  cuGraphExecDestroy(exec);
  cuGraphDestroy(parent);
}

TEST_F(GraphTest, InstantiateFormsAndProcAddress) {
  CUgraph g;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode e;
  ASSERT_CU(cuGraphAddEmptyNode(&e, g, nullptr, 0));
  using Inst5 = CUresult (*)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
  for (const char* name : {"cuGraphInstantiate", "cuGraphInstantiate_v2"}) {
    CUgraphExec exec = nullptr;
    CUgraphNode err = e;
    char log[8] = "junk";
    ASSERT_CU(Sym<Inst5>(name)(&exec, g, &err, log, sizeof(log))) << name;
    EXPECT_EQ(err, nullptr);
    EXPECT_EQ(log[0], '\0');
    ASSERT_CU(cuGraphLaunch(exec, s1_));
    EXPECT_CU(cuGraphExecDestroy(exec));
  }
  CUDA_GRAPH_INSTANTIATE_PARAMS p{};
  p.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  p.hUploadStream = s1_;
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiateWithParams(&exec, g, &p));
  EXPECT_EQ(p.result_out, CUDA_GRAPH_INSTANTIATE_SUCCESS);
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_EQ(cuGraphInstantiate(&exec, g, 1ull << 40), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_ERROR_INVALID_VALUE);  // destroyed

  // cuGetProcAddress maps the base names to the versioned exports.
  void* fn = nullptr;
  ASSERT_CU(cuGetProcAddress_v2("cuStreamBeginCapture", &fn, 12000,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  EXPECT_EQ(fn, Sym<void*>("cuStreamBeginCapture_v2_ptsz"));
  ASSERT_CU(cuGetProcAddress_v2("cuStreamGetCaptureInfo", &fn, 12030, 0, nullptr));
  EXPECT_EQ(fn, Sym<void*>("cuStreamGetCaptureInfo_v3"));
  ASSERT_CU(cuGetProcAddress_v2("cuGraphInstantiate", &fn, 11040, 0, nullptr));
  EXPECT_EQ(fn, Sym<void*>("cuGraphInstantiate_v2"));
  ASSERT_CU(cuGetProcAddress_v2("cuThreadExchangeStreamCaptureMode", &fn, 12000, 0, nullptr));
  EXPECT_NE(fn, nullptr);
  cuGraphDestroy(g);
}

TEST_F(GraphTest, BadArguments) {
  CUgraph g;
  EXPECT_EQ(cuGraphCreate(&g, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode a, b;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, g, &a, 1));
  EXPECT_EQ(cuGraphAddEmptyNode(&b, g, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CUgraphNode twice[] = {a, a};
  EXPECT_EQ(cuGraphAddEmptyNode(&b, g, twice, 2), CUDA_ERROR_INVALID_VALUE);
  // Edges: to itself, already there, between graphs.
  EXPECT_EQ(cuGraphAddDependencies(g, &a, &a, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphAddDependencies(g, &a, &b, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CUgraph other;
  ASSERT_CU(cuGraphCreate(&other, 0));
  CUgraphNode c;
  ASSERT_CU(cuGraphAddEmptyNode(&c, other, nullptr, 0));
  EXPECT_EQ(cuGraphAddEmptyNode(&b, g, &c, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphAddDependencies(g, &a, &c, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  // A cycle cannot be instantiated.
  ASSERT_CU(cuGraphAddDependencies(g, &b, &a, nullptr, 1));
  CUgraphExec exec;
  EXPECT_NE(cuGraphInstantiate(&exec, g, 0), CUDA_SUCCESS);
  // Kernel nodes are checked like launches.
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = fill_;
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 2048;
  kp.blockDimY = kp.blockDimZ = 1;
  int v = 0;
  void* args[] = {&v, &v, &v, &v};
  kp.kernelParams = args;
  EXPECT_EQ(cuGraphAddKernelNode(&c, other, nullptr, 0, &kp), CUDA_ERROR_INVALID_VALUE);
  kp.blockDimX = 1;
  kp.func = reinterpret_cast<CUfunction>(&kp);
  EXPECT_EQ(cuGraphAddKernelNode(&c, other, nullptr, 0, &kp), CUDA_ERROR_INVALID_HANDLE);
  CUDA_MEMSET_NODE_PARAMS mp{};
  mp.dst = 0x1000;
  mp.elementSize = 4;
  mp.width = 4;
  mp.height = 1;
  EXPECT_EQ(cuGraphAddMemsetNode(&c, other, nullptr, 0, &mp, ctx_),
            CUDA_ERROR_INVALID_VALUE);  // not device memory
  CUDA_MEMCPY3D cp{};
  EXPECT_EQ(cuGraphAddMemcpyNode(&c, other, nullptr, 0, &cp, ctx_), CUDA_ERROR_INVALID_VALUE);
  CUDA_HOST_NODE_PARAMS hp{nullptr, nullptr};
  EXPECT_EQ(cuGraphAddHostNode(&c, other, nullptr, 0, &hp), CUDA_ERROR_INVALID_VALUE);
  // Queries.
  EXPECT_EQ(cuGraphGetNodes(g, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  size_t n = 0;
  CUgraphNode from[2];
  EXPECT_EQ(cuGraphGetEdges(g, from, nullptr, nullptr, &n), CUDA_ERROR_INVALID_VALUE);
  CUgraphNodeType t;
  EXPECT_EQ(cuGraphNodeGetType(a, nullptr), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuGraphDestroy(g));
  EXPECT_EQ(cuGraphNodeGetType(a, &t), CUDA_ERROR_INVALID_VALUE);  // destroyed
  EXPECT_EQ(cuGraphDestroy(g), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphInstantiate(&exec, g, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphLaunch(nullptr, s1_), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuGraphInstantiate(&exec, other, 0));
  EXPECT_EQ(cuGraphLaunch(exec, reinterpret_cast<CUstream>(&n)), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_EQ(cuGraphLaunch(exec, s1_), CUDA_ERROR_INVALID_VALUE);
  cuGraphDestroy(other);
  EXPECT_EQ(cuThreadExchangeStreamCaptureMode(nullptr), CUDA_ERROR_INVALID_VALUE);
  CUstreamCaptureMode bad = static_cast<CUstreamCaptureMode>(9);
  EXPECT_EQ(cuThreadExchangeStreamCaptureMode(&bad), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamIsCapturing(s1_, nullptr), CUDA_ERROR_INVALID_VALUE);
}

// Operations the fake does not capture fail and invalidate the capture
// rather than run.
TEST_F(GraphTest, UncapturedOperationsInvalidate) {
  CUdeviceptr p;
  CUgraph g;
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuMemAllocAsync(&p, 64, s1_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUgraph inner;
  ASSERT_CU(cuGraphCreate(&inner, 0));
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, inner, 0));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuGraphLaunch(exec, s1_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(s1_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(inner);
}

// Capture into an existing graph after given nodes.
TEST_F(GraphTest, BeginCaptureToGraph) {
  Order order;
  Tag a{&order, 1}, b{&order, 2};
  CUgraph g;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode na;
  CUDA_HOST_NODE_PARAMS pa{Append, &a};
  ASSERT_CU(cuGraphAddHostNode(&na, g, nullptr, 0, &pa));
  ASSERT_CU(cuStreamBeginCaptureToGraph(s1_, g, &na, nullptr, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuLaunchHostFunc(s1_, Append, &b));
  CUgraph out;
  ASSERT_CU(cuStreamEndCapture(s1_, &out));
  EXPECT_EQ(out, g);
  size_t edges = 0;
  ASSERT_CU(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  EXPECT_EQ(edges, 1u);
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(order.seen, (std::vector<int>{1, 2}));
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
}

// cuGraphExecUpdate: a topologically identical graph's parameters replace
// the exec's; a different topology or node type is refused.
TEST_F(GraphTest, ExecUpdateTakesParametersOfAnIdenticalGraph) {
  constexpr int n = 4;
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, n * sizeof(int)));
  auto capture = [&](int value, bool extra) {
    EXPECT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_CU(cuMemsetD32Async(d, 0, n, s1_));
    EXPECT_CU(Fill(s1_, d, value, n, 0));
    if (extra) {
      EXPECT_CU(cuMemsetD8Async(d, 0, 1, s1_));
    }
    CUgraph g = nullptr;
    EXPECT_CU(cuStreamEndCapture(s1_, &g));
    return g;
  };
  CUgraph g1 = capture(1, false), g2 = capture(2, false), g3 = capture(3, true);
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, g1, 0));
  CUgraphExecUpdateResultInfo info{};
  ASSERT_CU(cuGraphExecUpdate(exec, g2, &info));
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_SUCCESS);
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(ReadInts(d, n), std::vector<int>(n, 2));
  EXPECT_EQ(cuGraphExecUpdate(exec, g3, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
  // The old form reports the same way.
  using Update1 = CUresult (*)(CUgraphExec, CUgraph, CUgraphNode*, CUgraphExecUpdateResult*);
  CUgraphNode err = nullptr;
  CUgraphExecUpdateResult res;
  ASSERT_CU(Sym<Update1>("cuGraphExecUpdate")(exec, g1, &err, &res));
  EXPECT_EQ(res, CU_GRAPH_EXEC_UPDATE_SUCCESS);
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(ReadInts(d, n), std::vector<int>(n, 1));
  // A node of another type in the same place.
  CUgraph g4;
  ASSERT_CU(cuGraphCreate(&g4, 0));
  CUgraphNode a, b;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g4, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, g4, &a, 1));
  EXPECT_EQ(cuGraphExecUpdate(exec, g4, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED);
  EXPECT_EQ(info.errorNode, a);
  for (CUgraph g : {g1, g2, g3, g4}) cuGraphDestroy(g);
  cuGraphExecDestroy(exec);
  cuMemFree_v2(d);
}

TEST_F(GraphTest, CloneSetParamsUploadAndCaptureDependencyUpdates) {
  constexpr int n = 4;
  CUdeviceptr d, other;
  ASSERT_CU(cuMemAlloc_v2(&d, n * sizeof(int)));
  ASSERT_CU(cuMemAlloc_v2(&other, n * sizeof(int)));
  // cuStreamUpdateCaptureDependencies: SET to nothing makes the next node a
  // root.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD32Async(other, 0, n, s1_));
  ASSERT_CU(cuStreamUpdateCaptureDependencies(s1_, nullptr, nullptr, 0,
                                              CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  ASSERT_CU(Fill(s1_, d, 4, n, 0));
  CUgraph g;
  ASSERT_CU(cuStreamEndCapture(s1_, &g));
  size_t roots = 0;
  ASSERT_CU(cuGraphGetRootNodes(g, nullptr, &roots));
  EXPECT_EQ(roots, 2u);
  EXPECT_EQ(cuStreamUpdateCaptureDependencies(s1_, nullptr, nullptr, 0, 0),
            CUDA_ERROR_ILLEGAL_STATE);

  // A clone, its node found from the original's, its params set.
  CUgraph clone;
  ASSERT_CU(cuGraphClone(&clone, g));
  CUgraphNode nodes[2];
  size_t count = 2;
  ASSERT_CU(cuGraphGetNodes(g, nodes, &count));
  CUgraphNode kernel_in_clone;
  ASSERT_CU(cuGraphNodeFindInClone(&kernel_in_clone, nodes[1], clone));
  EXPECT_NE(kernel_in_clone, nodes[1]);
  CUDA_KERNEL_NODE_PARAMS kp;
  ASSERT_CU(cuGraphKernelNodeGetParams(kernel_in_clone, &kp));
  int six = 6;
  std::vector<void*> args(kp.kernelParams, kp.kernelParams + 4);
  args[1] = &six;
  kp.kernelParams = args.data();
  ASSERT_CU(cuGraphKernelNodeSetParams(kernel_in_clone, &kp));
  ASSERT_CU(cuGraphKernelNodeGetParams(nodes[1], &kp));
  EXPECT_EQ(*static_cast<int*>(kp.kernelParams[1]), 4);  // the original's
  CUgraphExec exec;
  ASSERT_CU(cuGraphInstantiate(&exec, clone, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
  cuuint64_t flags = 0;
  ASSERT_CU(cuGraphExecGetFlags(exec, &flags));
  EXPECT_EQ(flags, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
  ASSERT_CU(cuGraphUpload(exec, s1_));
  ASSERT_CU(cuGraphLaunch(exec, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(ReadInts(d, n), std::vector<int>(n, 6));
  cuGraphExecDestroy(exec);
  cuGraphDestroy(clone);
  cuGraphDestroy(g);
  cuMemFree_v2(d);
  cuMemFree_v2(other);
}

// Threads capture their own streams (THREAD_LOCAL) while others launch one
// exec concurrently on their streams: captures stay apart, launches all run.
TEST_F(GraphTest, ConcurrentCapturesAndLaunches) {
  constexpr int kThreads = 4, kLaunches = 20, n = 16;
  CUdeviceptr x;
  ASSERT_CU(cuMemAlloc_v2(&x, n * sizeof(float)));
  float one = 1.0f;
  unsigned one_bits;
  std::memcpy(&one_bits, &one, 4);
  ASSERT_CU(cuMemsetD32_v2(x, one_bits, n));
  std::vector<CUdeviceptr> ys(kThreads);
  for (auto& y : ys) {
    ASSERT_CU(cuMemAlloc_v2(&y, n * sizeof(float)));
    ASSERT_CU(cuMemsetD32_v2(y, 0, n));
  }
  ASSERT_CU(cuCtxSynchronize());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cuCtxSetCurrent(ctx_);
      CUstream s;
      if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return void(++failures);
      CUgraph g = nullptr;
      CUgraphExec exec = nullptr;
      bool ok = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS &&
                Axpy(s, 1.0f, x, ys[t], n) == CUDA_SUCCESS &&
                cuStreamEndCapture(s, &g) == CUDA_SUCCESS &&
                cuGraphInstantiate(&exec, g, 0) == CUDA_SUCCESS;
      for (int i = 0; ok && i < kLaunches; ++i) {
        ok = cuGraphLaunch(exec, s) == CUDA_SUCCESS;
      }
      // Other threads' THREAD_LOCAL captures do not prohibit this.
      CUdeviceptr scratch;
      ok = ok && cuMemAlloc_v2(&scratch, 64) == CUDA_SUCCESS &&
           cuMemFree_v2(scratch) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS;
      if (!ok) ++failures;
      cuGraphExecDestroy(exec);
      cuGraphDestroy(g);
      cuStreamDestroy(s);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (auto y : ys) {
    EXPECT_EQ(ReadFloats(y, n), std::vector<float>(n, float(kLaunches)));
    cuMemFree_v2(y);
  }
  cuMemFree_v2(x);
}

}  // namespace
