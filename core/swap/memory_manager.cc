// MemoryManager's decisions: the eviction order, allocation under the cap
// and the S401-S405 loop that makes room, swapping out and in (the state
// transitions), and the Prepare/Finish of the program's operations with
// the planned swaps around them. The plumbing they drive lives apart:
// memory_manager_uses.cc (uses on streams, waits, stensor's streams),
// memory_manager_physical.cc (physical memory, the chunk pool, mappings),
// memory_manager_host.cc (host copies), memory_manager_external.cc (memory
// counted but not swapped); the shared state is memory_manager_internal.h.

#include "core/swap/memory_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <tuple>

#include "absl/container/fixed_array.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/json.h"
#include "core/base/log.h"
#include "core/driver/context_scope.h"
#include "core/driver/device_context.h"
#include "core/swap/driver_pool.h"
#include "core/swap/host_copy.h"
#include "core/swap/memory_manager_internal.h"
#include "core/swap/stream_use.h"

namespace stensor {

// Pins this thread's operations hold (Prepare to Finish), in any manager:
// what MakeRoom need not wait for. Initial-exec, as PerThread's pointer
// (core/base/thread_cache.h): four bytes of static TLS, where the
// general-dynamic model costs a __tls_get_addr call per access (about 200
// instructions a launch of six swappable buffers).
thread_local int t_operation_pins __attribute__((tls_model("initial-exec"))) = 0;

namespace {

// Who prepares the operation in progress on this thread: an operation's
// Prepare and Finish run on one thread, one operation at a time.
const void* ThisOperation() { return &t_operation_pins; }

}  // namespace

using memory_manager_internal::AlignUp;
using memory_manager_internal::kNoConsumer;
using memory_manager_internal::kSmallUnit;
using memory_manager_internal::Seconds;

void MemoryManager::Unindex(Buffer& b) { DeviceState(b.device).order.Remove(b); }

void MemoryManager::TellPlannerResidency(Buffer& b) {
  // A group is resident to the planner while every piece is.
  bool& told =
      b.group != nullptr && b.group->id != 0 ? b.group->planner_resident : b.planner_resident;
  const bool resident =
      b.group != nullptr && b.group->id != 0 ? GroupResident(*b.group) : b.resident();
  if (told != resident) {
    told = resident;
    if (resident) {
      planner_->OnResident(PlannerId(b));
    } else {
      planner_->OnEvicted(PlannerId(b));
    }
  }
}

std::string MemoryManager::MissingEntryPoints(const Driver& d) {
  const std::pair<const char*, bool> needed[] = {
#define STENSOR_SWAP_ENTRY(name) {#name, d.name != nullptr},
#include "core/swap/swap_entry_points.inc"
#undef STENSOR_SWAP_ENTRY
  };
  std::string missing;
  for (const auto& [name, found] : needed) {
    if (!found) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  }
  return missing;
}

std::unique_ptr<MemoryManager> MemoryManager::Create(const Config& config, const Driver* driver,
                                                     LogSink log) {
  if (!config.memory_limit.all_devices && config.memory_limit.per_device.empty()) {
    return nullptr;
  }
  if (std::string missing = MissingEntryPoints(*driver); !missing.empty()) {
    // Calling a null entry point later would crash the program: no cap.
    SayOnce(LogLevel::kWarn, "cap-not-applied",
            absl::StrCat("STENSOR_MEMORY_LIMIT is not applied: the CUDA driver lacks ", missing,
                         ", which swapping needs (STENSOR_REAL_LIBCUDA names another driver?)"));
    return nullptr;
  }
  std::unique_ptr<EvictionPolicy> policy =
      config.policy == EvictionPolicyKind::kLru      ? MakeLruPolicy()
      : config.policy == EvictionPolicyKind::kBelady ? MakeBeladyPolicy()
                                                     : MakeVersionPolicy();
  return std::unique_ptr<MemoryManager>(
      new MemoryManager(config, driver, std::move(log), std::move(policy)));
}

MemoryManager::MemoryManager(const Config& config, const Driver* driver, LogSink log,
                             std::unique_ptr<EvictionPolicy> policy)
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
  ManagerLock lock(this);
  while (!by_base_.empty()) {
    Buffer& b = *by_base_.begin()->second;
    WaitIdle(b, HostWait::kAllowed);  // an error here leaves nothing better to do than release
    if (!ReleaseBuffer(DeviceState(b.device), b)) {
      Unindex(b);
      DequeueGarbage(DeviceState(b.device), b);
      // At exit: leak what the driver would not release.
      const uint64_t key = b.key;
      by_base_.erase(by_base_.begin());
      EraseBuffer(key);
    }
  }
  ReleaseAllPooled();
  RetryReleases();
  (void)host_store_.FreeSpares();
  for (auto& d : devices_) {
    if (!d) continue;
    // Failures here leak a handle at exit; nothing is left to keep consistent.
    if (d->swap_stream != nullptr) (void)driver_->cuStreamDestroy_v2(d->swap_stream);
    if (d->fetch_stream != nullptr) (void)driver_->cuStreamDestroy_v2(d->fetch_stream);
    for (const Use& u : d->unknown) {
      if (u.own != nullptr) (void)driver_->cuEventDestroy_v2(u.own);
    }
  }
  for (const auto& [key, ring] : mark_rings_) {
    for (const std::unique_ptr<StreamMark>& m : ring.marks) {
      (void)driver_->cuEventDestroy_v2(m->event);
    }
  }
  for (const ExternalFree& f : external_frees_) {
    for (const Use& u : f.uses) {
      if (u.own != nullptr) (void)driver_->cuEventDestroy_v2(u.own);
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

MemoryManager::Device& MemoryManager::AddDeviceState(int ordinal) {
  if (ordinal < 0) ordinal = 0;
  if (static_cast<size_t>(ordinal) >= devices_.size()) devices_.resize(ordinal + 1);
  std::unique_ptr<Device>& d = devices_[ordinal];
  if (d) return *d;
  d = std::make_unique<Device>(policy_.get(), version_policy_);
  d->ordinal = ordinal;
  size_t total = 0;
  if (driver_->cuDeviceTotalMem_v2) driver_->cuDeviceTotalMem_v2(&total, ordinal);
  d->total = total;
  d->cap = CapFor(ordinal, total);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  size_t granularity = 0;
  if (driver_->cuMemGetAllocationGranularity &&
      driver_->cuMemGetAllocationGranularity(
          &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS) {
    d->granularity = granularity;
  }
  int host_vmm = 0;
  if (driver_->cuDeviceGetAttribute) {
    driver_->cuDeviceGetAttribute(
        &host_vmm, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, ordinal);
  }
  d->host_vmm = host_vmm != 0;
  return *d;
}

void MemoryManager::Charge(Device& dev, uint64_t bytes) {
  dev.used += bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, dev.used);
}

MemoryManager::Buffer* MemoryManager::ByIdSlow(uint64_t id) const {
  if (id == 0 || id >= kUntrackedKeys) return nullptr;  // never a registry id
  if (unindexed_ > 0) {
    auto it = buffers_.find(id);
    if (it != buffers_.end()) return it->second.get();
  }
  // A small allocation: the slab that holds it.
  if (!slab_blocks_.empty()) {
    auto k = slab_blocks_.find(id);
    if (k != slab_blocks_.end()) return k->second.slab;
  }
  // An allocation made of pieces: its first piece not yet released.
  if (groups_ == 0) return nullptr;
  auto g = group_ids_.find(id);
  if (g == group_ids_.end()) return nullptr;
  for (Buffer* p : g->second->pieces) {
    if (p != nullptr) return p;
  }
  return nullptr;
}

DenseIdMap<MemoryManager::Buffer>& MemoryManager::IndexOf(uint64_t key, uint64_t* at) {
  *at = key < kPieceKeys ? key : key - kPieceKeys;
  return key < kPieceKeys ? by_id_ : by_piece_key_;
}

void MemoryManager::PutBuffer(uint64_t key, std::unique_ptr<Buffer> b) {
  EraseBuffer(key);  // one there before (none expected) goes
  Buffer* buffer = b.get();
  buffers_[key] = std::move(b);
  if (key >= kUntrackedKeys) return;  // never looked up by id
  uint64_t at = 0;
  if (!IndexOf(key, &at).Put(at, buffer)) ++unindexed_;
}

void MemoryManager::EraseBuffer(uint64_t key) {
  if (buffers_.erase(key) == 0 || key >= kUntrackedKeys) return;
  uint64_t at = 0;
  DenseIdMap<Buffer>& index = IndexOf(key, &at);
  if (at >= DenseIdMap<Buffer>::kMaxId) {
    --unindexed_;  // refused by the index when put
  } else {
    index.Erase(at);
  }
}

absl::Span<const uint64_t> MemoryManager::ExpandedSlow(absl::Span<const uint64_t> ids, Keys* out,
                                                       bool overwritten) {
  out->clear();
  absl::InlinedVector<uint64_t, 4> slabs;  // named already
  for (uint64_t id : ids) {
    if (!slab_blocks_.empty()) {
      auto k = slab_blocks_.find(id);
      if (k != slab_blocks_.end()) {
        const uint64_t slab = k->second.slab->key;
        if (!overwritten && std::find(slabs.begin(), slabs.end(), slab) == slabs.end()) {
          slabs.push_back(slab);
          out->push_back(slab);
        }
        continue;
      }
    }
    auto g = groups_ > 0 && id < kPieceKeys ? group_ids_.find(id) : group_ids_.end();
    if (g == group_ids_.end()) {
      out->push_back(id);  // a whole buffer, or a piece named on its own
      continue;
    }
    for (const Buffer* p : g->second->pieces) {
      if (p != nullptr) out->push_back(p->key);
    }
  }
  return *out;
}

bool MemoryManager::Narrow(uint64_t id, uint64_t offset, uint64_t bytes, Keys* ids, Keys* covered) {
  ManagerLock lock(this);
  auto g = groups_ > 0 && id < kPieceKeys ? group_ids_.find(id) : group_ids_.end();
  if (g == group_ids_.end()) return false;
  PieceGroup& group = *g->second;
  const uint64_t end = offset + std::min(bytes, group.size - std::min(offset, group.size));
  group.bounds.Note(offset);
  group.bounds.Note(end);
  for (const Buffer* p : group.pieces) {
    if (p == nullptr) continue;
    const uint64_t from = p->base - group.base, to = from + p->size;
    if (to <= offset || from >= end) continue;
    ids->push_back(p->key);
    if (covered != nullptr && from >= offset && to <= end) covered->push_back(p->key);
  }
  return true;
}

bool MemoryManager::FarPieces(uint64_t id, absl::Span<const uint64_t> words, Keys* far) {
  ManagerLock lock(this);
  auto g = groups_ > 0 && id < kPieceKeys ? group_ids_.find(id) : group_ids_.end();
  if (g == group_ids_.end()) return false;
  PieceGroup& group = *g->second;
  auto offset = [&](uint64_t word) {
    return word >= group.base && word - group.base < group.size ? word - group.base : group.size;
  };
  // Every word a bound first: pointers of one launch end each other's reach.
  for (uint64_t w : words) {
    if (offset(w) < group.size) group.bounds.Note(offset(w));
  }
  for (const Buffer* p : group.pieces) {
    if (p == nullptr) continue;
    const uint64_t from = p->base - group.base, to = from + p->size;
    const bool near = std::any_of(words.begin(), words.end(), [&](uint64_t w) {
      const uint64_t at = offset(w);
      return at < to && at < group.size && group.bounds.EndFrom(at, group.size) > from;
    });
    if (!near) far->push_back(p->key);
  }
  return true;
}

void MemoryManager::EvictPlanned(Buffer& b) {
  if (EvictAsyncLocked(b) == CUDA_SUCCESS) {
    ++stats_.planned_evictions_issued;
  } else {
    ++stats_.planned_evictions_skipped;
  }
}

uint64_t MemoryManager::PlannerId(const Buffer& b) {
  return b.group != nullptr && b.group->id != 0 ? b.group->id : b.id;
}

bool MemoryManager::GroupResident(const PieceGroup& group) {
  return std::all_of(group.pieces.begin(), group.pieces.end(),
                     [](const Buffer* p) { return p == nullptr || p->resident(); });
}

std::vector<MemoryManager::Buffer*> MemoryManager::PlannedAs(Buffer& b, uint64_t id) {
  if (b.group == nullptr || b.group->id != id || id == 0) return {&b};
  return PiecesOf(b);
}

MemoryManager::Buffer& MemoryManager::Whole(Buffer& b) {
  if (b.group == nullptr || b.group->pieces.front() == nullptr) return b;
  return *b.group->pieces.front();
}

CUresult MemoryManager::MakePieces(Device& dev, Buffer& head,
                                   std::vector<std::unique_ptr<Buffer>>* pieces) {
  const uint64_t granule = dev.granularity;
  auto group = std::make_shared<PieceGroup>();
  group->base = head.base;
  group->size = head.size;
  group->reserved = head.reserved;
  group->pieces.push_back(&head);
  for (uint64_t at = granule; at < group->reserved; at += granule) {
    auto p = std::make_unique<Buffer>();
    p->vmm = true;
    p->device = head.device;
    p->context = head.context;
    p->base = head.base + at;
    p->size = std::min(granule, group->size - at);  // the last may be short
    p->reserved = granule;
    p->gpu_version = ++version_;
    p->last_use = ++clock_;
    group->pieces.push_back(p.get());
    pieces->push_back(std::move(p));
  }
  head.size = granule;
  head.reserved = granule;
  head.va_reserved = false;  // the group's, freed with its last piece
  // Known as pieces from here on (a piece born on the host is logged once
  // the allocation has its id); live and va_reserved only once all exist.
  for (Buffer* p : group->pieces) p->group = group;
  // Each on the device where room can be made, else born on the host (as a
  // whole buffer would be): the first pieces may fit where the rest do not.
  CUresult r = CUDA_SUCCESS;
  size_t made = 0;
  for (; made < group->pieces.size(); ++made) {
    Buffer& p = *group->pieces[made];
    r = MapDevice(dev, p);
    const bool stuck_here = !stuck_.empty() && stuck_.back().va == p.base;
    if (r == CUDA_ERROR_OUT_OF_MEMORY && p.device_chunks.empty() && !stuck_here) {
      r = AllocateOnHost(dev, p);
    }
    if (r != CUDA_SUCCESS) break;
  }
  if (r == CUDA_SUCCESS) {
    group->live = group->pieces.size();
    group->va_reserved = true;
    ++groups_;
    has_pieces_.store(true, std::memory_order_relaxed);
    return CUDA_SUCCESS;
  }
  // Undone: the pieces made so far let go of their memory, and the range
  // is freed unless memory stays stuck mapped in it (address space lost).
  bool range_free = stuck_.empty() || stuck_.back().va < group->base ||
                    stuck_.back().va >= group->base + group->reserved;
  for (size_t i = 0; i <= made && i < group->pieces.size(); ++i) {
    Buffer& p = *group->pieces[i];
    // Reused memory's zeroing may still be queued on the swap stream: the
    // piece lets go of it only once that is done (else the memory stays
    // mapped and charged, lost to the cap but never written unmapped).
    if (WaitSwapUse(dev, p, HostWait::kAllowed) != CUDA_SUCCESS) {
      range_free = false;
      continue;
    }
    range_free = ReleaseBuffer(dev, p) && range_free;
  }
  pieces->clear();
  head.group = nullptr;
  head.size = group->size;
  head.reserved = group->reserved;
  head.va_reserved = false;
  if (range_free) (void)Failed(driver_->cuMemAddressFree(group->base, group->reserved));
  return r;
}

CUresult MemoryManager::Failed(CUresult r) {
  if (r != CUDA_SUCCESS) ++stats_.driver_errors;
  return r;
}

// --- Allocation -----------------------------------------------------------------

CUresult MemoryManager::Allocate(uint64_t bytes, CUdeviceptr* dptr, RegisterId register_id,
                                 const CUstream* stream_order) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUdevice ordinal = 0;
  if (CUresult r = driver_->cuCtxGetDevice(&ordinal); r != CUDA_SUCCESS) return r;
  CUcontext context = nullptr;
  if (CUresult r = driver_->cuCtxGetCurrent(&context); r != CUDA_SUCCESS) return r;
  ManagerLock lock(this);
  Device& dev = DeviceState(ordinal);
  const CUresult r = AllocateLocked(dev, context, bytes, dptr, register_id, stream_order);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) LogOom(dev, bytes);
  return r;
}

CUresult MemoryManager::AllocateLocked(Device& dev, CUcontext context, uint64_t bytes,
                                       CUdeviceptr* dptr, RegisterId register_id,
                                       const CUstream* stream_order) {
  const bool stream_ordered = stream_order != nullptr;
  // More than the cap can never be resident: with host-located VMM it is
  // born in host memory and served from there (below); without, out of
  // memory. More than the device has is out of memory either way, as the
  // driver answers (a program probing for the largest allocation must not
  // be handed host memory without end; rounding SIZE_MAX up would wrap).
  const bool over_cap = bytes > dev.cap;
  if (over_cap && (!dev.host_vmm || dev.granularity == 0 || dev.total == 0 || bytes > dev.total)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (SlabSized(dev, bytes)) {
    return AllocateInSlab(dev, context, bytes, dptr, register_id, stream_order);
  }
  auto b = std::make_unique<Buffer>();
  b->size = bytes;
  b->device = dev.ordinal;
  b->context = context;
  if (dev.context == nullptr) dev.context = context;
  JournalOn(dev);
  b->gpu_version = ++version_;
  b->last_use = ++clock_;  // just used: not the first to go
  // From half a granule up a buffer maps a whole chunk (at most twice its
  // size): the memory it frees serves any other buffer, where the driver's
  // allocator would need a pooled chunk released for it (room for it) and
  // created again for the next VMM buffer.
  const bool vmm_sized = dev.granularity != 0 && bytes >= dev.granularity / 2;
  if (vmm_sized) b->reserved = AlignUp(bytes, dev.granularity);
  // Larger than a granule, where host memory can stand in at an address:
  // made of pieces of a granule each (PieceGroup), resident in part.
  const bool in_pieces =
      vmm_sized && !over_cap && !stream_ordered && dev.host_vmm && b->reserved > dev.granularity;
  // A pending free of the same size serves first, before it is released
  // (which would unmap and free what a new reservation then maps again).
  const bool may_take = vmm_sized && !over_cap && !in_pieces;
  bool taken_over = may_take && (TakeKept(dev, *b) || TakeOverGarbage(dev, *b));
  CollectGarbage();
  ReapOldMappings(dev, /*wait=*/false);
  if (may_take && !taken_over) taken_over = TakeKept(dev, *b) || TakeOverGarbage(dev, *b);
  // With host-located VMM, a small one finding no room under the cap is
  // no refusal either: made a buffer of one granule, born on the host
  // (below), it is swapped in when a granule is free.
  const bool small_fallback = ServesSmallFromHost(dev, bytes);
  bool small_on_host = false;
  std::vector<std::unique_ptr<Buffer>> pieces;  // after the first (in_pieces)
  if (!vmm_sized) {
    b->reserved = AlignUp(bytes, kSmallUnit);
    CUresult r = MakeRoom(dev, b->reserved, HostWait::kAllowed);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && small_fallback) {
      small_on_host = true;
      b->reserved = AlignUp(bytes, dev.granularity);
    } else if (r != CUDA_SUCCESS) {
      return r;
    }
  }
  if (taken_over) {
    b->vmm = true;
  } else if (!vmm_sized && !small_on_host) {
    // Too small to map on its own: the driver's allocator, charged, kept.
    TrimDriverPool(dev);
    CUresult r;
    while ((r = driver_->cuMemAlloc_v2(&b->base, bytes)) == CUDA_ERROR_OUT_OF_MEMORY) {
      if (!EvictByPolicy(dev, b->reserved, HostWait::kAllowed)) return r;  // the device is full
    }
    if (r != CUDA_SUCCESS) return r;
    Charge(dev, b->reserved);
  } else {
    b->vmm = true;
    // Room is made (or a pooled chunk taken) once the range is reserved.
    if (CUresult r = driver_->cuMemAddressReserve(&b->base, b->reserved, 0, 0, 0);
        r != CUDA_SUCCESS) {
      return r;
    }
    b->va_reserved = true;
    if (in_pieces) {
      if (CUresult r = MakePieces(dev, *b, &pieces); r != CUDA_SUCCESS) return r;
    }
    CUresult r = in_pieces                   ? CUDA_SUCCESS
                 : over_cap || small_on_host ? CUDA_ERROR_OUT_OF_MEMORY
                                             : MapDevice(dev, *b);
    r = OrBornOnHost(dev, *b, r);
    if (r != CUDA_SUCCESS) {
      UndoReservation(*b);
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
  if (PieceGroup* g = b->group.get()) {
    // The allocation's id names the group; each piece has a key of its own.
    g->id = b->id;
    if (g->id != 0) group_ids_[g->id] = g;
    b->id = b->key = kPieceKeys + ++pieces_made_;
  }
  Buffer& added = *b;
  by_base_[added.base] = &added;
  PutBuffer(added.key, std::move(b));
  Reindex(added);
  if (CountsForSlabs(dev, bytes)) {
    added.before_slabs = true;
    dev.slab_onset.Made(bytes, dev.cap);
  }
  for (std::unique_ptr<Buffer>& p : pieces) {
    Buffer& piece = *p;
    piece.serial = ++serial_;
    piece.id = piece.key = kPieceKeys + ++pieces_made_;
    by_base_[piece.base] = &piece;
    PutBuffer(piece.key, std::move(p));
    Reindex(piece);
  }
  if (added.group != nullptr) {
    for (const Buffer* p : added.group->pieces) {
      if (!p->resident()) LogBornOnHost(dev, *p);
    }
  }
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

CUresult MemoryManager::OrBornOnHost(Device& dev, Buffer& b, CUresult mapped) {
  // No room for it on the device: born on the host, swapped out, its
  // (zeroed) host copy mapped at its address, served from there. (Not
  // where a failed undo left memory mapped at the address.)
  const bool stuck_here = !stuck_.empty() && stuck_.back().va == b.base;
  if (mapped == CUDA_ERROR_OUT_OF_MEMORY && dev.host_vmm && b.device_chunks.empty() &&
      !stuck_here) {
    return AllocateOnHost(dev, b);
  }
  return mapped;
}

void MemoryManager::UndoReservation(Buffer& b) {
  if (!stuck_.empty() && stuck_.back().va == b.base && stuck_.back().reserved == 0) {
    stuck_.back().reserved = b.reserved;  // freed once unmapped
  } else {
    // A range that cannot be freed is only address space lost; the
    // program sees why its allocation failed.
    (void)Failed(driver_->cuMemAddressFree(b.base, b.reserved));
  }
}

// --- Small allocations in slabs --------------------------------------------------

bool MemoryManager::SlabSized(const Device& dev, uint64_t bytes) const {
  const bool packing = config_.slabs == SlabMode::kOn ||
                       (config_.slabs == SlabMode::kAuto && dev.slab_onset.packing());
  return packing && ServesSmallFromHost(dev, bytes);
}

bool MemoryManager::CountsForSlabs(const Device& dev, uint64_t bytes) const {
  return config_.slabs == SlabMode::kAuto && !dev.slab_onset.packing() &&
         ServesSmallFromHost(dev, bytes);
}

CUresult MemoryManager::AllocateInSlab(Device& dev, CUcontext context, uint64_t bytes,
                                       CUdeviceptr* dptr, RegisterId register_id,
                                       const CUstream* stream_order) {
  if (dev.context == nullptr) dev.context = context;
  const bool stream_ordered = stream_order != nullptr;
  // In stream order, space freed on the same stream is free at once: what
  // follows there runs after the free.
  std::optional<SlabPool::Order> order;
  if (stream_ordered) order = UseKey(*stream_order);
  ReclaimBlocks(dev, /*all=*/false);
  std::optional<SlabPool::Block> block = slabs_.Take(dev.ordinal, bytes, order);
  if (!block) {
    ReclaimBlocks(dev, /*all=*/true);
    block = slabs_.Take(dev.ordinal, bytes, order);
  }
  if (!block) {
    if (CUresult r = NewSlab(dev, context); r != CUDA_SUCCESS) return r;
    block = slabs_.Take(dev.ordinal, bytes, order);
    if (!block) return CUDA_ERROR_OUT_OF_MEMORY;  // not reached: an empty slab holds it
  }
  if (block->ended_wait != 0) slab_waits_.erase(block->ended_wait);
  Buffer* slab = ById(block->slab);
  *dptr = block->base;
  // Before the allocation's own record (logged as it is registered): a
  // reader of the log knows its place from the start (`stensor sim`).
  if (logging()) {
    Log(JsonLine()
            .Str("type", "slab_alloc")
            .Str("addr", absl::StrFormat("0x%x", block->base))
            .Uint("slab", block->slab)
            .Uint("bytes", block->span())
            .Finish());
  }
  const uint64_t id = register_id(block->base);
  slabs_.Name(block->base, id);
  if (id != 0 && id < kUntrackedKeys) {
    slab_blocks_[id] = SlabBlock{slab, block->base, bytes};
  } else {
    // No operation will name it, so none pins its slab: the slab stays
    // where it is for good (on the host, its copy mapped at its address,
    // if it is there now).
    slab->exported = true;
    Reindex(*slab);
  }
  ++stats_.slab_allocations;
  if (stream_ordered) {
    StreamOrderedUsage& u = dev.stream_ordered;
    u.used += bytes;
    u.reserved += block->span();
    u.used_high = std::max(u.used_high, u.used);
    u.reserved_high = std::max(u.reserved_high, u.reserved);
  }
  return CUDA_SUCCESS;
}

CUresult MemoryManager::NewSlab(Device& dev, CUcontext context) {
  auto b = std::make_unique<Buffer>();
  b->size = b->reserved = dev.granularity;
  b->device = dev.ordinal;
  b->context = context;
  b->vmm = true;
  b->slab = true;
  JournalOn(dev);
  b->gpu_version = ++version_;
  b->last_use = ++clock_;
  CollectGarbage();
  ReapOldMappings(dev, /*wait=*/false);
  if (CUresult r = driver_->cuMemAddressReserve(&b->base, b->reserved, 0, 0, 0);
      r != CUDA_SUCCESS) {
    return r;
  }
  b->va_reserved = true;
  CUresult r = OrBornOnHost(dev, *b, MapDevice(dev, *b));
  if (r != CUDA_SUCCESS) {
    UndoReservation(*b);
    return r;
  }
  b->serial = ++serial_;
  b->id = b->key = kPieceKeys + ++pieces_made_;
  Buffer& slab = *b;
  by_base_[slab.base] = &slab;
  PutBuffer(slab.key, std::move(b));
  Reindex(slab);
  slabs_.AddSlab(slab.key, dev.ordinal, slab.base, slab.reserved);
  ++stats_.slabs_made;
  if (logging()) {
    Log(JsonLine()
            .Str("type", "slab")
            .Uint("slab", slab.key)
            .Str("addr", absl::StrFormat("0x%x", slab.base))
            .Uint("bytes", slab.reserved)
            .Int("device", dev.ordinal)
            .Bool("resident", slab.resident())
            .Finish());
  }
  return CUDA_SUCCESS;
}

bool MemoryManager::BlockStartsAt(CUdeviceptr base) const {
  const Buffer* b = Containing(base);
  if (b == nullptr || !b->slab) return false;
  std::optional<SlabPool::Block> block = slabs_.Containing(base);
  return block && block->base == base;
}

bool MemoryManager::FreeBlock(CUdeviceptr base, const CUstream* stream) {
  if (!BlockStartsAt(base)) return false;
  Buffer& slab = *Containing(base);
  Device& dev = DeviceState(slab.device);
  // Until the work queued before the free is done, the block's space may
  // still be read or written: it waits for that work. In stream order, the
  // program ordered every access before the free on its stream: that point
  // is the one use to wait for (and none for the same stream's next
  // allocation). Else every use of the slab, and work of unknown accesses.
  std::vector<Use> after;
  std::optional<SlabPool::Order> order;
  if (stream != nullptr) {
    order = UseKey(*stream);
    Use* at = NoteUse(slab.uses, *stream, slab.device, *order);
    if (!Observed(*at)) after.push_back(*at);
  } else {
    for (Use& u : slab.uses) {
      if (!Observed(u)) after.push_back(u);
    }
    for (Use& u : dev.unknown) {
      if (!Observed(u)) after.push_back(u);
    }
  }
  uint64_t wait = 0;
  if (!after.empty()) {
    wait = ++slab_waits_made_;
    slab_waits_[wait] = std::move(after);
  }
  std::optional<SlabPool::Block> block = slabs_.Free(base, wait, order);
  if (!block) return false;  // not reached: checked above
  if (block->id != 0) slab_blocks_.erase(block->id);
  if (block->stream_ordered) {
    dev.stream_ordered.used -= block->size;
    dev.stream_ordered.reserved -= block->span();
  }
  ReclaimBlocks(dev, /*all=*/false);
  ReleaseEmptySlabs(dev, /*keep=*/1);  // one stays for the next small allocation
  return true;
}

void MemoryManager::ReclaimBlocks(Device& dev, bool all) {
  slabs_.Reclaim(dev.ordinal, all, [&](uint64_t wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = slab_waits_.find(wait);
    if (it == slab_waits_.end()) return true;
    for (Use& u : it->second) {
      if (!Observed(u)) return false;
    }
    slab_waits_.erase(it);
    return true;
  });
}

bool MemoryManager::ReleaseEmptySlabs(Device& dev, size_t keep) {
  // Freed as the program's allocations are (released once their work is
  // done).
  bool any = false;
  for (uint64_t key : slabs_.TakeEmpty(dev.ordinal, keep)) {
    if (Buffer* slab = ById(key); slab != nullptr && !slab->garbage) {
      FreeAllocation(dev, *slab, nullptr);
      if (logging()) Log(JsonLine().Str("type", "slab_free").Uint("slab", key).Finish());
      any = true;
    }
  }
  return any;
}

CUresult MemoryManager::CopyParts(const Buffer& b, CUstream stream, bool out, uint64_t* copied) {
  // A slab carries its live blocks only, unless verified drops hash it whole.
  std::vector<std::pair<uint64_t, uint64_t>> parts;
  if (b.slab && verifier_ == nullptr) {
    parts = slabs_.LiveRanges(b.key);
  } else {
    parts.emplace_back(0, b.size);
  }
  for (const auto& [offset, bytes] : parts) {
    CUresult r = out ? b.host.CopyFromDevice(vmm_, b.base + offset, bytes, stream, offset)
                     : b.host.CopyToDevice(vmm_, b.base + offset, bytes, stream, offset);
    if (r != CUDA_SUCCESS) return r;
    *copied += bytes;
  }
  return CUDA_SUCCESS;
}

bool MemoryManager::IntoSlab(uint64_t id, uint64_t* offset, uint64_t bytes) const {
  auto k = slab_blocks_.find(id);
  if (k == slab_blocks_.end()) return true;
  const SlabBlock& block = k->second;
  if (*offset > block.size || bytes > block.size - *offset) return false;
  *offset += block.base - block.slab->base;
  return true;
}

MemoryManager::StreamOrderedUsage MemoryManager::StreamOrdered(int device) {
  ManagerLock lock(this);
  CollectGarbage();  // freed buffers whose free ran hold no memory any more
  return DeviceState(device).stream_ordered;
}

void MemoryManager::ResetStreamOrderedHigh(int device, bool used, bool reserved) {
  ManagerLock lock(this);
  StreamOrderedUsage& u = DeviceState(device).stream_ordered;
  if (used) u.used_high = u.used;
  if (reserved) u.reserved_high = u.reserved;
}

bool MemoryManager::Swappable(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return false;
  ManagerLock lock(this);
  const Device& dev = DeviceState(ordinal);
  return (dev.granularity != 0 && bytes >= dev.granularity / 2 && bytes <= dev.cap) ||
         SlabSized(dev, bytes);
}

bool MemoryManager::SmallServedFromHost(uint64_t bytes) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return false;
  ManagerLock lock(this);
  return ServesSmallFromHost(DeviceState(ordinal), bytes);
}

bool MemoryManager::ServesSmallFromHost(const Device& dev, uint64_t bytes) {
  // Where host memory can stand in at an address: a small buffer (or a
  // slab) that does not fit beside an operation's other buffers is served
  // from there, never refused.
  return dev.host_vmm && dev.granularity != 0 && bytes < dev.granularity / 2;
}

MemoryManager::Footprint MemoryManager::FootprintOf(absl::Span<const uint64_t> ids) const {
  MutexLock lock(&mu_);
  Footprint f;
  absl::flat_hash_set<const Buffer*> seen;
  for (uint64_t id : ids) {
    const Buffer* found = ById(id);
    if (found == nullptr || found->garbage) continue;
    const Buffer& b = *found;
    if (!seen.insert(&b).second) continue;
    if (seen.size() == 1) f.device = b.device;
    f.bytes += ViewOf(b).reserved;  // a group: every piece
    ++f.buffers;
  }
  if (f.device >= 0 && static_cast<size_t>(f.device) < devices_.size() && devices_[f.device]) {
    f.cap = devices_[f.device]->cap;
    f.host_vmm = devices_[f.device]->host_vmm;
  }
  return f;
}

bool MemoryManager::Owns(CUdeviceptr base) const {
  MutexLock lock(&mu_);
  return Allocation(base) != nullptr || BlockStartsAt(base);
}

CUresult MemoryManager::Free(CUdeviceptr base) {
  ManagerLock lock(this);
  SettleAhead();
  Buffer* b = Allocation(base);
  if (b == nullptr && FreeBlock(base, nullptr)) return CUDA_SUCCESS;
  if (b == nullptr || b->garbage) return CUDA_ERROR_INVALID_VALUE;  // or freed twice
  Device& dev = DeviceState(b->device);
  FreeAllocation(dev, *b, nullptr);
  // Earlier frees whose work completed since: a program that never
  // synchronises holds only those still in flight.
  CollectGarbage(dev);
  ReapOldMappings(dev, /*wait=*/false);
  return CUDA_SUCCESS;
}

void MemoryManager::FreeAllocation(Device& dev, Buffer& b, const CUstream* stream) {
  // What the planner knows it as (`b` itself may be released below).
  const uint64_t planned = PlannerId(b);
  if (planner_ != nullptr) planner_->OnFreed(planned);
  if (b.before_slabs) dev.slab_onset.Freed(b.size);
  b.before_slabs = false;
  for (Buffer* p : PiecesOf(b)) {
    // In stream order: the free's place in `*stream`, a use recorded there.
    // A use that could not be recorded is not idle until a host wait for
    // the stream (or the context) has observed it (WaitForUse): still
    // stream order.
    if (stream != nullptr) NoteUse(p->uses, *stream, p->device);
    p->garbage = true;
    if (p->stream_ordered) dev.stream_ordered.used -= p->size;
    if (planner_ != nullptr && PlannerId(*p) != planned) planner_->OnFreed(p->id);
    Reindex(*p);  // out of the eviction order
    // Released once its work completed (or a release the driver refused is
    // retried), or its memory reused in stream order before then (S404).
    if (p->pins > 0 || !Idle(*p) || !ReleaseOrKeep(dev, *p)) EnqueueGarbage(dev, *p);
  }
}

MemoryManager::Buffer* MemoryManager::Allocation(CUdeviceptr base) const {
  auto it = by_base_.find(base);
  if (it == by_base_.end()) return nullptr;
  Buffer* b = it->second;
  // A piece's own address is inside an allocation, not one of its own; a
  // slab's is its first block's (FreeBlock).
  if ((b->group != nullptr && b->group->base != base) || b->slab) return nullptr;
  return b;
}

std::vector<MemoryManager::Buffer*> MemoryManager::PiecesOf(Buffer& b) {
  if (b.group == nullptr) return {&b};
  std::vector<Buffer*> pieces;
  for (Buffer* p : b.group->pieces) {
    if (p != nullptr) pieces.push_back(p);
  }
  return pieces;
}

CUresult MemoryManager::FreeAsync(CUdeviceptr base, CUstream stream,
                                  absl::FunctionRef<void()> forget) {
  // A use recorded on a stream that is none would be lost, and the buffer
  // freed where the driver refuses: asked without side effects (a driver
  // that cannot be asked, without cuStreamGetCtx, is taken at its word).
  CUcontext context = nullptr;
  if (CUresult r = StreamContext(*driver_, stream, &context);
      r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED) {
    return r;
  }
  ManagerLock lock(this);
  SettleAhead();
  Buffer* b = Allocation(base);
  if (b == nullptr && BlockStartsAt(base)) {
    forget();
    (void)FreeBlock(base, &stream);
    return CUDA_SUCCESS;
  }
  if (b == nullptr || b->garbage) return CUDA_ERROR_INVALID_VALUE;  // or freed twice
  forget();
  Device& dev = DeviceState(b->device);
  FreeAllocation(dev, *b, &stream);
  CollectGarbage(dev);
  ReapOldMappings(dev, /*wait=*/false);
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
  return ViewAt(addr);
}

std::optional<MemoryManager::BufferView> MemoryManager::ViewAt(CUdeviceptr addr) const {
  const Buffer* b = Containing(addr);
  if (b == nullptr) return std::nullopt;
  if (!b->slab) return ViewOf(*b);
  // In a slab: the allocation there as the program made it; free space is
  // no allocation (as past the end of one).
  if (std::optional<SlabPool::Block> k = slabs_.Containing(addr)) {
    return BufferView{k->base, k->size, k->span(), b->device, b->context, k->id, false};
  }
  return BufferView{addr, 0, 0, b->device, b->context, 0, true};
}

MemoryManager::BufferView MemoryManager::ViewOf(const Buffer& b) {
  // A piece looks like the allocation it is part of.
  if (const PieceGroup* g = b.group.get()) {
    return BufferView{g->base, g->size, g->reserved, b.device, b.context, g->id, b.garbage};
  }
  return BufferView{b.base, b.size, b.reserved, b.device, b.context, b.id, b.garbage};
}

JsonLine& MemoryManager::Named(JsonLine& line, const Buffer& b) {
  line.Uint("id", ViewOf(b).id);
  if (b.group != nullptr) line.Uint("piece", b.base - b.group->base);
  return line;
}

CUresult MemoryManager::CheckRange(uint64_t addr, uint64_t extent) const {
  if (extent == 0) return CUDA_SUCCESS;
  MutexLock lock(&mu_);
  const std::optional<BufferView> found = ViewAt(addr);
  if (!found) return CUDA_SUCCESS;  // not ours: the driver checks it
  const BufferView& v = *found;
  uint64_t offset = addr - v.base;
  if (v.freed || offset >= v.size || extent > v.size - offset) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// --- S401-S405 --------------------------------------------------------------------

void MemoryManager::LogOom(Device& dev, uint64_t need) {
  ++stats_.ooms;
  if (logging()) {
    Log(JsonLine()
            .Str("type", "oom")
            .Int("device", dev.ordinal)
            .Uint("bytes", need)
            .Uint("used", dev.used)
            .Uint("cap", dev.cap)
            .Finish());
  }
}

// MakeRoom's steps on one device (MakeRoomLoop takes them in order).
class MemoryManager::Room : public RoomSteps {
 public:
  Room(MemoryManager* mm, Device& dev, uint64_t need, HostWait host_wait, bool pool_counts)
      : mm_(mm), dev_(dev), need_(need), host_wait_(host_wait), pool_counts_(pool_counts) {}

  // What ended the search: the result of a step that stopped it.
  CUresult stop() const { return stop_; }
  // The driver error that kept the last candidate from being evicted.
  CUresult error() const { return error_; }

  bool Fits() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    mm_->ReapOldMappings(dev_, /*wait=*/false);
    // Written so that no sum can wrap, whatever `need` is. With
    // `pool_counts` the caller takes the pooled chunks that fit the need
    // (charged already), even those still mapped at old addresses (its work
    // is ordered after theirs on the swap stream): only the rest must fit.
    if (dev_.used <= dev_.cap - need_) return true;
    fits_ = pool_counts_ ? mm_->PoolFits(dev_, need_) : 0;  // walks the pool: not first
    fresh_ = need_ - std::min(need_, fits_);
    return dev_.used <= dev_.cap - fresh_;
  }

  Outcome Reclaim() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    // Driver allocations freed in stream order whose free has run: their
    // charge is gone already, so they go before any pooled chunk (a chunk
    // released here is created again at the next swap-in: the transformer's
    // small stream-ordered temporaries cost a create and a release a step).
    if (!mm_->external_frees_.empty() && mm_->SettleExternalFrees(dev_.ordinal, false)) {
      return Outcome::kProgress;
    }
    if (mm_->ReleaseOneKept(dev_)) return Outcome::kProgress;  // freed and kept: no copy, no wait
    // The empty slab kept for the next small allocation: likewise (a
    // program at a cap of its own working set is short by about that much).
    if (mm_->ReleaseEmptySlabs(dev_, /*keep=*/0)) return Outcome::kProgress;
    // A pooled chunk the need cannot use (larger than it, or left over):
    // released, it makes room at no copy.
    if (pool_counts_ && mm_->ReleaseOneUnfit(dev_, need_) > 0) return Outcome::kProgress;
    if (!pool_counts_ && mm_->ReleaseOnePooled(dev_) > 0) return Outcome::kProgress;
    // What is pooled and not taken is still mapped at old addresses whose
    // swap-out copies are in flight: it is becoming free, so wait for it
    // rather than evict more.
    if (const uint64_t unfit = dev_.pool.bytes() - fits_;
        unfit > 0 && dev_.used - unfit <= dev_.cap - fresh_) {
      if (!may_wait()) return Stop(CUDA_ERROR_NOT_READY);  // it comes, but not without a wait
      if (mm_->ReapOldMappings(dev_, /*wait=*/true)) return Outcome::kProgress;
    }
    return Outcome::kNothing;
  }

  bool DropOneClean(bool spend_prefetched) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    return mm_->DropOneClean(dev_, host_wait_, &error_, spend_prefetched);
  }

  bool ReleaseGarbage() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    if (mm_->ReleaseGarbage(dev_, /*wait=*/false, host_wait_, &error_)) return true;
    if (mm_->ReleaseGarbage(dev_, /*wait=*/true, host_wait_, &error_)) return true;
    // A host wait for driver frees still queued on the program's streams
    // only when they would make the room: else evicting is needed anyway,
    // and they settle by themselves meanwhile (transformer_train at 50 %
    // waited for a 128 KiB free a few times a step, then evicted).
    return !mm_->external_frees_.empty() &&
           mm_->QueuedExternalBytes(dev_.ordinal) >= dev_.used - (dev_.cap - fresh_) &&
           mm_->SettleExternalFrees(dev_.ordinal, /*wait=*/may_wait());
  }

