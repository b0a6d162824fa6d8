// Fake driver: streams as FIFO worker threads, the legacy and per-thread
// default streams, events and host callbacks.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tests/fakecuda/internal.h"
#include "tests/fakecuda/trace.h"

namespace fakecuda {

Stream::Stream(Context* ctx, unsigned flags, int priority, StreamKind kind)
    : ctx_(ctx),
      flags_(flags),
      priority_(priority),
      kind_(kind),
      trace_track_(TraceEnabled() ? TraceStreamTrack(this, kind, ctx->device) : 0) {
  worker_ = std::thread([this] { Run(); });
}

void Stream::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

uint64_t Stream::Enqueue(std::function<void()> work, std::vector<Dependency> deps,
                         const OpLabel& label) {
  std::unique_ptr<Op::Traced> traced;
  if (trace_track_ != 0) traced.reset(new Op::Traced{label, TraceNowNs()});
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = submitted_.load() + 1;
    submitted_.store(seq);
    queue_.push_back(Op{seq, std::move(work), std::move(deps), std::move(traced)});
  }
  cv_.notify_all();
  return seq;
}

void Stream::WaitFor(uint64_t seq) {
  if (Reached(seq)) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return Reached(seq); });
}

void Stream::Run() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    if (op.traced) {
      RunTraced(op);
    } else {
      for (const Dependency& d : op.deps) d.stream->WaitFor(d.seq);
      if (op.work) op.work();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_.store(op.seq);
    }
    cv_.notify_all();
  }
}

void Stream::RunTraced(Op& op) {
  TracedOp t;
  t.track = trace_track_;
  t.label = op.traced->label;
  t.enqueued_ns = op.traced->enqueued_ns;
  t.ready_ns = TraceNowNs();
  for (const Dependency& d : op.deps) {
    // The last dependency not yet reached is the one that held it longest.
    if (d.stream->Reached(d.seq)) continue;
    t.held_by = d.stream->trace_track();
    d.stream->WaitFor(d.seq);
  }
  t.start_ns = TraceNowNs();
  SetCurrentStreamTrack(trace_track_);  // copy engine records name this stream
  if (op.work) op.work();
  SetCurrentStreamTrack(0);
  t.end_ns = TraceNowNs();
  size_t host_faults = 0;
  const size_t host_bytes = TakeHostBytesTouched(&host_faults);
  if (t.label.kind == OpKind::kKernel) {
    t.label.bytes = host_bytes;
    t.label.host_faults = static_cast<uint32_t>(std::min<size_t>(host_faults, UINT32_MAX));
  }
  // Recorded before the operation counts as completed: a module is unloaded,
  // and the kernel name freed, only once its launches have completed.
  TraceStreamOp(t);
}

namespace {

// Live stream handles. A CUstream is the Stream's address.
struct Streams {
  std::mutex mu;
  std::unordered_set<Stream*> live;  // guarded by mu
};

Streams& GetStreams() {
  static Streams* s = new Streams;
  return *s;
}

void Unlist(Stream* s) {
  Context* ctx = s->context();
  std::lock_guard<std::mutex> lock(ctx->mu);
  ctx->streams.erase(std::remove(ctx->streams.begin(), ctx->streams.end(), s), ctx->streams.end());
}

// The calling thread's per-thread default streams, one per context; when the
// thread exits they finish their work and stop.
struct PerThreadStreams {
  std::unordered_map<Context*, Stream*> by_context;
  ~PerThreadStreams() {
    for (auto& entry : by_context) {
      Unlist(entry.second);
      entry.second->Stop();
    }
  }
};
thread_local PerThreadStreams t_per_thread;

Stream* PerThreadStream(Context* ctx) {
  auto it = t_per_thread.by_context.find(ctx);
  if (it != t_per_thread.by_context.end()) return it->second;
  auto* s = new Stream(ctx, 0, 0, StreamKind::kPerThread);
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->streams.push_back(s);
  }
  t_per_thread.by_context.emplace(ctx, s);
  return s;
}

}  // namespace

