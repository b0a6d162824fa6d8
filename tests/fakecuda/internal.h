// Internal state of the fake CUDA driver: devices, contexts, streams, events,
// memory regions and the call gate every exported function passes through.
//
// Thread-safety: the driver state is shared by all application threads and
// all stream workers. Memory regions, handles, contexts, modules and fault
// injection are guarded by their own mutexes; a Stream's queue by its own.
// Functions that need a lock held say so.
#ifndef STENSOR_TESTS_FAKECUDA_INTERNAL_H_
#define STENSOR_TESTS_FAKECUDA_INTERNAL_H_

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL  // declare every versioned symbol
#endif
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define FAKECUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace fakecuda {

constexpr size_t kGranularity = 2u << 20;  // VMM granularity of current GPUs
constexpr size_t kPageSize = 4096;
constexpr int kDriverVersion = 13000;

struct Options {
  size_t device_memory = size_t{16} << 30;  // FAKECUDA_DEVICE_MEMORY
  int devices = 1;                          // FAKECUDA_DEVICES: the machine's
  // The physical index of each device the process sees, by ordinal:
  // CUDA_VISIBLE_DEVICES applied to the machine's `devices`.
  std::vector<int> visible;
  bool host_vmm = true;  // FAKECUDA_HOST_VMM
  // FAKECUDA_SYNC: every stream operation has run when the call that
  // submitted it returns (a device that keeps up with any host).
  bool sync = false;
  // FAKECUDA_LINK: bandwidth of each direction's copy engine in bytes per
  // second; 0 leaves that direction untimed.
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  // FAKECUDA_VMM_LATENCY_US: host time each call costs, by VmmCall, for
  // device-located memory [0] and host-located memory [1].
  std::chrono::microseconds vmm_latency[2][5] = {};
  // FAKECUDA_REPORT_CALLS: exported symbols whose call counts are printed
  // at exit.
  std::vector<std::string> report_calls;
  // FAKECUDA_TRACE: the file a timeline is written to at exit (trace.h);
  // FAKECUDA_TRACE_EVENTS: how many records it keeps at most.
  bool trace = false;
  std::string trace_path;
  size_t trace_max_events = 1'000'000;
};
const Options& GetOptions();

inline size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// --- Call gate -------------------------------------------------------------
// Every exported entry point starts with FAKECUDA_ENTER(name): it applies
// fault injection and, unless the function may run before cuInit, returns
// CUDA_ERROR_NOT_INITIALIZED as the real driver does. An entry point that
// forwards to another (cuStreamCreate to cuStreamCreateWithPriority) is one
// call: only the outermost is counted and can be failed.
class CallScope {
 public:
  CallScope(const char* name, bool needs_init);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  CUresult result() const { return result_; }

 private:
  CUresult result_;
};
#define FAKECUDA_ENTER(name)                         \
  ::fakecuda::CallScope fakecuda_scope_(name, true); \
  if (fakecuda_scope_.result() != CUDA_SUCCESS) return fakecuda_scope_.result()
#define FAKECUDA_ENTER_NO_INIT(name)                  \
  ::fakecuda::CallScope fakecuda_scope_(name, false); \
  if (fakecuda_scope_.result() != CUDA_SUCCESS) return fakecuda_scope_.result()

// Each stream entry point (defined as Impl_<name>(args..., per_thread)) exists in a legacy and a
// per-thread (_ptsz) form that differ only in what stream handle 0 means.
#define FAKECUDA_STREAM_PAIR(name, params, ...) \
  FAKECUDA_EXPORT CUresult name params {        \
    FAKECUDA_ENTER(#name);                      \
    return Impl_##name(__VA_ARGS__, false);     \
  }                                             \
  FAKECUDA_EXPORT CUresult name##_ptsz params { \
    FAKECUDA_ENTER(#name "_ptsz");              \
    return Impl_##name(__VA_ARGS__, true);      \
  }

// True when this library exports `symbol` (looked up in the library itself,
// never through an interposer's dlsym).
bool IsExportedSymbol(const char* symbol);

// --- Devices and contexts --------------------------------------------------
struct Device {
  int ordinal = 0;              // as the process numbers it
  int physical = 0;             // in the machine, before CUDA_VISIBLE_DEVICES
  std::atomic<size_t> used{0};  // bytes of device memory in use
  std::atomic<size_t> peak{0};  // high-water mark of `used`
  // Reserves `bytes` of device capacity; false when the device is full.
  bool Charge(size_t bytes);
  void Uncharge(size_t bytes);
};
Device* GetDevice(int ordinal);  // nullptr when out of range
int DeviceCount();               // the visible devices

class Stream;

// How a stream came to be: named so in FAKECUDA_TRACE's timeline.
enum class StreamKind {
  kLegacy,     // a context's NULL stream
  kPerThread,  // a thread's per-thread default stream
  kCreated,    // cuStreamCreate
};

struct Context {
  int device = 0;
  std::atomic<unsigned> flags{0};
  bool primary = false;
  Stream* legacy = nullptr;      // the NULL stream
  std::mutex mu;                 // guards streams and submission order
  std::vector<Stream*> streams;  // every live stream but `legacy`
};

// The calling thread's current context, or nullptr.
Context* CurrentContext();
// Current context, or an error code the real driver would return.
CUresult RequireContext(Context** ctx);
bool IsLiveContext(Context* ctx);
// Waits until all work submitted to any stream of `ctx` has completed.
void SynchronizeContext(Context* ctx);
// The same for every live context.
void SynchronizeAllContexts();

// --- Streams and events ----------------------------------------------------
// What a stream operation is, for FAKECUDA_TRACE (trace.h). Made at every
// submission, traced or not, so it holds no strings of its own.
enum class OpKind : uint8_t {
  kOther,
  kKernel,
  kCopy,
  kMemset,
  kHostFunc,
  kEventRecord,
  kWaitEvent,
  kFree,   // cuMemFreeAsync
  kGraph,  // cuGraphLaunch: all of the graph's nodes, in one operation
};
// A copy's direction as the call names it (where each pointer lies).
enum class CopyDir : uint8_t { kHtoD, kDtoH, kDtoD, kHtoH };
struct OpLabel {
  OpKind kind = OpKind::kOther;
  CopyDir dir = CopyDir::kHtoH;  // kCopy
  size_t bytes = 0;              // kCopy, kMemset; kKernel: host bytes touched
  uint32_t host_faults = 0;      // kKernel: the faults that counted those
  // kKernel: its symbol name, alive until the launch has run (a module is
  // unloaded only once all work is done).
  const char* name = nullptr;
};

// A stream is a FIFO worker thread. Each submitted operation gets a sequence
// number; `completed` reaches it when the operation has run. Operations may
// depend on (stream, sequence) pairs of other streams: that is how events,
// cuStreamWaitEvent and the legacy default stream's implicit ordering work.
//
// Stream objects are never freed: a dependency or a stale handle may name a
// stream long after it was destroyed, and must still read its (final)
// progress. Stop() ends the worker thread once the queue is drained.
class Stream {
 public:
  struct Dependency {
    Stream* stream = nullptr;
    uint64_t seq = 0;
  };

  Stream(Context* ctx, unsigned flags, int priority, StreamKind kind);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Waits for the queue to drain and ends the worker. Idempotent; never
  // called from a stream worker (it would wait for itself).
  void Stop();

  Context* context() const { return ctx_; }
  unsigned flags() const { return flags_; }
  int priority() const { return priority_; }
  bool legacy() const { return kind_ == StreamKind::kLegacy; }
  uint32_t trace_track() const { return trace_track_; }  // 0: not traced
  bool blocking() const { return !(flags_ & CU_STREAM_NON_BLOCKING); }

  // Appends `work`; it runs after `deps` and after everything before it on
  // this stream. `label` says what it is, for the trace. Returns its
  // sequence number.
  uint64_t Enqueue(std::function<void()> work, std::vector<Dependency> deps,
                   const OpLabel& label = {});
  uint64_t last_submitted() const { return submitted_.load(); }
  bool Reached(uint64_t seq) const { return completed_.load() >= seq; }
  void WaitFor(uint64_t seq);
  void WaitIdle() { WaitFor(last_submitted()); }

 private:
  struct Op {
    uint64_t seq;
    std::function<void()> work;
    std::vector<Dependency> deps;
    // What it is and when it was submitted, only while FAKECUDA_TRACE is on:
    // behind a pointer, so that an untraced operation stays as small as it
    // was (a larger one costs the queue more allocations).
    struct Traced {
      OpLabel label;
      int64_t enqueued_ns = 0;
    };
    std::unique_ptr<Traced> traced;
  };
  void Run();
  // Run's step for a traced operation: the same, timed and recorded.
  void RunTraced(Op& op);

  Context* const ctx_;
  const unsigned flags_;
  const int priority_;
  const StreamKind kind_;
  const uint32_t trace_track_;
  std::mutex mu_;
  std::condition_variable cv_;  // queue changed or op completed
  std::deque<Op> queue_;        // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::atomic<uint64_t> submitted_{0};
  std::atomic<uint64_t> completed_{0};
  std::thread worker_;
};

// Resolves a stream handle the way the driver does: 0 is the legacy stream,
// or the per-thread stream for _ptsz/_ptds entry points; CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD are the special handles; anything else must be a live
// stream.
CUresult ResolveStream(CUstream handle, bool per_thread, Stream** out);
// A context ends (cuCtxDestroy, a primary context's reset or last release),
// its work completed: the handles of its created streams and of its events
// become invalid, as the driver destroys them with it ("Destroys and cleans
// up all resources associated with the context"); those streams stop. Its
// default streams (legacy, per-thread) have no handle of their own and stay
// for the primary context's next life.
void EndContextHandles(Context* ctx);
// Submits `work` to `stream` with the default-stream ordering rules applied:
// legacy-stream work waits for all blocking streams of the context, and
// blocking-stream work waits for the legacy stream. `label` says what the
// work is, for the trace.
uint64_t Submit(Stream* stream, std::function<void()> work,
                std::vector<Stream::Dependency> deps = {}, const OpLabel& label = {});
// Submit, then block until it has run (synchronous copies and memsets).
void SubmitAndWait(Stream* stream, std::function<void()> work, const OpLabel& label = {});

// --- Memory ----------------------------------------------------------------
// True when [ptr, ptr+bytes) lies in accessible device memory (cuMemAlloc
// allocations, or VMM mappings with access set).
bool IsDeviceRange(CUdeviceptr ptr, size_t bytes);
// True when ptr lies in any device allocation or mapping.
bool IsDevicePointer(CUdeviceptr ptr);
// True when [ptr, ptr+bytes) lies in page-locked host memory.
bool IsPinnedHost(const void* ptr, size_t bytes);
// Has `touches` watch the host-located VMM mappings a kernel given those
// words as pointers can reach, each once: every one in the reserved range a
// word points into (a kernel walks its allocation past the mapping its
// pointer starts in: a tensor over several chunks or pieces), of which the
// time model charges the pages it touches (FAKECUDA_LINK).
class HostTouches;
void WatchHostMapped(const uint64_t* words, size_t n, HostTouches* touches);
// Whether `p` lies in a VMM mapping (cuMemMap), device- or host-located.
bool InVmmMapping(CUdeviceptr p);

// --- Graphs and stream capture (graph.cc) ----------------------------------
// What a graph node does: its type, the parameters the cuGraph*GetParams
// calls read back, and how a stream worker runs it. A kernel node holds its
// own copy of the argument values, packed in the function's parameter
// layout, as a launch does.
struct NodeSpec {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  // CU_GRAPH_NODE_TYPE_KERNEL
  CUfunction func = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  std::shared_ptr<const std::vector<unsigned char>> args;  // packed values
  std::vector<size_t> param_offsets;                       // each parameter's offset in `args`
  // CU_GRAPH_NODE_TYPE_MEMCPY: the copy as a 3D description.
  CUDA_MEMCPY3D copy{};
  // CU_GRAPH_NODE_TYPE_MEMSET
  CUDA_MEMSET_NODE_PARAMS memset{};
  // CU_GRAPH_NODE_TYPE_HOST
  CUDA_HOST_NODE_PARAMS host{};
  // The context the node runs in (kernel, memcpy and memset nodes).
  Context* ctx = nullptr;
  // Runs the node on `stream`'s worker (copies use its device's engines).
  std::function<void(Stream*)> run;
  OpLabel label;
};

// Validates a launch and packs its parameters into a kernel node
// (module.cc). Does not look at any stream.
CUresult MakeKernelNode(CUfunction f, const unsigned grid[3], const unsigned block[3],
                        unsigned shared_mem, void** params, void** extra, NodeSpec* out);
// Validates a copy described as in cuMemcpy3D into a memcpy node (copy.cc).
CUresult MakeCopyNode(const CUDA_MEMCPY3D* p, NodeSpec* out);
// Validates a memset into a memset node (copy.cc).
CUresult MakeMemsetNode(const CUDA_MEMSET_NODE_PARAMS* p, NodeSpec* out);

// Stream capture. The driver's rules ("Stream capture" in the programming
// guide; cuThreadExchangeStreamCaptureMode):
//
// CaptureCheck, before an operation is pushed into `s`: CUDA_SUCCESS with
// *capturing false when it runs as usual, true when it must be recorded with
// CaptureAdd instead; CUDA_ERROR_STREAM_CAPTURE_IMPLICIT for the legacy
// stream while a blocking stream of its context captures, and
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for a stream whose capture was
// invalidated. `sync` marks an operation that also waits for the stream
// (synchronous copies): on a capturing stream it is unsupported.
CUresult CaptureCheck(Stream* s, bool* capturing, bool sync = false);
// Records `node` in the capture `s` takes part in: it depends on the
// stream's current capture dependencies and becomes them.
CUresult CaptureAdd(Stream* s, NodeSpec node);
// Invalidates the capture `s` takes part in, if any, and returns `error`:
// for an operation the driver cannot capture.
CUresult CaptureUnsupported(Stream* s, CUresult error);
// A potentially unsafe call (cuMemAlloc, cuMemFree, synchronous copies,
// synchronisation and queries): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and
// the captures that prohibit it invalidated, when the calling thread's
// capture mode prohibits it; else CUDA_SUCCESS.
CUresult CheckUnsafeCall();
// For cuStreamSynchronize/cuStreamQuery: a capturing stream cannot be
// waited for or queried (its capture is invalidated); any other stream only
// as CheckUnsafeCall allows.
CUresult CheckStreamWait(Stream* s);
// For cuCtxSynchronize: unsafe, and a context with a capturing stream
// cannot be synchronised.
CUresult CheckContextWait(Context* ctx);
// cuEventRecord on a capturing stream: the stream's current capture
// dependencies and the capture's id (the event becomes a capture event).
CUresult CaptureEventRecord(Stream* s, uint64_t* capture_id, std::vector<CUgraphNode>* nodes);
// cuStreamWaitEvent on a capture event: `s` joins the capture, or adds the
// event's nodes to its dependencies.
CUresult CaptureWaitEvent(Stream* s, uint64_t capture_id, const std::vector<CUgraphNode>& nodes);
// Invalidates the capture with this id if it is still going (an invalid
// use of one of its capture events).
void InvalidateCapture(uint64_t capture_id);

// --- Stream-ordered pools (pool.cc) ----------------------------------------
struct Pool;
// The pool cuMemAllocAsync on `device` takes from (cuDeviceSetMemPool).
Pool* CurrentPool(int device);
// The live pool of a handle, else CUDA_ERROR_INVALID_VALUE.
CUresult LookupPool(CUmemoryPool handle, Pool** out);
int PoolDevice(Pool* pool);
// `bytes` more in use from `pool`: reserved (charged to its device) where
// its unused reservation does not cover them. CUDA_ERROR_OUT_OF_MEMORY when
// the device (or the pool's maxSize) has no room. `*kept`: the address of
// memory of that size the pool kept mapped, now the caller's, else 0.
CUresult PoolTake(Pool* pool, size_t bytes, uintptr_t* kept);
// `bytes` no longer in use: kept reserved until a synchronisation or trim.
// With `addr` (the freed allocation's), the pool keeps that memory mapped
// while it holds the reservation (true), unless the pool was destroyed
// (false: the caller unmaps it).
bool PoolGive(Pool* pool, size_t bytes, uintptr_t addr);
// A stream, event or context synchronisation: each pool releases reserved
// memory above max(in use, its release threshold).
void ReleasePoolsAtSync();
// memory.cc, called with pool.cc's lock held (its lock comes first): the
// memory a pool keeps mapped for reuse. Park: a freed allocation's; Take:
// one of exactly `charged` bytes, its address (0: none); Trim: unmaps kept
// memory until at most `keep` bytes are left.
void ParkInPool(Pool* pool, uintptr_t addr, size_t charged);
uintptr_t TakeFromPool(Pool* pool, size_t charged);
void TrimPool(Pool* pool, uint64_t keep);
// cuMemAllocAsync / cuMemAllocFromPoolAsync on stream `h` from `pool`
// (null: the current pool of the stream's device).
CUresult AllocAsyncFrom(CUdeviceptr* dptr, size_t bytes, Pool* pool, CUstream h, bool pt);

// --- Time model ------------------------------------------------------------
// FAKECUDA_LINK gives each device one copy engine per direction, shared by all
// of its streams, as a GPU's DMA engines are: a host<->device copy occupies
// its direction's engine for bytes/bandwidth, after the copies that reached
// the engine before it. The two directions overlap each other and kernels.
// Waiting sleeps until a deadline; it never holds a CPU.
//
// Thread-safety: all functions are thread-safe; each engine's schedule is
// guarded by its own mutex.
enum class Link {
  kNone,  // not link traffic: device<->device, host<->host
  kHostToDevice,
  kDeviceToHost,
};

// Whether copies in `link` direction are timed (FAKECUDA_LINK sets it).
bool LinkTimed(Link link);

// Runs `move`, the data movement of a copy of `bytes` crossing `link`, on
// `device`'s copy engine: a copy reaching the engine at r occupies it from
// max(r, when the engine is free) for bytes/bandwidth; `move` runs at the
// start of that window and returns no earlier than its end (later if the
// move itself takes longer). Called on the stream worker (or the thread that
// waits for it), which is thereby busy until the copy has completed.
// `began`, when earlier than now: when the transfer reached the engine. A
// kernel's reads of host memory stream over the link while it runs (a GPU
// overlaps them with its compute), so they are charged once it has run, in
// a window from max(its start, when the engine was free): the kernel ends
// at the later of its own end and the window's.
// `garbage`, when given, runs at the window's start instead, and `move` at
// its end: a copy's destination is not the data until the copy is done, and
// its source is read until then.
void RunOnCopyEngine(int device, Link link, size_t bytes, const std::function<void()>& move,
                     std::chrono::steady_clock::time_point began = {},
                     const std::function<void()>& garbage = nullptr);

// The VMM calls FAKECUDA_VMM_LATENCY_US charges: the calling thread is busy
// for the configured time (on a GPU these are costly host calls), host-
// located memory's figure where the call's memory is on the host.
enum class VmmCall { kCreate, kMap, kSetAccess, kUnmap, kRelease };
void ChargeVmmLatency(VmmCall call, bool host_located);

// Charges one call when it goes out of scope: declared before the call takes
// its locks, so that the time is spent after they are released.
class VmmLatency {
 public:
  explicit VmmLatency(VmmCall call) : call_(call) {}
  ~VmmLatency() {
    for (int i = 0; i < mappings_; ++i) ChargeVmmLatency(call_, host_located_);
  }
  VmmLatency(const VmmLatency&) = delete;
  VmmLatency& operator=(const VmmLatency&) = delete;
  void set_host_located(bool host) { host_located_ = host; }
  // cuMemSetAccess and cuMemUnmap cost what they cost per mapping covered
  // (on an H200, 32 granules mapped side by side took 32 times one).
  void set_mappings(int n) { mappings_ = n; }

 private:
  VmmCall call_;
  bool host_located_ = false;
  int mappings_ = 1;
};

}  // namespace fakecuda

#endif  // STENSOR_TESTS_FAKECUDA_INTERNAL_H_
