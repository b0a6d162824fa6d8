// The memory manager's state per buffer and per device (MemoryManager::Buffer,
// MemoryManager::Device) and the helpers its translation units share: the
// decisions in memory_manager.cc and the plumbing in memory_manager_*.cc
// all read and change the same fields. Internal to //core/swap:memory_manager
// (a private header of that library); nothing else includes it.
//
// Thread-safety: every field here is guarded by MemoryManager::mu_; the
// member functions that touch them say so (ABSL_EXCLUSIVE_LOCKS_REQUIRED).
#ifndef STENSOR_CORE_SWAP_MEMORY_MANAGER_INTERNAL_H_
#define STENSOR_CORE_SWAP_MEMORY_MANAGER_INTERNAL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "core/swap/driver_pool.h"
#include "core/swap/host_copy.h"
#include "core/swap/memory_manager.h"
#include "core/swap/physical_pool.h"
#include "core/swap/stream_use.h"
#include "core/swap/tensor_bounds.h"
#include "policy/apply_plan.h"
#include "policy/eviction_order.h"
#include "policy/eviction_policy.h"
#include "policy/make_room.h"
#include "policy/reach.h"

namespace stensor {
namespace memory_manager_internal {

// Small allocations are charged in whole host pages, as a driver hands them out.
inline constexpr uint64_t kSmallUnit = 4096;

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The "consumer" of a prefetch's swap-in: nothing is ordered after it yet.
inline const CUstream kNoConsumer = reinterpret_cast<CUstream>(~uintptr_t{0});

inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace memory_manager_internal

// An allocation larger than a granule, where the device maps host memory:
// one VA range made of pieces of one granule each, every piece a Buffer of
// its own (resident, swapped out or served on its own), so that what does
// not fit of a large allocation (a caching allocator's segment, a big
// tensor) stays in host memory at its address while the rest is on the
// device. An operation naming the allocation names every piece: each is
// pinned and, when written, versioned, so no piece a kernel may reach is
// moved under it and no write is lost.
struct MemoryManager::PieceGroup {
  uint64_t id = 0;  // the registry's, 0 when untracked
  CUdeviceptr base = 0;
  uint64_t size = 0;      // as the application asked
  uint64_t reserved = 0;  // the VA range, every piece's granules
  // In address order; null once released.
  std::vector<Buffer*> pieces;
  size_t live = 0;           // pieces not yet released
  bool va_reserved = false;  // freed with the last piece
  // Every piece resident, as the planner was last told (Reindex).
  bool planner_resident = true;
  // Where its tensors were seen to begin and end (FarPieces, Narrow).
  TensorBounds bounds;
};

struct MemoryManager::Buffer : EvictionState {
  // EvictionState::id: the registry's; 0 when the registry could not track it.
  // EvictionState::reserved: VA and physical size (granules), or the charge.
  uint64_t key = 0;  // in buffers_: the id, or an internal key when untracked
  // A piece of a larger allocation (PieceGroup), null for a whole one. A
  // piece's id and key are its own (from kPieceKeys up), which the planner
  // and the policy see as ids; the registry's id names the group.
  std::shared_ptr<PieceGroup> group;
  CUdeviceptr base = 0;
  uint64_t size = 0;  // as the application asked
  int device = 0;
  CUcontext context = nullptr;  // current at allocation (pointer attributes)
  bool vmm = false;             // false: a small plain allocation, never swapped
  // Holds the program's small allocations (SlabPool), each named by its
  // own registry id (slab_blocks_); the slab itself only by its key.
  bool slab = false;
  // Served for cuMemAllocAsync from the device's default pool: counted in
  // Device::stream_ordered until its memory is released.
  bool stream_ordered = false;
  // Small and outside a slab, counted in Device::slab_onset until freed.
  bool before_slabs = false;
  // A handle to its memory left stensor's control (PinExported): resident
  // and never evicted again.
  bool exported = false;
  // S03 fields, besides EvictionState's. `pins` counts operations being
  // prepared or submitted right now (non-evictable while > 0); the
  // application's own reference ends with cuMemFree, after which a buffer
  // still in use is garbage.
  // Of those operations, the ones that reach it through its host copy at its
  // address (Serve): while any is pinned it is not brought in, so that all
  // of them see the same memory.
  int serving = 0;
  bool garbage = false;
  // The passes over the operation journal that last gave it a use and a
  // version (MemoryManager::ApplyJournal, newest record first), and the
  // journal's key (stream and thread) whose use the pass gave it last.
  uint64_t journal_pass = 0;
  uint64_t written_pass = 0;
  uint32_t journal_key = 0;
  // Freed, idle, and kept mapped for the next allocation of its size
  // (Device::kept).
  bool kept = false;
  // While garbage and not handed on: its place in its device's queue of
  // pending frees (Device::garbage), and the chunk bytes counted for it
  // there (Device::garbage_bytes).
  std::list<Buffer*>* garbage_queue = nullptr;
  std::list<Buffer*>::iterator garbage_at;
  uint64_t garbage_counted = 0;
  // The last use on each stream that used it (a use on one stream says
  // nothing about another); a swap's copy is a use on the swap stream.
  std::vector<Use> uses;
  // Device memory, when resident: chunks of the device's pool mapped at
  // consecutive offsets from base, adding up to `reserved` (empty when not
  // resident).
  std::vector<PhysicalChunk> device_chunks;
  // The host copy: host-located VMM memory (mapped at its own VA, and at base
  // while swapped out), or pinned memory where that is unsupported.
  HostCopy host;
  bool host_at_base = false;  // true only while the host copy is mapped there
  bool va_reserved = false;   // `base` is still reserved (VMM buffers)
  // Swapped in without a copy for an operation that overwrites it whole:
  // the thread preparing that operation (ThisOperation()), null when none.
  // Only that operation clears it once submitted, or restores the host
  // copy's contents if it is not: another operation holding the buffer
  // meanwhile may come and go, even fail, while the overwrite is in flight.
  const void* pending_overwrite = nullptr;
  // STENSOR_VERIFY: the hash of the host copy, taken when it was copied out
  // (hash mode), and the kernels named by a mismatch.
  std::optional<uint64_t> host_hash;
  const char* last_kernel = nullptr;
  const char* last_writer = nullptr;
  // EvictionState::stale_device: set when a restore failed and could not be
  // undone; brought in before the next use.
  // Swapped out asynchronously: `old_chunks` (in the pool, or some handed
  // on when `handed_on`) are still mapped at `base` until the swap-out's
  // copy, the buffer's use on the swap stream, is observed complete.
  bool old_mapped = false;
  bool handed_on = false;
  std::vector<PhysicalChunk> old_chunks;
  // Resident as the planner was last told (Reindex tells it of changes).
  bool planner_resident = true;