CUresult ResolveStream(CUstream handle, bool per_thread, Stream** out) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    Context* ctx = nullptr;
    if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
    bool use_per_thread = handle == CU_STREAM_PER_THREAD || (handle == nullptr && per_thread);
    *out = use_per_thread ? PerThreadStream(ctx) : ctx->legacy;
    return CUDA_SUCCESS;
  }
  Streams& all = GetStreams();
  std::lock_guard<std::mutex> lock(all.mu);
  auto* s = reinterpret_cast<Stream*>(handle);
  if (all.live.count(s) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (!IsLiveContext(s->context())) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = s;
  return CUDA_SUCCESS;
}

uint64_t Submit(Stream* stream, std::function<void()> work, std::vector<Stream::Dependency> deps,
                const OpLabel& label) {
  Context* ctx = stream->context();
  uint64_t seq;
  {
    // Holding the context lock makes the implicit dependencies and the
    // enqueue one step, so two threads cannot interleave between them.
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (stream->legacy()) {
      for (Stream* other : ctx->streams) {
        if (other->blocking() && other->last_submitted() > 0) {
          deps.push_back({other, other->last_submitted()});
        }
      }
    } else if (stream->blocking() && ctx->legacy->last_submitted() > 0) {
      deps.push_back({ctx->legacy, ctx->legacy->last_submitted()});
    }
    seq = stream->Enqueue(std::move(work), std::move(deps), label);
  }
  if (GetOptions().sync) stream->WaitFor(seq);
  return seq;
}

void SubmitAndWait(Stream* stream, std::function<void()> work, const OpLabel& label) {
  stream->WaitFor(Submit(stream, std::move(work), {}, label));
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

// --- Streams -----------------------------------------------------------------
FAKECUDA_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                    int priority) {
  FAKECUDA_ENTER("cuStreamCreateWithPriority");
  if (phStream == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  // Priorities range over [-5, 0] as on current GPUs; others are clamped.
  priority = std::max(-5, std::min(0, priority));
  auto s = new Stream(ctx, flags, priority, StreamKind::kCreated);
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->streams.push_back(s);
  }
  Streams& all = GetStreams();
  std::lock_guard<std::mutex> lock(all.mu);
  all.live.insert(s);
  *phStream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
  FAKECUDA_ENTER("cuStreamCreate");
  return cuStreamCreateWithPriority(phStream, flags, 0);
}

FAKECUDA_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  FAKECUDA_ENTER("cuStreamDestroy_v2");
  auto* s = reinterpret_cast<Stream*>(hStream);
  {
    Streams& all = GetStreams();
    std::lock_guard<std::mutex> lock(all.mu);
    if (all.live.erase(s) == 0) return CUDA_ERROR_INVALID_HANDLE;
  }
  Unlist(s);
  // Work already submitted still runs; the real driver returns at once and
  // releases the stream later, the fake waits for it here.
  s->Stop();
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuStreamDestroy(CUstream hStream) {
  FAKECUDA_ENTER("cuStreamDestroy");
  return cuStreamDestroy_v2(hStream);
}

namespace {

CUresult StreamSynchronize(CUstream h, bool per_thread) {
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckStreamWait(s); r != CUDA_SUCCESS) return r;
  // A host-side wait: synchronising is not an action in the stream, so it
  // adds no ordering of its own.
  s->WaitIdle();
  return CUDA_SUCCESS;
}

CUresult StreamQuery(CUstream h, bool per_thread) {
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckStreamWait(s); r != CUDA_SUCCESS) return r;
  return s->Reached(s->last_submitted()) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult StreamGetFlags(CUstream h, unsigned int* flags, bool per_thread) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  *flags = s->flags();
  return CUDA_SUCCESS;
}

CUresult StreamGetPriority(CUstream h, int* priority, bool per_thread) {
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  *priority = s->priority();
  return CUDA_SUCCESS;
}

CUresult StreamGetCtx(CUstream h, CUcontext* pctx, bool per_thread) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  *pctx = reinterpret_cast<CUcontext>(s->context());
  return CUDA_SUCCESS;
}

CUresult StreamGetCtx2(CUstream h, CUcontext* pctx, CUgreenCtx* green, bool per_thread) {
  if (CUresult r = StreamGetCtx(h, pctx, per_thread); r != CUDA_SUCCESS) return r;
  if (green != nullptr) *green = nullptr;  // green contexts are not modelled
  return CUDA_SUCCESS;
}

