#include "core/memory_manager.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/json.h"

namespace stensor {
namespace {

// Small allocations are charged in whole host pages, as a driver hands them out.
constexpr uint64_t kSmallUnit = 4096;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

struct MemoryManager::Buffer {
  uint64_t id = 0;
  CUdeviceptr base = 0;
  uint64_t size = 0;      // as the application asked
  uint64_t reserved = 0;  // VA and physical size (granules), or the charge
  int device = 0;
  CUcontext context = nullptr;  // current at allocation (pointer attributes)
  bool vmm = false;       // false: a small plain allocation, never swapped
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
  // The last use on each stream that used it (a use on one stream says
  // nothing about another); a swap-in's copy is a use on the swap stream.
  std::vector<std::pair<CUstream, CUevent>> uses;
  // Device memory, when resident.
  CUmemGenericAllocationHandle device_handle = 0;
  // The host copy: host-located VMM memory (mapped at host_va, and at base
  // while swapped out), or pinned memory where that is unsupported.
  CUmemGenericAllocationHandle host_handle = 0;
  CUdeviceptr host_va = 0;
  void* host_ptr = nullptr;
  bool host_at_base = false;
  // Swapped in without a copy for an operation that overwrites it whole;
  // cleared when that operation is submitted (or undone if it is not).
  bool pending_overwrite = false;
  // STENSOR_VERIFY: the hash of the host copy, taken when it was copied out
  // (hash mode), and the kernels named by a mismatch.
  std::optional<uint64_t> host_hash;
  const char* last_kernel = nullptr;
  const char* last_writer = nullptr;