  bool EvictByPolicy(bool spend_prefetched) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    return mm_->EvictByPolicy(dev_, dev_.used - (dev_.cap - need_), host_wait_, &error_,
                              spend_prefetched);
  }

  // Not while prefetching: a fetch never evicts another's.
  bool MayTakePrefetched() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    if (may_wait()) return true;
    stop_ = CUDA_ERROR_NOT_READY;
    return false;
  }

  Outcome LastResort() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    // Pooled memory the need cannot take is still mapped at old addresses:
    // once their copies are done it can go.
    // (A wait for the swap stream, which old mappings imply.)
    if (may_wait() && dev_.pool.bytes() > fits_ && mm_->ReapOldMappings(dev_, /*wait=*/true)) {
      return Outcome::kProgress;
    }
    if (!mm_->external_frees_.empty() &&
        mm_->SettleExternalFrees(dev_.ordinal, /*wait=*/may_wait())) {
      return Outcome::kProgress;
    }
    // Nothing was left to evict, or what was left could not be evicted
    // because the driver failed: then that is the error to see.
    if (error_ != CUDA_SUCCESS) return Stop(error_);
    // What other threads' operations hold while they are prepared or
    // submitted becomes evictable when they finish: wait for that rather
    // than refuse work the cap could hold one operation at a time. Bounded,
    // since two threads holding pins could each wait for the other.
    // Only a caller holding no pins of its own waits here (Prepare lets go
    // of its own first): two waiting for each other would never finish.
    if (may_wait() && t_operation_pins == 0 && mm_->OthersPin() &&
        mm_->WaitForUnpin(&waited_for_pins_)) {
      return Outcome::kProgress;
    }
    return Outcome::kNothing;
  }

 private:
  Outcome Stop(CUresult r) {
    stop_ = r;
    return Outcome::kStop;
  }
  bool may_wait() const { return host_wait_ == HostWait::kAllowed; }

  MemoryManager* const mm_;
  Device& dev_;
  const uint64_t need_;
  const HostWait host_wait_;
  const bool pool_counts_;
  uint64_t fits_ = 0;   // of the need, what pooled chunks it takes cover
  uint64_t fresh_ = 0;  // the rest
  CUresult stop_ = CUDA_SUCCESS;
  CUresult error_ = CUDA_SUCCESS;
  absl::Duration waited_for_pins_;
};