CUresult LaunchHostFunc(CUstream h, CUhostFn fn, void* data, bool per_thread) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  if (capturing) {
    NodeSpec node;
    node.type = CU_GRAPH_NODE_TYPE_HOST;
    node.host.fn = fn;
    node.host.userData = data;
    node.run = [fn, data](Stream*) { fn(data); };
    node.label = OpLabel{OpKind::kHostFunc};
    return CaptureAdd(s, std::move(node));
  }
  Submit(
      s, [fn, data] { fn(data); }, {}, OpLabel{OpKind::kHostFunc});
  return CUDA_SUCCESS;
}

CUresult StreamAddCallback(CUstream h, CUstreamCallback cb, void* data, unsigned flags,
                           bool per_thread) {
  if (cb == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  // cuStreamAddCallback is not captured (cuLaunchHostFunc is its graph
  // form); the fake treats it as unsupported during capture.
  if (capturing) return CaptureUnsupported(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  Submit(
      s, [cb, h, data] { cb(h, CUDA_SUCCESS, data); }, {}, OpLabel{OpKind::kHostFunc});
  return CUDA_SUCCESS;
}

}  // namespace

namespace {
CUresult Impl_cuStreamSynchronize(CUstream h, bool pt) {
  CUresult r = StreamSynchronize(h, pt);
  if (r == CUDA_SUCCESS) ReleasePoolsAtSync();  // pools release at synchronisation
  return r;
}
CUresult Impl_cuStreamQuery(CUstream h, bool pt) { return StreamQuery(h, pt); }
CUresult Impl_cuStreamGetFlags(CUstream h, unsigned* f, bool pt) {
  return StreamGetFlags(h, f, pt);
}
CUresult Impl_cuStreamGetPriority(CUstream h, int* p, bool pt) {
  return StreamGetPriority(h, p, pt);
}
CUresult Impl_cuStreamGetCtx(CUstream h, CUcontext* c, bool pt) { return StreamGetCtx(h, c, pt); }
CUresult Impl_cuStreamGetCtx_v2(CUstream h, CUcontext* c, CUgreenCtx* g, bool pt) {
  return StreamGetCtx2(h, c, g, pt);
}
CUresult Impl_cuLaunchHostFunc(CUstream h, CUhostFn fn, void* d, bool pt) {
  return LaunchHostFunc(h, fn, d, pt);
}
CUresult Impl_cuStreamAddCallback(CUstream h, CUstreamCallback cb, void* d, unsigned f, bool pt) {
  return StreamAddCallback(h, cb, d, f, pt);
}
}  // namespace

FAKECUDA_STREAM_PAIR(cuStreamSynchronize, (CUstream hStream), hStream)
FAKECUDA_STREAM_PAIR(cuStreamQuery, (CUstream hStream), hStream)
FAKECUDA_STREAM_PAIR(cuStreamGetFlags, (CUstream hStream, unsigned int* flags), hStream, flags)
FAKECUDA_STREAM_PAIR(cuStreamGetPriority, (CUstream hStream, int* priority), hStream, priority)
FAKECUDA_STREAM_PAIR(cuStreamGetCtx, (CUstream hStream, CUcontext* pctx), hStream, pctx)
FAKECUDA_STREAM_PAIR(cuStreamGetCtx_v2, (CUstream hStream, CUcontext* pctx, CUgreenCtx* pGreenCtx),
                     hStream, pctx, pGreenCtx)
FAKECUDA_STREAM_PAIR(cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void* userData), hStream, fn,
                     userData)
FAKECUDA_STREAM_PAIR(cuStreamAddCallback,
                     (CUstream hStream, CUstreamCallback callback, void* userData,
                      unsigned int flags),
                     hStream, callback, userData, flags)

FAKECUDA_EXPORT CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  FAKECUDA_ENTER("cuCtxGetStreamPriorityRange");
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return CUDA_SUCCESS;
}