  bool resident() const { return !vmm || device_handle != 0; }
  int refcount() const { return (garbage ? 0 : 1) + pins; }
  bool clean() const {
    return location == Location::kCpuGpu && host_version == gpu_version;
  }
};

struct MemoryManager::Device {
  int ordinal = 0;
  // The last operation whose accesses are unknown: until it completed, no
  // buffer of this device counts as idle.
  CUevent unknown_use = nullptr;
  bool unknown_used = false;
  uint64_t cap = 0;
  uint64_t used = 0;
  uint64_t granularity = 0;
  bool host_vmm = false;
  CUstream swap_stream = nullptr;
  CUevent swap_event = nullptr;
  uint64_t host_bytes = 0;  // host copies
};

std::unique_ptr<MemoryManager> MemoryManager::Create(const Config& config,
                                                     const Driver* driver,
                                                     LogSink log) {
  if (!config.memory_limit.all_devices && config.memory_limit.per_device.empty()) {
    return nullptr;
  }
  if (config.policy == EvictionPolicyKind::kBelady) {
    // Belady needs the profiled future, which comes with prefetching.
    std::fprintf(stderr,
                 "stensor: STENSOR_POLICY=belady is not implemented yet; using version\n");
  }
  std::unique_ptr<EvictionPolicy> policy =
      config.policy == EvictionPolicyKind::kLru ? MakeLruPolicy()
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
                    : std::make_unique<Verifier>(config.verify, driver)) {}

MemoryManager::~MemoryManager() {
  absl::MutexLock lock(&mu_);
  while (!by_base_.empty()) {
    Buffer& b = *by_base_.begin()->second;
    WaitIdle(b);
    ReleaseBuffer(DeviceState(b.device), b);
  }
  for (auto& d : devices_) {
    if (d && d->swap_stream != nullptr) driver_->cuStreamDestroy_v2(d->swap_stream);
    if (d && d->swap_event != nullptr) driver_->cuEventDestroy_v2(d->swap_event);
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
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

bool MemoryManager::Idle(const Buffer& b) const {
  for (const auto& [stream, event] : b.uses) {
    if (driver_->cuEventQuery(event) == CUDA_ERROR_NOT_READY) return false;
  }
  const Device* dev = static_cast<size_t>(b.device) < devices_.size()
                          ? devices_[b.device].get()
                          : nullptr;
  return dev == nullptr || !dev->unknown_used ||
         driver_->cuEventQuery(dev->unknown_use) != CUDA_ERROR_NOT_READY;
}

void MemoryManager::WaitIdle(Buffer& b) {
  if (Idle(b)) return;
  std::vector<CUevent> events;
  for (const auto& [stream, event] : b.uses) events.push_back(event);
  Device& dev = DeviceState(b.device);
  if (dev.unknown_used) events.push_back(dev.unknown_use);
  // Wait without the lock: the work waited for may depend on another
  // thread's next launch, which needs the lock. The pin keeps the buffer
  // (and its events) alive meanwhile; callers re-check everything after.
  ++b.pins;
  auto start = std::chrono::steady_clock::now();
  mu_.Unlock();
  for (CUevent event : events) driver_->cuEventSynchronize(event);
  mu_.Lock();
  --b.pins;
  double waited = Seconds(std::chrono::steady_clock::now() - start);
  stats_.host_wait_seconds += waited;
  Log(JsonLine()
          .Str("type", "evict_wait")
          .Uint("id", b.id)
          .Double("seconds", waited)
          .Finish());
}

void MemoryManager::RecordUse(Buffer& b, CUstream stream) {
  CUevent event = nullptr;
  for (auto& [s, e] : b.uses) {
    if (s == stream) event = e;
  }
  if (event == nullptr) {
    if (driver_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return;
    b.uses.emplace_back(stream, event);
  }
  driver_->cuEventRecord(event, stream);
}

// --- Allocation -----------------------------------------------------------------

CUresult MemoryManager::Allocate(uint64_t bytes, CUdeviceptr* dptr) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUdevice ordinal = 0;
  if (CUresult r = driver_->cuCtxGetDevice(&ordinal); r != CUDA_SUCCESS) return r;
  CUcontext context = nullptr;
  if (CUresult r = driver_->cuCtxGetCurrent(&context); r != CUDA_SUCCESS) return r;
  absl::MutexLock lock(&mu_);
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
  b->gpu_version = ++version_;
  b->last_use = ++clock_;  // just used: not the first to go
  CollectGarbage();
  if (dev.granularity == 0 || bytes < dev.granularity) {
    // Too small to map on its own: the driver's allocator, charged, kept.
    b->reserved = AlignUp(bytes, kSmallUnit);
    if (CUresult r = MakeRoom(dev, b->reserved); r != CUDA_SUCCESS) return r;
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
    if (CUresult r = MakeRoom(dev, b->reserved); r != CUDA_SUCCESS) return r;
    if (CUresult r = driver_->cuMemAddressReserve(&b->base, b->reserved, 0, 0, 0);
        r != CUDA_SUCCESS) {
      return r;
    }
    if (CUresult r = MapDevice(dev, *b); r != CUDA_SUCCESS) {
      driver_->cuMemAddressFree(b->base, b->reserved);
      return r;
    }
  }
  *dptr = b->base;
  by_base_[b->base] = std::move(b);
  return CUDA_SUCCESS;
}

CUresult MemoryManager::ReserveExternal(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (CUresult r = driver_->cuCtxGetDevice(&ordinal); r != CUDA_SUCCESS) return r;
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  if (bytes > DeviceState(ordinal).cap) return;  // never charged
  DeviceState(ordinal).used -= AlignUp(bytes, kSmallUnit);
}

void MemoryManager::AdoptExternal(CUdeviceptr base, uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
  absl::MutexLock lock(&mu_);
  external_[base] = {ordinal, AlignUp(bytes, kSmallUnit)};
}

void MemoryManager::ForgetExternal(CUdeviceptr base) {
  absl::MutexLock lock(&mu_);
  auto it = external_.find(base);
  if (it == external_.end()) return;
  DeviceState(it->second.first).used -= it->second.second;
  external_.erase(it);
}

void MemoryManager::Bind(CUdeviceptr base, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end() || id == 0) return;  // untracked: never looked up
  it->second->id = id;
  by_id_[id] = it->second.get();
}

bool MemoryManager::Owns(CUdeviceptr base) const {
  absl::MutexLock lock(&mu_);
  return by_base_.count(base) != 0;
}

CUresult MemoryManager::Free(CUdeviceptr base) {
  absl::MutexLock lock(&mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end()) return CUDA_ERROR_INVALID_VALUE;
  Buffer& b = *it->second;
  if (b.garbage) return CUDA_ERROR_INVALID_VALUE;  // freed twice
  Device& dev = DeviceState(b.device);
  b.garbage = true;
  if (b.pins == 0 && Idle(b)) {
    ReleaseBuffer(dev, b);
  } else {
    ++garbage_;  // released once its work completed, or at S404
  }
  return CUDA_SUCCESS;
}

CUresult MemoryManager::FreeAsync(CUdeviceptr base, CUstream stream) {
  absl::MutexLock lock(&mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end()) return CUDA_ERROR_INVALID_VALUE;
  Buffer& b = *it->second;
  if (b.garbage) return CUDA_ERROR_INVALID_VALUE;  // freed twice
  // The free's place in `stream`: an event recorded there. Without one the
  // free falls back to waiting for the stream, which is also stream order.
  CUevent event = nullptr;
  for (const auto& [s, e] : b.uses) {
    if (s == stream) event = e;
  }
  bool fresh = event == nullptr;
  CUresult r = fresh ? driver_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) r = driver_->cuEventRecord(event, stream);
  if (r == CUDA_SUCCESS) {
    if (fresh) b.uses.emplace_back(stream, event);
  } else {
    if (fresh && event != nullptr) driver_->cuEventDestroy_v2(event);
    // The stream's work before the free must be done before the memory is
    // reused; if even that cannot be observed, the buffer stays allocated.
    if (CUresult w = driver_->cuStreamSynchronize(stream); w != CUDA_SUCCESS) return w;
  }
  b.garbage = true;
  if (b.pins == 0 && Idle(b)) {
    ReleaseBuffer(DeviceState(b.device), b);
  } else {
    ++garbage_;  // released once the stream passed the free (S404)
  }
  return CUDA_SUCCESS;
}

MemoryManager::Buffer* MemoryManager::Containing(uint64_t addr) const {
  auto it = by_base_.upper_bound(addr);
  if (it == by_base_.begin()) return nullptr;
  --it;
  Buffer* b = it->second.get();
  return b->vmm && addr - b->base < b->reserved ? b : nullptr;
}

std::optional<MemoryManager::BufferView> MemoryManager::Find(CUdeviceptr addr) const {
  absl::MutexLock lock(&mu_);
  const Buffer* b = Containing(addr);
  if (b == nullptr) return std::nullopt;
  return BufferView{b->base, b->size, b->reserved, b->device, b->context, b->id, b->garbage};
}

CUresult MemoryManager::CheckRange(uint64_t addr, uint64_t extent) const {
  if (extent == 0) return CUDA_SUCCESS;
  absl::MutexLock lock(&mu_);
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
  bool first = !b.exported;
  b.exported = true;  // from now on no eviction chooses it
  if (!b.resident()) {
    Device& dev = DeviceState(b.device);
    ++b.pins;
    CUresult r = SwapIn(dev, b, /*copy=*/true, /*consumer=*/nullptr);
    --b.pins;
    if (r != CUDA_SUCCESS) {
      b.exported = false;  // still swapped out: a later call tries again
      return r;
    }
    // Synchronously: whoever gets the handle reads the memory directly. The
    // swap-in's copy is the buffer's use on the swap stream; wait for it
    // without the lock (the pin keeps the buffer and its events alive).
    CUevent copied = nullptr;
    for (const auto& [s, e] : b.uses) {
      if (s == dev.swap_stream && s != nullptr) copied = e;
    }
    if (copied != nullptr) {
      ++b.pins;
      mu_.Unlock();
      CUresult w = driver_->cuEventSynchronize(copied);
      mu_.Lock();
      --b.pins;
      if (w != CUDA_SUCCESS) return w;
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
  absl::MutexLock lock(&mu_);
  Buffer* b = Containing(addr);
  if (b == nullptr || b->garbage) return false;
  *result = PinLocked(*b, api);
  return true;
}

bool MemoryManager::PinExportedHandle(CUmemGenericAllocationHandle handle,
                                      const char* api) {
  absl::MutexLock lock(&mu_);
  for (auto& [base, b] : by_base_) {
    // A handle is only ever the current device memory of a resident buffer.
    if (b->vmm && b->device_handle == handle && handle != 0) {
      PinLocked(*b, api);  // resident already: cannot fail
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
    absl::MutexLock lock(&mu_);
    Device& dev = DeviceState(ordinal);
    if (dev.granularity != 0 && size % dev.granularity != 0) {
      return driver_->cuMemCreate(handle, size, prop, flags);  // INVALID_VALUE, nothing evicted
    }
    if (CUresult r = MakeRoom(dev, size); r != CUDA_SUCCESS) return r;
    Charge(dev, size);
  }
  // Outside the lock: the charge holds the room meanwhile.
  CUresult r = driver_->cuMemCreate(handle, size, prop, flags);
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  auto it = app_handles_.find(handle);
  if (it != app_handles_.end()) ++it->second.refs;
}

void MemoryManager::OnAppRelease(CUmemGenericAllocationHandle handle) {
  absl::MutexLock lock(&mu_);
  auto it = app_handles_.find(handle);
  if (it == app_handles_.end()) return;
  --it->second.refs;
  MaybeUnchargeApp(handle);
}

void MemoryManager::OnAppMap(CUdeviceptr ptr, uint64_t size,
                             CUmemGenericAllocationHandle handle) {
  absl::MutexLock lock(&mu_);
  auto it = app_handles_.find(handle);
  if (it == app_handles_.end()) return;
  ++it->second.mappings;
  app_mappings_[ptr] = {size, handle};
}

void MemoryManager::OnAppUnmap(CUdeviceptr ptr, uint64_t size) {
  absl::MutexLock lock(&mu_);
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

CUresult MemoryManager::MapDevice(Device& dev, Buffer& b) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev.ordinal;
  CUmemGenericAllocationHandle h = 0;
  CUresult r;
  // The device itself may be full below the cap: the same loop applies.
  while ((r = driver_->cuMemCreate(&h, b.reserved, &prop, 0)) == CUDA_ERROR_OUT_OF_MEMORY) {
    if (!EvictByPolicy(dev, b.reserved)) {
      LogOom(dev, b.reserved);  // the device itself is full
      return r;
    }
  }
  if (r != CUDA_SUCCESS) return r;
  if ((r = driver_->cuMemMap(b.base, b.reserved, 0, h, 0)) != CUDA_SUCCESS) {
    driver_->cuMemRelease(h);
    return r;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = driver_->cuMemSetAccess(b.base, b.reserved, &access, 1)) != CUDA_SUCCESS) {
    driver_->cuMemUnmap(b.base, b.reserved);
    driver_->cuMemRelease(h);
    return r;
  }
  b.device_handle = h;
  Charge(dev, b.reserved);
  return CUDA_SUCCESS;
}

void MemoryManager::ReleaseBuffer(Device& dev, Buffer& b) {
  if (!b.vmm) {
    driver_->cuMemFree_v2(b.base);
    dev.used -= b.reserved;
  } else {
    if (b.device_handle != 0 || b.host_at_base) driver_->cuMemUnmap(b.base, b.reserved);
    if (b.device_handle != 0) {
      driver_->cuMemRelease(b.device_handle);
      dev.used -= b.reserved;
    }
    driver_->cuMemAddressFree(b.base, b.reserved);
    if (b.host_handle != 0) {
      driver_->cuMemUnmap(b.host_va, b.reserved);
      driver_->cuMemRelease(b.host_handle);
      driver_->cuMemAddressFree(b.host_va, b.reserved);
      dev.host_bytes -= b.reserved;
    }
    if (b.host_ptr != nullptr) {
      driver_->cuMemFreeHost(b.host_ptr);
      dev.host_bytes -= b.reserved;
    }
  }
  for (const auto& [stream, event] : b.uses) driver_->cuEventDestroy_v2(event);
  by_id_.erase(b.id);
  by_base_.erase(b.base);  // destroys b
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

CUresult MemoryManager::MakeRoom(Device& dev, uint64_t need) {
  if (need > dev.cap) {  // evicting everything would not make it fit
    LogOom(dev, need);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (;;) {
    // Written so that no sum can wrap, whatever `need` is.
    if (need <= dev.cap && dev.used <= dev.cap - need) return CUDA_SUCCESS;  // S401/S402
    if (version_policy_ && DropOneClean(dev)) continue;              // S403
    if (ReleaseGarbage(dev, /*wait=*/false)) continue;               // S404
    if (ReleaseGarbage(dev, /*wait=*/true)) continue;
    if (EvictByPolicy(dev, dev.used - (dev.cap - need))) continue;  // S405
    LogOom(dev, need);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

bool MemoryManager::DropOneClean(Device& dev) {
  Buffer* pick = nullptr;
  for (auto& [base, b] : by_base_) {
    if (b->device != dev.ordinal || !b->vmm || !b->resident() || b->pins > 0 ||
        b->garbage || b->exported || !b->clean() || !Idle(*b)) {
      continue;
    }
    if (pick == nullptr || b->last_use < pick->last_use) pick = b.get();
  }
  return pick != nullptr && SwapOut(dev, *pick, /*copy=*/false) == CUDA_SUCCESS;
}

bool MemoryManager::ReleaseGarbage(Device& dev, bool wait) {
  if (garbage_ == 0) return false;
  for (auto& [base, b] : by_base_) {
    if (b->device != dev.ordinal || !b->garbage || b->pins > 0) continue;
    if (!Idle(*b)) {
      if (!wait) continue;
      WaitIdle(*b);  // unlocks: the caller looks again
      return true;
    }
    ++stats_.garbage_released;
    --garbage_;
    ReleaseBuffer(dev, *b);
    return true;
  }
  return false;
}

void MemoryManager::CollectGarbage() {
  if (garbage_ == 0) return;
  for (auto it = by_base_.begin(); it != by_base_.end();) {
    Buffer& b = *(it++)->second;  // advance first: release erases
    if (!b.garbage || b.pins > 0 || !Idle(b)) continue;
    ++stats_.garbage_released;
    --garbage_;
    ReleaseBuffer(DeviceState(b.device), b);
  }
}

bool MemoryManager::EvictByPolicy(Device& dev, uint64_t needed) {
  // Candidates are named by their index here: ids are only unique once
  // bound, and an allocation is bound after it returns.
  std::vector<EvictionCandidate> candidates;
  std::vector<Buffer*> buffers;
  for (auto& [base, b] : by_base_) {
    if (b->device != dev.ordinal || !b->vmm || !b->resident() || b->pins > 0 ||
        b->garbage || b->exported) {
      continue;
    }
    candidates.push_back(EvictionCandidate{buffers.size(), b->reserved, b->location,
                                           b->gpu_version, b->host_version,
                                           b->last_use});
    buffers.push_back(b.get());
  }
  if (candidates.empty()) return false;
  std::vector<Eviction> chosen = policy_->Choose(candidates, std::max<uint64_t>(needed, 1));
  if (chosen.empty()) return false;
  // One at a time: the caller re-checks the cap after each. A swap-out that
  // fails (the host limit, say) moves on to the next choice.
  for (const Eviction& e : chosen) {
    Buffer& b = *buffers[e.id];
    if (!Idle(b)) {
      WaitIdle(b);  // unlocks: the caller looks again, from the start
      return true;
    }
    if (SwapOut(dev, b, e.copy || !b.clean()) == CUDA_SUCCESS) return true;
  }
  return false;
}

// --- Swapping ---------------------------------------------------------------------

CUresult MemoryManager::EnsureHostCopy(Buffer& b) {
  if (b.host_handle != 0 || b.host_ptr != nullptr) return CUDA_SUCCESS;
  Device& dev = DeviceState(b.device);
  static const size_t host_total =
      static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::optional<size_t> host_cap = config_.HostLimitBytes(host_total);
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
  if (dev.host_vmm) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUresult r = driver_->cuMemCreate(&b.host_handle, b.reserved, &prop, 0);
    if (r == CUDA_SUCCESS) r = driver_->cuMemAddressReserve(&b.host_va, b.reserved, 0, 0, 0);
    if (r == CUDA_SUCCESS) r = driver_->cuMemMap(b.host_va, b.reserved, 0, b.host_handle, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = b.device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = driver_->cuMemSetAccess(b.host_va, b.reserved, &access, 1);
    }
    if (r != CUDA_SUCCESS) {
      // Undo what was made, so a later attempt starts afresh.
      if (b.host_va != 0) {
        driver_->cuMemUnmap(b.host_va, b.reserved);
        driver_->cuMemAddressFree(b.host_va, b.reserved);
      }
      if (b.host_handle != 0) driver_->cuMemRelease(b.host_handle);
      b.host_va = 0;
      b.host_handle = 0;
      return r;
    }
  } else {
    if (!warned_no_host_vmm_) {
      warned_no_host_vmm_ = true;
      Log(JsonLine()
              .Str("type", "limitation")
              .Str("what", "host-located VMM unsupported: swapped-out buffers are "
                           "unmapped; a kernel reaching one through a pointer "
                           "stensor cannot see would fault")
              .Finish());
    }
    if (CUresult r = driver_->cuMemHostAlloc(&b.host_ptr, b.size, 0); r != CUDA_SUCCESS) {
      return r;
    }
  }
  dev.host_bytes += b.reserved;
  return CUDA_SUCCESS;
}

CUresult MemoryManager::SwapOut(Device& dev, Buffer& b, bool copy) {
  if (dev.swap_stream == nullptr) {
    if (CUresult r = driver_->cuStreamCreate(&dev.swap_stream, CU_STREAM_NON_BLOCKING);
        r != CUDA_SUCCESS) {
      return r;
    }
    driver_->cuEventCreate(&dev.swap_event, CU_EVENT_DISABLE_TIMING);
  }
  // STENSOR_VERIFY: a clean drop is checked first; one that fails the check
  // (or cannot be checked) is a copy.
  if (!copy && verifier_ != nullptr && !VerifiedClean(dev, b)) copy = true;
  if (copy) {
    if (CUresult r = EnsureHostCopy(b); r != CUDA_SUCCESS) return r;
    CUresult r = b.host_handle != 0
                     ? driver_->cuMemcpyDtoDAsync_v2(b.host_va, b.base, b.size, dev.swap_stream)
                     : driver_->cuMemcpyDtoHAsync_v2(b.host_ptr, b.base, b.size, dev.swap_stream);
    if (r != CUDA_SUCCESS) return r;
    driver_->cuEventRecord(dev.swap_event, dev.swap_stream);
    auto start = std::chrono::steady_clock::now();
    driver_->cuEventSynchronize(dev.swap_event);
    stats_.host_wait_seconds += Seconds(std::chrono::steady_clock::now() - start);
    b.host_version = b.gpu_version;
    if (verifier_ != nullptr) {
      auto verify_start = std::chrono::steady_clock::now();
      b.host_hash = verifier_->RecordHash(dev.ordinal, b.base, b.size, dev.swap_stream);
      stats_.verify_seconds += Seconds(std::chrono::steady_clock::now() - verify_start);
    }
    ++stats_.swap_outs_copied;
    stats_.bytes_copied_out += b.size;
  } else {
    ++stats_.clean_drops;
    stats_.bytes_dropped += b.size;
  }
  UnmapDevice(dev, b);
  b.location = Location::kCpuOnly;
  Log(JsonLine()
          .Str("type", copy ? "swap_out" : "drop_clean")
          .Uint("id", b.id)
          .Uint("bytes", b.size)
          .Int("device", dev.ordinal)
          .Finish());
  return CUDA_SUCCESS;
}

// --- STENSOR_VERIFY ------------------------------------------------------------------

bool MemoryManager::VerifiedClean(Device& dev, Buffer& b) {
  ++stats_.verify_checks;
  Verifier::HostCopy host{b.host_handle != 0 ? b.host_va : 0, b.host_ptr};
  auto start = std::chrono::steady_clock::now();
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
  absl::MutexLock lock(&mu_);
  for (uint64_t id : used) {
    if (Buffer* b = ById(id)) b->last_kernel = kernel;
  }
  for (uint64_t id : written) {
    if (Buffer* b = ById(id)) b->last_writer = kernel;
  }
}

void MemoryManager::MapHostAtBase(Buffer& b) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = b.device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (driver_->cuMemMap(b.base, b.reserved, 0, b.host_handle, 0) == CUDA_SUCCESS) {
    driver_->cuMemSetAccess(b.base, b.reserved, &access, 1);
    b.host_at_base = true;
  }
}

void MemoryManager::UnmapDevice(Device& dev, Buffer& b) {
  driver_->cuMemUnmap(b.base, b.reserved);
  driver_->cuMemRelease(b.device_handle);
  b.device_handle = 0;
  dev.used -= b.reserved;
  // Never fault: the address reads the host copy while swapped out.
  if (b.host_handle != 0) MapHostAtBase(b);
}

CUresult MemoryManager::SwapIn(Device& dev, Buffer& b, bool copy, CUstream consumer) {
  if (CUresult r = MakeRoom(dev, b.reserved); r != CUDA_SUCCESS) return r;
  if (b.resident()) {
    // Another thread brought it in while MakeRoom waited without the lock:
    // order after its copy, as for any resident buffer.
    for (const auto& [s, event] : b.uses) {
      if (s == dev.swap_stream && s != nullptr) driver_->cuStreamWaitEvent(consumer, event, 0);
    }
    return CUDA_SUCCESS;
  }
  if (b.host_at_base) {
    driver_->cuMemUnmap(b.base, b.reserved);
    b.host_at_base = false;
  }
  if (CUresult r = MapDevice(dev, b); r != CUDA_SUCCESS) {
    if (b.host_handle != 0) MapHostAtBase(b);  // still swapped out, still readable
    return r;
  }
  if (copy) {
    CUresult r = b.host_handle != 0
                     ? driver_->cuMemcpyDtoDAsync_v2(b.base, b.host_va, b.size, dev.swap_stream)
                     : driver_->cuMemcpyHtoDAsync_v2(b.base, b.host_ptr, b.size, dev.swap_stream);
    if (r != CUDA_SUCCESS) {
      UnmapDevice(dev, b);  // the host copy stays the only one
      return r;
    }
    driver_->cuEventRecord(dev.swap_event, dev.swap_stream);
    // The copy is in flight: the buffer is busy until it completed, and any
    // other stream that uses it before then waits for it too (Prepare).
    RecordUse(b, dev.swap_stream);
    // The consumer waits on the device; the host goes on.
    driver_->cuStreamWaitEvent(consumer, dev.swap_event, 0);
    ++stats_.swap_ins;
    stats_.bytes_copied_in += b.size;
  } else {
    // Contents come from the operation about to run; until it is submitted
    // the host copy stays the truth (see Finish).
    b.pending_overwrite = true;
    ++stats_.swap_ins_without_copy;
  }
  b.location = Location::kCpuGpu;
  Log(JsonLine()
          .Str("type", "swap_in")
          .Uint("id", b.id)
          .Uint("bytes", b.size)
          .Bool("copy", copy)
          .Int("device", dev.ordinal)
          .Finish());
  return CUDA_SUCCESS;
}

// --- Operations ---------------------------------------------------------------------

CUresult MemoryManager::Prepare(absl::Span<const uint64_t> ids,
                                absl::Span<const uint64_t> overwritten,
                                CUstream stream) {
  absl::MutexLock lock(&mu_);
  CollectGarbage();
  std::vector<Buffer*> pinned;
  for (uint64_t id : ids) {
    Buffer* b = ById(id);
    if (b == nullptr || b->garbage) continue;
    ++b->pins;  // none of the operation's buffers may be evicted for another
    pinned.push_back(b);
  }
  for (Buffer* b : pinned) {
    Device& dev = DeviceState(b->device);
    if (b->resident()) {
      // Brought in for another stream: this one waits for that copy too.
      for (const auto& [s, event] : b->uses) {
        if (s == dev.swap_stream && s != nullptr &&
            driver_->cuEventQuery(event) == CUDA_ERROR_NOT_READY) {
          driver_->cuStreamWaitEvent(stream, event, 0);
        }
      }
      continue;
    }
    bool whole = std::find(overwritten.begin(), overwritten.end(), b->id) !=
                 overwritten.end();
    if (CUresult r = SwapIn(dev, *b, !whole, stream); r != CUDA_SUCCESS) {
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
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    Buffer* b = ById(id);
    if (b == nullptr || b->pins == 0) continue;
    --b->pins;
    if (b->pending_overwrite) {
      b->pending_overwrite = false;
      // The overwrite did not happen: the device memory holds nothing yet,
      // so bring the host copy's contents in after all.
      if (!submitted) RestoreFromHost(DeviceState(b->device), *b);
    }
    if (submitted) {
      if (b->vmm) RecordUse(*b, stream);  // small buffers are never evicted
      b->last_use = ++clock_;  // distinct ticks: LRU order has no ties
    }
  }
  if (submitted) {
    for (uint64_t id : written) {
      if (Buffer* b = ById(id)) b->gpu_version = ++version_;  // host copy now stale
    }
  }
}

void MemoryManager::MarkAllWritten(CUstream stream) {
  absl::MutexLock lock(&mu_);
  for (auto& [base, b] : by_base_) {
    if (b->resident()) b->gpu_version = ++version_;
  }
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
  Device& dev = DeviceState(ordinal);
  if (dev.unknown_use == nullptr &&
      driver_->cuEventCreate(&dev.unknown_use, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    return;
  }
  // Until it completed, nothing on this device may be evicted.
  if (driver_->cuEventRecord(dev.unknown_use, stream) == CUDA_SUCCESS) dev.unknown_used = true;
}

void MemoryManager::RestoreFromHost(Device& dev, Buffer& b) {
  CUresult r = b.host_handle != 0
                   ? driver_->cuMemcpyDtoDAsync_v2(b.base, b.host_va, b.size, dev.swap_stream)
                   : driver_->cuMemcpyHtoDAsync_v2(b.base, b.host_ptr, b.size, dev.swap_stream);
  if (r == CUDA_SUCCESS) {
    driver_->cuEventRecord(dev.swap_event, dev.swap_stream);
    driver_->cuEventSynchronize(dev.swap_event);
  } else {
    UnmapDevice(dev, b);  // keep the host copy as the only one
    b.location = Location::kCpuOnly;
  }
}

bool MemoryManager::ReadFromHostCopy(uint64_t id, uint64_t offset, void* dst,
                                     uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr || !b->vmm || b->resident() || offset + bytes > b->size) return false;
  CUresult r = b->host_handle != 0
                   ? driver_->cuMemcpyDtoH_v2(dst, b->host_va + offset, bytes)
                   : (std::memcpy(dst, static_cast<char*>(b->host_ptr) + offset, bytes),
                      CUDA_SUCCESS);
  if (r != CUDA_SUCCESS) return false;
  ++stats_.reads_served_from_host;
  return true;
}

CUresult MemoryManager::ReadBack(uint64_t id, uint64_t offset, void* dst, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (offset > b->size || bytes > b->size - offset) return CUDA_ERROR_INVALID_VALUE;
  if (!b->resident()) {
    if (b->host_ptr != nullptr) {
      std::memcpy(dst, static_cast<char*>(b->host_ptr) + offset, bytes);
      return CUDA_SUCCESS;
    }
    return driver_->cuMemcpyDtoH_v2(dst, b->host_va + offset, bytes);
  }
  // Pinned, so it stays mapped while the copy runs without the lock; a
  // swap-in still copying its contents in is waited for first.
  std::vector<CUevent> swap_ins;
  const CUstream swap_stream = DeviceState(b->device).swap_stream;
  for (const auto& [stream, event] : b->uses) {
    if (stream == swap_stream && swap_stream != nullptr) swap_ins.push_back(event);
  }
  ++b->pins;
  mu_.Unlock();
  CUresult r = CUDA_SUCCESS;
  for (CUevent e : swap_ins) {
    if (r == CUDA_SUCCESS) r = driver_->cuEventSynchronize(e);
  }
  if (r == CUDA_SUCCESS) r = driver_->cuMemcpyDtoH_v2(dst, b->base + offset, bytes);
  mu_.Lock();
  --b->pins;
  return r;
}

bool MemoryManager::SwappedOutStaysMapped() {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return false;
  absl::MutexLock lock(&mu_);
  return DeviceState(ordinal).host_vmm;
}

bool MemoryManager::IsSwappable(const Buffer& b, int device) {
  return b.vmm && !b.garbage && b.id != 0 && b.device == device;
}

uint64_t MemoryManager::BufferId(const Buffer& b) { return b.id; }

void MemoryManager::MemInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  absl::MutexLock lock(&mu_);
  CollectGarbage();
  Device& dev = DeviceState(device);
  if (total_bytes != nullptr) *total_bytes = dev.cap;
  if (free_bytes != nullptr) *free_bytes = dev.used >= dev.cap ? 0 : dev.cap - dev.used;
}

SwapStats MemoryManager::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::string MemoryManager::StatsText() const {
  SwapStats s = stats();
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  return absl::StrFormat(
      "stensor: policy %s\n"
      "stensor: peak resident      %10.1f MiB\n"
      "stensor: swap-outs copied   %10u (%.1f MiB device->host)\n"
      "stensor: clean drops        %10u (%.1f MiB, no copy)\n"
      "stensor: swap-ins on demand %10u (%.1f MiB host->device)\n"
      "stensor: swap-ins, no copy  %10u (buffer overwritten whole)\n"
      "stensor: reads from host    %10u (device->host copies served from the host copy)\n"
      "stensor: garbage released   %10u\n"
      "stensor: out of memory      %10u\n"
      "stensor: host waited        %10.3f s\n%s",
      std::string(policy_->name()), mib(s.peak_resident_bytes), s.swap_outs_copied,
      mib(s.bytes_copied_out), s.clean_drops, mib(s.bytes_dropped), s.swap_ins,
      mib(s.bytes_copied_in), s.swap_ins_without_copy, s.reads_served_from_host,
      s.garbage_released, s.ooms, s.host_wait_seconds,
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