CUresult MemoryManager::MakeRoom(Device& dev, uint64_t need, HostWait host_wait, bool pool_counts) {
  SettleAhead();
  if (need > dev.cap) return CUDA_ERROR_OUT_OF_MEMORY;  // evicting everything would not do
  ++round_;  // buffers that failed to go before may go now
  if (!unreleased_.empty() || !stuck_.empty()) RetryReleases();
  Room room(this, dev, need, host_wait, pool_counts);
  switch (MakeRoomLoop(room, version_policy_)) {
    case RoomResult::kFits:
      return CUDA_SUCCESS;
    case RoomResult::kStopped:
      return room.stop();
    case RoomResult::kNoRoom:
      break;
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

bool MemoryManager::OthersPin() const { return pinned_ > t_operation_pins; }

bool MemoryManager::WaitForUnpin(absl::Duration* waited) {
  constexpr absl::Duration kMostWait = absl::Seconds(2);
  if (*waited >= kMostWait) return false;
  const uint64_t seen = unpins_;
  const absl::Time start = absl::Now();
  auto unpinned = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return unpins_ != seen; };
  mu_.AwaitWithTimeout(absl::Condition(&unpinned), absl::Milliseconds(5));
  *waited += absl::Now() - start;
  ++round_;  // buffers that failed to go may go now
  return true;
}

bool MemoryManager::DropOneClean(Device& dev, HostWait host_wait, CUresult* error,
                                 bool spend_prefetched) {
  EndJournaling();  // nothing moves while operations are journaled
  // The least recently used droppable buffer not pinned (those are few:
  // an operation's own buffers) nor failed in this round.
  const bool can_queue = CanQueue(dev);
  auto* pick = static_cast<Buffer*>(dev.order.DropVictim(
      {round_, spend_prefetched}, [&](EvictionState& b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return can_queue || Idle(static_cast<Buffer&>(b));
      }));
  if (pick == nullptr) return false;
  CUresult r = SwapOut(dev, *pick, /*copy=*/false, host_wait);
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) r = WaitIdle(*pick, host_wait);  // not orderable on the device
  if (r == CUDA_SUCCESS) return true;                             // unlocked: look again
  pick->failed_round = round_;
  if (error != nullptr) *error = r;
  return true;  // look again: the next clean buffer, or the next step
}