// --- Events ------------------------------------------------------------------
namespace {

struct Event {
  unsigned flags = 0;
  // The context current at cuEventCreate: the driver records an event only
  // on a stream of that context (cuEventRecord: "hEvent and hStream must be
  // from the same context otherwise CUDA_ERROR_INVALID_HANDLE is returned").
  // Waits and queries take an event of any context.
  Context* ctx = nullptr;
  std::mutex mu;
  // The latest record: its stream and sequence number, and the time at which
  // the stream reached it (written by the worker).
  Stream* stream = nullptr;                          // guarded by mu; null until recorded
  uint64_t seq = 0;                                  // guarded by mu
  std::shared_ptr<std::atomic<int64_t>> reached_ns;  // guarded by mu
  // Nonzero when last recorded in a capturing stream: the capture's id and
  // the nodes the record stood for (a capture event).
  uint64_t capture_id = 0;                 // guarded by mu
  std::vector<CUgraphNode> capture_nodes;  // guarded by mu
};

struct Events {
  std::mutex mu;
  std::unordered_set<Event*> live;  // guarded by mu
};

Events& GetEvents() {
  static Events* e = new Events;
  return *e;
}

Event* LookupEvent(CUevent h) {
  Events& all = GetEvents();
  std::lock_guard<std::mutex> lock(all.mu);
  auto* e = reinterpret_cast<Event*>(h);
  return all.live.count(e) ? e : nullptr;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// cuEventQuery and cuEventSynchronize on an event last recorded in a
// capture: CUDA_ERROR_CAPTURED_EVENT ("the operation is not permitted on an
// event which was last recorded in a capturing stream"), in every capture
// mode, and the capture, if still going, is invalidated.
CUresult CheckCapturedEvent(Event* e) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    id = e->capture_id;
  }
  if (id == 0) return CUDA_SUCCESS;
  InvalidateCapture(id);
  return CUDA_ERROR_CAPTURED_EVENT;
}

CUresult EventRecord(CUevent h, CUstream hs, unsigned flags, bool per_thread) {
  Event* e = LookupEvent(h);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(hs, per_thread, &s); r != CUDA_SUCCESS) return r;
  if (s->context() != e->ctx) return CUDA_ERROR_INVALID_HANDLE;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  if (capturing) {
    // No node: the event now stands for the stream's capture dependencies.
    uint64_t id = 0;
    std::vector<CUgraphNode> nodes;
    if (CUresult r = CaptureEventRecord(s, &id, &nodes); r != CUDA_SUCCESS) {
      return r;
    }
    std::lock_guard<std::mutex> lock(e->mu);
    e->capture_id = id;
    e->capture_nodes = std::move(nodes);
    return CUDA_SUCCESS;
  }
  auto reached = std::make_shared<std::atomic<int64_t>>(0);
  uint64_t seq = Submit(
      s, [reached] { reached->store(NowNs()); }, {}, OpLabel{OpKind::kEventRecord});
  std::lock_guard<std::mutex> lock(e->mu);
  e->stream = s;
  e->seq = seq;
  e->reached_ns = reached;
  e->capture_id = 0;
  e->capture_nodes.clear();
  return CUDA_SUCCESS;
}

CUresult StreamWaitEvent(CUstream hs, CUevent h, unsigned flags, bool per_thread) {
  Event* e = LookupEvent(h);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(hs, per_thread, &s); r != CUDA_SUCCESS) return r;
  Stream::Dependency dep;
  uint64_t capture_id = 0;
  std::vector<CUgraphNode> capture_nodes;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    capture_id = e->capture_id;
    capture_nodes = e->capture_nodes;
    dep = {e->stream, e->seq};
  }
  // A capture event: fork or join within its capture.
  if (capture_id != 0) return CaptureWaitEvent(s, capture_id, capture_nodes);
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  if (capturing) {
    // "Waiting on a non-captured event from a stream which is being
    // captured without specifying the cudaEventWaitExternal flag is
    // invalid" (programming guide); event wait nodes are not modelled.
    return CaptureUnsupported(s, (flags & CU_EVENT_WAIT_EXTERNAL)
                                     ? CUDA_ERROR_NOT_SUPPORTED
                                     : CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  }
  if (dep.stream == nullptr) return CUDA_SUCCESS;  // never recorded: no wait
  Submit(s, nullptr, {dep}, OpLabel{OpKind::kWaitEvent});
  return CUDA_SUCCESS;
}

