// MemoryManager: the uses of buffers on streams, and waits for them. Every
// decision in memory_manager.cc asks whether a buffer's work is done, or
// orders one stream after another; here are the events that record those
// uses, what has been observed of them, the host waits (each made without
// the lock), and stensor's own swap and fetch streams. Apart so that the
// decisions read as decisions, not as event bookkeeping.

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "core/base/json.h"
#include "core/driver/context_scope.h"
#include "core/driver/device_context.h"
#include "core/swap/memory_manager.h"
#include "core/swap/memory_manager_internal.h"
#include "core/swap/stream_use.h"

namespace stensor {

using memory_manager_internal::kNoConsumer;
using memory_manager_internal::Seconds;

namespace {

// The handles that name a stream of the current context (its NULL stream,
// or the calling thread's per-thread stream) rather than one stream.
bool NamesCurrentContextStream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

}  // namespace

std::pair<CUstream, uint64_t> MemoryManager::UseKey(CUstream stream) {
  // An entry per stream. A handle for the current context's stream names
  // another stream in each context: keyed by the context too, so that a
  // use from one context never hides another's (the key is never a handle
  // of a real stream: contexts are aligned and CU_STREAM_LEGACY is 1).
  CUstream key = stream;
  if (NamesCurrentContextStream(stream)) {
    CUcontext current = nullptr;
    if (const CUresult r = driver_->cuCtxGetCurrent(&current); r != CUDA_SUCCESS) {
      (void)Failed(r);  // counted; keyed by the handle alone
    } else if (current != nullptr) {
      key = reinterpret_cast<CUstream>(reinterpret_cast<uintptr_t>(current) |
                                       (stream == CU_STREAM_PER_THREAD ? 2 : 1));
    }
  }
  // The per-thread stream is another stream in every thread: one entry per
  // thread, or a second thread's use would hide the first's.
  return {key, stream == CU_STREAM_PER_THREAD ? ThreadTag() : 0};
}

MemoryManager::Use* MemoryManager::NoteUse(std::vector<Use>& uses, CUstream stream, int device) {
  return NoteUse(uses, stream, device, UseKey(stream));
}

MemoryManager::Use& MemoryManager::AddEntry(std::vector<Use>& uses,
                                            std::pair<CUstream, uint64_t> key) {
  Use& u = uses.emplace_back();
  u.stream = key.first;
  u.thread = key.second;
  return u;
}

CUresult MemoryManager::CreateStreamEvent(Device& dev, CUstream stream, CUevent* event,
                                          CUcontext* home) {
  // In the stream's context: stensor's streams are in the device's; the
  // program's named ones say which (a copy may be issued to a stream of
  // another context); the others are the current context's.
  *home = nullptr;
  if (dev.OwnStream(stream)) {
    *home = dev.context;
  } else if (CUresult r = Failed(StreamContext(*driver_, stream, home)); r != CUDA_SUCCESS) {
    return r;
  }
  *event = nullptr;
  ContextScope scope(*driver_, *home, &stats_.driver_errors);
  CUresult r = scope.result();
  if (r == CUDA_SUCCESS) r = Failed(driver_->cuEventCreate(event, CU_EVENT_DISABLE_TIMING));
  (void)scope.Restore();
  if (r == CUDA_SUCCESS && *event == nullptr) r = CUDA_ERROR_UNKNOWN;
  if (r != CUDA_SUCCESS) *event = nullptr;
  return r;
}

MemoryManager::Use* MemoryManager::NoteUse(std::vector<Use>& uses, CUstream stream, int device,
                                           std::pair<CUstream, uint64_t> use_key) {
  Use* u = &EntryFor(uses, use_key);
  u->device = device;
  ++u->seq;
  u->done = false;
  u->recorded = false;
  u->mark = nullptr;  // its own event from here on
  u->event = u->own;
  if (u->own == nullptr) {
    // Made once. Without one the use is not recorded: waits fall back to
    // the stream or the context.
    CUcontext home = nullptr;
    if (CreateStreamEvent(DeviceState(device), stream, &u->own, &home) != CUDA_SUCCESS) return u;
    u->event = u->own;
    u->context = home;  // the event ends with it (AfterContextEnds)
  }
  u->recorded = Failed(driver_->cuEventRecord(u->event, stream)) == CUDA_SUCCESS;
  return u;
}

MemoryManager::MarkRing* MemoryManager::FindRing(std::pair<CUstream, uint64_t> key) {
  // An operation's stream is most often the last one's: looked up once.
  if (ring_memo_ != nullptr && ring_memo_key_ == key) return ring_memo_;
  auto found = mark_rings_.find(key);
  if (found == mark_rings_.end()) return nullptr;
  ring_memo_key_ = key;
  ring_memo_ = &found->second;
  return ring_memo_;
}

void MemoryManager::EraseRing(std::pair<CUstream, uint64_t> key) {
  if (ring_memo_key_ == key) ring_memo_ = nullptr;
  mark_rings_.erase(key);
}

StreamMark* MemoryManager::TakeMark(std::pair<CUstream, uint64_t> key, CUstream stream,
                                    int device) {
  MarkRing* found = FindRing(key);
  if (found == nullptr) {
    if (mark_rings_.size() >= kMaxMarkStreams) return nullptr;
    found = &mark_rings_.try_emplace(key).first->second;  // a node map: pointers stay
  }
  MarkRing& ring = *found;
  if (!ring.marks.empty()) {
    // The oldest record: taken again once complete, so that every use
    // still holding it is known done; with the ring full, at once (its
    // uses are then known done when the new record completes).
    StreamMark& oldest = *ring.marks[ring.next];
    if (oldest.in_flight() && ring.marks.size() < kMaxMarksPerStream &&
        driver_->cuEventQuery(oldest.event) == CUDA_SUCCESS) {
      oldest.completed_gen = oldest.recorded_gen;
    }
    if (!oldest.in_flight() || ring.marks.size() >= kMaxMarksPerStream) {
      ring.next = (ring.next + 1) % ring.marks.size();
      return &oldest;
    }
  }
  // A new one, in the stream's context (as NoteUse makes its events).
  CUevent event = nullptr;
  CUcontext home = nullptr;
  if (CreateStreamEvent(DeviceState(device), stream, &event, &home) != CUDA_SUCCESS) {
    if (ring.marks.empty()) EraseRing(key);
    return nullptr;
  }
  auto mark = std::make_unique<StreamMark>();
  mark->event = event;
  mark->context = home;
  StreamMark* taken = mark.get();
  // Recorded next: the newest, just before the oldest in the ring.
  ring.marks.insert(ring.marks.begin() + static_cast<std::ptrdiff_t>(ring.next), std::move(mark));
  if (ring.marks.size() > 1) ++ring.next;
  return taken;
}

StreamMark* MemoryManager::MarkOperation(std::pair<CUstream, uint64_t> key, CUstream stream,
                                         int device, bool defer, Marked* marked) {
  // Only on a handle of the current context's own streams, which no program
  // destroys: SettleAhead may record there later, when the program names
  // no stream; one the program made may be gone by then.
  defer = defer && NamesCurrentContextStream(stream);
  MarkRing* found = FindRing(key);
  StreamMark* mark = nullptr;
  if (found != nullptr && found->ahead != nullptr) {
    MarkRing& ring = *found;
    mark = ring.ahead;
    ++mark->gen;  // the record that will cover this operation
    if (defer && ++ring.deferred < kDeferredRecords) {
      *marked = Marked::kAhead;
      return mark;
    }
    // This operation closes the window: its record covers those noted
    // ahead too.
    ring.ahead = nullptr;
    ring.deferred = 0;
  } else {
    mark = TakeMark(key, stream, device);
    if (mark == nullptr) return nullptr;
    ++mark->gen;
  }
  const bool recorded = Failed(driver_->cuEventRecord(mark->event, stream)) == CUDA_SUCCESS;
  if (recorded) mark->recorded_gen = mark->gen;
  *marked = recorded ? Marked::kRecorded : Marked::kUnrecorded;
  if (defer && recorded) {
    // The next operations' uses wait for the next record of another mark
    // (the ring's turn), so that this record's completion still tells.
    if (StreamMark* next = TakeMark(key, stream, device); next != nullptr && next != mark) {
      MarkRing& ring = *FindRing(key);  // TakeMark found or made it
      ring.ahead = next;
      ring.stream = stream;
      any_ahead_ = true;
    }
  }
  return mark;
}

void MemoryManager::SettleAhead() {
  if (!any_ahead_) return;
  bool left = false;
  for (auto& [key, ring] : mark_rings_) {
    if (ring.ahead == nullptr) continue;
    // Only where this thread's handle names that stream (a per-thread
    // stream is another in each thread; a context's own streams are
    // another in each context): else left to that stream's next record.
    if (UseKey(ring.stream) != key) {
      left = true;
      continue;
    }
    StreamMark& m = *ring.ahead;
    if (m.recorded_gen == m.gen) continue;  // nothing noted ahead yet
    // An idle stream has run every operation noted on it: all done. A busy
    // one is left to its next record (within kDeferredRecords operations):
    // a record now, on the NULL stream, would order the program's other
    // streams after it where the program did not.
    const CUresult idle = driver_->cuStreamQuery(ring.stream);
    if (idle == CUDA_SUCCESS) {
      m.recorded_gen = m.completed_gen = m.gen;
      continue;
    }
    if (idle != CUDA_ERROR_NOT_READY) (void)Failed(idle);  // an error, counted
    left = true;
  }
  any_ahead_ = left;
}

bool MemoryManager::Observed(Use& u) const { return ObservedComplete(*driver_, u); }

CUresult MemoryManager::WaitForUse(const Use& u, CUstream own_stream) const {
  return WaitForStreamUse(*driver_, u, own_stream);
}

CUresult MemoryManager::WaitForWriters(uint64_t id) {
  ManagerLock lock(this);
  SettleAhead();
  Buffer* b = ById(id);
  // Small buffers (not VMM) record no uses: nothing to tell their writers.
  if (b == nullptr || b->garbage || !b->vmm) return CUDA_ERROR_NOT_FOUND;
  // A write may have reached any piece of a group: each one's writers, by
  // key, since the lock is let go while waiting.
  std::vector<uint64_t> keys;
  for (const Buffer* p : PiecesOf(*b)) keys.push_back(p->key);
  for (uint64_t key : keys) {
    Buffer* p = ById(key);
    if (p == nullptr || p->garbage) continue;
    Device& dev = DeviceState(p->device);
    if (dev.unknown_submitting > 0) return CUDA_ERROR_NOT_READY;
    std::vector<Use> pending;  // copies: others may grow the lists meanwhile
    for (Use& u : p->uses) {
      if (!Observed(u)) pending.push_back(u);
    }
    for (Use& u : dev.unknown) {
      if (!Observed(u)) pending.push_back(u);
    }
    if (pending.empty()) continue;
    // Without the lock: the work may wait on another thread's next launch.
    if (CUresult r = WaitUnlocked(*p, pending, /*on_their_streams=*/false); r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

CUresult MemoryManager::WaitUnlocked(Buffer& b, const std::vector<Use>& uses,
                                     bool on_their_streams) {
  Pin(b);
  mu_.Unlock();
  CUresult r = CUDA_SUCCESS;
  for (const Use& u : uses) {
    if (r == CUDA_SUCCESS) r = WaitForUse(u, on_their_streams ? u.stream : nullptr);
  }
  mu_.Lock();
  ApplyJournal();
  Unpin(b);
  return r;
}

bool MemoryManager::UnknownIdle(Device& dev) const {
  if (dev.unknown_submitting > 0) return false;
  for (Use& u : dev.unknown) {
    if (!Observed(u)) return false;
  }
  return true;
}

bool MemoryManager::InUse(Buffer& b) const {
  for (Use& u : b.uses) {
    if (!Observed(u)) return true;
  }
  return false;
}

bool MemoryManager::Idle(Buffer& b) const {
  if (InUse(b)) return false;
  Device* dev =
      static_cast<size_t>(b.device) < devices_.size() ? devices_[b.device].get() : nullptr;
  return dev == nullptr || UnknownIdle(*dev);
}

CUresult MemoryManager::WaitIdle(Buffer& b, HostWait host_wait, bool own_uses) {
  if (host_wait == HostWait::kNever) return CUDA_ERROR_NOT_READY;
  Device& dev = DeviceState(b.device);
  struct Pending {
    bool unknown;
    size_t index;
    Use use;
    CUresult result = CUDA_SUCCESS;
  };
  std::vector<Pending> pending;
  if (own_uses) {
    for (size_t i = 0; i < b.uses.size(); ++i) {
      if (!Observed(b.uses[i])) pending.push_back({false, i, b.uses[i]});
    }
  }
  for (size_t i = 0; i < dev.unknown.size(); ++i) {
    if (!Observed(dev.unknown[i])) pending.push_back({true, i, dev.unknown[i]});
  }
  if (pending.empty() && dev.unknown_submitting > 0) {
    // An operation of unknown accesses is being submitted: its event comes
    // in a moment, recorded under the lock this thread must let go of.
    Pin(b);
    mu_.Unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    mu_.Lock();
    ApplyJournal();
    Unpin(b);
    return CUDA_SUCCESS;  // callers look again
  }
  if (pending.empty()) return CUDA_SUCCESS;
  // Wait without the lock: the work waited for may depend on another
  // thread's next launch, which needs the lock. The pin keeps the buffer
  // (and its events) alive meanwhile; callers re-check everything after.
  Pin(b);
  const CUstream swap_stream = dev.swap_stream, fetch_stream = dev.fetch_stream;
  auto start = std::chrono::steady_clock::now();
  mu_.Unlock();
  for (Pending& p : pending) {
    p.result = WaitForUse(p.use, p.use.stream == fetch_stream ? fetch_stream : swap_stream);
  }
  mu_.Lock();
  ApplyJournal();
  Unpin(b);
  CUresult result = CUDA_SUCCESS;
  for (const Pending& p : pending) {
    if (Failed(p.result) != CUDA_SUCCESS) {
      if (result == CUDA_SUCCESS) result = p.result;
      continue;
    }
    // Observed, unless the stream was used again meanwhile.
    std::vector<Use>& uses = p.unknown ? dev.unknown : b.uses;
    if (p.index < uses.size() && SameStream(uses[p.index], p.use) &&
        uses[p.index].seq == p.use.seq) {
      uses[p.index].done = true;
    }
  }
  double waited = Seconds(std::chrono::steady_clock::now() - start);
  stats_.host_wait_seconds += waited;
  bool unknown =
      std::any_of(pending.begin(), pending.end(), [](const Pending& p) { return p.unknown; });
  (unknown ? stats_.wait_unknown_seconds : stats_.wait_program_seconds) += waited;
  if (logging()) {
    Log(Named(JsonLine().Str("type", own_uses ? "evict_wait" : "unknown_wait"), b)
            .Double("seconds", waited)
            .Finish());
  }
  return result;
}

CUresult MemoryManager::OrderAfterSwap(Device& dev, Buffer& b, CUstream consumer) {
  if (dev.swap_stream == nullptr || consumer == kNoConsumer) return CUDA_SUCCESS;
  for (Use& u : b.uses) {
    if (!dev.OwnStream(u.stream) || Observed(u)) continue;
    // The consumer waits on the device; the host goes on.
    if (u.recorded && Failed(driver_->cuStreamWaitEvent(consumer, u.event, 0)) == CUDA_SUCCESS) {
      continue;
    }
    // Else the host waits for the copies, so the consumer cannot start
    // before them (without the lock: the swap stream may be waiting for
    // the program's work behind a queued swap-out). A prefetch has no
    // consumer, so never gets here.
    return WaitSwapUse(dev, b, HostWait::kAllowed);
  }
  return CUDA_SUCCESS;
}

std::vector<MemoryManager::Use> MemoryManager::PendingOwnUses(const Device& dev, Buffer& b) const {
  std::vector<Use> pending;
  for (Use& u : b.uses) {
    if (dev.OwnStream(u.stream) && !Observed(u)) pending.push_back(u);
  }
  return pending;
}

CUresult MemoryManager::WaitSwapUse(Device& dev, Buffer& b, HostWait host_wait) {
  const std::vector<Use> copies = PendingOwnUses(dev, b);
  if (copies.empty()) return CUDA_SUCCESS;
  if (host_wait == HostWait::kNever) return CUDA_ERROR_NOT_READY;
  auto start = std::chrono::steady_clock::now();
  CUresult r = WaitUnlocked(b, copies, /*on_their_streams=*/true);
  double waited = Seconds(std::chrono::steady_clock::now() - start);
  stats_.host_wait_seconds += waited;
  stats_.wait_swap_seconds += waited;
  if (logging()) {
    Log(Named(JsonLine().Str("type", "swap_wait").Str("what", "buffer"), b)
            .Double("seconds", waited)
            .Finish());
  }
  if (Failed(r) != CUDA_SUCCESS) return r;
  for (const Use& copy : copies) {
    for (Use& v : b.uses) {
      if (SameStream(v, copy) && v.seq == copy.seq) v.done = true;
    }
  }
  return CUDA_SUCCESS;
}

CUresult MemoryManager::WaitSwapStream(Device& dev, double* reason) {
  const CUstream swap_stream = dev.swap_stream;
  if (swap_stream == nullptr) return CUDA_SUCCESS;
  auto start = std::chrono::steady_clock::now();
  mu_.Unlock();
  CUresult r = driver_->cuStreamSynchronize(swap_stream);
  mu_.Lock();
  ApplyJournal();
  double waited = Seconds(std::chrono::steady_clock::now() - start);
  stats_.host_wait_seconds += waited;
  *(reason != nullptr ? reason : &stats_.wait_swap_seconds) += waited;
  if (logging()) {
    Log(JsonLine()
            .Str("type", "swap_wait")
            .Str("what", reason == &stats_.wait_unknown_seconds ? "unknown" : "stream")
            .Double("seconds", waited)
            .Finish());
  }
  return Failed(r);
}

void MemoryManager::RecordUse(Buffer& b, CUstream stream, std::pair<CUstream, uint64_t> key) {
  NoteUse(b.uses, stream, b.device, key);
}

bool MemoryManager::OrderSwapAfterUses(Device& dev, Buffer& b) {
  for (Use& u : b.uses) {
    if (u.stream == dev.swap_stream || Observed(u)) continue;  // FIFO / done
    // An unrecorded use is known to no event: only a host wait tells.
    if (!u.recorded ||
        Failed(driver_->cuStreamWaitEvent(dev.swap_stream, u.event, 0)) != CUDA_SUCCESS) {
      return false;
    }
  }
  return true;
}

// --- Stensor's own streams -------------------------------------------------------

CUresult MemoryManager::CreateOwnStream(Device& dev, CUstream* stream) {
  *stream = nullptr;
  if (dev.context == nullptr) {
    // The context the device's streams lived in ended (AfterContextEnds):
    // a live one of the device, the current one where it is on the device.
    CUcontext home = nullptr;
    if (CUresult r = Failed(ContextForDevice(*driver_, dev.ordinal, &home)); r != CUDA_SUCCESS) {
      return r;
    }
    dev.context = home;
  }
  ContextScope scope(*driver_, dev.context, &stats_.driver_errors);
  CUresult r = scope.result();
  if (r == CUDA_SUCCESS) r = Failed(driver_->cuStreamCreate(stream, CU_STREAM_NON_BLOCKING));
  if (r != CUDA_SUCCESS) *stream = nullptr;
  // A stream made in the right context stays, even where the program's
  // context could not be made current again (counted as a driver error).
  (void)scope.Restore();
  return r;
}

void MemoryManager::ForEachUse(absl::FunctionRef<void(Use&)> f) {
  for (auto& [key, b] : buffers_) {
    for (Use& u : b->uses) f(u);
  }
  for (auto& d : devices_) {
    if (!d) continue;
    for (Use& u : d->unknown) f(u);
    for (Use& u : d->swap_marks) f(u);
  }
  for (ExternalFree& x : external_frees_) {
    for (Use& u : x.uses) f(u);
  }
  for (auto& [wait, uses] : slab_waits_) {
    for (Use& u : uses) f(u);
  }
}

void MemoryManager::BeforeContextEnds(CUcontext ctx) {
  if (ctx == nullptr) return;
  std::vector<CUstream> retiring;
  bool pending = false;
  {
    ManagerLock lock(this);
    for (auto& d : devices_) {
      if (!d || d->context != ctx) continue;
      // New swap work goes to streams made when next needed, elsewhere.
      for (CUstream* own : {&d->swap_stream, &d->fetch_stream}) {
        if (*own != nullptr) retiring.push_back(*own);
        *own = nullptr;
      }
      d->context = nullptr;
      d->fetch_stream_failed = false;
    }
    for (CUstream s : retiring) retiring_.emplace_back(ctx, s);
    ForEachUse([&](Use& u) { pending |= u.context == ctx && !u.done; });
  }
  if (retiring.empty() && !pending) return;
  // Everything queued there completes first, swap copies included: the
  // driver's end of the context would otherwise take them with it. Without
  // the lock, as every wait for the program's work.
  uint64_t errors = 0;  // the scope counts its own
  CUresult r;
  {
    ContextScope scope(*driver_, ctx, &errors);
    r = scope.result();
    if (r == CUDA_SUCCESS && (r = driver_->cuCtxSynchronize()) != CUDA_SUCCESS) ++errors;
  }
  if (r != CUDA_SUCCESS) {
    // At least stensor's own copies (the program's work is the driver's).
    for (CUstream s : retiring) {
      if (driver_->cuStreamSynchronize(s) != CUDA_SUCCESS) ++errors;
    }
  }
  ManagerLock lock(this);
  stats_.driver_errors += errors;
}

void MemoryManager::AfterContextEnds(CUcontext ctx, bool ended) {
  if (ctx == nullptr) return;
  ManagerLock lock(this);
  std::vector<CUstream> retired;
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    if (it->first != ctx) {
      ++it;
      continue;
    }
    retired.push_back(it->second);
    it = retiring_.erase(it);
  }
  if (!ended) {
    // It lives on (a release that was not the last): its events stay valid;
    // the streams taken out of service, idle, go.
    for (CUstream s : retired) (void)Failed(driver_->cuStreamDestroy_v2(s));
    return;
  }
  // Its events are gone with it, and so is its work: what was queued there
  // was waited for, and nothing of it runs after its end.
  ForEachUse([&](Use& u) {
    if (u.context != ctx) return;
    u.done = true;
    u.recorded = false;
    u.event = nullptr;
    u.own = nullptr;
    u.mark = nullptr;
    u.context = nullptr;
  });
  for (auto it = mark_rings_.begin(); it != mark_rings_.end();) {
    const std::vector<std::unique_ptr<StreamMark>>& marks = it->second.marks;
    if (!marks.empty() && marks.front()->context == ctx) {
      if (&it->second == ring_memo_) ring_memo_ = nullptr;
      mark_rings_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& d : devices_) {
    if (!d) continue;
    auto& marks = d->swap_marks;
    marks.erase(std::remove_if(marks.begin(), marks.end(),
                               [&](const Use& u) {
                                 return std::find(retired.begin(), retired.end(), u.stream) !=
                                        retired.end();
                               }),
                marks.end());
  }
}

CUresult MemoryManager::EnsureSwapStream(Device& dev) {
  if (dev.swap_stream != nullptr) return CUDA_SUCCESS;
  return CreateOwnStream(dev, &dev.swap_stream);
}

CUstream MemoryManager::FetchStreamFor(Device& dev, Buffer& b,
                                       absl::Span<const PhysicalChunk> chunks) {
  // A use of the buffer not seen done (its own swap-out into the host copy,
  // a zeroing) is on the swap stream: FIFO.
  if (dev.fetch_stream_failed) return dev.swap_stream;
  for (Use& u : b.uses) {
    if (!Observed(u)) return dev.swap_stream;
  }
  if (dev.fetch_stream == nullptr && CreateOwnStream(dev, &dev.fetch_stream) != CUDA_SUCCESS) {
    dev.fetch_stream_failed = true;  // not tried at every swap-in
    return dev.swap_stream;
  }
  // Memory still mapped at an old owner's address has that owner's copy or
  // drop queued on the swap stream: the copy in waits for those on the
  // device, not behind everything queued there, so copies in and out run
  // on their own engines. (Waits queued before a failure only delay.)
  if (!OrderAfterOldOwners(dev, chunks, dev.fetch_stream)) return dev.swap_stream;
  return dev.fetch_stream;
}

bool MemoryManager::OrderAfterOldOwners(Device& dev, absl::Span<const PhysicalChunk> chunks,
                                        CUstream stream) {
  for (const PhysicalChunk& c : chunks) {
    auto owners = dev.shadow_owners.find(c.handle);
    if (owners == dev.shadow_owners.end()) continue;
    for (Buffer* o : owners->second) {
      for (Use& u : o->uses) {
        if (Observed(u)) continue;
        if (!u.recorded || Failed(driver_->cuStreamWaitEvent(stream, u.event, 0)) != CUDA_SUCCESS) {
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace stensor