bool MemoryManager::ReleaseGarbage(Device& dev, bool wait, HostWait host_wait, CUresult* error) {
  if (dev.garbage.empty()) return false;
  // What completed is released; the memory of what did not is free in stream
  // order: handed on (QueueGarbage) rather than waited for.
  if (!wait) return CollectGarbage(dev) || HandOnGarbage(dev);
  // A host wait for the oldest one of a queue, which holds back the rest
  // (CollectGarbage releases each queue in order). Unlocks: the caller
  // looks again. A queue whose oldest is pinned is passed over: waiting for
  // a later one gains nothing, and one whose work is done returns without
  // letting go of the lock, so the caller would spin holding it while the
  // pin's owner (another thread's wait for that buffer) needs it.
  for (auto& [key, queue] : dev.garbage) {
    Buffer* b = queue.empty() ? nullptr : queue.front();
    if (b == nullptr || b->pins > 0 || b->failed_round == round_) continue;
    if (CUresult r = WaitIdle(*b, host_wait); r != CUDA_SUCCESS) {
      b->failed_round = round_;
      if (error != nullptr) *error = r;
    }
    return true;
  }
  return false;
}

bool MemoryManager::QueueGarbage(Device& dev, Buffer& b) {
  // Exported memory may still be mapped by whoever holds its handle: never
  // another buffer's.
  if (!b.vmm || b.exported || b.device_chunks.empty() || b.old_mapped || b.host_at_base ||
      !CanQueue(dev) || EnsureSwapStream(dev) != CUDA_SUCCESS || !OrderSwapAfterUses(dev, b)) {
    return false;
  }
  // The swap stream's point after the buffer's last uses: whoever takes its
  // chunks works after it there; its address is unmapped once it is seen.
  NoteUse(b.uses, dev.swap_stream, dev.ordinal);
  for (const Use& u : b.uses) {
    if (u.stream == dev.swap_stream && !u.recorded) return false;  // not observable
  }
  // Released from the old mappings once the swap stream passed that point
  // (ReapOldMappings), no longer a pending free of its streams.
  DequeueGarbage(dev, b);
  DetachShadowed(dev, b);
  return true;
}

bool MemoryManager::HandOnGarbage(Device& dev) {
  if (dev.garbage.empty() || !CanQueue(dev)) return false;
  // The oldest of each queue with device memory (a swapped-out one has
  // none to give). One that cannot be ordered now goes last, so that it
  // holds back no other (a host wait for it stays possible: ReleaseGarbage).
  for (auto& [key, queue] : dev.garbage) {
    auto it = queue.begin();
    for (size_t left = queue.size(); left > 0 && it != queue.end(); --left) {
      Buffer* b = *it++;
      if (b->pins > 0 || b->failed_round == round_ || !b->vmm || b->exported ||
          b->device_chunks.empty()) {
        continue;
      }
      if (QueueGarbage(dev, *b)) return true;  // b left the queue
      queue.splice(queue.end(), queue, b->garbage_at);
    }
  }
  return false;
}

bool MemoryManager::TakeOverGarbage(Device& dev, Buffer& b) {
  if (dev.garbage.empty()) return false;
  for (auto& [key, queue] : dev.garbage) {
    if (queue.empty()) continue;
    Buffer& g = *queue.front();
    if (g.reserved != b.reserved || !g.vmm || g.exported || g.pins > 0 || !g.va_reserved ||
        g.old_mapped || g.host_at_base || ChunkBytes(g.device_chunks) != b.reserved) {
      continue;
    }
    // Its work still queued comes first on the swap stream (no host wait).
    // Its host copy, stale for the new owner, is let go only once that work
    // is done, as at a release: a swap copy from or into it, or a kernel
    // reading it at the address while it was swapped out, may still be
    // queued, and letting it go releases its memory at once (or keeps it
    // for a release that does not wait). Where its work cannot be ordered,
    // it holds a host copy with work queued, or its host copy cannot be let
    // go, it is not taken, and goes last so that it holds back no other
    // (its device memory can still be handed on: HandOnGarbage).
    if ((!Idle(g) && (g.host.exists() || !CanQueue(dev) || EnsureSwapStream(dev) != CUDA_SUCCESS ||
                      !OrderSwapAfterUses(dev, g))) ||
        !ReleaseHostCopy(dev, g)) {
      queue.splice(queue.end(), queue, g.garbage_at);
      continue;
    }
    if (!Adopt(dev, b, g)) return false;
    ++stats_.garbage_taken_over;
    return true;
  }
  return false;
}

bool MemoryManager::Adopt(Device& dev, Buffer& b, Buffer& g) {
  b.base = g.base;
  b.va_reserved = true;
  b.device_chunks = std::move(g.device_chunks);
  // The old owner's uses stay the new owner's: evicting it, or releasing
  // it once freed, waits for them as for its own.
  b.uses = std::move(g.uses);
  if (ZeroReused(dev, b) != CUDA_SUCCESS) {
    // Holding the old contents: back to the freed buffer, taken no further.
    g.device_chunks = std::move(b.device_chunks);
    g.uses = std::move(b.uses);
    b.device_chunks.clear();
    b.uses.clear();
    b.base = 0;
    b.va_reserved = false;
    return false;
  }
  DequeueGarbage(dev, g);
  Unkeep(dev, g);
  Unindex(g);
  if (g.stream_ordered) dev.stream_ordered.reserved -= g.reserved;
  by_base_.erase(g.base);
  EraseBuffer(g.key);  // destroys g
  return true;
}

void MemoryManager::Unkeep(Device& dev, Buffer& b) {
  if (!b.kept) return;
  for (auto it = dev.kept.find(b.reserved); it != dev.kept.end() && it->first == b.reserved; ++it) {
    if (it->second == &b) {
      dev.kept.erase(it);
      break;
    }
  }
  dev.kept_bytes -= b.reserved;
  b.kept = false;
}

void MemoryManager::CollectGarbage() {
  SettleAhead();
  for (auto& d : devices_) {
    if (d) CollectGarbage(*d);
  }
}

bool MemoryManager::CollectGarbage(Device& dev) {
  const uint64_t pooled = dev.pool.bytes();
  bool released = false;
  for (auto it = dev.garbage.begin(); it != dev.garbage.end();) {
    std::list<Buffer*>& queue = it->second;
    // Oldest first, up to the first not done (work on one stream completes
    // in order). One the driver would not release goes last, for a retry.
    for (size_t left = queue.size(); left > 0 && !queue.empty(); --left) {
      Buffer& b = *queue.front();
      if (b.pins > 0 || !Idle(b)) break;
      if (ReleaseOrKeep(dev, b)) {  // takes it off the queue
        ++stats_.garbage_released;
        released = true;
        continue;
      }
      b.failed_round = round_;  // not waited for in this round (ReleaseGarbage)
      queue.splice(queue.end(), queue, b.garbage_at);
    }
    it = queue.empty() ? dev.garbage.erase(it) : std::next(it);
  }
  // A release that failed after pooling the memory made room too.
  return released || dev.pool.bytes() > pooled;
}

void MemoryManager::EnqueueGarbage(Device& dev, Buffer& b) {
  if (b.garbage_queue != nullptr) return;
  // The queue of the one stream its work not seen done is on; work on
  // several (or none known: a pin, work of unknown accesses, a release the
  // driver refused) shares another. A use no event records is never seen
  // done by a query (only a host wait tells): such frees wait apart, so
  // that they hold back no other.
  static constexpr Device::StreamKey kSeveral{nullptr, ~uint64_t{0}};
  static constexpr Device::StreamKey kUnrecorded{nullptr, ~uint64_t{0} - 1};
  std::optional<Device::StreamKey> key;
  for (Use& u : b.uses) {
    if (Observed(u)) continue;
    if (!u.recorded) {
      key = kUnrecorded;
      break;
    }
    const Device::StreamKey k{u.stream, u.thread};
    if (key.has_value() && *key != k) key = kSeveral;
    if (!key.has_value()) key = k;
  }
  std::list<Buffer*>& queue = dev.garbage[key.value_or(kSeveral)];
  b.garbage_at = queue.insert(queue.end(), &b);
  b.garbage_queue = &queue;
  RecountGarbage(dev, b);
}