CUresult Impl_cuEventRecord(CUevent h, CUstream s, bool pt) { return EventRecord(h, s, 0, pt); }
CUresult Impl_cuEventRecordWithFlags(CUevent h, CUstream s, unsigned f, bool pt) {
  return EventRecord(h, s, f, pt);
}
CUresult Impl_cuStreamWaitEvent(CUstream s, CUevent h, unsigned f, bool pt) {
  return StreamWaitEvent(s, h, f, pt);
}

}  // namespace

FAKECUDA_STREAM_PAIR(cuEventRecord, (CUevent hEvent, CUstream hStream), hEvent, hStream)
FAKECUDA_STREAM_PAIR(cuEventRecordWithFlags, (CUevent hEvent, CUstream hStream, unsigned int flags),
                     hEvent, hStream, flags)
FAKECUDA_STREAM_PAIR(cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int Flags),
                     hStream, hEvent, Flags)

FAKECUDA_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int flags) {
  FAKECUDA_ENTER("cuEventCreate");
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  auto* e = new Event;
  e->flags = flags;
  e->ctx = ctx;
  Events& all = GetEvents();
  std::lock_guard<std::mutex> lock(all.mu);
  all.live.insert(e);
  *phEvent = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  FAKECUDA_ENTER("cuEventDestroy_v2");
  Events& all = GetEvents();
  std::lock_guard<std::mutex> lock(all.mu);
  // Never freed, like streams: a thread still inside a call with this
  // handle must not touch freed memory.
  if (all.live.erase(reinterpret_cast<Event*>(hEvent)) == 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuEventDestroy(CUevent hEvent) {
  FAKECUDA_ENTER("cuEventDestroy");
  return cuEventDestroy_v2(hEvent);
}

FAKECUDA_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  FAKECUDA_ENTER("cuEventQuery");
  Event* e = LookupEvent(hEvent);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckCapturedEvent(e); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->stream == nullptr) return CUDA_SUCCESS;
  return e->stream->Reached(e->seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKECUDA_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  FAKECUDA_ENTER("cuEventSynchronize");
  Event* e = LookupEvent(hEvent);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckCapturedEvent(e); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  Stream* s = nullptr;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    s = e->stream;
    seq = e->seq;
  }
  if (s != nullptr) s->WaitFor(seq);
  ReleasePoolsAtSync();
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent hStart, CUevent hEnd) {
  FAKECUDA_ENTER("cuEventElapsedTime_v2");
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Event* start = LookupEvent(hStart);
  Event* end = LookupEvent(hEnd);
  if (start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Stream* stream[2];
  uint64_t seq[2];
  std::shared_ptr<std::atomic<int64_t>> reached[2];
  Event* both[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    std::lock_guard<std::mutex> lock(both[i]->mu);
    if (both[i]->stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    stream[i] = both[i]->stream;
    seq[i] = both[i]->seq;
    reached[i] = both[i]->reached_ns;
  }
  int64_t t[2];
  for (int i = 0; i < 2; ++i) {
    if (!stream[i]->Reached(seq[i])) return CUDA_ERROR_NOT_READY;
    t[i] = reached[i]->load();
  }
  *ms = static_cast<float>(static_cast<double>(t[1] - t[0]) / 1e6);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent hStart, CUevent hEnd) {
  FAKECUDA_ENTER("cuEventElapsedTime");
  return cuEventElapsedTime_v2(ms, hStart, hEnd);
}

namespace fakecuda {

void EndContextHandles(Context* ctx) {
  std::vector<Stream*> ended;
  {
    Streams& all = GetStreams();
    std::lock_guard<std::mutex> lock(all.mu);
    for (auto it = all.live.begin(); it != all.live.end();) {
      if ((*it)->context() == ctx) {
        ended.push_back(*it);
        it = all.live.erase(it);
      } else {
        ++it;
      }
    }
  }
  {
    Events& all = GetEvents();
    std::lock_guard<std::mutex> lock(all.mu);
    for (auto it = all.live.begin(); it != all.live.end();) {
      it = (*it)->ctx == ctx ? all.live.erase(it) : std::next(it);
    }
  }
  for (Stream* s : ended) {
    Unlist(s);
    s->Stop();
  }
}

}  // namespace fakecuda
