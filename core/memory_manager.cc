#include "core/memory_manager.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/context_scope.h"
#include "core/driver_pool.h"
#include "core/host_copy.h"
#include "core/json.h"
#include "core/stream_use.h"

namespace stensor {
namespace {

// Small allocations are charged in whole host pages, as a driver hands them out.
constexpr uint64_t kSmallUnit = 4096;

// Stream-ordered frees of driver allocations pending before a free settles
// those observed complete (MemoryManager::ForgetExternalAsync).
constexpr size_t kSettleExternalFrees = 32;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The "consumer" of a prefetch's swap-in: nothing is ordered after it yet.
const CUstream kNoConsumer = reinterpret_cast<CUstream>(~uintptr_t{0});

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The handles that name a stream of the current context (its NULL stream,
// or the calling thread's per-thread stream) rather than one stream.
bool NamesCurrentContextStream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

}  // namespace


struct MemoryManager::Buffer {
  uint64_t id = 0;   // the registry's; 0 when the registry could not track it
  uint64_t key = 0;  // in buffers_: the id, or an internal key when untracked
  CUdeviceptr base = 0;
  uint64_t size = 0;      // as the application asked
  uint64_t reserved = 0;  // VA and physical size (granules), or the charge
  int device = 0;
  CUcontext context = nullptr;  // current at allocation (pointer attributes)
  bool vmm = false;       // false: a small plain allocation, never swapped
  // Served for cuMemAllocAsync from the device's default pool: counted in
  // Device::stream_ordered until its memory is released.
  bool stream_ordered = false;
  // A handle to its memory left stensor's control (PinExported): resident
  // and never evicted again.
  bool exported = false;
  // S03 fields. `pins` counts operations being prepared or submitted right
  // now (non-evictable while > 0); the application's own reference ends
  // with cuMemFree, after which a buffer still in use is garbage.
  int pins = 0;
  bool garbage = false;
  Location location = Location::kGpuOnly;
  uint64_t gpu_version = 0;
  uint64_t host_version = 0;
  uint64_t last_use = 0;
  // Whether any operation may have written it since allocation (allocation
  // itself does not count): a never-written buffer holds what fresh memory
  // holds, so under `version` it moves without any copy.
  bool written = false;
  // The last use on each stream that used it (a use on one stream says
  // nothing about another); a swap's copy is a use on the swap stream.
  std::vector<Use> uses;
  // Device memory, when resident: granule-sized chunks of the device's pool
  // mapped at consecutive offsets from base (empty when not resident).
  std::vector<CUmemGenericAllocationHandle> device_chunks;
  // The host copy: host-located VMM memory (mapped at its own VA, and at base
  // while swapped out), or pinned memory where that is unsupported.
  HostCopy host;
  bool host_at_base = false;  // true only while the host copy is mapped there
  bool va_reserved = false;   // `base` is still reserved (VMM buffers)
  // Swapped in without a copy for an operation that overwrites it whole;
  // cleared when that operation is submitted (or undone if it is not).
  bool pending_overwrite = false;
  // STENSOR_VERIFY: the hash of the host copy, taken when it was copied out
  // (hash mode), and the kernels named by a mismatch.
  std::optional<uint64_t> host_hash;
  const char* last_kernel = nullptr;
  const char* last_writer = nullptr;
  // Resident, but the device memory does not hold the data: the host copy
  // does (a restore that failed and could not be undone). Brought in before
  // the next use; evicted without a copy.
  bool stale_device = false;
  uint64_t failed_round = 0;  // round_ in which evicting it failed
  // Swapped out asynchronously: `old_chunks` (in the pool, or some handed
  // on when `handed_on`) are still mapped at `base` until the swap-out's
  // copy, the buffer's use on the swap stream, is observed complete.
  bool old_mapped = false;
  bool handed_on = false;
  std::vector<CUmemGenericAllocationHandle> old_chunks;
  // Where it stands in its device's eviction order (Reindex).
  uint64_t serial = 0;
  uint64_t next_use = EvictionCandidate::kNoNextUse;
  // Resident as the planner was last told (Reindex tells it of changes).
  bool planner_resident = true;
  // Fetched ahead of its use and not used yet: evicted only when nothing
  // else can go (else prefetching would just feed the next eviction).
  bool prefetched = false;
  bool indexed = false;
  std::tuple<EvictionKey, uint64_t, uint64_t> index_key;
  bool drop_indexed = false;
  std::pair<uint64_t, uint64_t> drop_key;  // (last use, serial)

  bool resident() const { return !vmm || !device_chunks.empty(); }
  int refcount() const { return (garbage ? 0 : 1) + pins; }
  bool clean() const {
    return location == Location::kCpuGpu && host_version == gpu_version;
  }
};

struct MemoryManager::Device {
  int ordinal = 0;
  // Operations whose accesses are unknown, their last one per stream: until
  // they completed, no buffer of this device counts as idle.
  std::vector<Use> unknown;
  int unknown_submitting = 0;  // such operations being submitted right now
  // One per swap stream (below): each one's latest point, for them.
  std::vector<Use> swap_marks;
  uint64_t cap = 0;
  uint64_t used = 0;
  uint64_t granularity = 0;
  bool host_vmm = false;
  // Where stensor's streams and events for this device live: the context of
  // its first buffer (a context of this device, current at cuMemAlloc), so
  // no context of stensor's own is created. Null until then (current).
  CUcontext context = nullptr;
  // Stensor's own streams. The swap stream carries swap-outs, drops, zeroing
  // and swap-ins into memory that earlier swap work still reads or writes
  // (FIFO orders them). The fetch stream carries swap-ins into memory at
  // rest, so that they do not queue behind swap-outs waiting for the
  // program's work, and run beside them on the other copy direction.
  CUstream swap_stream = nullptr;
  CUstream fetch_stream = nullptr;
  bool fetch_stream_failed = false;  // its create failed: swap-ins stay FIFO
  bool OwnStream(CUstream s) const {
    return s != nullptr && (s == swap_stream || s == fetch_stream);
  }
  uint64_t host_bytes = 0;  // host copies
  uint64_t spare_host_bytes = 0;  // of them kept for reuse, host-located VMM
  // Idle physical memory in chunks of `granularity` bytes, charged (in
  // `used`).
  PhysicalPool pool;
  // Stensor's share of the default stream-ordered pool (StreamOrderedUsage).
  StreamOrderedUsage stream_ordered;
  // The driver's default pool of the device (TrimDriverPool).
  DriverPool driver_pool;
  // Buffers whose old mapping is still there (Buffer::old_mapped).
  std::vector<Buffer*> old_mappings;
  // The eviction order (MemoryManager::Reindex).
  std::map<std::tuple<EvictionKey, uint64_t, uint64_t>, Buffer*> evictable;
  std::map<std::pair<uint64_t, uint64_t>, Buffer*> droppable;
};

class MemoryManager::ReindexAtExit {
 public:
  ReindexAtExit(MemoryManager* mm, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm->mu_)
      : mm_(mm), b_(b) {}
  ~ReindexAtExit() ABSL_NO_THREAD_SAFETY_ANALYSIS { mm_->Reindex(b_); }
  ReindexAtExit(const ReindexAtExit&) = delete;
  ReindexAtExit& operator=(const ReindexAtExit&) = delete;