  bool resident() const { return !vmm || !device_chunks.empty(); }
  int refcount() const { return (garbage ? 0 : 1) + pins; }
};

struct MemoryManager::Device {
  Device(const EvictionPolicy* policy, bool version_rules) : order(policy, version_rules) {}
  int ordinal = 0;
  // Operations whose accesses are unknown, their last one per stream: until
  // they completed, no buffer of this device counts as idle.
  std::vector<Use> unknown;
  int unknown_submitting = 0;  // such operations being submitted right now
  // One per swap stream (below): each one's latest point, for them.
  std::vector<Use> swap_marks;
  uint64_t cap = 0;
  uint64_t total = 0;  // the device's memory (cuDeviceTotalMem)
  uint64_t used = 0;
  uint64_t granularity = 0;
  bool host_vmm = false;
  // Where stensor's streams and events for this device live: the context of
  // its first buffer (a context of this device, current at cuMemAlloc), so
  // no context of stensor's own is created. Null until then, and once that
  // context ended (AfterContextEnds): CreateOwnStream picks a live one.
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
  // Idle physical memory in chunks of whole granules, charged (in `used`).
  PhysicalPool pool;
  // Stensor's share of the default stream-ordered pool (StreamOrderedUsage).
  StreamOrderedUsage stream_ordered;
  // The driver's default pool of the device (TrimDriverPool).
  DriverPool driver_pool;
  // Buffers whose old mapping is still there (Buffer::old_mapped), in the
  // order of their uses on the swap stream, which complete in that order:
  // reaping looks at the oldest first and stops at the first not done.
  std::deque<Buffer*> old_mappings;
  // The old owners (old_mappings) of each chunk still mapped at an old
  // address: whom handing it on concerns, found without a walk.
  absl::flat_hash_map<CUmemGenericAllocationHandle, std::vector<Buffer*>> shadow_owners;
  // Whether a shadowed chunk's old owners include a freed buffer: such
  // chunks are handed on first, since that owner never comes back for them
  // (one that does waits on the host for its old copy).
  bool OfFreedOwner(CUmemGenericAllocationHandle h) const {
    auto it = shadow_owners.find(h);
    return it != shadow_owners.end() && std::any_of(it->second.begin(), it->second.end(),
                                                    [](const Buffer* o) { return o->garbage; });
  }
  // Freed buffers whose work was still queued (S404), not handed on: a FIFO
  // per stream that work is on (one more for work on several streams or
  // none known), in the order of their frees. Work on a stream completes in
  // order, so each call releases from the oldest of each queue and stops at
  // the first not done: its cost follows what completed, not the backlog.
  using StreamKey = std::pair<CUstream, uint64_t>;  // Use::stream, Use::thread
  std::map<StreamKey, std::list<Buffer*>> garbage;
  uint64_t garbage_bytes = 0;  // their device memory, for the planner's room
  // Freed buffers whose work is done, kept mapped at their address (device
  // memory mapped, access set) for the next allocation of their reserved
  // size, which takes one whole: on a GPU mapping and setting access cost
  // by granule (docs/gpu.md), and a training step frees and allocates the
  // same sizes again. Charged, but counted free; released first when room
  // is needed.
  std::multimap<uint64_t, Buffer*> kept;
  uint64_t kept_bytes = 0;
  // Its buffers in eviction order (MemoryManager::Reindex).
  EvictionOrder order;
  // STENSOR_SLABS=auto: whether its small allocations go to slabs yet.
  SlabOnset slab_onset;
};

// Every operation looks its buffers' devices up, several times: made once
// (AddDeviceState), then found inline.
inline MemoryManager::Device& MemoryManager::DeviceState(int ordinal) {
  if (ordinal >= 0 && static_cast<size_t>(ordinal) < devices_.size() && devices_[ordinal]) {
    return *devices_[ordinal];
  }
  return AddDeviceState(ordinal);
}

inline void MemoryManager::Reindex(Buffer& b) {
  // Every change of residency passes here: the planner hears of it.
  if (!b.resident()) b.prefetched = false;
  if (planner_ != nullptr && b.vmm && !b.garbage) TellPlannerResidency(b);
  // Pins, failed rounds and idleness change all the time: checked when an
  // eviction looks, not kept here.
  DeviceState(b.device).order.Update(b, b.vmm && b.resident() && !b.garbage && !b.exported);
}

// Inline, as EntryFor and NoteMarkedUse below: every buffer of every launch
// under a cap passes here.
inline void MemoryManager::Pin(Buffer& b) {
  ++b.pins;
  ++pinned_;
}

inline void MemoryManager::Unpin(Buffer& b) {
  --b.pins;
  --pinned_;
}

inline MemoryManager::Buffer* MemoryManager::ById(uint64_t id) const {
  Buffer* b = id < kPieceKeys       ? by_id_.Find(id)
              : id < kUntrackedKeys ? by_piece_key_.Find(id - kPieceKeys)
                                    : nullptr;
  return b != nullptr ? b : ByIdSlow(id);
}

inline MemoryManager::Use& MemoryManager::EntryFor(std::vector<Use>& uses,
                                                   std::pair<CUstream, uint64_t> key) {
  for (Use& x : uses) {
    if (x.stream == key.first && x.thread == key.second) return x;
  }
  return AddEntry(uses, key);
}

inline void MemoryManager::NoteMarkedUse(std::vector<Use>& uses, std::pair<CUstream, uint64_t> key,
                                         int device, StreamMark& mark, Marked marked) {
  Use* u = &EntryFor(uses, key);
  u->device = device;
  ++u->seq;
  u->done = false;
  u->context = mark.context;
  u->recorded = marked == Marked::kRecorded;
  if (marked == Marked::kAhead) {
    // Known to the mark's next record, once made (ObservedComplete); until
    // then to no event.
    u->mark = &mark;
    u->mark_gen = mark.gen;
    u->event = nullptr;
    return;
  }
  if (marked == Marked::kUnrecorded) {
    // Known to no event (only a host wait tells), and not to the mark's
    // next record either: that one may be taken again at once.
    u->mark = nullptr;
    u->event = nullptr;
    return;
  }
  u->mark = &mark;
  u->mark_gen = mark.gen;
  u->event = mark.event;
}

class ABSL_SCOPED_LOCKABLE MemoryManager::ManagerLock {
 public:
  explicit ManagerLock(MemoryManager* mm) ABSL_EXCLUSIVE_LOCK_FUNCTION(mm->mu_) : mm_(mm) {
    mm_->mu_.Lock();
    Applied();
  }
  ~ManagerLock() ABSL_UNLOCK_FUNCTION() {
    Closing();
    mm_->mu_.Unlock();
  }
  ManagerLock(const ManagerLock&) = delete;
  ManagerLock& operator=(const ManagerLock&) = delete;

 private:
  void Applied() ABSL_NO_THREAD_SAFETY_ANALYSIS { mm_->ApplyJournal(); }
  void Closing() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (mm_->journaling_) mm_->UpdateJournalOpen();
  }
  MemoryManager* const mm_;
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

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_MEMORY_MANAGER_INTERNAL_H_