void MemoryManager::DequeueGarbage(Device& dev, Buffer& b) {
  if (b.garbage_queue == nullptr) return;
  dev.garbage_bytes -= b.garbage_counted;
  b.garbage_counted = 0;
  // An emptied queue is erased by the next CollectGarbage.
  b.garbage_queue->erase(b.garbage_at);
  b.garbage_queue = nullptr;
}

void MemoryManager::RecountGarbage(Device& dev, Buffer& b) {
  if (b.garbage_queue == nullptr) return;
  const uint64_t now = b.vmm && !b.exported ? ChunkBytes(b.device_chunks) : 0;
  dev.garbage_bytes = dev.garbage_bytes - b.garbage_counted + now;
  b.garbage_counted = now;
}

uint64_t MemoryManager::Held(const Device& dev) {
  const uint64_t room = dev.pool.bytes() + dev.garbage_bytes + dev.kept_bytes;
  return dev.used - std::min(dev.used, room);
}

uint64_t MemoryManager::FreeUnderCap(const Device& dev) {
  const uint64_t held = Held(dev);
  return held < dev.cap ? dev.cap - held : 0;
}

bool MemoryManager::EvictByPolicy(Device& dev, uint64_t needed, HostWait host_wait, CUresult* error,
                                  bool spend_prefetched) {
  EndJournaling();  // nothing moves while operations are journaled
  // The first in the policy's order not pinned (those are few: the buffers
  // of operations being prepared) nor failed in this round; one at a time,
  // the caller re-checks the cap after each. Sizes weigh only where next
  // uses are predicted (in the planner's times).
  const IterationPlanner* planner = planner_made_ ? planner_.get() : nullptr;
  Buffer* pick = static_cast<Buffer*>(
      dev.order.Victim({round_, spend_prefetched, planner != nullptr ? needed : 0,
                        planner != nullptr ? planner->now() : 0}));
  if (pick == nullptr) return false;
  Buffer& b = *pick;
  if (!CanQueue(dev) && !Idle(b)) {
    // Unlocks: the caller looks again, from the start (without this
    // buffer, if its work could not be observed complete).
    if (CUresult r = WaitIdle(b, host_wait); r != CUDA_SUCCESS) {
      b.failed_round = round_;
      if (error != nullptr) *error = r;
    }
    return true;
  }
  CUresult r = SwapOut(dev, b, dev.order.Copies(b), host_wait);
  if (r == CUDA_SUCCESS) {
    if (planner != nullptr) dev.order.NoteForcedOut(b, planner->now());
    return true;
  }
  if (r == CUDA_ERROR_NOT_READY) {
    // Its work could not be ordered on the device: wait on the host.
    if (r = WaitIdle(b, host_wait); r != CUDA_SUCCESS) {
      b.failed_round = round_;
      if (error != nullptr) *error = r;
    }
    return true;
  }
  // A swap-out that fails (the host limit, a driver error) is skipped in
  // the next look.
  b.failed_round = round_;
  if (error != nullptr && r != CUDA_ERROR_OUT_OF_MEMORY) *error = r;
  return true;
}

// --- Swapping ---------------------------------------------------------------------

bool MemoryManager::CanQueue(Device& dev) const {
  // Work of unknown accesses may reach any buffer: it holds eviction off.
  // STENSOR_VERIFY checks a drop on the device while it is idle.
  return verifier_ == nullptr && UnknownIdle(dev);
}

// resident -> swapped out. The steps that can fail come first (host copy,
// the swap stream ordered after the buffer's uses, the copy, the record of
// its completion), the metadata last; on a failure the buffer is still
// resident and consistent. The device memory reaches the pool at once: if
// the copy (or the buffer's last use) is still in flight it stays mapped at
// the buffer's address until that is observed complete (ReapOldMappings),
// and its next user runs after it on the swap stream.
CUresult MemoryManager::SwapOut(Device& dev, Buffer& b, bool copy, HostWait host_wait) {
  EndJournaling();  // nothing moves while operations are journaled
  ReindexAtExit reindex(this, b);
  const bool idle = Idle(b);
  // Nothing is evicted under pending work that may reach it unless it can
  // be queued behind that work (callers wait otherwise).
  if (!idle && !CanQueue(dev)) return CUDA_ERROR_NOT_READY;
  if (b.stale_device) copy = false;                   // the host copy is the data
  if (!copy && !dev.order.Droppable(b)) copy = true;  // never drop what is dirty
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
  uint64_t copied = 0;
  if (copy) {
    if (CUresult r = CopyParts(b, dev.swap_stream, /*out=*/true, &copied); r != CUDA_SUCCESS) {
      return r;
    }
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
      if (CUresult r = WaitSwapUse(dev, b, host_wait); r != CUDA_SUCCESS) return r;
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
    stats_.bytes_copied_out += copied;
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
  swapped_out_ = true;
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
  // A copy's bytes are those it carried (a slab's live blocks).
  if (logging()) {
    Log(Named(JsonLine().Str("type", type), b)
            .Uint("bytes", copy ? copied : b.size)
            .Int("device", dev.ordinal)
            .Finish());
  }
  return CUDA_SUCCESS;
}

void MemoryManager::LogSwapIn(const Device& dev, const Buffer& b, bool copy, uint64_t bytes) const {
  if (logging()) {
    Log(Named(JsonLine().Str("type", "swap_in"), b)
            .Uint("bytes", bytes)
            .Bool("copy", copy)
            .Int("device", dev.ordinal)
            .Finish());
  }
}

// swapped out -> resident. Device memory is made first, the host copy is
// taken off the address only then (and only when no work of unknown
// accesses that may read it is pending), the copy is ordered before the
// consumer; a failure before the copy is submitted puts everything back.
CUresult MemoryManager::SwapIn(Device& dev, Buffer& b, bool copy, CUstream consumer,
                               HostWait host_wait) {
  EndJournaling();  // nothing moves while operations are journaled
  ReindexAtExit reindex(this, b);
  // A second attempt takes fresh memory: zeroing reused chunks failed.
  for (int attempt = 0;; ++attempt) {
    const bool reuse = attempt == 0;
    std::vector<PhysicalChunk> h;
    bool pooled = false;
    bool shadowed = false;
    for (;;) {
      if (!b.resident() && b.old_mapped) {
        if (!b.handed_on && TakeBack(dev, b)) {
          // Its swap-out is still in flight and its device memory was not
          // handed on: taken back; it holds the data (the copy only reads).
          b.location = Location::kCpuGpu;  // the host copy is current once the copy is done
          ++stats_.swap_outs_cancelled;
          LogSwapIn(dev, b, /*copy=*/false, b.size);
          // The consumer may write it: after the swap-out's copy read it.
          return OrderAfterSwap(dev, b, consumer);
        }
        // Handed on: the address is unmapped once the copy is done (the GPU
        // would fault before), only then can memory be mapped there.
        if (CUresult r = WaitSwapUse(dev, b, host_wait); r != CUDA_SUCCESS) return r;
        if (b.old_mapped && !EndOldMapping(dev, b)) return CUDA_ERROR_UNKNOWN;
        continue;  // unlocked: look again
      }
      // Served from host to an operation being prepared or submitted: the
      // address stays on the host copy until it finished.
      if (!b.resident() && b.serving > 0) return CUDA_ERROR_NOT_READY;
      if (!b.resident() && b.host_at_base && !UnknownIdle(dev)) {
        // A kernel whose accesses are unknown may be reading the host copy
        // through the address: it stays mapped until that work completed.
        if (CUresult r = WaitIdle(b, host_wait, /*own_uses=*/false); r != CUDA_SUCCESS) return r;
        continue;  // unlocked: look again
      }
      if (!b.resident() && b.host_at_base && !Idle(b)) {
        // An operation it was served to may still read or write the host
        // copy through the address: likewise.
        if (CUresult r = WaitIdle(b, host_wait); r != CUDA_SUCCESS) return r;
        continue;  // unlocked: look again
      }
      if (b.resident()) {
        // Another thread brought it in while the lock was released: order
        // after its copy, as for any resident buffer.
        return OrderAfterSwap(dev, b, consumer);
      }
      if (CUresult r = AcquireChunks(dev, b.reserved, reuse, host_wait, &h, &pooled, &shadowed);
          r != CUDA_SUCCESS) {
        return r;
      }
      // Making room may have waited without the lock.
      if (!b.resident() && !b.old_mapped && b.serving == 0 && !(b.host_at_base && !Idle(b))) {
        break;
      }
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
    if (CUresult r = vmm_.Map(b.base, h, dev.ordinal, &mapped); r != CUDA_SUCCESS) {
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
    uint64_t copied = 0;
    if (copying) {
      const CUstream copy_stream = FetchStreamFor(dev, b, b.device_chunks);
      CUresult r = CopyParts(b, copy_stream, /*out=*/false, &copied);
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
      stats_.bytes_copied_in += copied;
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
      b.pending_overwrite = ThisOperation();
      ++stats_.swap_ins_without_copy;
      // Memory still in use by its last owner's queued work: the operation
      // runs after that (an event on the swap stream, or a host wait there).
      if (shadowed) NoteUse(b.uses, dev.swap_stream, dev.ordinal);
    }
    b.location = Location::kCpuGpu;
    LogSwapIn(dev, b, copying, copying ? copied : b.size);
    // An error here leaves the copy in flight and the buffer resident, with
    // its use on the swap stream not observed: consistent, and retried.
    return OrderAfterSwap(dev, b, consumer);  // nothing to do without swap-stream work
  }
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
  if (logging()) {
    Log(Named(JsonLine().Str("type", "verify_mismatch"), b)
            .Uint("bytes", b.size)
            .Int("device", dev.ordinal)
            .Str("mode", mode)
            .Str("last_kernel", name(b.last_kernel))
            .Str("last_writer", name(b.last_writer))
            .Finish());
  }
  Say(LogLevel::kWarn, "verify-mismatch",
      absl::StrCat("STENSOR_VERIFY=", mode, ": buffer ", b.id, " (", b.size,
                   " bytes) changed on the device although no write to it was inferred; "
                   "copied instead of dropped. Last kernel that used it: ",
                   name(b.last_kernel), "; last inferred writer: ", name(b.last_writer)));
  return false;
}

void MemoryManager::NoteKernel(absl::Span<const uint64_t> used, absl::Span<const uint64_t> written,
                               const char* kernel) {
  if (verifier_ == nullptr) return;
  ManagerLock lock(this);
  Keys used_x, written_x;
  for (uint64_t id : Expanded(used, &used_x)) {
    if (Buffer* b = ById(id)) b->last_kernel = kernel;
  }
  for (uint64_t id : Expanded(written, &written_x)) {
    if (Buffer* b = ById(id)) b->last_writer = kernel;
  }
}

// --- Operations ---------------------------------------------------------------------

CUresult MemoryManager::Prepare(absl::Span<const uint64_t> named,
                                absl::Span<const uint64_t> named_overwritten, CUstream stream,
                                const Operation* note) {
  if (note != nullptr) {
    *note->ticket = OpTicket{};
    // Before the cap presses: no lock, no look at the buffers, no pin.
    if (journal_open_.load(std::memory_order_relaxed) && PrepareJournaled(named, note->ticket)) {
      return CUDA_SUCCESS;
    }
  }
  ManagerLock lock(this);
  // Stensor's own work that kept operations off the journal may be done.
  if (journaling_ && own_work_) OwnWorkDone();
  // A group's pieces, each in place of its id, from here on.
  Keys ids_x, overwritten_x, written_x;
  const absl::Span<const uint64_t> ids = Expanded(named, &ids_x);
  const absl::Span<const uint64_t> overwritten =
      Expanded(named_overwritten, &overwritten_x, /*overwritten=*/true);
  // The planner first: each buffer's next use after this operation decides
  // whether a swapped-out one is worth bringing in (ChooseReach).
  // Kept here (inline), not in the planner's scratch, which other threads'
  // operations reuse while this one waits without the lock.
  // Each buffer looked up once while the lock is held (a freed one as none).
  absl::FixedArray<Buffer*, 16> found(ids.size());  // inline: no allocation per launch
  bool swappable = false;                           // any of them
  const auto look_up = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t k = 0; k < ids.size(); ++k) {
      Buffer* b = ById(ids[k]);
      if (b != nullptr && b->garbage) b = nullptr;
      swappable |= b != nullptr && b->vmm;
      found[k] = b;
    }
  };
  look_up();
  // Asked at every operation, so that Finish knows whether to defer.
  const bool pressed = Pressed();
  const bool plans = note != nullptr && Plans() && pressed;
  if (!plans && !swappable) {
    // Plain allocations only, resident for good: nothing to hold, nothing
    // for Finish to do.
    if (note != nullptr) note->ticket->finish = false;
    return CUDA_SUCCESS;
  }
  if (!plans && PinIfReady(found)) return CUDA_SUCCESS;
  Noted noted;
  bool predicted = false;
  absl::InlinedVector<uint64_t, 16> next_after;
  if (plans) {
    next_after.assign(ids.size(), EvictionCandidate::kNoNextUse);
    predicted = PredictLocked(note->Key(), ids, Expanded(note->written, &written_x), note->marker,
                              &noted, absl::MakeSpan(next_after), found);
    if (!predicted) next_after.clear();
  }
  absl::Duration waited;
  bool waited_enough = false;
  for (;;) {
    // While other threads' operations hold buffers, room may come when they
    // finish: serving from host (slower for the kernel) only once waiting
    // for them gave nothing.
    const bool may_wait = !waited_enough && OthersPin();
    Refusal refused;
    CUresult r = PrepareOnce(ids, found, overwritten, stream, /*may_serve=*/!may_wait, next_after,
                             note != nullptr ? note->far : absl::Span<const uint64_t>(), &refused);
    if (r == CUDA_SUCCESS && predicted) ApplyNotedLocked(noted, stream, note->ticket);
    // Out of room while other threads' operations hold buffers: this one
    // let go of its own (PrepareOnce unpins on failure), so that two
    // operations never wait for each other; it waits for one of theirs
    // to finish, then tries again.
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !may_wait && refused.device >= 0) {
      LogOom(DeviceState(refused.device), refused.bytes);  // refused after all
    }
    if (r != CUDA_ERROR_OUT_OF_MEMORY || !may_wait) return r;
    if (!WaitForUnpin(&waited)) waited_enough = true;
    look_up();  // the lock was let go: buffers may have been freed
  }
}