 private:
  MemoryManager* const mm_;
  Buffer& b_;
};

EvictionCandidate MemoryManager::CandidateOf(const Buffer& b) const {
  // What may go without a copy is shown as clean (a current host copy).
  bool free = Droppable(b);
  EvictionCandidate c;
  c.id = b.id;
  c.bytes = b.reserved;
  c.location = free ? Location::kCpuGpu : b.location;
  c.gpu_version = b.gpu_version;
  c.host_version = free ? b.gpu_version : b.host_version;
  c.last_use = b.last_use;
  c.next_use = b.next_use;
  return c;
}

void MemoryManager::Unindex(Buffer& b) {
  if (!b.indexed && !b.drop_indexed) return;
  Device& dev = DeviceState(b.device);
  if (b.indexed) dev.evictable.erase(b.index_key);
  if (b.drop_indexed) dev.droppable.erase(b.drop_key);
  b.indexed = false;
  b.drop_indexed = false;
}

void MemoryManager::Reindex(Buffer& b) {
  // Every change of residency passes here: the planner hears of it.
  if (!b.resident()) b.prefetched = false;
  if (planner_ != nullptr && b.vmm && !b.garbage && b.planner_resident != b.resident()) {
    b.planner_resident = b.resident();
    if (b.resident()) {
      planner_->OnResident(b.id);
    } else {
      planner_->OnEvicted(b.id);
    }
  }
  // Pins, failed rounds and idleness change all the time: checked when an
  // eviction looks, not kept here.
  const bool eligible = b.vmm && b.resident() && !b.garbage && !b.exported;
  const bool droppable = eligible && Droppable(b);
  Device& dev = DeviceState(b.device);
  if (eligible) {
    auto key = std::make_tuple(policy_->Key(CandidateOf(b)), b.id, b.serial);
    if (!b.indexed || key != b.index_key) {
      if (b.indexed) dev.evictable.erase(b.index_key);
      b.index_key = key;
      dev.evictable.emplace(key, &b);
      b.indexed = true;
    }
  } else if (b.indexed) {
    dev.evictable.erase(b.index_key);
    b.indexed = false;
  }
  if (droppable) {
    std::pair<uint64_t, uint64_t> key{b.last_use, b.serial};
    if (!b.drop_indexed || key != b.drop_key) {
      if (b.drop_indexed) dev.droppable.erase(b.drop_key);
      b.drop_key = key;
      dev.droppable.emplace(key, &b);
      b.drop_indexed = true;
    }
  } else if (b.drop_indexed) {
    dev.droppable.erase(b.drop_key);
    b.drop_indexed = false;
  }
}

std::string MemoryManager::MissingEntryPoints(const Driver& d) {
  const std::pair<const char*, bool> needed[] = {
#define STENSOR_SWAP_ENTRY(name) {#name, d.name != nullptr},
#include "core/swap_entry_points.inc"
#undef STENSOR_SWAP_ENTRY
  };
  std::string missing;
  for (const auto& [name, found] : needed) {
    if (!found) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  }
  return missing;
}

std::unique_ptr<MemoryManager> MemoryManager::Create(const Config& config,
                                                     const Driver* driver,
                                                     LogSink log) {
  if (!config.memory_limit.all_devices && config.memory_limit.per_device.empty()) {
    return nullptr;
  }
  if (std::string missing = MissingEntryPoints(*driver); !missing.empty()) {
    // Calling a null entry point later would crash the program: no cap.
    std::fprintf(stderr,
                 "stensor: STENSOR_MEMORY_LIMIT is not applied: the CUDA driver lacks %s, "
                 "which swapping needs (STENSOR_REAL_LIBCUDA names another driver?)\n",
                 missing.c_str());
    return nullptr;
  }
  std::unique_ptr<EvictionPolicy> policy =
      config.policy == EvictionPolicyKind::kLru      ? MakeLruPolicy()
      : config.policy == EvictionPolicyKind::kBelady ? MakeBeladyPolicy()
                                                     : MakeVersionPolicy();
  return std::unique_ptr<MemoryManager>(
      new MemoryManager(config, driver, std::move(log), std::move(policy)));
}

MemoryManager::MemoryManager(const Config& config, const Driver* driver,
                             LogSink log, std::unique_ptr<EvictionPolicy> policy)
    : config_(config),
      driver_(driver),
      log_(std::move(log)),
      policy_(std::move(policy)),
      version_policy_(config.policy != EvictionPolicyKind::kLru),
      verifier_(config.verify == VerifyMode::kOff
                    ? nullptr
                    : std::make_unique<Verifier>(config.verify, driver)),
      profiler_(driver) {}

MemoryManager::~MemoryManager() {
  MutexLock lock(&mu_);
  while (!by_base_.empty()) {
    Buffer& b = *by_base_.begin()->second;
    WaitIdle(b);  // an error here leaves nothing better to do than release
    if (!ReleaseBuffer(DeviceState(b.device), b)) {
      Unindex(b);
      // At exit: leak what the driver would not release.
      const uint64_t key = b.key;
      by_base_.erase(by_base_.begin());
      buffers_.erase(key);
    }
  }
  ReleaseAllPooled();
  RetryReleases();
  (void)FreeSpareHostCopies();
  for (auto& d : devices_) {
    if (!d) continue;
    // Failures here leak a handle at exit; nothing is left to keep consistent.
    if (d->swap_stream != nullptr) (void)driver_->cuStreamDestroy_v2(d->swap_stream);
    if (d->fetch_stream != nullptr) (void)driver_->cuStreamDestroy_v2(d->fetch_stream);
    for (const Use& u : d->unknown) {
      if (u.event != nullptr) (void)driver_->cuEventDestroy_v2(u.event);
    }
  }
  for (const ExternalFree& f : external_frees_) {
    for (const Use& u : f.uses) {
      if (u.event != nullptr) (void)driver_->cuEventDestroy_v2(u.event);
    }
  }
}

void MemoryManager::Log(std::string line) const {
  if (log_) log_(std::move(line));
}

uint64_t MemoryManager::CapFor(int device, size_t device_total) const {
  std::optional<size_t> cap = config_.memory_limit.BytesFor(device, device_total);
  return cap ? *cap : device_total;
}

MemoryManager::Device& MemoryManager::DeviceState(int ordinal) {
  if (ordinal < 0) ordinal = 0;
  if (static_cast<size_t>(ordinal) >= devices_.size()) devices_.resize(ordinal + 1);
  std::unique_ptr<Device>& d = devices_[ordinal];
  if (d) return *d;
  d = std::make_unique<Device>();
  d->ordinal = ordinal;
  size_t total = 0;
  if (driver_->cuDeviceTotalMem_v2) driver_->cuDeviceTotalMem_v2(&total, ordinal);
  d->cap = CapFor(ordinal, total);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  size_t granularity = 0;
  if (driver_->cuMemGetAllocationGranularity &&
      driver_->cuMemGetAllocationGranularity(&granularity, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
          CUDA_SUCCESS) {
    d->granularity = granularity;
  }
  d->pool = PhysicalPool(d->granularity);
  int host_vmm = 0;
  if (driver_->cuDeviceGetAttribute) {
    driver_->cuDeviceGetAttribute(
        &host_vmm, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        ordinal);
  }
  d->host_vmm = host_vmm != 0;
  return *d;
}

void MemoryManager::Charge(Device& dev, uint64_t bytes) {
  dev.used += bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, dev.used);
}

MemoryManager::Buffer* MemoryManager::ById(uint64_t id) {
  if (id == 0 || id >= kUntrackedKeys) return nullptr;  // never a registry id
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : it->second.get();
}

CUresult MemoryManager::Failed(CUresult r) {
  if (r != CUDA_SUCCESS) ++stats_.driver_errors;
  return r;
}

// --- Uses -------------------------------------------------------------------------

MemoryManager::Use* MemoryManager::NoteUse(std::vector<Use>& uses, CUstream stream,
                                           int device) {
  Device& dev = DeviceState(device);
  // An entry per stream. A handle for the current context's stream names
  // another stream in each context: keyed by the context too, so that a
  // use from one context never hides another's (the key is never a handle
  // of a real stream: contexts are aligned and CU_STREAM_LEGACY is 1).
  CUstream key = stream;
  CUcontext current = nullptr;
  if (NamesCurrentContextStream(stream) &&
      Failed(driver_->cuCtxGetCurrent(&current)) == CUDA_SUCCESS && current != nullptr) {
    key = reinterpret_cast<CUstream>(reinterpret_cast<uintptr_t>(current) |
                                     (stream == CU_STREAM_PER_THREAD ? 2 : 1));
  }
  // The per-thread stream is another stream in every thread: one entry per
  // thread, or a second thread's use would hide the first's.
  const uint64_t thread = stream == CU_STREAM_PER_THREAD ? ThreadTag() : 0;
  Use* u = nullptr;
  for (Use& x : uses) {
    if (x.stream == key && x.thread == thread) u = &x;
  }
  if (u == nullptr) {
    u = &uses.emplace_back();
    u->stream = key;
    u->thread = thread;
  }
  u->device = device;
  ++u->seq;
  u->done = false;
  u->recorded = false;
  if (u->event == nullptr) {
    // Made once, in the stream's context: stensor's streams are in the
    // device's; the program's named ones say which (a copy may be issued to
    // a stream of another context); the others are the current context's.
    CUcontext home = nullptr;
    if (dev.OwnStream(stream)) {
      home = dev.context;
    } else if (!NamesCurrentContextStream(stream) &&
               Failed(driver_->cuStreamGetCtx(stream, &home)) != CUDA_SUCCESS) {
      return u;  // not recorded: waits fall back to the stream or the context
    }
    ContextScope scope(*driver_, home, &stats_.driver_errors);
    CUresult r = scope.result();
    if (r == CUDA_SUCCESS) r = Failed(driver_->cuEventCreate(&u->event, CU_EVENT_DISABLE_TIMING));
    if (r != CUDA_SUCCESS) u->event = nullptr;
    (void)scope.Restore();
    if (u->event == nullptr) return u;
  }
  u->recorded = Failed(driver_->cuEventRecord(u->event, stream)) == CUDA_SUCCESS;
  return u;
}

bool MemoryManager::Observed(Use& u) const { return ObservedComplete(*driver_, u); }

CUresult MemoryManager::WaitForUse(const Use& u, CUstream own_stream) const {
  return WaitForStreamUse(*driver_, u, own_stream);
}

bool MemoryManager::UnknownIdle(Device& dev) const {
  if (dev.unknown_submitting > 0) return false;
  for (Use& u : dev.unknown) {
    if (!Observed(u)) return false;
  }
  return true;
}

bool MemoryManager::Idle(Buffer& b) const {
  for (Use& u : b.uses) {
    if (!Observed(u)) return false;
  }
  const Device* dev = static_cast<size_t>(b.device) < devices_.size()
                          ? devices_[b.device].get()
                          : nullptr;
  return dev == nullptr || UnknownIdle(*devices_[b.device]);
}

CUresult MemoryManager::WaitIdle(Buffer& b, bool own_uses) {
  if (no_block_) return CUDA_ERROR_NOT_READY;
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
    ++b.pins;
    mu_.Unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    mu_.Lock();
    --b.pins;
    return CUDA_SUCCESS;  // callers look again
  }
  if (pending.empty()) return CUDA_SUCCESS;
  // Wait without the lock: the work waited for may depend on another
  // thread's next launch, which needs the lock. The pin keeps the buffer
  // (and its events) alive meanwhile; callers re-check everything after.
  ++b.pins;
  const CUstream swap_stream = dev.swap_stream, fetch_stream = dev.fetch_stream;
  auto start = std::chrono::steady_clock::now();
  mu_.Unlock();
  for (Pending& p : pending) {
    p.result = WaitForUse(p.use, p.use.stream == fetch_stream ? fetch_stream : swap_stream);
  }
  mu_.Lock();
  --b.pins;
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
  bool unknown = std::any_of(pending.begin(), pending.end(),
                             [](const Pending& p) { return p.unknown; });
  (unknown ? stats_.wait_unknown_seconds : stats_.wait_program_seconds) += waited;
  Log(JsonLine()
          .Str("type", own_uses ? "evict_wait" : "unknown_wait")
          .Uint("id", b.id)
          .Double("seconds", waited)
          .Finish());
  return result;
}

CUresult MemoryManager::OrderAfterSwap(Device& dev, Buffer& b, CUstream consumer) {
  if (dev.swap_stream == nullptr || consumer == kNoConsumer) return CUDA_SUCCESS;
  for (Use& u : b.uses) {
    if (!dev.OwnStream(u.stream) || Observed(u)) continue;
    // The consumer waits on the device; the host goes on.
    if (u.recorded &&
        Failed(driver_->cuStreamWaitEvent(consumer, u.event, 0)) == CUDA_SUCCESS) {
      continue;
    }
    // Else the host waits for the copies, so the consumer cannot start
    // before them (without the lock: the swap stream may be waiting for
    // the program's work behind a queued swap-out).
    return WaitSwapUse(dev, b);
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

CUresult MemoryManager::WaitSwapUse(Device& dev, Buffer& b) {
  const std::vector<Use> copies = PendingOwnUses(dev, b);
  if (copies.empty()) return CUDA_SUCCESS;
  if (no_block_) return CUDA_ERROR_NOT_READY;
  ++b.pins;
  auto start = std::chrono::steady_clock::now();
  mu_.Unlock();
  CUresult r = CUDA_SUCCESS;
  for (const Use& u : copies) {
    if (r == CUDA_SUCCESS) r = WaitForUse(u, u.stream);
  }
  mu_.Lock();
  --b.pins;
  double waited = Seconds(std::chrono::steady_clock::now() - start);
  stats_.host_wait_seconds += waited;
  stats_.wait_swap_seconds += waited;
  Log(JsonLine()
          .Str("type", "swap_wait")
          .Str("what", "buffer")
          .Uint("id", b.id)
          .Double("seconds", waited)
          .Finish());
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
  if (no_block_) return CUDA_ERROR_NOT_READY;
  auto start = std::chrono::steady_clock::now();
  mu_.Unlock();
  CUresult r = driver_->cuStreamSynchronize(swap_stream);
  mu_.Lock();
  double waited = Seconds(std::chrono::steady_clock::now() - start);
  stats_.host_wait_seconds += waited;
  *(reason != nullptr ? reason : &stats_.wait_swap_seconds) += waited;
  Log(JsonLine()
          .Str("type", "swap_wait")
          .Str("what", reason == &stats_.wait_unknown_seconds ? "unknown" : "stream")
          .Double("seconds", waited)
          .Finish());
  return Failed(r);
}

void MemoryManager::RecordUse(Buffer& b, CUstream stream) {
  NoteUse(b.uses, stream, b.device);
}

// --- Allocation -----------------------------------------------------------------

CUresult MemoryManager::Allocate(uint64_t bytes, CUdeviceptr* dptr, RegisterId register_id,
                                 bool stream_ordered) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUdevice ordinal = 0;
  if (CUresult r = driver_->cuCtxGetDevice(&ordinal); r != CUDA_SUCCESS) return r;
  CUcontext context = nullptr;
  if (CUresult r = driver_->cuCtxGetCurrent(&context); r != CUDA_SUCCESS) return r;
  MutexLock lock(&mu_);
  Device& dev = DeviceState(ordinal);
  // More than the cap can never fit (and rounding SIZE_MAX up would wrap):
  // out of memory, as the driver answers for more than the device has.
  if (bytes > dev.cap) {
    LogOom(dev, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto b = std::make_unique<Buffer>();
  b->size = bytes;
  b->device = ordinal;
  b->context = context;
  if (dev.context == nullptr) dev.context = context;
  b->gpu_version = ++version_;
  b->last_use = ++clock_;  // just used: not the first to go
  CollectGarbage();
  ReapOldMappings(dev, /*wait=*/false);
  // From half a granule up a buffer maps a whole chunk (at most twice its
  // size): the memory it frees serves any other buffer, where the driver's
  // allocator would need a pooled chunk released for it (room for it) and
  // created again for the next VMM buffer.
  if (dev.granularity == 0 || bytes < dev.granularity / 2) {
    // Too small to map on its own: the driver's allocator, charged, kept.
    b->reserved = AlignUp(bytes, kSmallUnit);
    if (CUresult r = MakeRoom(dev, b->reserved); r != CUDA_SUCCESS) return r;
    TrimDriverPool(dev);
    CUresult r;
    while ((r = driver_->cuMemAlloc_v2(&b->base, bytes)) == CUDA_ERROR_OUT_OF_MEMORY) {
      if (!EvictByPolicy(dev, b->reserved)) {  // the device is full
        LogOom(dev, b->reserved);
        return r;
      }
    }
    if (r != CUDA_SUCCESS) return r;
    Charge(dev, b->reserved);
  } else {
    b->vmm = true;
    b->reserved = AlignUp(bytes, dev.granularity);
    // Room is made (or a pooled chunk taken) once the range is reserved.
    if (CUresult r = driver_->cuMemAddressReserve(&b->base, b->reserved, 0, 0, 0);
        r != CUDA_SUCCESS) {
      return r;
    }
    b->va_reserved = true;
    if (CUresult r = MapDevice(dev, *b); r != CUDA_SUCCESS) {
      if (!stuck_.empty() && stuck_.back().va == b->base && stuck_.back().reserved == 0) {
        stuck_.back().reserved = b->reserved;  // freed once unmapped
      } else {
        // A range that cannot be freed is only address space lost; the
        // program sees why its allocation failed.
        (void)Failed(driver_->cuMemAddressFree(b->base, b->reserved));
      }
      return r;
    }
  }
  *dptr = b->base;
  b->serial = ++serial_;
  // Named by the registry's id from here on, before any other thread can
  // see it (the lock is held).
  b->id = register_id(b->base);
  b->key = b->id != 0 && b->id < kUntrackedKeys ? b->id : kUntrackedKeys + ++untracked_;
  if (b->key != b->id) b->id = 0;
  Buffer& added = *b;
  by_base_[added.base] = &added;
  buffers_[added.key] = std::move(b);
  Reindex(added);
  if (stream_ordered) {
    added.stream_ordered = true;
    StreamOrderedUsage& u = dev.stream_ordered;
    u.used += added.size;
    u.reserved += added.reserved;
    u.used_high = std::max(u.used_high, u.used);
    u.reserved_high = std::max(u.reserved_high, u.reserved);
  }
  return CUDA_SUCCESS;
}

MemoryManager::StreamOrderedUsage MemoryManager::StreamOrdered(int device) {
  MutexLock lock(&mu_);
  CollectGarbage();  // freed buffers whose free ran hold no memory any more
  return DeviceState(device).stream_ordered;
}

void MemoryManager::ResetStreamOrderedHigh(int device, bool used, bool reserved) {
  MutexLock lock(&mu_);
  StreamOrderedUsage& u = DeviceState(device).stream_ordered;
  if (used) u.used_high = u.used;
  if (reserved) u.reserved_high = u.reserved;
}

uint64_t MemoryManager::ReleaseIdlePooled(int device, uint64_t keep) {
  MutexLock lock(&mu_);
  CollectGarbage();
  Device& dev = DeviceState(device);
  uint64_t released = 0;
  while (dev.pool.bytes() > keep && ReleaseOnePooled(dev)) released += dev.granularity;
  return released;
}

bool MemoryManager::Swappable(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return false;
  MutexLock lock(&mu_);
  const Device& dev = DeviceState(ordinal);
  return dev.granularity != 0 && bytes >= dev.granularity / 2 && bytes <= dev.cap;
}

CUresult MemoryManager::ReserveExternal(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (CUresult r = driver_->cuCtxGetDevice(&ordinal); r != CUDA_SUCCESS) return r;
  MutexLock lock(&mu_);
  Device& dev = DeviceState(ordinal);
  if (bytes > dev.cap) {  // never fits; AlignUp would wrap
    LogOom(dev, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uint64_t charge = AlignUp(bytes, kSmallUnit);
  if (CUresult r = MakeRoom(dev, charge); r != CUDA_SUCCESS) return r;
  Charge(dev, charge);
  return CUDA_SUCCESS;
}

void MemoryManager::UnreserveExternal(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
  MutexLock lock(&mu_);
  if (bytes > DeviceState(ordinal).cap) return;  // never charged
  DeviceState(ordinal).used -= AlignUp(bytes, kSmallUnit);
}

void MemoryManager::AdoptExternal(CUdeviceptr base, uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
  MutexLock lock(&mu_);
  external_[base] = {ordinal, AlignUp(bytes, kSmallUnit)};
}

void MemoryManager::ForgetExternal(CUdeviceptr base) {
  MutexLock lock(&mu_);
  auto it = external_.find(base);
  if (it == external_.end()) return;
  DeviceState(it->second.first).used -= it->second.second;
  external_.erase(it);
}

void MemoryManager::ForgetExternalAsync(CUdeviceptr base, CUstream stream) {
  MutexLock lock(&mu_);
  auto it = external_.find(base);
  if (it == external_.end()) return;
  ExternalFree& f = external_frees_.emplace_back();
  f.device = it->second.first;
  f.bytes = it->second.second;
  external_.erase(it);
  // Unrecorded (a failed create or record): settled by a wait for the
  // stream's whole context, still in stream order.
  NoteUse(f.uses, stream, f.device);
  // Settled when room is needed or cuMemGetInfo asks; here too once a few
  // are pending, so a program that never runs short keeps no more than
  // that many events.
  if (external_frees_.size() >= kSettleExternalFrees) {
    (void)SettleExternalFrees(f.device, /*wait=*/false);
  }
}

bool MemoryManager::SettleExternalFrees(int device, bool wait) {
  bool settled = false;
  for (auto it = external_frees_.begin(); it != external_frees_.end();) {
    ExternalFree& f = *it;
    bool done = f.waiters == 0;
    for (Use& u : f.uses) done = done && Observed(u);
    if (!done) {
      ++it;
      continue;
    }
    DeviceState(f.device).used -= f.bytes;
    for (const Use& u : f.uses) {
      if (u.event != nullptr) (void)Failed(driver_->cuEventDestroy_v2(u.event));
    }
    settled |= f.device == device;
    it = external_frees_.erase(it);
  }
  if (settled || !wait || no_block_) return settled;
  for (ExternalFree& f : external_frees_) {
    if (f.device != device || f.waiters > 0) continue;
    // Without the lock (the stream may wait for another thread's next
    // launch); the entry and its events stay while it is waited for.
    ++f.waiters;
    std::vector<Use> uses = f.uses;
    const CUstream swap_stream = DeviceState(device).swap_stream;
    auto start = std::chrono::steady_clock::now();
    mu_.Unlock();
    std::vector<CUresult> results;
    for (const Use& u : uses) results.push_back(WaitForUse(u, swap_stream));
    mu_.Lock();
    --f.waiters;
    const double waited = Seconds(std::chrono::steady_clock::now() - start);
    stats_.host_wait_seconds += waited;
    stats_.wait_program_seconds += waited;
    for (size_t i = 0; i < uses.size() && i < f.uses.size(); ++i) {
      if (Failed(results[i]) == CUDA_SUCCESS) f.uses[i].done = true;
    }
    (void)SettleExternalFrees(device, /*wait=*/false);
    return true;  // callers look again
  }
  return false;
}

bool MemoryManager::Owns(CUdeviceptr base) const {
  MutexLock lock(&mu_);
  return by_base_.count(base) != 0;
}

CUresult MemoryManager::Free(CUdeviceptr base) {
  MutexLock lock(&mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end()) return CUDA_ERROR_INVALID_VALUE;
  Buffer& b = *it->second;
  if (b.garbage) return CUDA_ERROR_INVALID_VALUE;  // freed twice
  Device& dev = DeviceState(b.device);
  b.garbage = true;
  if (b.stream_ordered) DeviceState(b.device).stream_ordered.used -= b.size;
  if (planner_ != nullptr) planner_->OnFreed(b.id);
  Reindex(b);  // out of the eviction order
  // A release the driver refused is retried as garbage.
  if (b.pins > 0 || !Idle(b) || !ReleaseBuffer(dev, b)) {
    garbage_.push_back(&b);  // released once its work completed, or at S404
  }
  return CUDA_SUCCESS;
}

CUresult MemoryManager::FreeAsync(CUdeviceptr base, CUstream stream) {
  MutexLock lock(&mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end()) return CUDA_ERROR_INVALID_VALUE;
  Buffer& b = *it->second;
  if (b.garbage) return CUDA_ERROR_INVALID_VALUE;  // freed twice
  // The free's place in `stream`: a use recorded there.
  // A use that could not be recorded is not idle until a host wait for the
  // stream (or the context) has observed it (WaitForUse): still stream order.
  NoteUse(b.uses, stream, b.device);
  b.garbage = true;
  if (b.stream_ordered) DeviceState(b.device).stream_ordered.used -= b.size;
  if (planner_ != nullptr) planner_->OnFreed(b.id);
  Reindex(b);  // out of the eviction order
  // A release the driver refused is retried as garbage.
  if (b.pins > 0 || !Idle(b) || !ReleaseBuffer(DeviceState(b.device), b)) {
    garbage_.push_back(&b);  // released once the stream passed the free (S404)
  }
  return CUDA_SUCCESS;
}

MemoryManager::Buffer* MemoryManager::Containing(uint64_t addr) const {
  auto it = by_base_.upper_bound(addr);
  if (it == by_base_.begin()) return nullptr;
  --it;
  Buffer* b = it->second;
  return b->vmm && addr - b->base < b->reserved ? b : nullptr;
}

std::optional<MemoryManager::BufferView> MemoryManager::Find(CUdeviceptr addr) const {
  MutexLock lock(&mu_);
  const Buffer* b = Containing(addr);
  if (b == nullptr) return std::nullopt;
  return BufferView{b->base, b->size, b->reserved, b->device, b->context, b->id, b->garbage};
}

CUresult MemoryManager::CheckRange(uint64_t addr, uint64_t extent) const {
  if (extent == 0) return CUDA_SUCCESS;
  MutexLock lock(&mu_);
  const Buffer* b = Containing(addr);
  if (b == nullptr) return CUDA_SUCCESS;  // not ours: the driver checks it
  uint64_t offset = addr - b->base;
  if (b->garbage || offset >= b->size || extent > b->size - offset) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// --- Handles that leave stensor's control -----------------------------------------

CUresult MemoryManager::PinLocked(Buffer& b, const char* api) {
  ReindexAtExit reindex(this, b);
  bool first = !b.exported;
  b.exported = true;  // from now on no eviction chooses it
  Device& dev = DeviceState(b.device);
  if (!b.resident() || b.stale_device) {
    ++b.pins;
    CUresult r = b.resident() ? RestoreFromHost(dev, b) : SwapIn(dev, b, /*copy=*/true,
                                                                 /*consumer=*/nullptr);
    --b.pins;
    if (r != CUDA_SUCCESS) {
      if (first) b.exported = false;  // still swapped out: a later call tries again
      return r;
    }
  }
  // Synchronously: whoever gets the handle reads the memory directly. The
  // swap-in's copy is the buffer's use on a stream of stensor's; wait for it
  // without the lock (the pin keeps the buffer and its uses alive).
  // Copied first: another thread may add uses (reallocating b.uses) while
  // the lock is released.
  const std::vector<Use> copies = PendingOwnUses(dev, b);
  for (const Use& copy : copies) {
    ++b.pins;
    mu_.Unlock();
    CUresult w = WaitForUse(copy, copy.stream);
    mu_.Lock();
    --b.pins;
    if (Failed(w) != CUDA_SUCCESS) return w;
    for (Use& v : b.uses) {
      if (SameStream(v, copy) && v.seq == copy.seq) v.done = true;
    }
  }
  if (first) {
    Log(JsonLine()
            .Str("type", "pin")
            .Str("api", api)
            .Uint("id", b.id)
            .Uint("bytes", b.size)
            .Int("device", b.device)
            .Finish());
    if (config_.log_level <= LogLevel::kWarn) {
      std::fprintf(stderr,
                   "stensor [warning] buffer %llu (%llu bytes at 0x%llx) stays on the "
                   "device for good: %s hands its memory out of stensor's control\n",
                   static_cast<unsigned long long>(b.id),
                   static_cast<unsigned long long>(b.size),
                   static_cast<unsigned long long>(b.base), api);
    }
  }
  return CUDA_SUCCESS;
}

bool MemoryManager::PinExported(CUdeviceptr addr, const char* api, CUresult* result) {
  MutexLock lock(&mu_);
  Buffer* b = Containing(addr);
  if (b == nullptr || b->garbage) return false;
  *result = PinLocked(*b, api);
  return true;
}

bool MemoryManager::PinExportedHandle(CUmemGenericAllocationHandle handle,
                                      const char* api) {
  MutexLock lock(&mu_);
  for (auto& [base, b] : by_base_) {
    // A handle is only ever the current device memory of a resident buffer.
    if (b->vmm && handle != 0 &&
        std::find(b->device_chunks.begin(), b->device_chunks.end(), handle) !=
            b->device_chunks.end()) {
      // Resident already; a failure (a stale device copy not restored) is
      // still a pin, retried by the next pinning call.
      (void)PinLocked(*b, api);
      return true;
    }
  }
  return false;
}

// --- The program's own VMM memory --------------------------------------------------

CUresult MemoryManager::CreateAppMemory(CUmemGenericAllocationHandle* handle, size_t size,
                                        const CUmemAllocationProp* prop,
                                        unsigned long long flags) {
  bool device_located = prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  if (!device_located || handle == nullptr || size == 0) {
    return driver_->cuMemCreate(handle, size, prop, flags);  // host memory, or the driver's error
  }
  int ordinal = prop->location.id;
  int count = 0;
  if (driver_->cuDeviceGetCount(&count) != CUDA_SUCCESS || ordinal < 0 || ordinal >= count) {
    return driver_->cuMemCreate(handle, size, prop, flags);  // the driver's error
  }
  {
    MutexLock lock(&mu_);
    Device& dev = DeviceState(ordinal);
    if (dev.granularity != 0 && size % dev.granularity != 0) {
      return driver_->cuMemCreate(handle, size, prop, flags);  // INVALID_VALUE, nothing evicted
    }
    if (CUresult r = MakeRoom(dev, size); r != CUDA_SUCCESS) return r;
    Charge(dev, size);
  }
  // Outside the lock: the charge holds the room meanwhile.
  CUresult r = driver_->cuMemCreate(handle, size, prop, flags);
  MutexLock lock(&mu_);
  // The device itself may be full below the cap (other processes): evict
  // and retry while anything is left, as for stensor's own memory.
  while (r == CUDA_ERROR_OUT_OF_MEMORY && EvictByPolicy(DeviceState(ordinal), size)) {
    r = driver_->cuMemCreate(handle, size, prop, flags);
  }
  if (r != CUDA_SUCCESS) {
    DeviceState(ordinal).used -= size;
    if (r == CUDA_ERROR_OUT_OF_MEMORY) LogOom(DeviceState(ordinal), size);
    return r;
  }
  app_handles_[*handle] = AppHandle{ordinal, size, 1, 0};
  return CUDA_SUCCESS;
}

void MemoryManager::MaybeUnchargeApp(CUmemGenericAllocationHandle handle) {
  auto it = app_handles_.find(handle);
  if (it == app_handles_.end() || it->second.refs > 0 || it->second.mappings > 0) return;
  DeviceState(it->second.device).used -= it->second.bytes;
  app_handles_.erase(it);
}

void MemoryManager::OnAppRetain(CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = app_handles_.find(handle);
  if (it != app_handles_.end()) ++it->second.refs;
}

void MemoryManager::OnAppRelease(CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = app_handles_.find(handle);
  if (it == app_handles_.end()) return;
  --it->second.refs;
  MaybeUnchargeApp(handle);
}

void MemoryManager::OnAppMap(CUdeviceptr ptr, uint64_t size,
                             CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = app_handles_.find(handle);
  if (it == app_handles_.end()) return;
  ++it->second.mappings;
  app_mappings_[ptr] = {size, handle};
}

void MemoryManager::OnAppUnmap(CUdeviceptr ptr, uint64_t size) {
  MutexLock lock(&mu_);
  // The driver unmaps whole mappings only, so each starts inside the range.
  for (auto it = app_mappings_.lower_bound(ptr);
       it != app_mappings_.end() && it->first < ptr + size;) {
    CUmemGenericAllocationHandle handle = it->second.second;
    it = app_mappings_.erase(it);
    auto h = app_handles_.find(handle);
    if (h == app_handles_.end()) continue;
    --h->second.mappings;
    MaybeUnchargeApp(handle);
  }
}

void MemoryManager::TrimDriverPool(Device& dev) {
  dev.driver_pool.Trim(*driver_, dev.ordinal, &stats_.driver_errors);
}

CUresult MemoryManager::CreatePhysical(Device& dev, uint64_t bytes,
                                       CUmemGenericAllocationHandle* handle) {
  TrimDriverPool(dev);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev.ordinal;
  CUresult r;
  // The device itself may be full below the cap: the same loop applies.
  // (Fresh physical memory is what a never-written buffer holds: zeros on
  // the fake, as cuMemAlloc's; undefined on a GPU, as cuMemAlloc's.)
  while ((r = driver_->cuMemCreate(handle, bytes, &prop, 0)) == CUDA_ERROR_OUT_OF_MEMORY) {
    if (ReleaseOnePooled(dev)) continue;
    if (!EvictByPolicy(dev, bytes)) {
      LogOom(dev, bytes);  // the device itself is full
      return r;
    }
  }
  if (Failed(r) != CUDA_SUCCESS) return r;
  ++stats_.physical_creates;
  Charge(dev, bytes);
  return CUDA_SUCCESS;
}

void MemoryManager::ReleasePhysical(Device& dev, CUmemGenericAllocationHandle handle,
                                    uint64_t bytes) {
  if (Failed(driver_->cuMemRelease(handle)) == CUDA_SUCCESS) {
    dev.used -= bytes;
    ++stats_.physical_releases;
  } else {
    unreleased_.push_back({dev.ordinal, handle, bytes});  // still held: still charged
  }
}

void MemoryManager::RetryReleases() {
  for (size_t i = 0; i < stuck_.size();) {
    StuckMapping& m = stuck_[i];
    if (m.mapped != 0 && vmm_.Unmap(m.va, m.mapped) != CUDA_SUCCESS) {
      ++i;
      continue;
    }
    m.mapped = 0;
    Device& dev = DeviceState(m.device);
    for (CUmemGenericAllocationHandle h : m.chunks) ReleasePhysical(dev, h, dev.granularity);
    if (m.reserved != 0) (void)Failed(driver_->cuMemAddressFree(m.va, m.reserved));
    stuck_.erase(stuck_.begin() + i);
  }
  for (size_t i = 0; i < unreleased_.size();) {
    if (Failed(driver_->cuMemRelease(unreleased_[i].handle)) == CUDA_SUCCESS) {
      DeviceState(unreleased_[i].device).used -= unreleased_[i].bytes;
      ++stats_.physical_releases;
      unreleased_.erase(unreleased_.begin() + i);
    } else {
      ++i;
    }
  }
}

// --- The physical pool ------------------------------------------------------------
//
// Granule-sized chunks: a buffer is mapped from as many chunks as its
// reserved size holds, at consecutive offsets, so memory freed by any buffer
// serves any other, whatever the sizes (the transformer's per-step
// temporaries, a swap-in replacing a smaller victim). The pool is bounded by
// the cap itself: its chunks stay charged, the swap path takes them before
// making room, and everything else that needs room (small allocations, the
// program's own VMM memory) releases them first, so pooling never costs an
// eviction.

size_t MemoryManager::TakePooled(Device& dev, size_t n,
                                 std::vector<CUmemGenericAllocationHandle>* chunks,
                                 bool* shadowed) {
  // Chunks of freed buffers are handed on first: their owners never come
  // back for them (a buffer that does waits on the host for its old copy).
  absl::flat_hash_set<CUmemGenericAllocationHandle> freed;
  for (const Buffer* o : dev.old_mappings) {
    if (o->garbage) freed.insert(o->old_chunks.begin(), o->old_chunks.end());
  }
  std::vector<CUmemGenericAllocationHandle> handed;
  const size_t taken = dev.pool.Take(n, chunks, &handed, &freed);
  for (CUmemGenericAllocationHandle h : handed) {
    *shadowed = true;
    // Its old owner can no longer take it back (its contents will change).
    for (Buffer* o : dev.old_mappings) {
      if (std::find(o->old_chunks.begin(), o->old_chunks.end(), h) != o->old_chunks.end()) {
        o->handed_on = true;
      }
    }
  }
  stats_.pooled_bytes -= taken * dev.granularity;
  stats_.pool_hits += taken;
  return taken;
}

void MemoryManager::PoolPhysical(Device& dev, CUmemGenericAllocationHandle handle) {
  dev.pool.Put(handle);
  stats_.pooled_bytes += dev.granularity;
}

void MemoryManager::PoolChunks(Device& dev, std::vector<CUmemGenericAllocationHandle>* chunks) {
  stats_.pooled_bytes += chunks->size() * dev.granularity;
  dev.pool.PutAll(chunks);
}

bool MemoryManager::ReleaseOnePooled(Device& dev) {
  std::optional<CUmemGenericAllocationHandle> h = dev.pool.TakeIdle();
  if (!h) return false;
  stats_.pooled_bytes -= dev.granularity;
  ReleasePhysical(dev, *h, dev.granularity);  // a failure is retried, still charged
  return true;
}

CUresult MemoryManager::AcquireChunks(Device& dev, size_t n, bool reuse,
                                      std::vector<CUmemGenericAllocationHandle>* chunks,
                                      bool* pooled, bool* shadowed) {
  chunks->clear();
  *pooled = false;
  *shadowed = false;
  if (reuse) *pooled = TakePooled(dev, n, chunks, shadowed) > 0;
  if (chunks->size() < n) {
    // Room for the rest; evictions meanwhile feed the pool, which counts.
    if (CUresult r = MakeRoom(dev, (n - chunks->size()) * dev.granularity, reuse);
        r != CUDA_SUCCESS) {
      PoolChunks(dev, chunks);
      return r;
    }
    if (reuse && TakePooled(dev, n - chunks->size(), chunks, shadowed) > 0) *pooled = true;
  }
  while (chunks->size() < n) {
    CUmemGenericAllocationHandle h = 0;
    if (CUresult r = CreatePhysical(dev, dev.granularity, &h); r != CUDA_SUCCESS) {
      PoolChunks(dev, chunks);
      return r;
    }
    chunks->push_back(h);
  }
  return CUDA_SUCCESS;
}

void MemoryManager::ReleaseAllPooled() {
  for (auto& d : devices_) {
    if (!d) continue;
    while (ReleaseOnePooled(*d)) {
    }
  }
}

void MemoryManager::EndShadow(Device& dev, Buffer& b) {
  if (!b.old_mapped) return;
  b.old_mapped = false;
  b.handed_on = false;
  for (CUmemGenericAllocationHandle h : b.old_chunks) dev.pool.Unshadow(h);
  b.old_chunks.clear();
  auto it = std::find(dev.old_mappings.begin(), dev.old_mappings.end(), &b);
  if (it != dev.old_mappings.end()) dev.old_mappings.erase(it);
}

bool MemoryManager::EndOldMapping(Device& dev, Buffer& b) {
  if (vmm_.Unmap(b.base, b.reserved) != CUDA_SUCCESS) return false;
  EndShadow(dev, b);
  // Never fault: the address reads the host copy from now on (a freed
  // buffer's address is read by nothing).
  if (!b.garbage && b.host.vmm() && MapHostAtBase(b) != CUDA_SUCCESS) {
    if (b.host_at_base && vmm_.Unmap(b.base, b.reserved) == CUDA_SUCCESS) {
      b.host_at_base = false;
    }
    Log(JsonLine()
            .Str("type", "limitation")
            .Str("what", "the host copy could not be mapped at a swapped-out "
                         "buffer's address")
            .Uint("id", b.id)
            .Finish());
  }
  return true;
}

bool MemoryManager::ReapOldMappings(Device& dev, bool wait, double* waited) {
  if (dev.old_mappings.empty()) return false;
  if (wait && WaitSwapStream(dev, waited) != CUDA_SUCCESS) return false;
  bool any = false;
  // Copy: ending one edits the list (and the wait released the lock).
  std::vector<Buffer*> pending = dev.old_mappings;
  for (Buffer* b : pending) {
    bool observed = false;
    for (Use& u : b->uses) {
      if (u.stream == dev.swap_stream) observed = Observed(u);
    }
    if (observed && EndOldMapping(dev, *b)) any = true;
  }
  return any;
}

void MemoryManager::SettleOldMappings(int device) {
  Device& dev = DeviceState(device);
  while (!dev.old_mappings.empty() &&
         ReapOldMappings(dev, /*wait=*/true, &stats_.wait_unknown_seconds)) {
  }
}

CUresult MemoryManager::ZeroReused(Device& dev, Buffer& b) {
  if (CUresult r = EnsureSwapStream(dev); r != CUDA_SUCCESS) return r;
  if (CUresult r = Failed(driver_->cuMemsetD8Async(b.base, 0, b.reserved, dev.swap_stream));
      r != CUDA_SUCCESS) {
    return r;
  }
  // Consumers wait for it (OrderAfterSwap), as for a swap-in's copy.
  NoteUse(b.uses, dev.swap_stream, dev.ordinal);
  return CUDA_SUCCESS;
}

CUresult MemoryManager::MapDevice(Device& dev, Buffer& b) {
  // Pooled chunks first; fresh memory for the rest, or for all of it when
  // zeroing reused chunks failed.
  const size_t n = b.reserved / dev.granularity;
  for (bool reuse = true;; reuse = false) {
    std::vector<CUmemGenericAllocationHandle> chunks;
    bool pooled = false, shadowed = false;
    if (CUresult r = AcquireChunks(dev, n, reuse, &chunks, &pooled, &shadowed);
        r != CUDA_SUCCESS) {
      return r;
    }
    bool mapped = false;
    uint64_t left_mapped = 0;
    if (CUresult r = vmm_.Map(b.base, chunks, dev.granularity, dev.ordinal, &mapped, &left_mapped);
        r != CUDA_SUCCESS) {
      if (mapped) {
        // The undo failed too: the chunks stay charged (what is mapped is
        // held) until a later retry unmaps them.
        stuck_.push_back({dev.ordinal, b.base, left_mapped, 0, std::move(chunks)});
      } else {
        PoolChunks(dev, &chunks);
      }
      return r;
    }
    b.device_chunks = std::move(chunks);
    // Fresh memory holds zeros on the fake (as cuMemAlloc's); reused chunks
    // are zeroed on the swap stream, after whatever their last owners
    // queued there, and the buffer's first user waits for that.
    if (!pooled) return CUDA_SUCCESS;
    CUresult r = ZeroReused(dev, b);
    if (r == CUDA_SUCCESS) return CUDA_SUCCESS;
    if (vmm_.Unmap(b.base, b.reserved) != CUDA_SUCCESS) {
      return r;  // mapped and holding old contents: the allocation fails
    }
    PoolChunks(dev, &b.device_chunks);
  }
}

bool MemoryManager::ReleaseHostCopy(Device& dev, Buffer& b) {
  // A whole copy is kept for the next buffer of its size and device (a
  // step's temporaries swapped out and freed would otherwise cost a
  // cuMemCreate and a cuMemRelease each, every step). Host-located VMM
  // copies are kept up to a device cap's worth; pinned ones always, since
  // freeing them synchronises (see spare_host_).
  const bool whole = b.host.vmm() || (b.host.ptr() != nullptr && b.host.handle() == 0);
  if (whole && (!b.host.vmm() || dev.spare_host_bytes + b.reserved <= dev.cap)) {
    if (b.host.vmm()) dev.spare_host_bytes += b.reserved;
    spare_host_.emplace(std::make_pair(b.reserved, dev.ordinal), b.host);
    b.host = HostCopy();
    return true;
  }
  return b.host.Release(vmm_, b.reserved, &dev.host_bytes);
}

bool MemoryManager::FreeSpareHostCopies() {
  bool freed = false;
  for (auto it = spare_host_.begin(); it != spare_host_.end();) {
    const auto [reserved, ordinal] = it->first;
    Device& dev = DeviceState(ordinal);
    const bool vmm = it->second.vmm();
    if (!it->second.Release(vmm_, reserved, &dev.host_bytes)) {
      ++it;  // kept (still counted) for a later attempt
      continue;
    }
    if (vmm) dev.spare_host_bytes -= reserved;
    it = spare_host_.erase(it);
    freed = true;
  }
  return freed;
}

bool MemoryManager::ReleaseBuffer(Device& dev, Buffer& b) {
  // Each step is recorded as it succeeds, so a retry goes on from there.
  if (!b.vmm) {
    if (Failed(driver_->cuMemFree_v2(b.base)) != CUDA_SUCCESS) return false;
    dev.used -= b.reserved;
  } else {
    if (!b.device_chunks.empty() || b.host_at_base || b.old_mapped) {
      if (vmm_.Unmap(b.base, b.reserved) != CUDA_SUCCESS) return false;
      b.host_at_base = false;
      if (b.exported) {
        // The program may still hold a retained handle to this memory:
        // never hand it to another buffer (the driver keeps it alive for
        // that handle; it is the program's now, and no longer charged).
        for (CUmemGenericAllocationHandle h : b.device_chunks) {
          ReleasePhysical(dev, h, dev.granularity);
        }
        b.device_chunks.clear();
      } else {
        PoolChunks(dev, &b.device_chunks);
      }
      EndShadow(dev, b);  // released only once idle: its swap-out copy is done
    }
    if (b.va_reserved) {
      if (Failed(driver_->cuMemAddressFree(b.base, b.reserved)) != CUDA_SUCCESS) return false;
      b.va_reserved = false;
    }
    if (!ReleaseHostCopy(dev, b)) return false;
  }
  // A failed destroy leaks one event; nothing depends on it any more.
  for (const Use& u : b.uses) {
    if (u.event != nullptr) (void)Failed(driver_->cuEventDestroy_v2(u.event));
  }
  Unindex(b);
  if (b.garbage) {
    auto g = std::find(garbage_.begin(), garbage_.end(), &b);
    if (g != garbage_.end()) garbage_.erase(g);
  }
  const uint64_t key = b.key;
  if (b.stream_ordered) dev.stream_ordered.reserved -= b.reserved;
  by_base_.erase(b.base);
  buffers_.erase(key);  // destroys b
  return true;
}

// --- S401-S405 --------------------------------------------------------------------

void MemoryManager::LogOom(Device& dev, uint64_t need) {
  ++stats_.ooms;
  Log(JsonLine()
          .Str("type", "oom")
          .Int("device", dev.ordinal)
          .Uint("bytes", need)
          .Uint("used", dev.used)
          .Uint("cap", dev.cap)
          .Finish());
}

CUresult MemoryManager::MakeRoom(Device& dev, uint64_t need, bool pool_counts) {
  if (need > dev.cap) {  // evicting everything would not make it fit
    LogOom(dev, need);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ++round_;  // buffers that failed to go before may go now
  if (!unreleased_.empty() || !stuck_.empty()) RetryReleases();
  CUresult error = CUDA_SUCCESS;
  for (;;) {
    ReapOldMappings(dev, /*wait=*/false);
    // Written so that no sum can wrap, whatever `need` is. With
    // `pool_counts` the caller takes pooled chunks (charged already), even
    // those still mapped at old addresses (its work is ordered after theirs
    // on the swap stream): only the rest must fit.
    const uint64_t fresh = pool_counts ? need - std::min(need, dev.pool.bytes()) : need;
    if (dev.used <= dev.cap - fresh) return CUDA_SUCCESS;                  // S401/S402
    if (!pool_counts) {
      if (ReleaseOnePooled(dev)) continue;  // pooled chunks go first
      // What is pooled is still mapped at old addresses whose swap-out
      // copies are in flight: it is becoming free, so wait for it rather
      // than evict more.
      if (dev.pool.bytes() > 0 && dev.used - dev.pool.bytes() <= dev.cap - need) {
        if (no_block_) return CUDA_ERROR_NOT_READY;  // it comes, but not without a wait
        if (ReapOldMappings(dev, /*wait=*/true)) continue;
      }
    }
    // Driver allocations freed in stream order whose free has run.
    if (!external_frees_.empty() && SettleExternalFrees(dev.ordinal, false)) continue;
    if (version_policy_ && DropOneClean(dev, &error)) continue;           // S403
    if (ReleaseGarbage(dev, /*wait=*/false, &error)) continue;            // S404
    if (ReleaseGarbage(dev, /*wait=*/true, &error)) continue;
    if (!external_frees_.empty() && SettleExternalFrees(dev.ordinal, true)) continue;
    if (EvictByPolicy(dev, dev.used - (dev.cap - need), &error)) continue;  // S405
    if (!spend_prefetched_) {
      // Last, what was fetched ahead of its use (not while prefetching:
      // a fetch never evicts another's).
      if (no_block_) return CUDA_ERROR_NOT_READY;
      spend_prefetched_ = true;
      const bool evicted = (version_policy_ && DropOneClean(dev, &error)) ||
                           EvictByPolicy(dev, dev.used - (dev.cap - need), &error);
      spend_prefetched_ = false;
      if (evicted) continue;
    }
    if (!pool_counts && dev.pool.bytes() > 0 && ReapOldMappings(dev, /*wait=*/true)) continue;
    // Nothing was left to evict, or what was left could not be evicted
    // because the driver failed: then that is the error to see.
    if (error != CUDA_SUCCESS) return error;
    LogOom(dev, need);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

bool MemoryManager::Droppable(const Buffer& b) const {
  return b.stale_device || b.clean() || (version_policy_ && !b.written);
}

bool MemoryManager::DropOneClean(Device& dev, CUresult* error) {
  // The least recently used droppable buffer not pinned (those are few:
  // an operation's own buffers) nor failed in this round.
  Buffer* pick = nullptr;
  for (auto& [key, b] : dev.droppable) {
    if (b->pins > 0 || b->failed_round == round_ || (!CanQueue(dev) && !Idle(*b)) ||
        (b->prefetched && !spend_prefetched_)) {
      continue;
    }
    pick = b;
    break;
  }
  if (pick == nullptr) return false;
  CUresult r = SwapOut(dev, *pick, /*copy=*/false);
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) r = WaitIdle(*pick);  // not orderable on the device
  if (r == CUDA_SUCCESS) return true;  // unlocked: look again
  pick->failed_round = round_;
  if (error != nullptr) *error = r;
  return true;  // look again: the next clean buffer, or the next step
}

bool MemoryManager::ReleaseGarbage(Device& dev, bool wait, CUresult* error) {
  if (garbage_.empty()) return false;
  for (Buffer* b : garbage_) {
    if (b->device != dev.ordinal || !b->garbage || b->pins > 0 ||
        b->failed_round == round_) {
      continue;
    }
    if (!Idle(*b)) {
      // Its memory is free in stream order: handed on (below) rather than
      // waited for.
      if (!wait) {
        if (QueueGarbage(dev, *b)) return true;
        continue;
      }
      // Unlocks: the caller looks again.
      if (CUresult r = WaitIdle(*b); r != CUDA_SUCCESS) {
        b->failed_round = round_;
        if (error != nullptr) *error = r;
      }
      return true;
    }
    uint64_t used = dev.used - dev.pool.bytes();  // what the pool holds is as good as free
    Buffer& g = *b;
    if (ReleaseBuffer(dev, g)) {
      ++stats_.garbage_released;
      return true;
    }
    // Partly released, perhaps: progress if its device memory went.
    g.failed_round = round_;
    if (dev.used - dev.pool.bytes() < used) return true;
  }
  return false;
}

bool MemoryManager::QueueGarbage(Device& dev, Buffer& b) {
  if (!b.vmm || b.device_chunks.empty() || b.old_mapped || b.host_at_base ||
      !CanQueue(dev) || EnsureSwapStream(dev) != CUDA_SUCCESS ||
      !OrderSwapAfterUses(dev, b)) {
    return false;
  }
  // The swap stream's point after the buffer's last uses: whoever takes its
  // chunks works after it there; its address is unmapped once it is seen.
  NoteUse(b.uses, dev.swap_stream, dev.ordinal);
  for (const Use& u : b.uses) {
    if (u.stream == dev.swap_stream && !u.recorded) return false;  // not observable
  }
  DetachShadowed(dev, b);
  return true;
}

void MemoryManager::CollectGarbage() {
  if (garbage_.empty()) return;
  std::vector<Buffer*> garbage = garbage_;  // a release edits the list
  for (Buffer* b : garbage) {
    if (b->pins > 0 || !Idle(*b)) continue;
    if (!ReleaseBuffer(DeviceState(b->device), *b)) continue;  // retried later
    ++stats_.garbage_released;
  }
}

bool MemoryManager::EvictByPolicy(Device& dev, uint64_t needed, CUresult* error) {
  (void)needed;  // one at a time: the caller re-checks the cap after each
  // The first in the policy's order not pinned (those are few: the buffers
  // of operations being prepared) nor failed in this round.
  Buffer* pick = nullptr;
  for (auto& [key, b] : dev.evictable) {
    if (b->pins > 0 || b->failed_round == round_ || (b->prefetched && !spend_prefetched_)) {
      continue;
    }
    pick = b;
    break;
  }
  if (pick == nullptr) return false;
  const bool copies = policy_->Copies(CandidateOf(*pick));
  const Eviction chosen[] = {{pick->id, copies}};
  std::vector<Buffer*> buffers = {pick};
  // One at a time: the caller re-checks the cap after each. A swap-out that
  // fails (the host limit, a driver error) is skipped in the next look.
  for (const Eviction& e : chosen) {
    Buffer& b = *buffers[0];
    if (!CanQueue(dev) && !Idle(b)) {
      // Unlocks: the caller looks again, from the start (without this
      // buffer, if its work could not be observed complete).
      if (CUresult r = WaitIdle(b); r != CUDA_SUCCESS) {
        b.failed_round = round_;
        if (error != nullptr) *error = r;
      }
      return true;
    }
    CUresult r = SwapOut(dev, b, e.copy || !Droppable(b));
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_NOT_READY) {
      // Its work could not be ordered on the device: wait on the host.
      if (r = WaitIdle(b); r != CUDA_SUCCESS) {
        b.failed_round = round_;
        if (error != nullptr) *error = r;
      }
      return true;
    }
    // Look again without it: the policy chose only as much as was needed.
    b.failed_round = round_;
    if (error != nullptr && r != CUDA_ERROR_OUT_OF_MEMORY) *error = r;
    return true;
  }
  return false;
}

// --- Swapping ---------------------------------------------------------------------

CUresult MemoryManager::EnsureHostCopy(Buffer& b, bool will_copy) {
  if (b.host.exists()) return CUDA_SUCCESS;
  Device& dev = DeviceState(b.device);
  // What a failed attempt could not undo goes first (or this one fails too).
  if (!ReleaseHostCopy(dev, b)) return CUDA_ERROR_UNKNOWN;
  static const size_t host_total =
      static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::optional<size_t> host_cap = config_.HostLimitBytes(host_total);
  // A kept copy holds an earlier buffer's bytes: one about to be copied
  // into takes it as it is; a never-written buffer's (`will_copy` false)
  // must hold what fresh memory holds, so it is zeroed first on the swap
  // stream, as a use of the buffer there (what reads the address while it
  // is swapped out is ordered after the swap stream).
  if (auto it = spare_host_.find({b.reserved, dev.ordinal});
      it != spare_host_.end() && it->second.vmm() == dev.host_vmm &&
      (will_copy || it->second.vmm())) {
    bool zeroed = will_copy;
    if (!zeroed && EnsureSwapStream(dev) == CUDA_SUCCESS &&
        Failed(driver_->cuMemsetD8Async(it->second.va(), 0, b.reserved, dev.swap_stream)) ==
            CUDA_SUCCESS) {
      NoteUse(b.uses, dev.swap_stream, dev.ordinal);
      zeroed = true;
    }
    if (zeroed) {  // else a fresh copy after all; the spare stays kept
      b.host = it->second;  // still counted in host_bytes
      if (b.host.vmm()) dev.spare_host_bytes -= b.reserved;
      spare_host_.erase(it);
      return CUDA_SUCCESS;
    }
  }
  if (host_cap && dev.host_bytes + b.reserved > *host_cap && !spare_host_.empty()) {
    (void)FreeSpareHostCopies();  // the room is needed (pinned ones: a synchronising free)
  }
  if (host_cap && dev.host_bytes + b.reserved > *host_cap) {
    if (!warned_host_limit_) {
      warned_host_limit_ = true;
      std::fprintf(stderr,
                   "stensor: out of memory: the device cap (STENSOR_MEMORY_LIMIT, %llu "
                   "bytes on device %d) and the host limit (STENSOR_HOST_LIMIT, %zu "
                   "bytes) are both exhausted\n",
                   static_cast<unsigned long long>(dev.cap), dev.ordinal, *host_cap);
    }
    Log(JsonLine()
            .Str("type", "oom")
            .Str("what", "host")
            .Uint("bytes", b.reserved)
            .Uint("host_used", dev.host_bytes)
            .Finish());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!dev.host_vmm && !warned_no_host_vmm_) {
    warned_no_host_vmm_ = true;
    Log(JsonLine()
            .Str("type", "limitation")
            .Str("what", "host-located VMM unsupported: swapped-out buffers are "
                         "unmapped; a kernel reaching one through a pointer "
                         "stensor cannot see would fault")
            .Finish());
  }
  // Page-locked memory from cuMemHostAlloc is pinned for the context that
  // allocated it: the one whose streams copy it (host-located VMM memory
  // belongs to no context).
  ContextScope scope(*driver_, dev.host_vmm ? nullptr : dev.context, &stats_.driver_errors);
  return b.host.Create(vmm_, dev.host_vmm, b.reserved, b.size, b.device, &dev.host_bytes);
}

CUresult MemoryManager::CreateOwnStream(Device& dev, CUstream* stream) {
  ContextScope scope(*driver_, dev.context, &stats_.driver_errors);
  CUresult r = scope.result();
  if (r == CUDA_SUCCESS) r = Failed(driver_->cuStreamCreate(stream, CU_STREAM_NON_BLOCKING));
  if (r != CUDA_SUCCESS) *stream = nullptr;
  // A stream made in the right context stays, even where the program's
  // context could not be made current again (counted as a driver error).
  (void)scope.Restore();
  return r;
}

CUresult MemoryManager::EnsureSwapStream(Device& dev) {
  if (dev.swap_stream != nullptr) return CUDA_SUCCESS;
  return CreateOwnStream(dev, &dev.swap_stream);
}

CUstream MemoryManager::FetchStreamFor(Device& dev, Buffer& b, bool shadowed) {
  // Memory still mapped at an old owner's address has that owner's copy or
  // drop queued on the swap stream, and a use of the buffer not seen done
  // (its own swap-out into the host copy, a zeroing) may be there too: FIFO.
  if (shadowed || dev.fetch_stream_failed) return dev.swap_stream;
  for (Use& u : b.uses) {
    if (!Observed(u)) return dev.swap_stream;
  }
  if (dev.fetch_stream == nullptr && CreateOwnStream(dev, &dev.fetch_stream) != CUDA_SUCCESS) {
    dev.fetch_stream_failed = true;  // not tried at every swap-in
    return dev.swap_stream;
  }
  return dev.fetch_stream;
}

bool MemoryManager::CanQueue(Device& dev) const {
  // Work of unknown accesses may reach any buffer: it holds eviction off.
  // STENSOR_VERIFY checks a drop on the device while it is idle.
  return verifier_ == nullptr && UnknownIdle(dev);
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

void MemoryManager::DetachShadowed(Device& dev, Buffer& b) {
  b.old_chunks = b.device_chunks;
  b.old_mapped = true;
  b.handed_on = false;
  for (CUmemGenericAllocationHandle h : b.old_chunks) dev.pool.Shadow(h);
  dev.old_mappings.push_back(&b);
  PoolChunks(dev, &b.device_chunks);
}

// resident -> swapped out. The steps that can fail come first (host copy,
// the swap stream ordered after the buffer's uses, the copy, the record of
// its completion), the metadata last; on a failure the buffer is still
// resident and consistent. The device memory reaches the pool at once: if
// the copy (or the buffer's last use) is still in flight it stays mapped at
// the buffer's address until that is observed complete (ReapOldMappings),
// and its next user runs after it on the swap stream.
CUresult MemoryManager::SwapOut(Device& dev, Buffer& b, bool copy) {
  ReindexAtExit reindex(this, b);
  const bool idle = Idle(b);
  // Nothing is evicted under pending work that may reach it unless it can
  // be queued behind that work (callers wait otherwise).
  if (!idle && !CanQueue(dev)) return CUDA_ERROR_NOT_READY;
  if (b.stale_device) copy = false;         // the host copy is the data
  if (!copy && !Droppable(b)) copy = true;  // never drop what is dirty
  bool never_written = !copy && !b.stale_device && !b.clean();
  // Never fault: with host-located VMM the address reads the host copy
  // while swapped out, so even a never-written buffer gets one (fresh, or
  // a kept one zeroed: holding what fresh device memory holds; nothing is
  // copied into it).
  if (copy || (never_written && dev.host_vmm)) {
    if (CUresult r = EnsureHostCopy(b, /*will_copy=*/copy); r != CUDA_SUCCESS) return r;
  }
  // STENSOR_VERIFY: a clean drop is checked first; one that fails the check
  // (or cannot be checked) is a copy. (Only idle buffers get here with it.)
  // Never-written buffers have no contents to compare; a stale device copy
  // is not the data.
  if (!copy && !never_written && !b.stale_device && verifier_ != nullptr &&
      !VerifiedClean(dev, b)) {
    copy = true;
  }
  const bool queued = copy || !idle;  // anything on the swap stream
  if (queued) {
    if (CUresult r = EnsureSwapStream(dev); r != CUDA_SUCCESS) return r;
    // A drop too: its memory may still be read by in-flight work, so its
    // next user (on the swap stream) must come after that work.
    if (!idle && !OrderSwapAfterUses(dev, b)) return CUDA_ERROR_NOT_READY;
  }
  if (copy) {
    CUresult r = b.host.CopyFromDevice(vmm_, b.base, b.size, dev.swap_stream);
    if (r != CUDA_SUCCESS) return r;
  }
  bool in_flight = false;
  if (queued) {
    // The copy (or the wait) is a use on the swap stream: the device memory
    // is free once it is observed complete.
    NoteUse(b.uses, dev.swap_stream, dev.ordinal);
    Use* fence = nullptr;
    for (Use& u : b.uses) {
      if (u.stream == dev.swap_stream) fence = &u;
    }
    if (!fence->recorded) {
      // No event tells when it is done: wait for the swap stream on the
      // host. Not observed: still resident, not idle until seen done.
      if (CUresult r = WaitSwapUse(dev, b); r != CUDA_SUCCESS) return r;
      // Unlocked meanwhile: another operation may have used it since.
      if (!b.resident() || b.pins > 0 || !Idle(b)) return CUDA_ERROR_NOT_READY;
    } else {
      in_flight = !Observed(*fence);
    }
  }
  if (copy) {
    b.host_version = b.gpu_version;
    b.location = Location::kCpuGpu;  // a current copy on each side, for now
    if (verifier_ != nullptr) {
      auto verify_start = std::chrono::steady_clock::now();
      // Its kernel runs on the swap stream: in that stream's context.
      ContextScope scope(*driver_, dev.context, &stats_.driver_errors);
      b.host_hash = verifier_->RecordHash(dev.ordinal, b.base, b.size, dev.swap_stream);
      stats_.verify_seconds += Seconds(std::chrono::steady_clock::now() - verify_start);
    }
    ++stats_.swap_outs_copied;
    stats_.bytes_copied_out += b.size;
  }
  if (in_flight) {
    // The address keeps the device memory until the copy is done (the GPU
    // would fault), and the memory goes to its next user in stream order.
    DetachShadowed(dev, b);
    ++stats_.async_evictions;
  } else if (CUresult r = UnmapDevice(dev, b); r != CUDA_SUCCESS) {
    return r;
  }
  b.location = Location::kCpuOnly;
  b.stale_device = false;
  const char* type = "swap_out";
  if (never_written) {
    type = "drop_unwritten";
    ++stats_.never_written_drops;
    stats_.bytes_never_written_dropped += b.size;
  } else if (!copy) {
    type = "drop_clean";
    ++stats_.clean_drops;
    stats_.bytes_dropped += b.size;
  }
  Log(JsonLine()
          .Str("type", type)
          .Uint("id", b.id)
          .Uint("bytes", b.size)
          .Int("device", dev.ordinal)
          .Finish());
  return CUDA_SUCCESS;
}

// --- STENSOR_VERIFY ------------------------------------------------------------------

bool MemoryManager::VerifiedClean(Device& dev, Buffer& b) {
  ++stats_.verify_checks;
  Verifier::HostCopy host{b.host.vmm() ? b.host.va() : 0, b.host.ptr()};
  auto start = std::chrono::steady_clock::now();
  ContextScope scope(*driver_, dev.context, &stats_.driver_errors);  // as in RecordHash
  Verifier::Result r =
      host.va == 0 && host.ptr == nullptr
          ? Verifier::Result::kError  // no host copy to compare with
          : verifier_->Check(dev.ordinal, b.base, b.size, host, b.host_hash, dev.swap_stream);
  stats_.verify_seconds += Seconds(std::chrono::steady_clock::now() - start);
  if (r == Verifier::Result::kMatch) return true;
  if (r == Verifier::Result::kError) {
    ++stats_.verify_errors;
    return false;
  }
  ++stats_.verify_mismatches;
  const char* mode = verifier_->mode() == VerifyMode::kHash ? "hash" : "copy";
  auto name = [](const char* kernel) { return kernel != nullptr ? kernel : "(none)"; };
  Log(JsonLine()
          .Str("type", "verify_mismatch")
          .Uint("id", b.id)
          .Uint("bytes", b.size)
          .Int("device", dev.ordinal)
          .Str("mode", mode)
          .Str("last_kernel", name(b.last_kernel))
          .Str("last_writer", name(b.last_writer))
          .Finish());
  constexpr int kMaxWarnings = 10;
  if (verify_warnings_ < kMaxWarnings) {
    ++verify_warnings_;
    std::fprintf(stderr,
                 "stensor: STENSOR_VERIFY=%s: buffer %llu (%llu bytes) changed on the device "
                 "although no write to it was inferred; copied instead of dropped. Last kernel "
                 "that used it: %s; last inferred writer: %s%s\n",
                 mode, static_cast<unsigned long long>(b.id),
                 static_cast<unsigned long long>(b.size), name(b.last_kernel),
                 name(b.last_writer),
                 verify_warnings_ == kMaxWarnings ? " (further mismatches are only counted)" : "");
  }
  return false;
}

void MemoryManager::NoteKernel(absl::Span<const uint64_t> used,
                               absl::Span<const uint64_t> written, const char* kernel) {
  if (verifier_ == nullptr) return;
  MutexLock lock(&mu_);
  for (uint64_t id : used) {
    if (Buffer* b = ById(id)) b->last_kernel = kernel;
  }
  for (uint64_t id : written) {
    if (Buffer* b = ById(id)) b->last_writer = kernel;
  }
}

CUresult MemoryManager::MapHostAtBase(Buffer& b) {
  bool mapped = false;
  CUresult r = vmm_.Map(b.base, {b.host.handle()}, b.reserved, b.device, &mapped);
  // A mapping without access after a second failure is still a mapping:
  // it has to be unmapped before device memory goes there.
  b.host_at_base = mapped;
  return r;
}

CUresult MemoryManager::UnmapDevice(Device& dev, Buffer& b) {
  if (CUresult r = vmm_.Unmap(b.base, b.reserved); r != CUDA_SUCCESS) {
    return r;  // still mapped: still resident
  }
  // Never fault: the address reads the host copy while swapped out.
  if (CUresult r = b.host.vmm() ? MapHostAtBase(b) : CUDA_SUCCESS; r != CUDA_SUCCESS) {
    if (b.host_at_base && vmm_.Unmap(b.base, b.reserved) == CUDA_SUCCESS) {
      b.host_at_base = false;
    }
    bool mapped = false;
    if (!b.host_at_base &&
        vmm_.Map(b.base, b.device_chunks, dev.granularity, dev.ordinal, &mapped) == CUDA_SUCCESS) {
      return r;  // back as it was: resident
    }
    // Neither: swapped out with the address unmapped, as without host VMM.
    Log(JsonLine()
            .Str("type", "limitation")
            .Str("what", "the host copy could not be mapped at a swapped-out "
                         "buffer's address")
            .Uint("id", b.id)
            .Finish());
  }
  PoolChunks(dev, &b.device_chunks);
  return CUDA_SUCCESS;
}

// swapped out -> resident. Device memory is made first, the host copy is
// taken off the address only then (and only when no work of unknown
// accesses that may read it is pending), the copy is ordered before the
// consumer; a failure before the copy is submitted puts everything back.
bool MemoryManager::TakeBack(Device& dev, Buffer& b) {
  if (!dev.pool.TakeBack(b.old_chunks)) return false;
  stats_.pooled_bytes -= b.reserved;
  std::vector<CUmemGenericAllocationHandle> back = b.old_chunks;
  EndShadow(dev, b);
  b.device_chunks = std::move(back);
  return true;
}

void MemoryManager::LogSwapIn(const Device& dev, const Buffer& b, bool copy) const {
  Log(JsonLine()
          .Str("type", "swap_in")
          .Uint("id", b.id)
          .Uint("bytes", b.size)
          .Bool("copy", copy)
          .Int("device", dev.ordinal)
          .Finish());
}

CUresult MemoryManager::SwapIn(Device& dev, Buffer& b, bool copy, CUstream consumer) {
  ReindexAtExit reindex(this, b);
  const size_t n = b.reserved / dev.granularity;
  // A second attempt takes fresh memory: zeroing reused chunks failed.
  for (int attempt = 0;; ++attempt) {
    const bool reuse = attempt == 0;
    std::vector<CUmemGenericAllocationHandle> h;
    bool pooled = false;
    bool shadowed = false;
    for (;;) {
      if (!b.resident() && b.old_mapped) {
        if (!b.handed_on && TakeBack(dev, b)) {
          // Its swap-out is still in flight and its device memory was not
          // handed on: taken back; it holds the data (the copy only reads).
          b.location = Location::kCpuGpu;  // the host copy is current once the copy is done
          ++stats_.swap_outs_cancelled;
          LogSwapIn(dev, b, /*copy=*/false);
          // The consumer may write it: after the swap-out's copy read it.
          return OrderAfterSwap(dev, b, consumer);
        }
        // Handed on: the address is unmapped once the copy is done (the GPU
        // would fault before), only then can memory be mapped there.
        if (CUresult r = WaitSwapUse(dev, b); r != CUDA_SUCCESS) return r;
        if (b.old_mapped && !EndOldMapping(dev, b)) return CUDA_ERROR_UNKNOWN;
        continue;  // unlocked: look again
      }
      if (!b.resident() && b.host_at_base && !UnknownIdle(dev)) {
        // A kernel whose accesses are unknown may be reading the host copy
        // through the address: it stays mapped until that work completed.
        if (CUresult r = WaitIdle(b, /*own_uses=*/false); r != CUDA_SUCCESS) return r;
        continue;  // unlocked: look again
      }
      if (b.resident()) {
        // Another thread brought it in while the lock was released: order
        // after its copy, as for any resident buffer.
        return OrderAfterSwap(dev, b, consumer);
      }
      if (CUresult r = AcquireChunks(dev, n, reuse, &h, &pooled, &shadowed);
          r != CUDA_SUCCESS) {
        return r;
      }
      // Making room may have waited without the lock.
      if (!b.resident() && !b.old_mapped && !(b.host_at_base && !UnknownIdle(dev))) break;
      PoolChunks(dev, &h);
    }
    // A buffer with no host copy was dropped never written (nothing to copy).
    bool never_written = (version_policy_ && !b.written) || !b.host.exists();
    bool copying = copy && !never_written;
    if (copying) {
      if (CUresult r = EnsureSwapStream(dev); r != CUDA_SUCCESS) {
        PoolChunks(dev, &h);
        return r;
      }
    }
    if (b.host_at_base) {
      if (CUresult r = vmm_.Unmap(b.base, b.reserved); r != CUDA_SUCCESS) {
        PoolChunks(dev, &h);
        return r;  // still swapped out, still readable
      }
      b.host_at_base = false;
    }
    bool mapped = false;
    if (CUresult r = vmm_.Map(b.base, h, dev.granularity, dev.ordinal, &mapped); r != CUDA_SUCCESS) {
      if (!mapped) {
        // Still swapped out; readable again unless this fails too (then
        // host_at_base says so).
        if (b.host.vmm()) (void)MapHostAtBase(b);
        PoolChunks(dev, &h);
        return r;
      }
      // Mapped without access and stuck there: resident, holding nothing.
      b.device_chunks = std::move(h);
      b.stale_device = true;
      b.location = Location::kCpuGpu;
      return r;
    }
    b.device_chunks = std::move(h);
    if (copying) {
      const CUstream copy_stream = FetchStreamFor(dev, b, shadowed);
      CUresult r = b.host.CopyToDevice(vmm_, b.base, b.size, copy_stream);
      if (r != CUDA_SUCCESS) {
        // The host copy stays the only one.
        if (UnmapDevice(dev, b) != CUDA_SUCCESS) {
          b.stale_device = true;  // resident, holding nothing: restored at next use
          b.location = Location::kCpuGpu;
        }
        return r;
      }
      // The copy is in flight: the buffer is busy until it completed, and any
      // stream that uses it before then waits for it (OrderAfterSwap).
      NoteUse(b.uses, copy_stream, dev.ordinal);
      ++stats_.swap_ins;
      stats_.bytes_copied_in += b.size;
    } else if (copy) {
      // Never written: fresh memory holds what it held (zeros), a reused
      // chunk is zeroed first.
      if (pooled) {
        if (CUresult r = ZeroReused(dev, b); r != CUDA_SUCCESS) {
          // Swapped out again (the chunk back in the pool): try fresh memory.
          if (UnmapDevice(dev, b) == CUDA_SUCCESS) continue;
          b.stale_device = true;  // resident, holding nothing: restored at next use
          b.location = Location::kCpuGpu;
          return r;
        }
      }
      ++stats_.swap_ins_never_written;
    } else {
      // Contents come from the operation about to run; until it is submitted
      // the host copy stays the truth (see Finish).
      b.pending_overwrite = true;
      ++stats_.swap_ins_without_copy;
      // Memory still in use by its last owner's queued work: the operation
      // runs after that (an event on the swap stream, or a host wait there).
      if (shadowed) NoteUse(b.uses, dev.swap_stream, dev.ordinal);
    }
    b.location = Location::kCpuGpu;
    LogSwapIn(dev, b, copying);
    // An error here leaves the copy in flight and the buffer resident, with
    // its use on the swap stream not observed: consistent, and retried.
    return OrderAfterSwap(dev, b, consumer);  // nothing to do without swap-stream work
  }
}

// --- Operations ---------------------------------------------------------------------

CUresult MemoryManager::Prepare(absl::Span<const uint64_t> ids,
                                absl::Span<const uint64_t> overwritten,
                                CUstream stream) {
  MutexLock lock(&mu_);
  CollectGarbage();
  for (auto& d : devices_) {
    if (d) ReapOldMappings(*d, /*wait=*/false);
  }
  std::vector<Buffer*> pinned;
  for (uint64_t id : ids) {
    Buffer* b = ById(id);
    if (b == nullptr || b->garbage) continue;
    ++b->pins;  // none of the operation's buffers may be evicted for another
    pinned.push_back(b);
  }
  for (Buffer* b : pinned) {
    Device& dev = DeviceState(b->device);
    CUresult r = CUDA_SUCCESS;
    if (b->resident()) {
      // Brought in for another stream: this one waits for that copy too.
      // (Uses observed complete cost nothing here: the fast path.)
      if (b->stale_device) r = RestoreFromHost(dev, *b);
      if (r == CUDA_SUCCESS && b->resident()) r = OrderAfterSwap(dev, *b, stream);
      if (r == CUDA_SUCCESS && !b->resident()) {
        r = SwapIn(dev, *b, /*copy=*/true, stream);  // the restore swapped it out
      }
    } else {
      bool whole = std::find(overwritten.begin(), overwritten.end(), b->id) !=
                   overwritten.end();
      const uint64_t copies = stats_.swap_ins;
      r = SwapIn(dev, *b, !whole, stream);
      // What prefetch exists to avoid: a copy in, on demand, once planned.
      if (stats_.swap_ins > copies && planner_ != nullptr && planner_->has_profile()) {
        ++stats_.on_demand_after_profile;
      }
    }
    if (r != CUDA_SUCCESS) {
      for (Buffer* p : pinned) {
        --p->pins;
        if (p->pending_overwrite) {  // the overwrite will not happen
          p->pending_overwrite = false;
          RestoreFromHost(DeviceState(p->device), *p);
        }
      }
      return r;
    }
  }
  return CUDA_SUCCESS;
}

void MemoryManager::Finish(absl::Span<const uint64_t> ids,
                           absl::Span<const uint64_t> written, CUstream stream,
                           bool submitted) {
  MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    Buffer* b = ById(id);
    if (b == nullptr || b->pins == 0) continue;
    --b->pins;
    if (b->pending_overwrite) {
      b->pending_overwrite = false;
      // The overwrite did not happen: the device memory holds nothing yet,
      // so bring the host copy's contents in after all (or, failing that,
      // keep the buffer stale or swapped out: never wrong).
      if (!submitted) RestoreFromHost(DeviceState(b->device), *b);
    }
    if (submitted) {
      if (b->vmm) RecordUse(*b, stream);  // small buffers are never evicted
      b->last_use = ++clock_;  // distinct ticks: LRU order has no ties
    }
  }
  if (submitted) {
    for (uint64_t id : written) {
      if (Buffer* b = ById(id)) {
        b->gpu_version = ++version_;  // host copy now stale
        b->written = true;
      }
    }
  }
  // Re-keyed once all their fields changed (unchanged keys cost a compare).
  for (uint64_t id : ids) {
    if (Buffer* b = ById(id)) Reindex(*b);
  }
  if (submitted) {
    for (uint64_t id : written) {
      if (Buffer* b = ById(id)) Reindex(*b);
    }
  }
}

int MemoryManager::BeginUnknown(CUstream stream) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return -1;
  MutexLock lock(&mu_);
  Device& dev = DeviceState(ordinal);
  ++dev.unknown_submitting;  // from here on nothing new is evicted on `dev`
  // It may reach a swapped-out buffer through its address, which must show
  // the host copy (or fault) rather than memory handed on: old mappings end
  // first, after their copies (the one host wait unknown work costs).
  SettleOldMappings(ordinal);
  for (CUstream own : {dev.swap_stream, dev.fetch_stream}) {
    if (own == nullptr) continue;
    // After every swap-in copy in flight: on the device, else on the host
    // (finite: nothing on the swap stream waits for the program's work).
    const Use* mark = NoteUse(dev.swap_marks, own, ordinal);
    if (!mark->recorded ||
        Failed(driver_->cuStreamWaitEvent(stream, mark->event, 0)) != CUDA_SUCCESS) {
      (void)Failed(driver_->cuStreamSynchronize(own));
    }
  }
  return ordinal;
}

void MemoryManager::EndUnknown(int device) {
  if (device < 0) return;
  MutexLock lock(&mu_);
  --DeviceState(device).unknown_submitting;
}

void MemoryManager::MarkAllWritten(CUstream stream) {
  MutexLock lock(&mu_);
  for (auto& [base, b] : by_base_) {
    if (b->resident()) b->gpu_version = ++version_;
    // A swapped-out buffer is reachable only through its host copy at its
    // address (host-located VMM): without one, nothing could write it.
    if (b->resident() || b->host_at_base) b->written = true;
    Reindex(*b);
  }
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) {
    // Which device ran it is unknown: none is idle until a wait for the
    // context shows it (a failed record, on every device).
    ++stats_.driver_errors;
    for (auto& d : devices_) {
      if (!d) continue;
      NoteUse(d->unknown, stream, d->ordinal)->recorded = false;
    }
    return;
  }
  // Until it completed, nothing on this device may be evicted. A record
  // that failed leaves the entry unrecorded: not idle until observed.
  NoteUse(DeviceState(ordinal).unknown, stream, ordinal);
}

CUresult MemoryManager::RestoreFromHost(Device& dev, Buffer& b) {
  ReindexAtExit reindex(this, b);
  if (!b.resident()) return CUDA_SUCCESS;
  if ((version_policy_ && !b.written) || !b.host.exists()) {
    // Never written: the fresh device memory holds what it held.
    b.stale_device = false;
    return CUDA_SUCCESS;
  }
  CUresult r = EnsureSwapStream(dev);
  if (r == CUDA_SUCCESS) {
    r = b.host.CopyToDevice(vmm_, b.base, b.size, dev.swap_stream);
  }
  if (r == CUDA_SUCCESS) {
    // In flight: later uses wait for it (OrderAfterSwap), as after a swap-in.
    NoteUse(b.uses, dev.swap_stream, dev.ordinal);
    b.stale_device = false;
    b.location = Location::kCpuGpu;
    return CUDA_SUCCESS;
  }
  // Keep the host copy as the only one; where even that fails, the device
  // memory stays, marked as holding nothing.
  if (b.pins == 0 && Idle(b) && UnmapDevice(dev, b) == CUDA_SUCCESS) {
    b.location = Location::kCpuOnly;
    b.stale_device = false;
  } else {
    b.stale_device = true;
  }
  return r;
}

CUresult MemoryManager::Prefetch(uint64_t id) {
  MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  return PrefetchLocked(*b);
}

CUresult MemoryManager::PrefetchLocked(Buffer& b) {
  if (b.garbage || !b.vmm) return CUDA_ERROR_NOT_FOUND;
  if (b.resident() && !b.stale_device) return CUDA_SUCCESS;
  Device& dev = DeviceState(b.device);
  no_block_ = true;
  ++b.pins;  // not evicted to make room for itself
  CUresult r = b.resident() ? RestoreFromHost(dev, b)
                            : SwapIn(dev, b, /*copy=*/true, kNoConsumer);
  --b.pins;
  no_block_ = false;
  // Nothing to evict without waiting (or at all): not now.
  if (r == CUDA_ERROR_OUT_OF_MEMORY) r = CUDA_ERROR_NOT_READY;
  return r;
}

CUresult MemoryManager::EvictAsync(uint64_t id) {
  MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  return EvictAsyncLocked(*b);
}

CUresult MemoryManager::EvictAsyncLocked(Buffer& b) {
  if (b.garbage || !b.vmm) return CUDA_ERROR_NOT_FOUND;
  if (!b.resident()) return CUDA_SUCCESS;
  if (b.pins > 0 || b.exported) return CUDA_ERROR_NOT_READY;
  Device& dev = DeviceState(b.device);
  no_block_ = true;
  CUresult r = SwapOut(dev, b, policy_->Copies(CandidateOf(b)) || !Droppable(b));
  no_block_ = false;
  return r;
}

// --- S02 and planned swaps -------------------------------------------------------

IterationPlanner* MemoryManager::Planner(Device& dev) {
  if (planner_made_) return planner_.get();
  planner_made_ = true;
  // Only prefetch and belady read what the planner learns.
  if (!config_.prefetch && config_.policy != EvictionPolicyKind::kBelady) return nullptr;
  IterationPlanner::Options options;
  options.prefetch = config_.prefetch;
  // Without a measurement, a PCIe 4.0 x16 link's practical rate.
  constexpr double kDefaultBandwidth = 16e9;
  options.bandwidth = Bandwidth{kDefaultBandwidth, kDefaultBandwidth};
  if (!config_.bandwidth.measured()) {
    // STENSOR_BANDWIDTH: taken as given, nothing probed.
    absl::StatusOr<Bandwidth> configured = Profiler::MeasureBandwidth(config_, driver_);
    if (configured.ok()) options.bandwidth = *configured;
  } else if (config_.prefetch) {
    // The probe's device buffer is charged like any other, in what is free
    // under the cap now (never evicting for it); too little room: default.
    constexpr uint64_t kMinProbe = uint64_t{1} << 20, kMaxProbe = uint64_t{16} << 20;
    const uint64_t room = dev.used < dev.cap ? dev.cap - dev.used : 0;
    const uint64_t probe = std::min(kMaxProbe, room) & ~(kMinProbe - 1);
    if (probe >= kMinProbe) {
      dev.used += probe;
      absl::StatusOr<Bandwidth> measured = Profiler::MeasureBandwidth(config_, driver_, probe);
      dev.used -= probe;
      if (measured.ok()) {
        options.bandwidth = *measured;
        stats_.bandwidth_probed = true;
      }
    }
  }
  stats_.planner_bandwidth_h2d = options.bandwidth.h2d;
  absl::StatusOr<std::unique_ptr<IterationPlanner>> planner =
      IterationPlanner::Create(std::move(options));
  if (!planner.ok()) return nullptr;  // a bandwidth the probe got wrong: no planning
  planner_ = std::move(*planner);
  // Buffers already evicted before the planner existed are its to fetch.
  for (auto& [base, b] : by_base_) b->planner_resident = true;
  return planner_.get();
}

void MemoryManager::NoteOperation(uint64_t key, absl::Span<const uint64_t> ids,
                                  absl::Span<const uint64_t> written, bool marker,
                                  CUstream stream, OpTicket* ticket) {
  *ticket = OpTicket{};
  // Only prefetch and belady read what the planner learns: without them a
  // launch pays no second lock.
  if (!config_.prefetch && config_.policy != EvictionPolicyKind::kBelady) return;
  MutexLock lock(&mu_);
  Buffer* first = nullptr;
  for (uint64_t id : ids) {
    if (Buffer* b = ById(id); b != nullptr && !b->garbage) {
      if (first == nullptr) first = b;
      b->prefetched = false;  // used now
    }
  }
  if (first == nullptr) return;  // nothing the manager holds
  Device& dev = DeviceState(first->device);
  IterationPlanner* planner = Planner(dev);
  if (planner == nullptr) return;

  // The key names the kernel (or transfer) and the shapes of its buffers,
  // never their ids: temporaries get new ids every step.
  absl::InlinedVector<BufferTouch, 8> touches;
  absl::InlinedVector<Buffer*, 8> buffers;
  for (uint64_t id : ids) {
    Buffer* b = ById(id);
    if (b == nullptr || b->garbage) continue;
    key = (key ^ b->size) * 0x9e3779b97f4a7c15ull;  // order matters: a slot per argument
    key ^= key >> 29;
    const bool write = std::find(written.begin(), written.end(), id) != written.end();
    touches.push_back(BufferTouch{id, b->reserved, write});
    buffers.push_back(b);
  }
  if (marker) planner->MarkBoundary();
  std::vector<uint64_t> next_uses;
  std::vector<std::pair<uint64_t, uint64_t>> repredicted;
  const uint64_t time = planner->OnOperation(key, touches, &next_uses, &repredicted);
  for (size_t i = 0; i < buffers.size(); ++i) {
    Buffer& b = *buffers[i];
    // Never swapped: never planned for.
    if (!b.vmm || b.exported) planner->SetPinned(b.id, true);
    if (b.next_use != next_uses[i]) {
      b.next_use = next_uses[i];
      Reindex(b);
    }
  }
  // Buffers the predictor learnt more about without a use (a shard's cycle,
  // the next shard of a rotating slot): belady's order follows.
  for (const auto& [id, next] : repredicted) {
    Buffer* b = ById(id);
    if (b == nullptr || b->garbage || b->next_use == next) continue;
    b->next_use = next;
    Reindex(*b);
  }
  if (planner->profiling()) {
    ticket->timing = profiler_.BeginTiming(stream);
    ticket->time = time;
  }
  for (const auto& [op, seconds] : profiler_.TakeCompleted()) planner->OnComputeTime(op, seconds);

  // Pooled chunks and freed buffers' chunks are room: a swap-in takes them
  // before it evicts (MakeRoom), a freed buffer still in use hands its
  // chunks on in stream order, and the sim's replay counts a free at once.
  // Counted as used, the planner evicted for fetches that on demand went
  // into them with no eviction (mlp_train --hidden 2048 at 50 %: 1272-1384
  // MiB moved against 888 with prefetch off).
  const auto free_under_cap = [this](const Device& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t room = d.pool.bytes();
    for (const Buffer* g : garbage_) {
      if (g->device == d.ordinal && g->vmm && !g->exported) {
        room += g->device_chunks.size() * d.granularity;
      }
    }
    const uint64_t held = d.used - std::min(d.used, room);
    return held < d.cap ? d.cap - held : 0;
  };
  const uint64_t free_bytes = free_under_cap(dev);
  // The link's queue is the planner's own model (in profiled compute time),
  // never the clock: its decisions then follow from the profile and the
  // operations, as in `stensor sim`.
  for (const PlannedAction& a : planner->Plan(free_bytes)) {
    Buffer* b = ById(a.id);
    if (b == nullptr || b->garbage || !b->vmm) {
      if (a.kind == PlannedAction::Kind::kFetch) planner->CancelFetch(a.id);
      continue;
    }
    if (a.kind == PlannedAction::Kind::kEvict) {
      // Queued behind the buffer's last use, never waited for here. One
      // that cannot go now (pinned by this operation or in flight) stays;
      // the fetch it made room for is then refused below if it no longer
      // fits. (These thrashed while shards were predicted from their first
      // gap, fetched far too early and held: policy/next_use.h.)
      if (!b->resident()) continue;
      if (EvictAsyncLocked(*b) == CUDA_SUCCESS) {
        ++stats_.planned_evictions_issued;
      } else {
        ++stats_.planned_evictions_skipped;
      }
      continue;
    }
    const bool was_resident = b->resident();
    // Only into memory that is free: room for a fetch comes from the
    // planner's evictions, which take only buffers needed later than it.
    Device& home = DeviceState(b->device);
    // Not counting freed buffers' chunks here: MakeRoom takes other room
    // (clean drops, then evictions by the policy) before it releases them,
    // and a fetch must never evict what the planner did not choose.
    const bool fits = (home.used <= home.cap && b->reserved <= home.cap - home.used) ||
                      home.pool.bytes() >= b->reserved;
    if (!fits || PrefetchLocked(*b) != CUDA_SUCCESS || was_resident) {
      ++stats_.prefetches_refused;
      planner->CancelFetch(a.id);
      continue;
    }
    ++stats_.prefetches_issued;
    b->prefetched = true;
  }
}

void MemoryManager::EndOperation(const OpTicket& ticket, CUstream stream, bool submitted) {
  if (ticket.timing < 0) return;
  profiler_.EndTiming(ticket.timing, stream, ticket.time, submitted);
}

void MemoryManager::SetNextUse(uint64_t id, uint64_t next_use) {
  MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr) return;
  b->next_use = next_use;
  Reindex(*b);
}

bool MemoryManager::ReadFromHostCopy(uint64_t id, uint64_t offset, void* dst,
                                     uint64_t bytes) {
  MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr || !b->vmm || b->resident() || !b->host.exists() ||
      offset + bytes > b->size) {
    return false;
  }
  for (Use& u : b->uses) {
    // Its swap-out copy is still in flight: not served from the host copy.
    Device& dev = DeviceState(b->device);
    if (dev.swap_stream != nullptr && u.stream == dev.swap_stream && !Observed(u)) {
      return false;
    }
  }
  CUresult r = b->host.handle() != 0
                   ? Failed(driver_->cuMemcpyDtoH_v2(dst, b->host.va() + offset, bytes))
                   : (std::memcpy(dst, static_cast<char*>(b->host.ptr()) + offset, bytes),
                      CUDA_SUCCESS);
  if (r != CUDA_SUCCESS) return false;
  ++stats_.reads_served_from_host;
  return true;
}

CUresult MemoryManager::ReadBack(uint64_t id, uint64_t offset, void* dst, uint64_t bytes) {
  MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (offset > b->size || bytes > b->size - offset) return CUDA_ERROR_INVALID_VALUE;
  if (!b->resident() || b->stale_device) {
    // The host copy holds the data once the swap-out's copy into it is done.
    if (CUresult r = WaitSwapUse(DeviceState(b->device), *b); r != CUDA_SUCCESS) return r;
  }
  if (!b->resident() || b->stale_device) {  // the host copy holds the data
    if (b->host.ptr() != nullptr) {
      std::memcpy(dst, static_cast<char*>(b->host.ptr()) + offset, bytes);
      return CUDA_SUCCESS;
    }
    if (!b->host.vmm()) {
      std::memset(dst, 0, bytes);  // dropped never written: fresh memory
      return CUDA_SUCCESS;
    }
    // A synchronous copy waits for the program's blocking streams: never
    // under the lock. The pin keeps the host copy where it is.
    const CUdeviceptr from = b->host.va() + offset;
    ++b->pins;
    mu_.Unlock();
    CUresult r = driver_->cuMemcpyDtoH_v2(dst, from, bytes);
    mu_.Lock();
    --b->pins;
    return r;
  }
  // Pinned, so it stays mapped while the copy runs without the lock; a
  // swap-in still copying its contents in is waited for first.
  const std::vector<Use> copies = PendingOwnUses(DeviceState(b->device), *b);
  ++b->pins;
  mu_.Unlock();
  CUresult r = CUDA_SUCCESS;
  for (const Use& u : copies) {
    if (r == CUDA_SUCCESS) r = WaitForUse(u, u.stream);
  }
  if (r == CUDA_SUCCESS) r = driver_->cuMemcpyDtoH_v2(dst, b->base + offset, bytes);
  mu_.Lock();
  --b->pins;
  return r;
}

bool MemoryManager::Readable(const Buffer& b) { return b.resident() || b.host_at_base; }

bool MemoryManager::HostVmm(int device) { return DeviceState(device).host_vmm; }

bool MemoryManager::IsSwappable(const Buffer& b, int device) {
  return b.vmm && !b.garbage && b.id != 0 && b.device == device;
}

uint64_t MemoryManager::BufferId(const Buffer& b) { return b.id; }

void MemoryManager::MemInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  MutexLock lock(&mu_);
  CollectGarbage();
  if (!external_frees_.empty()) (void)SettleExternalFrees(device, /*wait=*/false);
  Device& dev = DeviceState(device);
  if (total_bytes != nullptr) *total_bytes = dev.cap;
  // The program asks what is free (to size its allocations, or to watch the
  // device): the pool's idle chunks go back to the driver, so the answer and
  // the device agree. Chunks still mapped at an old address are about to be
  // free and are counted so.
  while (ReleaseOnePooled(dev)) {
  }
  uint64_t used = dev.used - dev.pool.bytes();
  if (free_bytes != nullptr) *free_bytes = used >= dev.cap ? 0 : dev.cap - used;
}

SwapStats MemoryManager::stats() const {
  MutexLock lock(&mu_);
  SwapStats s = stats_;
  if (planner_ != nullptr) {
    const IterationPlanner::Stats p = planner_->stats();
    s.profiled_period = p.last_period;
    s.profiles = p.profiles;
    s.pattern_changes = p.pattern_changes;
    s.prefetches_used = p.planner.fetch_hits;
    s.prefetches_wasted = p.planner.fetches_wasted;
    s.planner_bytes_caused = p.planner.bytes_caused;
    s.planner_stopped = p.planner.stopped;
  }
  return s;
}

std::string MemoryManager::StatsText() const {
  SwapStats s = stats();
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  return absl::StrFormat(
      "stensor: policy %s\n"
      "stensor: peak resident      %10.1f MiB\n"
      "stensor: swap-outs copied   %10u (%.1f MiB device->host)\n"
      "stensor: clean drops        %10u (%.1f MiB, no copy)\n"
      "stensor: never-written drops %9u (%.1f MiB, no copy)\n"
      "stensor: swap-ins copied    %10u (%.1f MiB host->device, on demand or prefetched)\n"
      "stensor: swap-ins, no copy  %10u (buffer overwritten whole)\n"
      "stensor: swap-ins, never written %5u (no copy)\n"
      "stensor: reads from host    %10u (device->host copies served from the host copy)\n"
      "stensor: garbage released   %10u\n"
      "stensor: out of memory      %10u\n"
      "stensor: driver errors      %10u (in the swap path, recovered or returned)\n"
      "stensor: host waited        %10.3f s\n"
      "stensor:  for program work  %10.3f s (buffers to evict or release still in use)\n"
      "stensor:  for swap copies   %10.3f s\n"
      "stensor:  for unknown work  %10.3f s (operations of unknown accesses)\n"
      "stensor: queued evictions   %10u (behind in-flight work, no host wait)\n"
      "stensor: swap-outs taken back %8u (swapped in before their copy was done)\n"
      "stensor: physical creates   %10u (cuMemCreate of device memory)\n"
      "stensor: physical releases  %10u (cuMemRelease)\n"
      "stensor: pool hits          %10u (device memory reused)\n"
      "stensor: profiled iteration %10u operations (%u profiles, %u pattern changes)\n"
      "stensor: prefetches         %10u issued (%u used, %u evicted before use, %u not now)\n"
      "stensor: planned evictions  %10u issued (%u could not go: in use or in flight)\n"
      "stensor: planner cost       %10.1f MiB moved because of its plans (%s)\n"
      "stensor: on-demand after profile %5u (swap-ins copied on demand once profiled)\n"
      "stensor: link bandwidth     %10.2f GB/s host->device (%s)\n%s",
      std::string(policy_->name()), mib(s.peak_resident_bytes), s.swap_outs_copied,
      mib(s.bytes_copied_out), s.clean_drops, mib(s.bytes_dropped), s.never_written_drops,
      mib(s.bytes_never_written_dropped), s.swap_ins, mib(s.bytes_copied_in),
      s.swap_ins_without_copy, s.swap_ins_never_written, s.reads_served_from_host,
      s.garbage_released, s.ooms, s.driver_errors, s.host_wait_seconds,
      s.wait_program_seconds, s.wait_swap_seconds, s.wait_unknown_seconds, s.async_evictions,
      s.swap_outs_cancelled, s.physical_creates, s.physical_releases, s.pool_hits,
      s.profiled_period, s.profiles, s.pattern_changes, s.prefetches_issued, s.prefetches_used,
      s.prefetches_wasted, s.prefetches_refused, s.planned_evictions_issued, s.planned_evictions_skipped,
      mib(s.planner_bytes_caused), s.planner_stopped ? "stopped: past its cut-off" : "running",
      s.on_demand_after_profile,
      s.planner_bandwidth_h2d / 1e9,
      s.planner_bandwidth_h2d == 0                ? "no planner"
      : !config_.bandwidth.measured()             ? "STENSOR_BANDWIDTH"
      : s.bandwidth_probed                        ? "probed"
                                                  : "assumed: no room to probe",
      verifier_ == nullptr
          ? std::string()
          : absl::StrFormat("stensor: verified drops     %10u (STENSOR_VERIFY=%s)\n"
                            "stensor: verify mismatches  %10u (copied instead)\n"
                            "stensor: verify errors      %10u (not checkable: copied)\n"
                            "stensor: verify time        %10.3f s\n",
                            s.verify_checks,
                            verifier_->mode() == VerifyMode::kHash ? "hash" : "copy",
                            s.verify_mismatches, s.verify_errors, s.verify_seconds));
}

}  // namespace stensor