CUresult MemoryManager::AllocateOnHost(Device& dev, Buffer& b) {
  EndJournaling();  // nothing moves while operations are journaled
  if (CUresult r = EnsureHostCopy(b, /*will_copy=*/false); r != CUDA_SUCCESS) return r;
  if (CUresult r = MapHostAtBase(b); r != CUDA_SUCCESS) {
    if (!b.host_at_base) (void)ReleaseHostCopy(dev, b);
    return r;
  }
  b.location = Location::kCpuOnly;
  b.host_version = b.gpu_version;
  swapped_out_ = true;  // as good as swapped out, to the planner
  // A piece is logged once its allocation has its id (LogBornOnHost).
  if (b.group == nullptr && !b.slab) LogBornOnHost(dev, b);  // a slab: its own record
  return CUDA_SUCCESS;
}

void MemoryManager::LogBornOnHost(const Device& dev, const Buffer& b) const {
  if (!logging()) return;
  JsonLine line;
  line.Str("type", "alloc_host");
  if (b.group != nullptr) Named(line, b);
  Log(line.Uint("bytes", b.size).Int("device", dev.ordinal).Uint("cap", dev.cap).Finish());
}

bool MemoryManager::ReleaseOrKeep(Device& dev, Buffer& b) {
  return Keep(dev, b) || ReleaseBuffer(dev, b);
}

bool MemoryManager::Keep(Device& dev, Buffer& b) {
  // Stream-ordered allocations only (cuMemAllocAsync, PyTorch's pluggable
  // allocator): what a pool would keep; cuMemFree'd memory goes back.
  if (!b.stream_ordered || !b.vmm || b.exported || b.kept || b.device_chunks.empty() ||
      b.old_mapped || b.host_at_base || b.stale_device || !b.va_reserved || b.pins > 0 ||
      ChunkBytes(b.device_chunks) != b.reserved || !Idle(b)) {
    return false;
  }
  // Its host copy is stale for whoever takes it (kept for a buffer of its
  // size, as at a release).
  if (!ReleaseHostCopy(dev, b)) return false;
  for (const Use& u : b.uses) {
    if (u.own != nullptr) (void)Failed(driver_->cuEventDestroy_v2(u.own));
  }
  b.uses.clear();
  DequeueGarbage(dev, b);
  Unindex(b);
  // Stensor's idle memory from here on, as its chunk pool: no longer the
  // default pool's reserved share (a trim releases it).
  dev.stream_ordered.reserved -= b.reserved;
  b.stream_ordered = false;
  b.kept = true;
  dev.kept.emplace(b.reserved, &b);
  dev.kept_bytes += b.reserved;
  return true;
}

bool MemoryManager::TakeKept(Device& dev, Buffer& b) {
  auto it = dev.kept.find(b.reserved);
  if (it == dev.kept.end() || !Adopt(dev, b, *it->second)) return false;
  ++stats_.kept_reused;
  return true;
}

bool MemoryManager::ReleaseOneKept(Device& dev) {
  for (auto it = dev.kept.begin(); it != dev.kept.end(); ++it) {
    Buffer& g = *it->second;
    if (g.failed_round == round_) continue;
    if (ReleaseBuffer(dev, g)) {  // takes it out of `kept`
      ++stats_.garbage_released;
      return true;
    }
    g.failed_round = round_;
    return false;  // retried in a later round
  }
  return false;
}

bool MemoryManager::Servable(const Buffer& b) const {
  return b.vmm && !b.resident() && b.host_at_base && !b.old_mapped && b.host.vmm() && !b.exported;
}

void MemoryManager::Serve(Device& dev, Buffer& b, bool by_choice) {
  ++b.serving;
  CountServed(dev, b, by_choice);
}

void MemoryManager::CountServed(Device& dev, Buffer& b, bool by_choice) {
  ++stats_.served_from_host;
  stats_.bytes_served_from_host += b.size;
  if (by_choice) ++stats_.served_by_choice;
  if (logging()) {
    Log(Named(JsonLine().Str("type", "serve_host"), b)
            .Uint("bytes", b.size)
            .Int("device", dev.ordinal)
            .Bool("by_choice", by_choice)
            .Finish());
  }
}

bool MemoryManager::PinIfReady(absl::Span<Buffer* const> found) {
  // Nothing for PrepareOnce's first steps to release.
  for (const auto& d : devices_) {
    if (d != nullptr && (!d->garbage.empty() || !d->old_mappings.empty())) return false;
  }
  for (const Buffer* b : found) {
    if (b == nullptr || !b->vmm) continue;  // plain: resident for good
    if (!b->resident() || b->stale_device || b->old_mapped || b->serving > 0 ||
        b->pending_overwrite != nullptr) {
      return false;
    }
    // A copy of stensor's own that this operation would have to wait for
    // (or that no look has seen done yet): OrderAfterSwap's case.
    if (!b->uses.empty()) {
      const Device& dev = *devices_[b->device];
      for (const Use& u : b->uses) {
        if (!u.done && dev.OwnStream(u.stream)) return false;
      }
    }
  }
  int& operation_pins = t_operation_pins;  // one look-up of the thread's
  for (Buffer* b : found) {
    if (b == nullptr || !b->vmm) continue;
    Pin(*b);
    ++operation_pins;
  }
  return true;
}

CUresult MemoryManager::PrepareOnce(absl::Span<const uint64_t> ids, absl::Span<Buffer* const> found,
                                    absl::Span<const uint64_t> overwritten, CUstream stream,
                                    bool may_serve, absl::Span<const uint64_t> next_after,
                                    absl::Span<const uint64_t> far, Refusal* refused) {
  // Releases freed buffers only: none of `found`.
  CollectGarbage();
  for (auto& d : devices_) {
    if (d) ReapOldMappings(*d, /*wait=*/false);
  }
  // An operation's buffers fit inline: no allocation per launch.
  absl::InlinedVector<Buffer*, 16> pinned;
  absl::InlinedVector<uint32_t, 16> pinned_at;  // where in `ids`
  int& operation_pins = t_operation_pins;       // one look-up of the thread's
  for (size_t k = 0; k < ids.size(); ++k) {
    Buffer* b = found[k];
    if (b == nullptr || !b->vmm) continue;  // plain: never evicted, nothing to do
    Pin(*b);  // none of the operation's buffers may be evicted for another
    ++operation_pins;
    pinned.push_back(b);
    pinned_at.push_back(static_cast<uint32_t>(k));
  }
  // Which of them this operation serves: a failure undoes its own serving
  // only, never that of another operation serving the same buffer.
  absl::InlinedVector<bool, 16> served(pinned.size(), false);
  for (size_t i = 0; i < pinned.size(); ++i) {
    Buffer* b = pinned[i];
    Device& dev = DeviceState(b->device);
    CUresult r = CUDA_SUCCESS;
    // Copies of stensor's own into the host copy still in flight come
    // first; the serving is claimed before, since ordering after them may
    // wait on the host without the lock, and no swap-in may take the buffer
    // then.
    auto serve_too = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      ++b->serving;
      served[i] = true;
      CUresult ordered = OrderAfterSwap(dev, *b, stream);
      if (ordered == CUDA_SUCCESS) CountServed(dev, *b);
      return ordered;
    };
    const auto overwritten_whole = [&]() {
      return std::find(overwritten.begin(), overwritten.end(), b->id) != overwritten.end();
    };
    auto reach = [&](bool servable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      ReachFacts facts;
      facts.servable = servable;
      facts.overwritten = overwritten_whole();
      facts.predicted = !next_after.empty();
      if (facts.predicted) facts.next_use = next_after[pinned_at[i]];
      facts.bytes = b->reserved;
      facts.fits = FreeUnderCap(dev) >= b->reserved;
      facts.far = !far.empty() && std::binary_search(far.begin(), far.end(), b->key);
      if (planner_made_ && planner_->has_profile()) {
        facts.now = planner_->now();
        facts.period = planner_->profile()->period();
      }
      return ChooseReach(facts, dev.order, {round_, false});
    };
    // Its swap-out still in flight and its memory handed on: bringing it in
    // waits for that copy, then makes room again; serving it waits for the
    // same copy and makes none. Chosen as for one whose host copy is at its
    // address already, the copy waited for first.
    if (b->old_mapped && b->handed_on && b->serving == 0 && may_serve && dev.host_vmm && b->vmm &&
        b->host.vmm() && !b->exported && reach(/*servable=*/true) == Reach::kServeByChoice) {
      r = WaitSwapUse(dev, *b, HostWait::kAllowed);
      if (r == CUDA_SUCCESS && b->old_mapped && !EndOldMapping(dev, *b)) r = CUDA_ERROR_UNKNOWN;
    }
    if (r != CUDA_SUCCESS) {
      // Refused below, as a failed swap-in would be.
    } else if (b->resident()) {
      // Brought in for another stream: this one waits for that copy too.
      // (Uses observed complete cost nothing here: the fast path.)
      if (b->stale_device) r = RestoreFromHost(dev, *b);
      if (r == CUDA_SUCCESS && b->resident()) r = OrderAfterSwap(dev, *b, stream);
      if (r == CUDA_SUCCESS && !b->resident()) {
        r = SwapIn(dev, *b, /*copy=*/true, stream,
                   HostWait::kAllowed);  // the restore swapped it out
      }
    } else if (Servable(*b) && (b->serving > 0 || (may_serve && dev.host_vmm && InUse(*b)))) {
      // Another operation reaches it through the host copy (being prepared,
      // or submitted and not yet observed complete): this one does too.
      // Bringing it in would remap the address under the first, so it would
      // wait for it on the host, and a host that waits for the device at
      // every launch loses the lead that hides the link.
      r = serve_too();
    } else {
      if (const Reach how = reach(may_serve && dev.host_vmm && Servable(*b));
          how != Reach::kFetch) {
        Serve(dev, *b, /*by_choice=*/true);
        if (how == Reach::kServeFar) ++stats_.served_far;
        served[i] = true;
      } else {
        const uint64_t copies = stats_.swap_ins;
        // (Servable may only become true in SwapIn: a swap-out in flight ends.)
        r = SwapIn(dev, *b, !overwritten_whole(), stream, HostWait::kAllowed);
        // What prefetch exists to avoid: a copy in, on demand, once planned.
        if (stats_.swap_ins > copies && planner_ != nullptr && planner_->has_profile()) {
          ++stats_.on_demand_after_profile;
        }
        // No room with the operation's other buffers: served from host
        // rather than refused (SwapIn leaves it swapped out, its copy at the
        // address).
        if (r == CUDA_ERROR_OUT_OF_MEMORY && may_serve && dev.host_vmm && Servable(*b)) {
          Serve(dev, *b);
          served[i] = true;
          r = CUDA_SUCCESS;
        }
      }
    }
    // A swap-in that let go of the lock (to wait, or to make room) found
    // another thread's operation serving the buffer meanwhile: its address
    // stays on the host copy until that operation is done, so this one is
    // served too rather than refused.
    if (r == CUDA_ERROR_NOT_READY && !served[i] && b->serving > 0 && Servable(*b)) r = serve_too();
    if (r != CUDA_SUCCESS) {
      *refused = Refusal{b->device, b->reserved};
      for (size_t k = 0; k < pinned.size(); ++k) {
        Buffer* p = pinned[k];
        Unpin(*p);
        --t_operation_pins;
        ++unpins_;
        if (served[k]) --p->serving;
        if (p->pending_overwrite == ThisOperation()) {  // the overwrite will not happen
          p->pending_overwrite = nullptr;
          RestoreFromHost(DeviceState(p->device), *p);  // re-keys it
        } else {
          Reindex(*p);  // a next use predicted for it (PredictLocked)
        }
      }
      return r;
    }
  }
  return CUDA_SUCCESS;
}

// Inline: its one caller is every journaled launch.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void MemoryManager::JournalFinish(
    absl::Span<const uint64_t> named, absl::Span<const uint64_t> named_written, CUstream stream) {
  Keys ids_x, written_x;
  const absl::Span<const uint64_t> ids = Expanded(named, &ids_x);
  const absl::Span<const uint64_t> written = Expanded(named_written, &written_x);
  // The use each buffer's entry for the stream would get on the full path:
  // one mark after the operation, recorded after several before the cap
  // presses.
  const std::pair<CUstream, uint64_t> key = UseKey(stream);
  OperationJournal::Use use;
  use.stream = key.first;
  use.thread = key.second;
  use.device = journal_device_;
  Marked marked = Marked::kUnrecorded;
  // Null: unrecorded, only a host wait tells (as for a failed record).
  use.mark = MarkOperation(key, stream, journal_device_, /*defer=*/!pressed_, &marked);
  use.marked = static_cast<int>(marked);
  if (use.mark != nullptr) use.gen = use.mark->gen;
  // One tick a buffer, as the full path hands them out.
  const uint64_t tick = clock_ + 1;
  clock_ += ids.size();
  if (journal_.full()) ApplyJournal();
  journal_.Add(ids, written, tick, use);
}

bool MemoryManager::FinishJournaled(absl::Span<const uint64_t> named,
                                    absl::Span<const uint64_t> named_written, CUstream stream,
                                    bool submitted, uint64_t journal) {
  // Not a ManagerLock: the journal grows, and nothing journal_open_ sums up
  // changes.
  MutexLock lock(&mu_);
  auto& slot = *reinterpret_cast<OperationJournal::Slot*>(journal);
  const bool pinned = slot.pinned;
  slot.pinned = false;
  slot.owner.store(nullptr, std::memory_order_release);
  if (pinned) return false;  // the journaling ended meanwhile: the full Finish
  if (submitted) JournalFinish(named, named_written, stream);
  return true;
}

void MemoryManager::FinishFull(absl::Span<const uint64_t> named,
                               absl::Span<const uint64_t> named_written, CUstream stream,
                               bool submitted, bool pinned_by_end) {
  ManagerLock lock(this);
  // A write through any pointer into a group may reach any of its pieces:
  // each is versioned (a clean drop never loses it).
  Keys ids_x, written_x;
  const absl::Span<const uint64_t> ids = Expanded(named, &ids_x);
  const absl::Span<const uint64_t> written = Expanded(named_written, &written_x);
  // Each buffer looked up once (inline: no allocation per launch), unless a
  // restore ran, which may release garbage buffers: then by id again.
  absl::FixedArray<Buffer*, 16> held(ids.size());
  bool restored = false;
  int& operation_pins = t_operation_pins;  // one look-up of the thread's
  // The stream's use key and the mark of this operation there, found once.
  std::optional<std::pair<CUstream, uint64_t>> use_key;
  StreamMark* mark = nullptr;
  Marked marked = Marked::kUnrecorded;
  for (size_t i = 0; i < ids.size(); ++i) {
    Buffer* b = held[i] = ById(ids[i]);
    // A plain allocation is never pinned nor evicted: nothing to keep.
    if (b == nullptr || !b->vmm || b->pins == 0) continue;
    Unpin(*b);
    // Pins taken for it by EndJournaling were never this thread's count.
    if (operation_pins > 0 && !pinned_by_end) --operation_pins;
    ++unpins_;
    // Pinned and not resident: this operation was served from host.
    const bool served = b->serving > 0 && !b->resident();
    if (served) --b->serving;
    if (b->pending_overwrite == ThisOperation()) {
      b->pending_overwrite = nullptr;
      // The overwrite did not happen: the device memory holds nothing yet,
      // so bring the host copy's contents in after all (or, failing that,
      // keep the buffer stale or swapped out: never wrong).
      if (!submitted) {
        RestoreFromHost(DeviceState(b->device), *b);
        restored = true;
      }
    }
    if (submitted) {
      if (b->vmm) {  // small buffers are never evicted
        if (!use_key) {
          use_key = UseKey(stream);
          // One record after the operation for all its buffers; before the
          // cap presses (nothing is evicted), one after several.
          mark = MarkOperation(*use_key, stream, b->device, /*defer=*/!pressed_, &marked);
        }
        if (mark != nullptr) {
          NoteMarkedUse(b->uses, *use_key, b->device, *mark, marked);
        } else {
          RecordUse(*b, stream, *use_key);
        }
      }
      b->last_use = ++clock_;  // distinct ticks: LRU order has no ties
    }
  }
  // Re-keyed once all their fields changed: a written buffer not among the
  // operation's right after its version, the operation's after.
  if (submitted) {
    for (uint64_t id : written) {
      // A written buffer is one of the operation's: found where it was.
      Buffer* b = nullptr;
      bool held_here = false;
      if (ids.size() <= 16) {
        auto at = std::find(ids.begin(), ids.end(), id);
        held_here = at != ids.end();
        b = held_here ? held[static_cast<size_t>(at - ids.begin())] : ById(id);
      } else {
        b = ById(id);
      }
      if (b == nullptr || !b->vmm) continue;  // plain: no copy to keep current
      if (!b->resident()) {
        // Served from host: written there, the host copy is the newest.
        b->host_version = b->gpu_version = ++version_;
      } else {
        b->gpu_version = ++version_;  // host copy now stale
      }
      b->written = true;
      if (!held_here) Reindex(*b);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Buffer* b = restored ? ById(ids[i]) : held[i];
    // A small buffer is never evicted nor planned for: nothing to re-key.
    if (b != nullptr && b->vmm) Reindex(*b);
  }
}

// --- Operations before the cap presses (OperationJournal) -------------------------

void MemoryManager::ForEachPinnedAtEnd(const OperationJournal::Slot& slot,
                                       absl::FunctionRef<void(Buffer&)> f) {
  Keys ids_x;
  for (uint64_t id : Expanded(slot.named(), &ids_x)) {
    Buffer* b = ById(id);
    if (b != nullptr && !b->garbage && b->vmm) f(*b);
  }
}

void MemoryManager::Withdraw(OperationJournal::Slot& slot) {
  MutexLock lock(&mu_);
  if (slot.pinned) {
    ForEachPinnedAtEnd(slot, [this](Buffer& b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (b.pins == 0) return;
      Unpin(b);
      ++unpins_;
    });
    slot.pinned = false;
  }
  slot.owner.store(nullptr, std::memory_order_release);
}

void MemoryManager::UpdateJournalOpen() {
  bool open =
      journaling_ && !own_work_ && journal_device_ >= 0 && verifier_ == nullptr && !pressed_;
  // The cap about to press: the next operation's Pressed() ends the
  // journaling (the moment it presses is the same as on the full path).
  for (const auto& d : devices_) {
    if (!open) break;
    if (d != nullptr && IterationPlanner::Wanted(Held(*d), d->cap, swapped_out_)) open = false;
  }
  journal_open_.store(open, std::memory_order_seq_cst);
}

void MemoryManager::ApplyJournal() {
  if (journal_.empty()) return;
  // Newest first: a buffer takes its latest tick and, per stream, its
  // latest use; a write bumps its version once. Each buffer is re-keyed once,
  // when all its fields are current.
  const uint64_t pass = ++journal_passes_;
  const absl::Span<const OperationJournal::Record> records = journal_.records();
  std::vector<uint64_t>& touched = journal_touched_;
  touched.clear();
  for (size_t r = records.size(); r-- > 0;) {
    const OperationJournal::Record& rec = records[r];
    const absl::Span<const uint64_t> ids = journal_.ids(rec);
    for (size_t i = ids.size(); i-- > 0;) {
      Buffer* b = ById(ids[i]);
      if (b == nullptr || !b->vmm) continue;  // a plain allocation keeps no uses
      if (b->journal_pass != pass) {
        b->journal_pass = pass;
        b->last_use = std::max(b->last_use, rec.tick + i);
        if (b->written_pass != pass) touched.push_back(ids[i]);
      } else if (b->journal_key == rec.key) {
        continue;  // a later use on that stream holds
      }
      b->journal_key = rec.key;
      Use& u = EntryFor(b->uses, {rec.use.stream, rec.use.thread});
      if (u.journal_pass == pass) continue;  // a later use on that stream holds
      u.journal_pass = pass;
      NoteJournaledUse(u, rec.use);
    }
    for (uint64_t id : journal_.written(rec)) {
      Buffer* b = ById(id);
      if (b == nullptr || !b->vmm || b->written_pass == pass) continue;
      if (b->journal_pass != pass) touched.push_back(id);
      b->written_pass = pass;
      if (!b->resident()) {
        b->host_version = b->gpu_version = ++version_;  // served: written there
      } else {
        b->gpu_version = ++version_;  // host copy now stale
      }
      b->written = true;
    }
  }
  for (uint64_t id : touched) {
    if (Buffer* b = ById(id)) Reindex(*b);
  }
  journal_.Clear();
}

void MemoryManager::NoteJournaledUse(Use& u, const OperationJournal::Use& j) {
  // As NoteMarkedUse noted it then: the mark's record `j.gen`, not its
  // latest.
  u.device = j.device;
  ++u.seq;
  u.done = false;
  const Marked marked = static_cast<Marked>(j.marked);
  u.context = j.mark != nullptr ? j.mark->context : nullptr;
  u.recorded = j.mark != nullptr && marked == Marked::kRecorded;
  if (j.mark == nullptr || marked == Marked::kUnrecorded) {
    u.mark = nullptr;
    u.event = nullptr;
    return;
  }
  u.mark = j.mark;
  u.mark_gen = j.gen;
  u.event = marked == Marked::kAhead ? nullptr : j.mark->event;
}

void MemoryManager::EndJournaling() {
  if (!journaling_) return;
  journaling_ = false;
  journal_open_.store(false, std::memory_order_seq_cst);
  ApplyJournal();
  journal_.Release();
  // What the Prepare of the operations in flight would have pinned.
  OperationJournal::ForEachInFlight(
      this, [this](OperationJournal::Slot& slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        ForEachPinnedAtEnd(slot, [this](Buffer& b) ABSL_NO_THREAD_SAFETY_ANALYSIS { Pin(b); });
        slot.pinned = true;
      });
}

void MemoryManager::JournalOn(const Device& dev) {
  // One device's operations only: a second one's would need their own marks.
  if (journal_device_ < 0) journal_device_ = dev.ordinal;
  if (journal_device_ != dev.ordinal) EndJournaling();
}

bool MemoryManager::OwnWorkDone() {
  for (const auto& d : devices_) {
    if (d == nullptr) continue;
    for (CUstream own : {d->swap_stream, d->fetch_stream}) {
      if (own != nullptr && driver_->cuStreamQuery(own) != CUDA_SUCCESS) return false;
    }
  }
  own_work_ = false;
  return true;
}

int MemoryManager::BeginUnknown(CUstream stream) {
  CUdevice ordinal = 0;
  if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return -1;
  ManagerLock lock(this);
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
  ManagerLock lock(this);
  --DeviceState(device).unknown_submitting;
}

void MemoryManager::MarkAllWritten(CUstream stream) {
  ManagerLock lock(this);
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
  uint64_t copied = 0;
  if (r == CUDA_SUCCESS) r = CopyParts(b, dev.swap_stream, /*out=*/false, &copied);
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
  ManagerLock lock(this);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUresult result = CUDA_SUCCESS;
  for (Buffer* p : PiecesOf(*b)) {
    if (CUresult r = PrefetchLocked(*p); result == CUDA_SUCCESS) result = r;
  }
  return result;
}

CUresult MemoryManager::PrefetchLocked(Buffer& b) {
  EndJournaling();  // nothing moves while operations are journaled
  if (b.garbage || !b.vmm) return CUDA_ERROR_NOT_FOUND;
  if (b.resident() && !b.stale_device) return CUDA_SUCCESS;
  Device& dev = DeviceState(b.device);
  Pin(b);  // not evicted to make room for itself
  CUresult r = b.resident() ? RestoreFromHost(dev, b)
                            : SwapIn(dev, b, /*copy=*/true, kNoConsumer, HostWait::kNever);
  Unpin(b);
  // Nothing to evict without waiting (or at all): not now.
  if (r == CUDA_ERROR_OUT_OF_MEMORY) r = CUDA_ERROR_NOT_READY;
  return r;
}

CUresult MemoryManager::EvictAsync(uint64_t id) {
  ManagerLock lock(this);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUresult result = CUDA_SUCCESS;
  for (Buffer* p : PiecesOf(*b)) {
    if (CUresult r = EvictAsyncLocked(*p); result == CUDA_SUCCESS) result = r;
  }
  return result;
}

CUresult MemoryManager::EvictAsyncLocked(Buffer& b) {
  EndJournaling();  // nothing moves while operations are journaled
  SettleAhead();
  if (b.garbage || !b.vmm) return CUDA_ERROR_NOT_FOUND;
  if (!b.resident()) return CUDA_SUCCESS;
  if (b.pins > 0 || b.exported) return CUDA_ERROR_NOT_READY;
  Device& dev = DeviceState(b.device);
  return SwapOut(dev, b, dev.order.Copies(b), HostWait::kNever);
}

// --- S02 and planned swaps -------------------------------------------------------

IterationPlanner* MemoryManager::Planner(Device& dev) {
  if (planner_made_) return planner_.get();
  planner_made_ = true;
  if (!Plans()) return nullptr;
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
  // Buffers already evicted before the planner existed are its to fetch,
  // and a use that serves one leaves it swapped out: told now (what each
  // was told so far is still its default, resident, as the planner assumes
  // of a buffer it has not heard of).
  for (auto& [base, b] : by_base_) {
    if (b->vmm && !b->garbage) TellPlannerResidency(*b);
  }
  return planner_.get();
}

void MemoryManager::NoteOperation(uint64_t key, absl::Span<const uint64_t> ids,
                                  absl::Span<const uint64_t> written, bool marker, CUstream stream,
                                  OpTicket* ticket) {
  *ticket = OpTicket{};
  // Only prefetch and belady read what the planner learns: without them a
  // launch pays no second lock.
  if (!Plans()) return;
  ManagerLock lock(this);
  Keys ids_x, written_x;
  if (!Pressed()) return;
  NoteOperationLocked(key, Expanded(ids, &ids_x), Expanded(written, &written_x), marker, stream,
                      ticket);
}

bool MemoryManager::PressureBegins() {
  for (const auto& d : devices_) {
    if (d == nullptr) continue;
    if (IterationPlanner::Wanted(Held(*d), d->cap, swapped_out_)) pressed_ = true;
  }
  // Evictions may follow: uses are recorded at each operation from here.
  if (pressed_) {
    EndJournaling();
    SettleAhead();
  }
  return pressed_;
}

void MemoryManager::NoteOperationLocked(uint64_t key, absl::Span<const uint64_t> ids,
                                        absl::Span<const uint64_t> written, bool marker,
                                        CUstream stream, OpTicket* ticket) {
  Noted noted;
  if (PredictLocked(key, ids, written, marker, &noted, {})) {
    ApplyNotedLocked(noted, stream, ticket);
  }
}

bool MemoryManager::PredictLocked(uint64_t key, absl::Span<const uint64_t> ids,
                                  absl::Span<const uint64_t> written, bool marker, Noted* noted,
                                  absl::Span<uint64_t> next_after,
                                  absl::Span<Buffer* const> found) {
  // The key names the operation and its shape (Tracker's LaunchKey and
  // TransferKey), never the buffers: temporaries get new ids every step,
  // and a caching allocator's tensors other segments.
  // The planner plans allocations: a group's pieces are one touch, under
  // the group's id (PlannerId), and each piece takes its next use.
  absl::InlinedVector<Buffer*, 16> buffers;
  absl::InlinedVector<size_t, 16> at;  // where in `ids`
  for (size_t k = 0; k < ids.size(); ++k) {
    Buffer* b = found.empty() ? ById(ids[k]) : found[k];
    if (b == nullptr || b->garbage) continue;
    b->prefetched = false;  // used now
    buffers.push_back(b);
    at.push_back(k);
  }
  if (buffers.empty()) return false;  // nothing the manager holds
  Device& dev = DeviceState(buffers.front()->device);
  IterationPlanner* planner = Planner(dev);
  if (planner == nullptr) return false;

  if (marker) planner->MarkBoundary();
  IterationPlanner::Scratch& scratch = predict_scratch_;  // kept: a launch allocates nothing here
  noted->time = planner->PredictUses(
      key, buffers.size(),
      [&](size_t i) {
        const Buffer& b = *buffers[i];
        const uint64_t id = ids[at[i]];
        // Never swapped: never planned for.
        return IterationPlanner::Use{
            PlannerId(b),
            ViewOf(b).reserved,
            /*write=*/std::find(written.begin(), written.end(), id) != written.end(),
            /*piece=*/b.group != nullptr,
            /*pinned=*/!b.vmm || b.exported,
            /*position=*/static_cast<uint32_t>(at[i])};
      },
      [&](size_t i, uint64_t next) {
        if (!next_after.empty()) next_after[at[i]] = next;
        // Re-keyed once, with its last use, by Finish (or by a failed
        // Prepare's unwind): the operation pins it meanwhile, so no
        // eviction looks at it.
        buffers[i]->next_use = next;
      },
      &scratch);
  noted->planner = planner;
  noted->device = dev.ordinal;
  noted->profiling = planner->profiling();
  // Buffers the predictor learnt more about without a use (a shard's cycle,
  // the next shard of a rotating slot): belady's order follows.
  for (const auto& [id, next] : scratch.repredicted) {
    Buffer* found = ById(id);
    if (found == nullptr) continue;
    for (Buffer* b : PlannedAs(*found, id)) {
      if (b->garbage || b->next_use == next) continue;
      b->next_use = next;
      Reindex(*b);
    }
  }
  return true;
}

// ApplyPlan's steps: the planner's evictions queued behind the buffers' last
// uses, its fetches on the fetch stream.
class MemoryManager::PlanCarrier : public PlanSteps {
 public:
  PlanCarrier(MemoryManager* mm, IterationPlanner* planner) : mm_(mm), planner_(planner) {}

  std::vector<EvictionState*> Named(uint64_t id, bool* pieces) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    Buffer* found = mm_->ById(id);
    if (found == nullptr || found->garbage || !found->vmm) return {};
    home_ = &mm_->DeviceState(found->device);
    std::vector<EvictionState*> named;
    for (Buffer* b : PlannedAs(*found, id)) named.push_back(b);
    const Buffer& front = *static_cast<Buffer*>(named.front());
    *pieces = front.group != nullptr && PlannerId(front) == id;
    return named;
  }
  bool Resident(const EvictionState& b) override { return Of(b).resident(); }
  bool NeedsFetch(const EvictionState& b) override { return !Of(b).resident() || b.stale_device; }
  // Pooled chunks count: a swap-in takes them. So do freed buffers'
  // chunks and kept buffers, which the planner counts as free: handed on to
  // the pool in stream order, or released, here, until the need fits. Left
  // to the swap-in, MakeRoom would drop clean buffers before it took them,
  // and a fetch must never evict what the planner did not choose.
  bool Fits(uint64_t missing) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    Device& home = *home_;
    const auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
      return (home.used <= home.cap && missing <= home.cap - home.used) ||
             home.pool.bytes() >= missing;
    };
    while (!fits() && (mm_->HandOnGarbage(home) || mm_->ReleaseOneKept(home))) {
    }
    return fits();
  }
  // Queued behind the buffer's last use, never waited for here. One that
  // cannot go now (pinned by this operation or in flight) stays; the fetch
  // it made room for is then refused if it no longer fits. (These thrashed
  // while shards were predicted from their first gap, fetched far too
  // early and held: policy/next_use.h.)
  void Evict(EvictionState& b) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    mm_->EvictPlanned(Of(b));
  }
  bool Fetch(EvictionState& b) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mm_->mu_) {
    if (mm_->PrefetchLocked(Of(b)) != CUDA_SUCCESS) return false;
    b.prefetched = true;
    return true;
  }
  void Cancel(uint64_t id) override { planner_->CancelFetch(id); }

 private:
  static Buffer& Of(EvictionState& b) { return static_cast<Buffer&>(b); }
  static const Buffer& Of(const EvictionState& b) { return static_cast<const Buffer&>(b); }

  MemoryManager* const mm_;
  IterationPlanner* const planner_;
  Device* home_ = nullptr;  // of the buffers Named last
};

void MemoryManager::ApplyNotedLocked(const Noted& noted, CUstream stream, OpTicket* ticket) {
  IterationPlanner* planner = noted.planner;
  Device& dev = DeviceState(noted.device);
  // Its uses, to the prefetch planner, after the swap-ins it made.
  planner->Commit();
  if (noted.profiling) {
    ticket->timing = profiler_.BeginTiming(stream);
    ticket->time = noted.time;
  }
  for (const auto& [op, seconds] : profiler_.TakeCompleted()) planner->OnComputeTime(op, seconds);

  // Pooled chunks and freed buffers' chunks are room: a swap-in takes them
  // before it evicts (MakeRoom), a freed buffer still in use hands its
  // chunks on in stream order, and the sim's replay counts a free at once.
  // Counted as used, the planner evicted for fetches that on demand went
  // into them with no eviction (mlp_train --hidden 2048 at 50 %: 1272-1384
  // MiB moved against 888 with prefetch off).
  const uint64_t free_bytes = FreeUnderCap(dev);
  // The link's queue is the planner's own model (in profiled compute time),
  // never the clock: its decisions then follow from the profile and the
  // operations, as in `stensor sim`.
  PlanCarrier carrier(this, planner);
  // What a use would serve rather than bring in (ChooseReach) is not fetched.
  const ForcedOutLog* forced =
      dev.order.policy().RanksByNextUse() ? &dev.order.forced_out() : nullptr;
  const PlanApplied applied = ApplyPlan(planner->Plan(free_bytes, forced), carrier);
  stats_.prefetches_issued += applied.fetches_issued;
  stats_.prefetches_refused += applied.fetches_refused;
}

void MemoryManager::EndOperation(const OpTicket& ticket, CUstream stream, bool submitted) {
  if (ticket.timing < 0) return;
  profiler_.EndTiming(ticket.timing, stream, ticket.time, submitted);
}

bool MemoryManager::Readable(const Buffer& b) { return b.resident() || b.host_at_base; }

bool MemoryManager::HostVmm(int device) { return DeviceState(device).host_vmm; }

bool MemoryManager::IsSwappable(const Buffer& b, int device) {
  return b.vmm && !b.garbage && ViewOf(b).id != 0 && b.device == device;
}

uint64_t MemoryManager::BufferId(const Buffer& b) { return ViewOf(b).id; }

MemoryManager::Usage MemoryManager::SettledUsage(int device) {
  CollectGarbage();
  if (!external_frees_.empty()) (void)SettleExternalFrees(device, /*wait=*/false);
  Device& dev = DeviceState(device);
  // Chunks still mapped at an old address are about to be free and are
  // counted so.
  return Usage{dev.cap, dev.used - dev.pool.bytes() - dev.kept_bytes};
}

void MemoryManager::MemInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  ManagerLock lock(this);
  const Usage usage = SettledUsage(device);
  if (total_bytes != nullptr) *total_bytes = usage.cap;
  // The program asks what is free (to size its allocations, or to watch the
  // device): the pool's idle chunks go back to the driver, so the answer and
  // the device agree.
  Device& dev = DeviceState(device);
  while (ReleaseOnePooled(dev)) {
  }
  if (free_bytes != nullptr) {
    *free_bytes = usage.used >= usage.cap ? 0 : usage.cap - usage.used;
  }
}

MemoryManager::Usage MemoryManager::DeviceUsage(int device) {
  ManagerLock lock(this);
  return SettledUsage(device);
}

SwapStats MemoryManager::stats() const {
  MutexLock lock(&mu_);
  SwapStats s = stats_;
  s.driver_errors += host_store_.driver_errors();
  if (planner_ != nullptr) {
    const IterationPlanner::Stats p = planner_->stats();
    s.profiled_period = p.main_period;
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
      "stensor: served from host   %10u (%.1f MiB: buffers an operation reached in host memory, "
      "over the cap with its others, or by choice: %u, where their room would displace one needed "
      "no later or copy out a larger one nothing uses again or they would be forced out again "
      "before "
      "their next use, or, %u of them, pieces a kernel held but likely did not touch)\n"
      "stensor: kept mapped, reused %9u (freed buffers' device memory taken whole, no remap)\n"
      "stensor: garbage released   %10u\n"
      "stensor: garbage taken over %10u (freed buffers reused whole in stream order)\n"
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
      "stensor: slab allocations   %10u (small allocations packed into %u swappable slabs)\n"
      "stensor: link bandwidth     %10.2f GB/s host->device (%s)\n%s",
      std::string(policy_->name()), mib(s.peak_resident_bytes), s.swap_outs_copied,
      mib(s.bytes_copied_out), s.clean_drops, mib(s.bytes_dropped), s.never_written_drops,
      mib(s.bytes_never_written_dropped), s.swap_ins, mib(s.bytes_copied_in),
      s.swap_ins_without_copy, s.swap_ins_never_written, s.reads_served_from_host,
      s.served_from_host, mib(s.bytes_served_from_host), s.served_by_choice, s.served_far,
      s.kept_reused, s.garbage_released, s.garbage_taken_over, s.ooms, s.driver_errors,
      s.host_wait_seconds, s.wait_program_seconds, s.wait_swap_seconds, s.wait_unknown_seconds,
      s.async_evictions, s.swap_outs_cancelled, s.physical_creates, s.physical_releases,
      s.pool_hits, s.profiled_period, s.profiles, s.pattern_changes, s.prefetches_issued,
      s.prefetches_used, s.prefetches_wasted, s.prefetches_refused, s.planned_evictions_issued,
      s.planned_evictions_skipped, mib(s.planner_bytes_caused),
      s.planner_stopped ? "stopped: past its cut-off" : "running", s.on_demand_after_profile,
      s.slab_allocations, s.slabs_made, s.planner_bandwidth_h2d / 1e9,
      s.planner_bandwidth_h2d == 0    ? "no planner"
      : !config_.bandwidth.measured() ? "STENSOR_BANDWIDTH"
      : s.bandwidth_probed            ? "probed"
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

void MemoryManager::AppendStatsJson(JsonLine* out) const {
  SwapStats s = stats();
  JsonLine& j = *out;
  j.Str("policy", policy_->name())
      .Uint("peak_resident_bytes", s.peak_resident_bytes)
      .Uint("swap_outs_copied", s.swap_outs_copied)
      .Uint("bytes_copied_out", s.bytes_copied_out)
      .Uint("clean_drops", s.clean_drops)
      .Uint("bytes_dropped", s.bytes_dropped)
      .Uint("never_written_drops", s.never_written_drops)
      .Uint("bytes_never_written_dropped", s.bytes_never_written_dropped)
      .Uint("swap_ins", s.swap_ins)
      .Uint("bytes_copied_in", s.bytes_copied_in)
      .Uint("swap_ins_without_copy", s.swap_ins_without_copy)
      .Uint("swap_ins_never_written", s.swap_ins_never_written)
      .Uint("reads_served_from_host", s.reads_served_from_host)
      .Uint("served_from_host", s.served_from_host)
      .Uint("bytes_served_from_host", s.bytes_served_from_host)
      .Uint("served_by_choice", s.served_by_choice)
      .Uint("served_far", s.served_far)
      .Uint("slab_allocations", s.slab_allocations)
      .Uint("slabs_made", s.slabs_made)
      .Uint("kept_reused", s.kept_reused)
      .Uint("garbage_released", s.garbage_released)
      .Uint("ooms", s.ooms)
      .Uint("driver_errors", s.driver_errors)
      .Double("host_wait_seconds", s.host_wait_seconds)
      .Double("wait_program_seconds", s.wait_program_seconds)
      .Double("wait_swap_seconds", s.wait_swap_seconds)
      .Double("wait_unknown_seconds", s.wait_unknown_seconds)
      .Uint("async_evictions", s.async_evictions)
      .Uint("swap_outs_cancelled", s.swap_outs_cancelled)
      .Uint("physical_creates", s.physical_creates)
      .Uint("physical_releases", s.physical_releases)
      .Uint("pool_hits", s.pool_hits)
      .Uint("pooled_bytes", s.pooled_bytes)
      .Uint("profiled_period", s.profiled_period)
      .Uint("profiles", s.profiles)
      .Uint("pattern_changes", s.pattern_changes)
      .Uint("prefetches_issued", s.prefetches_issued)
      .Uint("prefetches_used", s.prefetches_used)
      .Uint("prefetches_wasted", s.prefetches_wasted)
      .Uint("prefetches_refused", s.prefetches_refused)
      .Uint("planned_evictions_issued", s.planned_evictions_issued)
      .Uint("planned_evictions_skipped", s.planned_evictions_skipped)
      .Uint("planner_bytes_caused", s.planner_bytes_caused)
      .Bool("planner_stopped", s.planner_stopped)
      .Uint("on_demand_after_profile", s.on_demand_after_profile)
      .Double("planner_bandwidth_h2d", s.planner_bandwidth_h2d)
      .Bool("bandwidth_probed", s.bandwidth_probed);
  if (verifier_ != nullptr) {
    j.Uint("verify_checks", s.verify_checks)
        .Uint("verify_mismatches", s.verify_mismatches)
        .Uint("verify_errors", s.verify_errors)
        .Double("verify_seconds", s.verify_seconds);
  }
}

}  // namespace stensor
