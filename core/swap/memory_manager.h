// MemoryManager: the device-memory cap (STENSOR_MEMORY_LIMIT) and the swap
// machinery under it. Tracked allocations are served on the VMM API, so a
// buffer keeps its address while its physical memory comes and goes; when
// room is needed the allocation loop of the method (S401-S405) drops clean
// device copies, releases garbage and swaps least-recently-used buffers out
// to host memory; before a launch, copy or memset touches a swapped-out
// buffer it is swapped back in at the same address. To the program a buffer
// keeps the size it asked for (not the granules behind it), and the
// program's own device-located VMM memory is charged against the cap too.
//
// Each buffer carries the STensor fields: evictable flag, location,
// reference count and the versions (logical modification times) of its
// device and host copies. A host copy whose version equals the device one is
// current, so evicting that buffer costs no transfer.
//
// Every state change of a buffer (resident -> swapped out, back, garbage
// released) makes its fallible driver calls first and commits the metadata
// last, undoing what it did when a call fails: the buffer stays as it was
// (resident, or swapped out with its current host copy), and a later
// attempt starts afresh. Nothing is taken as complete that was not observed
// complete: an event that could not be recorded, queried or synchronised
// leaves its buffer "not known idle", so it is not evicted.
//
// Thread-safety: all methods are thread-safe. One mutex serialises the
// manager's decisions and the driver calls they make (allocation, eviction,
// swaps); launches of buffers already resident only record events. Waits
// for the program's own work happen without the mutex, since that work may
// depend on another thread's next launch. (Host waits for the swap stream
// hold it: nothing on that stream waits for the program's work.)
#ifndef STENSOR_CORE_SWAP_MEMORY_MANAGER_H_
#define STENSOR_CORE_SWAP_MEMORY_MANAGER_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "core/base/config.h"
#include "core/base/dense_id_map.h"
#include "core/base/json.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "core/swap/external_charges.h"
#include "core/swap/host_copy.h"
#include "core/swap/host_store.h"
#include "core/swap/operation_journal.h"
#include "core/swap/physical_pool.h"
#include "core/swap/profiler.h"
#include "core/swap/slab_pool.h"
#include "core/swap/stream_use.h"
#include "core/swap/verifier.h"
#include "core/swap/vmm.h"
#include "policy/eviction_policy.h"
#include "policy/iteration_planner.h"

namespace stensor {

// Counters printed by STENSOR_STATS=1 and used by tests.
struct SwapStats {
  uint64_t peak_resident_bytes = 0;
  uint64_t swap_outs_copied = 0;
  uint64_t bytes_copied_out = 0;  // device -> host
  uint64_t clean_drops = 0;
  uint64_t bytes_dropped = 0;
  uint64_t swap_ins = 0;
  uint64_t bytes_copied_in = 0;        // host -> device
  uint64_t swap_ins_without_copy = 0;  // whole buffer about to be overwritten
  // Buffers nothing has written since allocation (`version` only): evicted
  // and brought back without any copy. Counted apart from the above.
  uint64_t never_written_drops = 0;
  uint64_t bytes_never_written_dropped = 0;
  uint64_t swap_ins_never_written = 0;
  // Swap-path driver calls that failed; each was undone or worked around.
  uint64_t driver_errors = 0;
  uint64_t reads_served_from_host = 0;
  // Buffers an operation reached through their host copy, mapped at their
  // address, because they did not fit under the cap with its others.
  uint64_t served_from_host = 0;
  uint64_t bytes_served_from_host = 0;
  // Of those, served although room could have been made: brought in, they
  // would have displaced a buffer the policy predicts is needed sooner.
  uint64_t served_by_choice = 0;
  // Of those, pieces a kernel held but likely did not touch (FarPieces).
  uint64_t served_far = 0;
  // Small allocations placed in slabs, and the slabs made for them.
  uint64_t slab_allocations = 0;
  uint64_t slabs_made = 0;
  uint64_t garbage_released = 0;
  // Freed buffers whose address and device memory a new allocation of
  // their size took over, in stream order (their work may still be queued).
  uint64_t garbage_taken_over = 0;
  // Allocations that took a freed buffer kept mapped (no map, no access
  // set, no unmap of the old one).
  uint64_t kept_reused = 0;
  uint64_t ooms = 0;
  double host_wait_seconds = 0;  // waiting for in-flight work and copies
  // host_wait_seconds split by what was waited for: the program's work on a
  // buffer to be evicted (or freed), the swap stream's copies, work of
  // unknown accesses.
  double wait_program_seconds = 0;
  double wait_swap_seconds = 0;
  double wait_unknown_seconds = 0;
  // Physical memory: cuMemCreate / cuMemRelease of stensor's own device
  // memory, and chunks taken from the pool instead of created.
  uint64_t physical_creates = 0;
  uint64_t physical_releases = 0;
  uint64_t pool_hits = 0;
  uint64_t pooled_bytes = 0;  // in the pool now (charged), all devices
  // Swap-outs and drops queued behind the buffer's in-flight work or copy
  // without a host wait, and swap-ins that took back the device memory of
  // their own swap-out still in flight (no copy).
  uint64_t async_evictions = 0;
  uint64_t swap_outs_cancelled = 0;
  // S02 and planned swaps (policy/iteration_planner): the iteration found
  // and profiled (its length in operations; of the profile in use for the
  // most operations), fetches and evictions the
  // planner asked for and those issued, and the swap-ins that still had to
  // happen on demand once a profile existed.
  uint64_t profiled_period = 0;
  uint64_t profiles = 0;
  uint64_t pattern_changes = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_refused = 0;  // not now: no room without waiting
  uint64_t prefetches_used = 0;
  uint64_t prefetches_wasted = 0;  // evicted again before their use
  uint64_t planned_evictions_issued = 0;
  uint64_t planned_evictions_skipped = 0;  // pinned now or already in flight
  uint64_t planner_bytes_caused = 0;       // extra bytes its plans caused
  bool planner_stopped = false;            // the cost cut-off was reached
  uint64_t on_demand_after_profile = 0;
  double planner_bandwidth_h2d = 0;  // bytes/s the planner assumed
  bool bandwidth_probed = false;
  // STENSOR_VERIFY: clean drops checked, those whose device contents
  // differed from the host copy, and those that could not be checked; the
  // last two were copied instead.
  uint64_t verify_checks = 0;
  uint64_t verify_mismatches = 0;
  uint64_t verify_errors = 0;
  double verify_seconds = 0;  // checking drops and recording hashes
};

class MemoryManager {
 public:
  // Called with each finished access-log record (JSON object), if logging.
  using LogSink = std::function<void(std::string)>;

  // An operation's swappable buffers share one event record on its stream:
  // up to kMaxMarksPerStream such events per stream, on up to
  // kMaxMarkStreams streams (beyond, each buffer records its own).
  static constexpr size_t kMaxMarkStreams = 64;
  static constexpr size_t kMaxMarksPerStream = 256;
  // Before the cap presses, one record per this many operations on a
  // stream (MarkOperation): each a driver call costing about what a launch
  // does, where deferring one only delays seeing a free's memory idle.
  static constexpr int kDeferredRecords = 64;

  // Null when the configuration sets no memory limit, or when the driver
  // lacks an entry point swapping needs (said once on stderr: the program
  // then runs uncapped rather than crashing on a missing call).
  static std::unique_ptr<MemoryManager> Create(const Config& config, const Driver* driver,
                                               LogSink log);
  ~MemoryManager();

  // cuMemAlloc under the cap: a VMM-backed, swappable buffer (of whole
  // granules, so from half a granule up), or for sizes below half the
  // allocation granularity a plain allocation that counts against the cap
  // and is never swapped. The driver's result code, or
  // CUDA_ERROR_OUT_OF_MEMORY when nothing is left to evict.
  // `register_id` is called once, with the new buffer's address, under the
  // manager's lock (so no thread sees the buffer without its id): it
  // registers the buffer and returns the registry's id, by which every later
  // call names it; 0 when the registry could not track it (then no
  // operation names it).
  // `stream_order`: served for cuMemAllocAsync on that stream from the
  // device's default pool, so counted in StreamOrdered; null for cuMemAlloc.
  using RegisterId = absl::FunctionRef<uint64_t(CUdeviceptr base)>;
  CUresult Allocate(uint64_t bytes, CUdeviceptr* dptr, RegisterId register_id,
                    const CUstream* stream_order = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Stensor's share of a device's default stream-ordered pool: `used`, the
  // requested bytes of its stream-ordered buffers the program has not freed
  // (cuMemFreeAsync ends it at the call); `reserved`, the device memory
  // those buffers take (whole granules, whether resident or swapped out at
  // the moment: what the cap charges them when resident), from allocation
  // until the memory of a freed one is released to the chunk pool (once the
  // stream passed the free). The _high marks are high-water marks of each
  // since the last reset (ResetStreamOrderedHigh: to the current value).
  // StreamOrdered first releases freed buffers whose work completed.
  struct StreamOrderedUsage {
    uint64_t used = 0;
    uint64_t reserved = 0;
    uint64_t used_high = 0;
    uint64_t reserved_high = 0;
  };
  StreamOrderedUsage StreamOrdered(int device) ABSL_LOCKS_EXCLUDED(mu_);
  void ResetStreamOrderedHigh(int device, bool used, bool reserved) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases idle chunks of `device`'s physical pool (freed buffers whose
  // work completed first) while more than `keep` bytes stay pooled, never
  // leaving fewer (cuMemPoolTrimTo's promise; a chunk goes whole); chunks
  // still mapped at an old address stay. Returns the bytes released.
  uint64_t ReleaseIdlePooled(int device, uint64_t keep) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether Allocate(bytes) on the current context's device would make a
  // VMM-backed, swappable buffer (at least half the granularity, at most the
  // cap, or smaller and placed in a slab); false also when the device cannot
  // be told.
  bool Swappable(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether Allocate(bytes) of a smaller one, finding no room, serves it
  // from host memory rather than refusing it (host-located VMM): what a
  // stream-ordered allocation the driver's pool could not be given room for
  // falls back to.
  bool SmallServedFromHost(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // What an operation over `ids` needs on the device at once (each buffer
  // counted once, by what the cap charges it), the cap of that device, and
  // whether it has host-located VMM: the words of a refusal. The device
  // is the first buffer's.
  struct Footprint {
    uint64_t bytes = 0;
    size_t buffers = 0;
    uint64_t cap = 0;
    int device = 0;
    bool host_vmm = false;
  };
  Footprint FootprintOf(absl::Span<const uint64_t> ids) const ABSL_LOCKS_EXCLUDED(mu_);
  // Allocations the driver makes itself under the cap (cuMemAllocPitch,
  // stream-ordered pools): never swapped, but counted. Reserve makes room
  // for `bytes` on the current device and charges them; Adopt ties the
  // charge to the allocation at `base` (or Unreserve when the driver failed);
  // Forget releases it when the program frees that allocation.
  //
  // A stream-ordered one (cuMemAllocAsync and kin) is charged as any other:
  // the driver reserves fresh memory for it wherever a free queued before
  // it (even on its own stream, from its own pool) has not run, so that
  // free stays charged until it is observed run (ForgetExternalAsync).
  //
  // `source`: where the driver takes the memory from. Fresh device memory
  // (cuMemCreate, cuMemAllocPitch, an explicit pool) comes after the
  // default pool gave back what it keeps reserved of settled frees (as
  // stensor's own memory does: TrimDriverPool); an allocation from the
  // default pool takes that kept memory first, so it is left there.
  enum class ExternalSource { kFresh, kDefaultPool };
  CUresult ReserveExternal(uint64_t bytes, ExternalSource source = ExternalSource::kFresh)
      ABSL_LOCKS_EXCLUDED(mu_);
  void UnreserveExternal(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void AdoptExternal(CUdeviceptr base, uint64_t bytes,
                     ExternalSource source = ExternalSource::kFresh) ABSL_LOCKS_EXCLUDED(mu_);
  void ForgetExternal(CUdeviceptr base) ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemFreeAsync of such an allocation on `stream`: the driver frees it
  // when the stream reaches the free, so its charge stays until an event
  // recorded there is observed complete (a room-making allocation waits for
  // it before it evicts anything).
  void ForgetExternalAsync(CUdeviceptr base, CUstream stream) ABSL_LOCKS_EXCLUDED(mu_);

  // An operation of exact extent (a linear copy or memset) reaching
  // [offset, offset + bytes) of allocation `id`: where that allocation is
  // made of pieces, appends the keys of the pieces the range reaches to
  // `*ids` (what Prepare and Finish then take in place of `id`), and of
  // those the ones it covers whole to `*covered` (if given), and returns
  // true; else false, and the caller names `id` itself.
  using Keys = absl::InlinedVector<uint64_t, 16>;
  // Its start and end are kept as bounds of the allocation's tensors.
  bool Narrow(uint64_t id, uint64_t offset, uint64_t bytes, Keys* ids, Keys* covered)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A kernel's pointer words `words` into allocation `id`: where that
  // allocation is made of pieces, appends to `*far` the keys of the pieces
  // that no word likely reaches (from where it points to the next tensor
  // bound seen: TensorBounds), and returns true; else false. The words are
  // kept as bounds. Such pieces are still held and versioned with the
  // operation; when swapped out they are served from host, not fetched
  // (Operation::far).
  bool FarPieces(uint64_t id, absl::Span<const uint64_t> words, Keys* far) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether some allocation is made of pieces now (FarPieces has work).
  bool has_pieces() const { return has_pieces_.load(std::memory_order_relaxed); }

  // --- Exact sizes: a buffer looks like the cuMemAlloc allocation asked for.
  // What the program sees of one VMM-backed buffer, resident or swapped out.
  struct BufferView {
    CUdeviceptr base = 0;
    uint64_t size = 0;      // as the program asked, not the reserved granules
    uint64_t reserved = 0;  // the VA range stensor holds
    int device = 0;
    CUcontext context = nullptr;  // current at cuMemAlloc
    uint64_t id = 0;
    bool freed = false;  // cuMemFree'd, not yet released (garbage)
  };
  // The VMM-backed buffer whose reserved range contains `addr` (the tail
  // past its requested size included), if any.
  std::optional<BufferView> Find(CUdeviceptr addr) const ABSL_LOCKS_EXCLUDED(mu_);
  // A transfer touching [addr, addr + extent): CUDA_ERROR_INVALID_VALUE when
  // it starts in a buffer of this manager and runs past its requested size
  // (or starts past it, or the buffer was freed), as the driver answers for
  // a cuMemAlloc allocation; else CUDA_SUCCESS. An extent of 0 is nothing.
  CUresult CheckRange(uint64_t addr, uint64_t extent) const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `base` is a buffer this manager allocated.
  bool Owns(CUdeviceptr base) const ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemFree of a buffer this manager allocated: released now if no work
  // in flight uses it, else when that work completed (garbage, S404).
  CUresult Free(CUdeviceptr base) ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemFreeAsync: freed in stream order. A use is recorded on `stream`, so
  // the buffer is released (its memory reused) only once the stream passed
  // this point; until then it is garbage (S404). A stream the driver does
  // not take (destroyed, never one, no context current for the NULL stream)
  // is its error, asked first as the driver checks it, and the buffer stays
  // as it was. `forget` runs under the lock just before the buffer counts
  // as freed (the caller forgets its range there, before its address can
  // be handed out again).
  CUresult FreeAsync(
      CUdeviceptr base, CUstream stream, absl::FunctionRef<void()> forget = [] {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Handles that leave stensor's control (cuIpcGetMemHandle,
  // cuMemExportToShareableHandle, cuMemRetainAllocationHandle): the buffer
  // containing `addr` (or whose device memory is `handle`) is made resident,
  // synchronously, and never evicted again, since whoever holds the handle
  // maps that physical memory itself. Logged once per buffer. False when
  // the address is not in a buffer of this manager; else `*result` is the
  // outcome (an error when it could not be brought back).
  bool PinExported(CUdeviceptr addr, const char* api, CUresult* result) ABSL_LOCKS_EXCLUDED(mu_);
  bool PinExportedHandle(CUmemGenericAllocationHandle handle, const char* api)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- The program's own VMM memory (cuMemCreate of device-located
  // memory) counts against the cap while its physical memory exists: from
  // cuMemCreate until the last reference is released (cuMemRelease of the
  // created and of every retained handle) and the last mapping of it is
  // unmapped, since the driver keeps mapped memory alive past cuMemRelease.
  // A cuMemCreate that does not fit first makes room (S403-S405).
  CUresult CreateAppMemory(CUmemGenericAllocationHandle* handle, size_t size,
                           const CUmemAllocationProp* prop, unsigned long long flags)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnAppRetain(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  void OnAppRelease(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  void OnAppMap(CUdeviceptr ptr, uint64_t size, CUmemGenericAllocationHandle handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnAppUnmap(CUdeviceptr ptr, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Before an operation on `stream`: makes every buffer of `ids` resident
  // (swapping in, the stream waiting for the copy) and keeps them from being
  // evicted until Finish. Buffers in `overwritten` will be written whole, so
  // a swapped-out one comes back without copying its old contents. Where
  // the device has host-located VMM, a swapped-out buffer that does not fit
  // under the cap with the others is served from its host copy instead,
  // mapped at its address, for this operation (and any other that serves
  // it meanwhile): the operation reaches it over the link, and what it
  // writes there is the newest version. Out of memory only where no room
  // can be made and nothing can be served.
  // With `note`, the operation is also noted (NoteOperation, below), under
  // the same lock: a launch takes it once for both. Before the cap presses
  // it is journaled instead (Journal, below): nothing is looked at or held. The planner sees it
  // first, so that a swapped-out buffer whose next use after it is
  // predicted later than that of the buffer its room would displace is
  // served rather than brought in (belady with bypass); the planner's
  // evictions and fetches follow once it is prepared.
  struct Operation;
  CUresult Prepare(absl::Span<const uint64_t> ids, absl::Span<const uint64_t> overwritten,
                   CUstream stream, const Operation* note = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // After the operation was submitted (or failed): marks the last use of
  // `ids` on `stream`, bumps the device version of `written`, makes them
  // evictable again. `journal`: its OpTicket's, when Prepare was given one.
  void Finish(absl::Span<const uint64_t> ids, absl::Span<const uint64_t> written, CUstream stream,
              bool submitted, uint64_t journal = 0) ABSL_LOCKS_EXCLUDED(mu_) {
    if (journal != 0 && FinishJournaled(ids, written, stream, submitted, journal)) return;
    FinishFull(ids, written, stream, submitted, /*pinned_by_end=*/journal != 0);
  }

  // An operation whose accesses are unknown (a kernel the driver could not
  // describe, a graph launch) may have written any buffer: every host copy
  // is treated as stale from now on, so none is dropped as clean.
  // Also, until it completed (an event on `stream`, one per stream), no
  // buffer of the current device counts as idle, so none is evicted under
  // it, and with host-located VMM no swapped-out buffer's host copy is
  // unmapped from its address under it. Counts as a write for the
  // never-written tracking of every buffer it could have reached.
  void MarkAllWritten(CUstream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Brackets the submission of such an operation: from BeginUnknown until
  // EndUnknown (called after MarkAllWritten recorded its completion, or after
  // the submission failed), no buffer of the current device counts as idle,
  // so nothing is evicted between the launch and the record of its event.
  // Returns the device for EndUnknown (-1 when none is current).
  // `stream`, which will run it, is also ordered after every swap-in copy
  // still in flight on the device (the operation may read those buffers).
  int BeginUnknown(CUstream stream) ABSL_LOCKS_EXCLUDED(mu_);
  void EndUnknown(int device) ABSL_LOCKS_EXCLUDED(mu_);

  // STENSOR_VERIFY: the kernel `kernel` (a name that outlives the manager)
  // was launched with these inferred accesses; a mismatch names the last
  // kernel that used the buffer and the last one inferred to write it.
  // Nothing is recorded when verification is off.
  bool verifying() const { return verifier_ != nullptr; }
  void NoteKernel(absl::Span<const uint64_t> used, absl::Span<const uint64_t> written,
                  const char* kernel) ABSL_LOCKS_EXCLUDED(mu_);

  // A device-to-host copy of [src, src+bytes) that lies in one swapped-out
  // buffer is served from its host copy: copies and returns true.
  bool ReadFromHostCopy(uint64_t id, uint64_t offset, void* dst, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A host wait for every operation that may have written buffer `id` so
  // far: its last use on each of the program's streams, and the device's
  // work of unknown accesses. A reader of device memory whose writers are
  // not known more precisely waits for these streams, not the context.
  // CUDA_ERROR_NOT_FOUND when the buffer is not this manager's or a small
  // one (not VMM: no uses recorded),
  // CUDA_ERROR_NOT_READY while an operation of unknown accesses is being
  // submitted (its event does not exist yet): the caller waits for the
  // context instead.
  CUresult WaitForWriters(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // Copies [offset, offset+bytes) of buffer `id` to host memory `dst` from
  // wherever its contents are (device memory, kept from eviction meanwhile,
  // or the host copy). CUDA_ERROR_NOT_FOUND when the buffer is not this
  // manager's; the caller has synchronised with the work that wrote it.
  CUresult ReadBack(uint64_t id, uint64_t offset, void* dst, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Primitives for prefetching (the planner decides when).
  // Prefetch: an asynchronous swap-in of buffer `id` on the swap stream,
  // with no consumer yet (the Prepare of its next operation orders that
  // operation after the copy, on the device). Room is made as for any
  // swap-in, queueing evictions behind in-flight work, but the host never
  // blocks: CUDA_ERROR_NOT_READY ("not now") when no room can be made
  // without waiting. CUDA_SUCCESS also when already resident;
  // CUDA_ERROR_NOT_FOUND for an id this manager does not hold.
  CUresult Prefetch(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // EvictAsync: a planned swap-out (or drop, where the host copy is current
  // or the buffer never written) of buffer `id`, idle or busy, queued on the
  // swap stream behind its in-flight uses; never a host wait.
  // CUDA_ERROR_NOT_READY when it cannot go now (pinned by an operation being
  // prepared, work of unknown accesses pending, or its uses not orderable on
  // the device); CUDA_SUCCESS also when already swapped out.
  CUresult EvictAsync(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // --- S02 and planned swaps. After Prepare of an operation (a launch, a
  // copy, a memset) and before it is submitted: feeds it to the iteration
  // planner (policy/iteration_planner.h) under `key` (the operation and its
  // shape, never its buffers: the same from one step to the next), gives every
  // buffer its predicted next use (belady), times the operation while its
  // iteration is profiled, and issues the planned evictions and fetches,
  // none of which waits on the host. `marker`: the operation is
  // STENSOR_ITERATION_MARKER's kernel. Nothing happens when neither
  // prefetch nor belady needs it.
  struct OpTicket {
    int timing = -1;  // Profiler token, -1 when not timed
    uint64_t time = 0;
    // Set by Prepare: false when it held nothing (each buffer a plain
    // allocation, never swapped, or none of this manager's), so that Finish
    // has nothing to do and need not be called.
    bool finish = true;
    // Set by Prepare before the cap presses: the operation was let through
    // without a look at its buffers (OperationJournal), and Finish must be
    // given this token (its thread's slot).
    uint64_t journal = 0;
  };
  void NoteOperation(uint64_t key, absl::Span<const uint64_t> ids,
                     absl::Span<const uint64_t> written, bool marker, CUstream stream,
                     OpTicket* ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // NoteOperation's arguments, for Prepare (its `ids` are Prepare's).
  struct Operation {
    uint64_t key = 0;
    absl::Span<const uint64_t> written;
    bool marker = false;
    OpTicket* ticket = nullptr;
    // Pieces the operation holds but likely does not touch (FarPieces),
    // ascending: served from host when swapped out, never fetched for it.
    absl::Span<const uint64_t> far;
    // Where set, the key is make_key(key_arg), made only when the planner
    // reads it (hashing a launch's shape at every launch costs as much as
    // the rest of a journaled one).
    uint64_t (*make_key)(const void* arg) = nullptr;
    const void* key_arg = nullptr;
    uint64_t Key() const { return make_key != nullptr ? make_key(key_arg) : key; }
  };
  // After the operation was submitted (or failed).
  void EndOperation(const OpTicket& ticket, CUstream stream, bool submitted)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Prepare's way for an operation of known accesses before the cap presses,
  // for a caller that would build the Operation only for it: lets it through
  // without the lock or a look at its buffers (OperationJournal), true with
  // `*ticket` set (a fresh OpTicket otherwise), Finish then given
  // ticket->journal; false where Prepare must be called.
  bool Journal(absl::Span<const uint64_t> ids, OpTicket* ticket) ABSL_LOCKS_EXCLUDED(mu_) {
    *ticket = OpTicket{};
    return journal_open_.load(std::memory_order_relaxed) && PrepareJournaled(ids, ticket);
  }

  // Appends the ids of the swappable buffers of the current device whose
  // address a kernel stensor cannot see into could fault on: without
  // host-located VMM every one (any could be evicted before the kernel
  // runs), with it those swapped out whose host copy is not mapped at their
  // address (after a failed mapping). For an operation that may touch any.
  template <typename Ids>
  void AppendUnreadable(Ids* ids) ABSL_LOCKS_EXCLUDED(mu_) {
    CUdevice ordinal = 0;
    if (driver_->cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return;
    MutexLock lock(&mu_);
    const bool all = !HostVmm(ordinal);
    // Buffers swapped out behind in-flight work get their host copy mapped
    // once their copy is done: wait for that rather than list them all.
    if (!all) SettleOldMappings(ordinal);
    uint64_t last = 0;  // a group's pieces are neighbours: its id once
    for (const auto& [base, b] : by_base_) {
      if (IsSwappable(*b, ordinal) && (all || !Readable(*b)) && BufferId(*b) != last) {
        last = BufferId(*b);
        ids->push_back(last);
      }
    }
  }

  // --- A context that ends (cuCtxDestroy, a primary context's reset or
  // last release) takes its streams and events with it, and any later use
  // of their handles is undefined ("the context or its resources are not
  // accessed or passed in subsequent API calls"). BeforeContextEnds, before
  // the program's call: stensor's own streams in `ctx` are taken out of
  // service (later swaps make new ones in a live context of the device when
  // first needed: the current one there, else its primary one) and, where
  // stensor has work there, the context's work is waited for, swap copies
  // included. AfterContextEnds: when `ended`, every use recorded by an event
  // of `ctx` is complete (waited for, and nothing of a context runs after
  // its end) and those handles are forgotten; else the streams taken out of
  // service are destroyed, and the context's events stay.
  void BeforeContextEnds(CUcontext ctx) ABSL_LOCKS_EXCLUDED(mu_);
  void AfterContextEnds(CUcontext ctx, bool ended) ABSL_LOCKS_EXCLUDED(mu_);

  // cuMemGetInfo / cuDeviceTotalMem under the cap.
  void MemInfo(int device, size_t* free_bytes, size_t* total_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // What MemInfo reports, as the cap and the bytes in use under it (so
  // free is cap - used, or 0 past the cap), without handing the pool's
  // idle chunks back to the driver: for observers that may poll (NVML),
  // whose asking must not cost the pool.
  struct Usage {
    uint64_t cap = 0;
    uint64_t used = 0;
  };
  Usage DeviceUsage(int device) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t CapFor(int device, size_t device_total) const;
  // The entry points swapping needs (core/swap/swap_entry_points.inc) that
  // `driver` lacks, comma-separated; empty when it has them all.
  static std::string MissingEntryPoints(const Driver& driver);

  SwapStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The statistics block STENSOR_STATS=1 prints at exit.
  std::string StatsText() const ABSL_LOCKS_EXCLUDED(mu_);
  // The same numbers as fields of the JSON object `out`, for a program to
  // log as it runs (stensor_stats_json): the counters under SwapStats'
  // names, bytes as bytes and times in seconds, and the policy's name.
  void AppendStatsJson(JsonLine* out) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Buffer;
  struct Device;
  struct PieceGroup;
  using Use = StreamUse;

  MemoryManager(const Config& config, const Driver* driver, LogSink log,
                std::unique_ptr<EvictionPolicy> policy);

  // --- State and bookkeeping (memory_manager.cc).
  Device& DeviceState(int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // inline: hot
  Device& AddDeviceState(int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Charge(Device& dev, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The buffer `id` names (inline: the index; ByIdSlow the rest), or null.
  Buffer* ById(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Buffer* ByIdSlow(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The only ways a buffer enters buffers_ and leaves it (destroyed).
  void PutBuffer(uint64_t key, std::unique_ptr<Buffer> b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseBuffer(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The index that holds `key` (below kUntrackedKeys), and its place there.
  DenseIdMap<Buffer>& IndexOf(uint64_t key, uint64_t* at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The manager's buffers behind the program's ids, as the decisions take
  // them: every piece of a group in place of the group's id (in `*out`,
  // inline, so a launch allocates nothing), and a small allocation's slab
  // in place of its id, once; `ids` itself when no group or slab exists.
  // Of `overwritten` ones, a slab's allocations are dropped: overwriting
  // one overwrites none of its neighbours.
  absl::Span<const uint64_t> Expanded(absl::Span<const uint64_t> ids, Keys* out,
                                      bool overwritten = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (groups_ == 0 && slab_blocks_.empty()) return ids;  // inline: every operation asks
    return ExpandedSlow(ids, out, overwritten);
  }
  absl::Span<const uint64_t> ExpandedSlow(absl::Span<const uint64_t> ids, Keys* out,
                                          bool overwritten) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocation `b` is part of: its group's first piece, or itself.
  static Buffer& Whole(Buffer& b);
  // What the iteration planner calls `b`: a group's pieces are planned as
  // one allocation, under its id (fetched and evicted together, each piece
  // given the allocation's next use); anything else by its own id.
  static uint64_t PlannerId(const Buffer& b);
  static bool GroupResident(const PieceGroup& group);
  // The buffers the planner's `id` names, `b` being ById(id).
  static std::vector<Buffer*> PlannedAs(Buffer& b, uint64_t id);
  // A planned eviction of `b` (resident), counted.
  void EvictPlanned(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ApplyPlan's steps (policy/apply_plan.h, shared with `stensor sim`).
  class PlanCarrier;
  // Maps each piece of `head`'s range (reserved, at head.base): on the
  // device where room can be made, else born on the host. On failure every
  // piece made is released and the head left as it was.
  CUresult MakePieces(Device& dev, Buffer& head, std::vector<std::unique_ptr<Buffer>>* pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls f for each buffer [offset, offset + bytes) of `b`'s allocation
  // reaches (b itself, or pieces of its group), with the part inside it and
  // where that part starts in the range.
  static void ForEachPart(
      Buffer& b, uint64_t offset, uint64_t bytes,
      absl::FunctionRef<void(Buffer& piece, uint64_t offset, uint64_t bytes, uint64_t at)> f);
  // Swapped out with a host copy that holds its data now (no swap-out copy
  // into it in flight): a host read is served from there.
  bool HostCopyCurrent(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReadBack of one buffer (a whole one, or a piece).
  CUresult ReadBackLocked(Buffer& b, uint64_t offset, void* dst, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The VMM buffer (or piece) whose reserved range contains addr, or null.
  Buffer* Containing(uint64_t addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks every piece of the allocation `b` freed (garbage), and releases
  // those whose work is done; with `stream`, freed in its order
  // (cuMemFreeAsync).
  void FreeAllocation(Device& dev, Buffer& b, const CUstream* stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocation at `base` (a group's first piece), or null.
  Buffer* Allocation(CUdeviceptr base) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The buffers `b`'s allocation is made of: its group's pieces not yet
  // released, or `b` alone.
  static std::vector<Buffer*> PiecesOf(Buffer& b);
  // What the program sees of the allocation `b` is (part of).
  static BufferView ViewOf(const Buffer& b);
  // `b` in a log record: the allocation's id and, for a piece, its offset
  // in the allocation ("piece").
  static JsonLine& Named(JsonLine& line, const Buffer& b);
  static bool IsSwappable(const Buffer& b, int device);
  bool HostVmm(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resident, or swapped out with its host copy mapped at its address.
  static bool Readable(const Buffer& b);
  static uint64_t BufferId(const Buffer& b);
  // Counts a failed driver call of the swap path.
  CUresult Failed(CUresult r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(std::string line) const;
  // Whether anything takes log lines: each is built only then (swap
  // records are made at every swap).
  bool logging() const { return static_cast<bool>(log_); }

  // The eviction order (Device::order, policy/eviction_order.h): Reindex
  // tells it, and the planner, after any change to `b`'s fields (re-keyed
  // when an eviction next reads the order); Unindex takes `b` out before it
  // is destroyed.
  void Reindex(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // inline: every use passes here
  // Reindex's news for the planner: a change of residency.
  void TellPlannerResidency(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unindex(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-keys the buffer when the scope ends, however it ends.
  class ReindexAtExit;
  // mu_ held for a section of the manager's: the journal applied on taking
  // it, journal_open_ brought up to date on letting it go.
  class ManagerLock;

  // --- The decisions (memory_manager.cc).
  // Whether a call may wait on the host (without the lock) for work in
  // flight. Prefetch and EvictAsync may not: where they would have to, they
  // answer CUDA_ERROR_NOT_READY (the work is put off, never the program).
  enum class HostWait { kAllowed, kNever };
  // S401-S405: frees device memory until `need` more bytes fit under the
  // cap on `dev`. Buffers with pins > 0 are never chosen; while other
  // threads' operations hold some, a caller holding none waits (up to 2 s
  // in all) for them to finish before giving up. When no room can be made,
  // CUDA_ERROR_OUT_OF_MEMORY, or the driver error that kept the last
  // candidate from being evicted.
  // With `pool_counts`, pooled chunks are room too (the caller takes them;
  // they are charged already), and none is released to make room. With
  // HostWait::kNever, CUDA_ERROR_NOT_READY where room needs a host wait
  // (and never by taking a buffer fetched ahead of its use).
  CUresult MakeRoom(Device& dev, uint64_t need, HostWait host_wait, bool pool_counts = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its steps on one device, which MakeRoomLoop (policy/make_room.h, shared
  // with `stensor sim`) takes in order.
  class Room;
  // Whether operations of other threads hold pins: more pins held in all
  // (pinned_) than this thread's operations hold. O(1), so every Prepare
  // may ask.
  bool OthersPin() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every change of a buffer's `pins` goes through these, which keep
  // pinned_, their sum over all buffers, current.
  void Pin(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int pinned_ ABSL_GUARDED_BY(mu_) = 0;
  // Prepare in the steady state: when every buffer of `found` (ids' buffers,
  // null for none) is resident, holds its data and waits for no copy of
  // stensor's own, and no freed buffer or old mapping awaits release, pins
  // them and returns true, as PrepareOnce would have done; else does
  // nothing and returns false. Plain allocations (never swapped) are not
  // pinned, by it or by PrepareOnce: nothing evicts them.
  bool PinIfReady(absl::Span<Buffer* const> found) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prepare's one attempt; on failure nothing of it stays pinned. With
  // `may_serve`, a buffer that cannot be brought in is served from host.
  // `next_after`: each of `ids`' next use after this operation (empty when
  // not predicted), for ChooseReach (policy/reach.h). `far`: Operation::far.
  // The buffer an operation found no room for: its device and bytes.
  struct Refusal {
    int device = -1;
    uint64_t bytes = 0;
  };
  // On CUDA_ERROR_OUT_OF_MEMORY, `*refused` says for which buffer.
  // `found`: ids' buffers, looked up since the lock was last let go (null
  // for none or a freed one).
  CUresult PrepareOnce(absl::Span<const uint64_t> ids, absl::Span<Buffer* const> found,
                       absl::Span<const uint64_t> overwritten, CUstream stream, bool may_serve,
                       absl::Span<const uint64_t> next_after, absl::Span<const uint64_t> far,
                       Refusal* refused) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocate under the lock, on `dev`; its refusal is logged by the caller.
  // A small allocation of `bytes` made outside a slab counts toward the
  // device's SlabOnset (STENSOR_SLABS=auto, not packing yet).
  bool CountsForSlabs(const Device& dev, uint64_t bytes) const;
  // Small allocations in slabs (SlabPool): whether `bytes` goes to one; the
  // allocation placed (a new slab made when none has room); a block freed,
  // its space reused once the work queued before the free is done (false:
  // no block starts at `base`); freed blocks whose work completed given
  // back (`all`: each asked, not only the oldest); empty slabs beyond
  // `keep` freed (false: none was; one is kept for the next small
  // allocation until room is needed); what the program sees at an address (a block, or free space
  // as no allocation), and a block's offset into its slab.
  bool SlabSized(const Device& dev, uint64_t bytes) const;
  CUresult AllocateInSlab(Device& dev, CUcontext context, uint64_t bytes, CUdeviceptr* dptr,
                          RegisterId register_id, const CUstream* stream_order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUresult NewSlab(Device& dev, CUcontext context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FreeBlock(CUdeviceptr base, const CUstream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BlockStartsAt(CUdeviceptr base) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReclaimBlocks(Device& dev, bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReleaseEmptySlabs(Device& dev, size_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<BufferView> ViewAt(CUdeviceptr addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IntoSlab(uint64_t id, uint64_t* offset, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A swap's copies of `b` between its device memory and its host copy
  // (`out`: to the host) on `stream`: the whole buffer, or a slab's live
  // blocks; `*copied` counts the bytes.
  CUresult CopyParts(const Buffer& b, CUstream stream, bool out, uint64_t* copied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a new buffer's mapping that found no room on the device becomes:
  // born on the host where host memory can stand in (`mapped` otherwise).
  CUresult OrBornOnHost(Device& dev, Buffer& b, CUresult mapped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reserved range whose mapping failed given back (or left to the stuck
  // mapping that holds it).
  void UndoReservation(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUresult AllocateLocked(Device& dev, CUcontext context, uint64_t bytes, CUdeviceptr* dptr,
                          RegisterId register_id, const CUstream* stream_order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Freed `b`, idle: kept mapped for the next allocation of its size
  // (Device::kept) where it can be, else released. True when it is one or
  // the other.
  bool ReleaseOrKeep(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Keep(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new buffer of a kept one's size takes its address and device memory
  // (zeroed first, as fresh memory is); false when none is kept.
  bool TakeKept(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `b` takes freed `g`'s address, device memory and uses (zeroed first, as
  // fresh memory is), and `g` is destroyed; false, nothing changed, when
  // the zeroing could not be queued.
  bool Adopt(Device& dev, Buffer& b, Buffer& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `b` out of Device::kept, if it is there.
  void Unkeep(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases one kept buffer (its chunks to the pool); true when one went.
  bool ReleaseOneKept(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether swapped-out `b` can be served from its host copy: host-located
  // VMM, and the copy mapped at its address.
  bool Servable(const Buffer& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an allocation of `bytes`, too small to map on its own, finding
  // no room is served from host memory (made a buffer of one granule, born
  // on the host) rather than refused.
  static bool ServesSmallFromHost(const Device& dev, uint64_t bytes);
  // `by_choice`: room could have been made (ChooseReach).
  void Serve(Device& dev, Buffer& b, bool by_choice = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Serve's statistics and log record, for a serving claimed already.
  void CountServed(Device& dev, Buffer& b, bool by_choice = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new VMM buffer with no room on the device (host-located VMM only):
  // swapped out from birth, a zeroed host copy mapped at its address.
  CUresult AllocateOnHost(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its `alloc_host` record (a piece's names the allocation and the piece).
  void LogBornOnHost(const Device& dev, const Buffer& b) const;
  // Waits (releasing the lock) until a pin is dropped, a few milliseconds
  // at most; false once `*waited` reached the bound.
  bool WaitForUnpin(absl::Duration* waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The steps of MakeRoom. Each returns true when it made progress (or
  // waited without the lock, so the caller must look again); a candidate
  // that could not be evicted is skipped for the rest of the round and its
  // error stored in `*error` (when not null). Buffers fetched ahead of
  // their use are taken only with `spend_prefetched` (MakeRoom's last
  // resort).
  bool DropOneClean(Device& dev, HostWait host_wait, CUresult* error = nullptr,
                    bool spend_prefetched = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `wait`: a host wait for the oldest freed buffer of a queue (it fails
  // with CUDA_ERROR_NOT_READY under HostWait::kNever).
  bool ReleaseGarbage(Device& dev, bool wait, HostWait host_wait, CUresult* error = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EvictByPolicy(Device& dev, uint64_t needed, HostWait host_wait, CUresult* error = nullptr,
                     bool spend_prefetched = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the freed buffers whose last uses were seen complete, oldest
  // first in each of the device's queues (Device::garbage), up to the first
  // not done: event queries, never a host wait. True when device memory
  // came free (released, or pooled by a release that then failed).
  void CollectGarbage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CollectGarbage(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A freed buffer still in use: its chunks go to the pool at once, mapped
  // at its address until the swap stream, made to wait for its last uses,
  // is seen past them (as for a queued swap-out); it leaves its queue of
  // pending frees. False, changing nothing the caller relies on, when its
  // uses cannot be ordered on the device.
  bool QueueGarbage(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // QueueGarbage of the oldest pending free of `dev` that can go (its
  // memory then pooled, shadowed). False when none can.
  bool HandOnGarbage(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new VMM buffer `b` (its size and reservation set, nothing mapped)
  // takes over the address, device memory and uses of the oldest pending
  // free of the same reservation in one of `dev`'s queues: no reservation,
  // map or unmap, and no new chunk. Its zeroing on the swap stream runs
  // after the old owner's work still queued (the swap stream waits for it),
  // and its first users wait for the zeroing (OrderAfterSwap). False,
  // `b` unchanged, when no pending free can serve.
  bool TakeOverGarbage(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pending frees (Device::garbage): a freed buffer not released joins the
  // queue of the stream its unfinished work is on, and leaves it when
  // released, handed on or taken over. RecountGarbage updates its device
  // memory counted in Device::garbage_bytes.
  void EnqueueGarbage(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DequeueGarbage(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecountGarbage(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refusal the program sees (CUDA_ERROR_OUT_OF_MEMORY returned to it):
  // counted and logged by the public call that returns it, once. Never
  // below, where a lack of room may still end served from host, waited
  // for and retried, or a prefetch put off.
  void LogOom(Device& dev, uint64_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a busy buffer of `dev` may be evicted in stream order now.
  bool CanQueue(Device& dev) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queued behind the buffer's in-flight uses on the swap stream (no host
  // wait) where nothing of unknown accesses is pending and STENSOR_VERIFY
  // is off; else the buffer must be idle. CUDA_ERROR_NOT_READY when its work
  // could not be ordered on the device: the caller waits on the host.
  CUresult SwapOut(Device& dev, Buffer& b, bool copy, HostWait host_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUresult SwapIn(Device& dev, Buffer& b, bool copy, CUstream consumer, HostWait host_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The access log's record of a swap-in (`copy`: its contents copied in).
  void LogSwapIn(const Device& dev, const Buffer& b, bool copy, uint64_t bytes) const;
  // The buffer is resident but its device memory does not hold its data
  // (an overwrite that was not submitted, a failed swap-in copy that could
  // not be undone): copies the host copy in, or swaps the buffer out again.
  CUresult RestoreFromHost(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether anything reads what the planner learns: prefetch and belady.
  bool Plans() const { return config_.prefetch || config_.policy == EvictionPolicyKind::kBelady; }
  // NoteOperation under the lock, once a planner is wanted: PredictLocked
  // then ApplyNotedLocked.
  void NoteOperationLocked(uint64_t key, absl::Span<const uint64_t> ids,
                           absl::Span<const uint64_t> written, bool marker, CUstream stream,
                           OpTicket* ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its two halves. PredictLocked feeds the operation to the planner and
  // gives its buffers (and those the planner repredicted) their next uses;
  // `next_after`, when not empty, receives each of `ids`' next use after
  // this operation (kNoNextUse where none is known), which a launch's
  // Prepare reads to choose between fetching and serving. False when the
  // manager holds none of the buffers or no planner is wanted.
  // ApplyNotedLocked, once the operation is prepared: times it while its
  // iteration is profiled and issues the planner's evictions and fetches.
  struct Noted {
    IterationPlanner* planner = nullptr;
    int device = 0;
    uint64_t time = 0;
    bool profiling = false;
  };
  // `found`, when not empty: ids' buffers, as PrepareOnce's.
  bool PredictLocked(uint64_t key, absl::Span<const uint64_t> ids,
                     absl::Span<const uint64_t> written, bool marker, Noted* noted,
                     absl::Span<uint64_t> next_after, absl::Span<Buffer* const> found = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyNotedLocked(const Noted& noted, CUstream stream, OpTicket* ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What is free under the cap on `dev` for a swap-in: pooled chunks, freed
  // buffers' and kept ones' count as free (MakeRoom takes them first).
  static uint64_t FreeUnderCap(const Device& dev);
  // What `dev` holds that making room could not take back without evicting:
  // charged bytes less pooled, freed and kept chunks.
  static uint64_t Held(const Device& dev);
  // Prefetch and EvictAsync, locked.
  CUresult PrefetchLocked(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUresult EvictAsyncLocked(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The planner, made at the first operation it is wanted for (bandwidth
  // probed then, in memory free under the cap); null when nothing needs one.
  IterationPlanner* Planner(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the cap presses: from the first operation at which
  // IterationPlanner::Wanted holds on any device, for good. From there the
  // planner is fed (where prefetch or belady reads it) and every
  // operation's uses are recorded at once (MarkOperation); before, nothing
  // is evicted, and the uses of several operations share a record.
  bool Pressed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pressed_ || PressureBegins(); }
  // The operation journal (OperationJournal). PrepareJournaled: Prepare
  // lets the operation through on the journal without the lock (`ticket`
  // says so), or false for the full path. JournalFinish records a
  // journaled operation's submission.
  // ApplyJournal brings every buffer up to date with the records: called
  // with the lock taken anywhere but a journaled Prepare and Finish.
  // EndJournaling, before the first eviction (or when the cap presses, or a
  // second device appears): applies the records and pins the buffers of the
  // operations in flight, as their Prepare would have; their Finish is then
  // the full one. For good.
  bool PrepareJournaled(absl::Span<const uint64_t> named, OpTicket* ticket)
      ABSL_LOCKS_EXCLUDED(mu_) {  // inline: every launch before the cap presses
    if (named.size() > OperationJournal::kMaxIds) return false;
    OperationJournal::Slot& slot = OperationJournal::ThisThread();
    if (slot.owner.load(std::memory_order_relaxed) != nullptr) return false;  // one at a time
    slot.count = named.size();
    std::copy(named.begin(), named.end(), slot.ids);
    // Published, then the journaling asked again: EndJournaling stores its
    // flag, then reads the slots (OperationJournal::Slot).
    slot.owner.store(this, std::memory_order_seq_cst);
    if (journal_open_.load(std::memory_order_seq_cst)) {
      ticket->journal = reinterpret_cast<uintptr_t>(&slot);  // Finish's, with no look-up
      return true;
    }
    Withdraw(slot);
    return false;
  }
  // Closed meanwhile: the slot withdrawn, letting go of the pins
  // EndJournaling may have taken for it; the full path follows.
  void Withdraw(OperationJournal::Slot& slot) ABSL_LOCKS_EXCLUDED(mu_);
  // The buffers EndJournaling pins for an operation in flight (its
  // non-garbage VMM ones), for the pin and for Withdraw's unpin.
  void ForEachPinnedAtEnd(const OperationJournal::Slot& slot, absl::FunctionRef<void(Buffer&)> f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // journal_open_ from the fields it sums up: at the end of every locked
  // section while journaling (ManagerLock).
  void UpdateJournalOpen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finish's two ways: a journaled operation's (false where the journaling
  // ended since its Prepare, its buffers pinned for it), and the full one
  // (`pinned_by_end`: those pins were taken by EndJournaling).
  bool FinishJournaled(absl::Span<const uint64_t> named, absl::Span<const uint64_t> named_written,
                       CUstream stream, bool submitted, uint64_t journal) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishFull(absl::Span<const uint64_t> named, absl::Span<const uint64_t> named_written,
                  CUstream stream, bool submitted, bool pinned_by_end) ABSL_LOCKS_EXCLUDED(mu_);
  void JournalFinish(absl::Span<const uint64_t> named, absl::Span<const uint64_t> named_written,
                     CUstream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyJournal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer's entry for a journaled operation's stream, as it was noted.
  static void NoteJournaledUse(Use& u, const OperationJournal::Use& j);
  void EndJournaling() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer is made on `dev`: the journal's device, or the end of journaling.
  void JournalOn(const Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every device's own streams are idle (own_work_ done).
  bool OwnWorkDone() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PressureBegins() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // STENSOR_VERIFY: whether a clean drop of `b` may go ahead (its device
  // contents equal the host copy); false means copy it instead.
  bool VerifiedClean(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Uses and what has been observed of them, stensor's streams
  // (memory_manager_uses.cc).
  // Records a use now on `stream` (of `device`'s buffer or work) in its
  // entry of `uses` (added if none), its event made once in that stream's
  // context. A failed create or record leaves it unrecorded. The entry.
  Use* NoteUse(std::vector<Use>& uses, CUstream stream, int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same with the stream's key (UseKey) known: an operation's buffers
  // share it, and finding it may ask the driver for the current context.
  Use* NoteUse(std::vector<Use>& uses, CUstream stream, int device,
               std::pair<CUstream, uint64_t> key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of `uses` for the stream keyed `key` (UseKey), added if none
  // (AddEntry, out of line).
  static Use& EntryFor(std::vector<Use>& uses, std::pair<CUstream, uint64_t> key);
  static Use& AddEntry(std::vector<Use>& uses, std::pair<CUstream, uint64_t> key);
  // An event (timing off) made in `stream`'s context, which `*home` says;
  // the driver's error, counted, when the context or the event cannot be had.
  CUresult CreateStreamEvent(Device& dev, CUstream stream, CUevent* event, CUcontext* home)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The key and thread a use on `stream` is kept under (Use::stream,
  // Use::thread): the handle, or for the handles that name a stream of the
  // current context, that context's (and the calling thread's) own.
  std::pair<CUstream, uint64_t> UseKey(CUstream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the buffer's last use on `stream` (one event per stream);
  // `key` is UseKey(stream).
  void RecordUse(Buffer& b, CUstream stream, std::pair<CUstream, uint64_t> key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct MarkRing;
  // The ring of `key`, null if none; EraseRing takes one out.
  MarkRing* FindRing(std::pair<CUstream, uint64_t> key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseRing(std::pair<CUstream, uint64_t> key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An operation's buffers share one record on its stream (a StreamMark):
  // TakeMark finds that stream's mark whose last record was seen complete,
  // or makes one (in the stream's context), or with kMaxMarksPerStream
  // there takes the oldest; null when none can be had (the driver failed,
  // or kMaxMarkStreams streams have marks already): then each buffer
  // records its own event (RecordUse). NoteMarkedUse points a buffer's
  // entry for that stream at the mark's record just made (`recorded`:
  // whether the driver took it).
  StreamMark* TakeMark(std::pair<CUstream, uint64_t> key, CUstream stream, int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How an operation's uses are marked: by a record just made, by none (the
  // driver failed: only a host wait tells), or ahead of the record that
  // will cover them (the mark's next on the same stream).
  enum class Marked { kRecorded, kUnrecorded, kAhead };
  // The mark an operation on `stream` (key UseKey(stream)) notes its uses
  // with, recorded now; or, with `defer` and a stream of the current
  // context's own (NULL, legacy, per-thread), for up to kDeferredRecords - 1
  // operations after a record, the same mark not recorded again until the
  // next that is (each costs a driver call, as much as the launch itself).
  // Deferring delays only when those uses are seen done (their frees'
  // releases), never makes one seen early; the manager defers while no
  // planner is wanted, when nothing is evicted. Null as TakeMark.
  StreamMark* MarkOperation(std::pair<CUstream, uint64_t> key, CUstream stream, int device,
                            bool defer, Marked* marked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Before anything asks whether a buffer is idle outside a launch's fast
  // path (a free, a look for garbage, room to make, the cap pressing): the
  // uses noted ahead on every stream this thread can name are seen done
  // where the stream is idle (a query, no record: one on the NULL stream
  // would order the program's other streams after it); a busy stream's
  // wait for its next record.
  void SettleAhead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteMarkedUse(std::vector<Use>& uses, std::pair<CUstream, uint64_t> key, int device,
                     StreamMark& mark, Marked marked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Observed(Use& use) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host wait for `use` (no lock needed); `own_stream`, when it is the use's stream (one of
  // stensor's), is synchronised if the use's event cannot tell.
  CUresult WaitForUse(const Use& use, CUstream own_stream) const;
  bool UnknownIdle(Device& dev) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Idle(Buffer& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Some use of `b` itself not yet observed complete (work of unknown
  // accesses aside, which Idle also counts).
  bool InUse(Buffer& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the buffer's in-flight uses (with `own_uses`; always for the
  // device's work of unknown accesses), releasing the mutex meanwhile:
  // anything may have changed when it returns. An error when some use could
  // not be observed complete; CUDA_ERROR_NOT_READY under HostWait::kNever.
  CUresult WaitIdle(Buffer& b, HostWait host_wait, bool own_uses = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `consumer` wait for the swap stream's copies into `b`: on the
  // device, or on the host where the device-side wait failed.
  CUresult OrderAfterSwap(Device& dev, Buffer& b, CUstream consumer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the swap stream wait (on the device) for the buffer's uses on
  // other streams not yet observed complete. False when one cannot be.
  bool OrderSwapAfterUses(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies of b's uses on stensor's streams not yet seen complete (copies:
  // a wait without the lock must not walk b.uses, which others may grow).
  std::vector<Use> PendingOwnUses(const Device& dev, Buffer& b) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host wait for the buffer's last use on the swap stream, without the
  // lock (the buffer pinned meanwhile); CUDA_ERROR_NOT_READY under
  // HostWait::kNever when there is one to wait for.
  CUresult WaitSwapUse(Device& dev, Buffer& b, HostWait host_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host wait for `uses` (copies) of `b`, in order until one fails,
  // without the lock: the pin keeps `b` and its events alive meanwhile.
  // `on_their_streams`: uses on stensor's own streams, waited for with
  // their stream (WaitForStreamUse's `swap_stream`) where an event cannot
  // tell; else with the context.
  CUresult WaitUnlocked(Buffer& b, const std::vector<Use>& uses, bool on_their_streams)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host wait for the swap stream's latest work, without the lock (it may
  // wait for the program's work since swap-outs wait on its events).
  CUresult WaitSwapStream(Device& dev, double* waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUresult EnsureSwapStream(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every use the manager keeps: buffers', unknown work's, the swap marks,
  // pending external frees'.
  void ForEachUse(absl::FunctionRef<void(Use&)> f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One of stensor's streams for `dev`, made in the device's context (chosen
  // anew when the last one ended) with the program's context current again
  // after, failures included.
  CUresult CreateOwnStream(Device& dev, CUstream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream a swap-in's copy into b goes on: the fetch stream when
  // nothing queued on the swap stream touches its host copy and the work
  // still reading `chunks` at old owners' addresses can be waited for
  // there, else the swap stream, in FIFO order after that work.
  CUstream FetchStreamFor(Device& dev, Buffer& b, absl::Span<const PhysicalChunk> chunks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `stream` wait on the device for every use not seen complete of
  // the buffers whose addresses still map `chunks`; false when one has no
  // recorded event or the wait cannot be queued.
  bool OrderAfterOldOwners(Device& dev, absl::Span<const PhysicalChunk> chunks, CUstream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Device memory: physical memory, the chunk pool, mappings at a buffer's
  // address (memory_manager_physical.cc).
  // Physical memory. CreatePhysical charges it (evicting when the device
  // itself is full); ReleasePhysical uncharges it once the driver released
  // it, and keeps it (charged) for a retry when it did not.
  CUresult CreatePhysical(Device& dev, uint64_t bytes, HostWait host_wait,
                          CUmemGenericAllocationHandle* handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before stensor takes device memory the cap counts (CreatePhysical, a
  // small cuMemAlloc): the driver's default stream-ordered pool releases
  // what it keeps reserved but unused (cuMemPoolTrimTo(pool, 0)), memory
  // the cap no longer charges once its frees ran (ForgetExternalAsync).
  void TrimDriverPool(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePhysical(Device& dev, CUmemGenericAllocationHandle handle, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryReleases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The physical pool (per device): chunks of whole granules, each as large
  // as the buffer that made it, a buffer mapped from one chunk of its size
  // or from several that add up to it (PhysicalPool says which). Pooled
  // chunks stay charged; a chunk may still be mapped at the address of a
  // buffer whose swap-out copy is in flight ("shadowed"), so whoever takes
  // it must order its work after that copy on the swap stream.
  // TakePooled appends chunks of up to `need` bytes and returns their
  // bytes; `*shadowed` is set when one of them is shadowed. PoolFits is
  // what it would take.
  uint64_t TakePooled(Device& dev, uint64_t need, std::vector<PhysicalChunk>* chunks,
                      bool* shadowed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t PoolFits(const Device& dev, uint64_t need) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pools every chunk of `*chunks` and empties it.
  void PoolChunks(Device& dev, std::vector<PhysicalChunk>* chunks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `bytes` of device memory for one buffer: pooled chunks first (with
  // `reuse`), room made for the rest, then created as one chunk.
  // `*pooled`: some came from the pool (they hold old contents). On failure
  // nothing is held.
  CUresult AcquireChunks(Device& dev, uint64_t bytes, bool reuse, HostWait host_wait,
                         std::vector<PhysicalChunk>* chunks, bool* pooled, bool* shadowed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer swapped out asynchronously takes its old chunks back from the
  // pool (none was handed on). False, changing nothing, when one was.
  bool TakeBack(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases one pooled chunk no address maps any more and returns its
  // bytes; 0 when none. ReleaseOneUnfit releases one that a need of
  // `need` bytes could not use (larger than it, or left over).
  uint64_t ReleaseOnePooled(Device& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases a chunk taken out of the pool (none: 0) and returns its bytes.
  uint64_t ReleasePooled(Device& dev, std::optional<PhysicalChunk> taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t ReleaseOneUnfit(Device& dev, uint64_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DeviceUsage's answer, once collected garbage and settled frees are
  // counted; chunks in the pool count as free.
  Usage SettledUsage(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseAllPooled() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Zeroes a reused chunk just mapped at `b.base` (fresh memory holds zeros)
  // on the swap stream, as a use of `b` there.
  CUresult ZeroReused(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Physical memory for a buffer at its VA (S401/S402 with retries through
  // the eviction loop when the device itself is full).
  CUresult MapDevice(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device memory off a buffer's address, the host copy mapped there instead
  // where that is supported. On failure the buffer stays resident.
  CUresult UnmapDevice(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the buffer's device memory to the pool while it is still mapped
  // at its address (until its use on the swap stream is observed).
  void DetachShadowed(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndShadow(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs that swapped-out `b`'s address could not be given its host copy
  // (it faults until swapped in).
  void LogHostUnmapped(const Buffer& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Old mappings of buffers swapped out asynchronously: unmapped (the host
  // copy mapped there instead, with host-located VMM) once their swap-out
  // copy is observed complete. With `wait`, waits for the swap stream first
  // (without the lock). True when any was ended.
  bool ReapOldMappings(Device& dev, bool wait, double* waited = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EndOldMapping(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before work of unknown accesses on `device`: ends every old mapping
  // there, waiting for the swap stream (a wait counted for unknown work).
  void SettleOldMappings(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps and releases everything of a freed buffer and forgets it. False
  // when a driver call failed: the buffer stays (garbage) for a retry, with
  // the steps already done recorded.
  bool ReleaseBuffer(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Host copies (memory_manager_host.cc).
  // A host copy for `b`, a kept one (host_store_) where there is one; unless
  // `will_copy` (the buffer's contents go there next), it holds zeros, as
  // fresh memory does.
  CUresult EnsureHostCopy(Buffer& b, bool will_copy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUresult MapHostAtBase(Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReleaseHostCopy(Device& dev, Buffer& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Memory counted but not swapped (memory_manager_external.cc).
  // Drops the charges of device `device`'s stream-ordered external frees
  // observed complete; with `wait`, first waits (the lock released) for the
  // oldest one pending. True when a charge was dropped or a wait made.
  bool SettleExternalFrees(int device, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The charges of device `device`'s stream-ordered external frees pending.
  uint64_t QueuedExternalBytes(int device) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `b` resident and never evicted again (PinExported).
  CUresult PinLocked(Buffer& b, const char* api) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PinLocked of every piece of the allocation `b` is (part of).
  CUresult PinAllocation(Buffer& b, const char* api) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a charge external_ no longer holds (and its SlabOnset count).
  void Uncharge(ExternalCharges::Charge charge) ABSL_LOCKS_EXCLUDED(mu_);

  const Config config_;
  const Driver* const driver_;
  const LogSink log_;
  const std::unique_ptr<EvictionPolicy> policy_;
  const bool version_policy_;
  // Null unless STENSOR_VERIFY is on. Called under mu_.
  const std::unique_ptr<Verifier> verifier_;
  // Compute times of profiled operations (thread-safe on its own).
  Profiler profiler_;

  mutable Mutex mu_;
  // The buffers, keyed by the registry's id from allocation on (untracked
  // ones by keys from kUntrackedKeys up, which no registry id reaches), and
  // the same buffers by base address, for lookups of an address.
  static constexpr uint64_t kUntrackedKeys = uint64_t{1} << 63;
  // Keys of a group's pieces, below kUntrackedKeys (so ById finds them)
  // and above any registry id.
  static constexpr uint64_t kPieceKeys = uint64_t{1} << 62;
  uint64_t pieces_made_ ABSL_GUARDED_BY(mu_) = 0;
  size_t groups_ ABSL_GUARDED_BY(mu_) = 0;  // with a piece not yet released
  std::atomic<bool> has_pieces_{false};     // groups_ > 0, read without the lock
  // Those groups by the registry's id of their allocation.
  absl::flat_hash_map<uint64_t, PieceGroup*> group_ids_ ABSL_GUARDED_BY(mu_);
  // Allocations placed in slabs (STENSOR_SLABS), by the registry's id: the
  // slab that holds each (a Buffer keyed from kPieceKeys up), and where.
  struct SlabBlock {
    Buffer* slab;
    CUdeviceptr base;
    uint64_t size;
  };
  absl::flat_hash_map<uint64_t, SlabBlock> slab_blocks_ ABSL_GUARDED_BY(mu_);
  // Where in the slabs each small allocation goes (its own lock, taken
  // inside mu_), and what each freed block's space waits for: the uses
  // queued before its free, by the wait's number there.
  SlabPool slabs_;
  absl::flat_hash_map<uint64_t, std::vector<Use>> slab_waits_ ABSL_GUARDED_BY(mu_);
  uint64_t slab_waits_made_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Buffer>> buffers_ ABSL_GUARDED_BY(mu_);
  // The same buffers by key, found without a hash: every operation looks
  // its buffers up, twice or more. Registry ids count up from 1, pieces'
  // and slabs' keys from kPieceKeys; a key the index cannot hold
  // (DenseIdMap::kMaxId) is only in buffers_, counted in unindexed_.
  DenseIdMap<Buffer> by_id_ ABSL_GUARDED_BY(mu_);
  DenseIdMap<Buffer> by_piece_key_ ABSL_GUARDED_BY(mu_);
  size_t unindexed_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Buffer*> by_base_ ABSL_GUARDED_BY(mu_);
  uint64_t untracked_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<Device>> devices_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;    // access order
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // modification times
  SwapStats stats_ ABSL_GUARDED_BY(mu_);
  // The VMM driver calls, their failures counted in stats_ (under mu_).
  const Vmm vmm_{driver_, &stats_.driver_errors};
  bool warned_no_host_vmm_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_host_limit_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t serial_ ABSL_GUARDED_BY(mu_) = 0;  // allocation order: the last tie-break
  // Pins dropped by operations that finished (or failed to prepare): what
  // an allocation that found everything pinned waits to change.
  uint64_t unpins_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<IterationPlanner> planner_ ABSL_GUARDED_BY(mu_);
  // PredictLocked's touches and the planner's answers, kept so that their
  // capacity is reused (no allocation per operation).
  IterationPlanner::Scratch predict_scratch_ ABSL_GUARDED_BY(mu_);
  bool planner_made_ ABSL_GUARDED_BY(mu_) = false;
  bool pressed_ ABSL_GUARDED_BY(mu_) = false;  // Pressed()
  // Until the cap presses (or anything is evicted, or a second device is
  // used, or STENSOR_VERIFY checks drops), operations named with a ticket
  // are journaled (OperationJournal) rather than bookkept buffer by buffer.
  bool journaling_ ABSL_GUARDED_BY(mu_) = true;
  int journal_device_ ABSL_GUARDED_BY(mu_) = -1;  // the one device used while journaling
  // Work of stensor's own queued while journaling (a reused chunk's zeroing):
  // operations take the full path, which orders them after it, until the
  // device's own streams are seen idle.
  bool own_work_ ABSL_GUARDED_BY(mu_) = false;
  OperationJournal journal_ ABSL_GUARDED_BY(mu_);
  // Whether an operation may be journaled now, read without the lock:
  // journaling_, no own work queued, a device, no STENSOR_VERIFY, and the
  // cap not about to press (UpdateJournalOpen).
  std::atomic<bool> journal_open_{false};
  uint64_t journal_passes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> journal_touched_ ABSL_GUARDED_BY(mu_);  // ApplyJournal's, kept
  bool swapped_out_ ABSL_GUARDED_BY(mu_) = false;               // anything, ever
  // Eviction rounds: a buffer whose eviction failed in this round is not
  // tried again in it (its driver call would likely fail again).
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 1;
  // Physical memory the driver failed to release: (device, handle, bytes),
  // still charged, released again by the next MakeRoom.
  struct Unreleased {
    int device;
    CUmemGenericAllocationHandle handle;
    uint64_t bytes;
  };
  std::vector<Unreleased> unreleased_ ABSL_GUARDED_BY(mu_);
  // Chunks a failed map left mapped at [va, va+mapped) because its undo
  // failed too: still charged, unmapped and released by RetryReleases (and
  // the range freed when `reserved`, the allocation's own, is not 0).
  struct StuckMapping {
    int device;
    CUdeviceptr va;
    uint64_t mapped;
    uint64_t reserved;
    std::vector<PhysicalChunk> chunks;
  };
  std::vector<StuckMapping> stuck_ ABSL_GUARDED_BY(mu_);
  // Own streams BeforeContextEnds took out of service, with their context,
  // until AfterContextEnds.
  std::vector<std::pair<CUcontext, CUstream>> retiring_ ABSL_GUARDED_BY(mu_);
  // Each stream's marks (by UseKey), in the order of their records from
  // `next` (the oldest) on; made once, they live until their context ends.
  struct MarkRing {
    std::vector<std::unique_ptr<StreamMark>> marks;
    size_t next = 0;
    // The mark whose next record covers the uses noted since its last
    // (MarkOperation), and how many operations deferred to it.
    StreamMark* ahead = nullptr;
    int deferred = 0;
    CUstream stream = nullptr;  // the handle `ahead` is recorded on
  };
  bool any_ahead_ ABSL_GUARDED_BY(mu_) = false;  // some ring's `ahead` is set (or was)
  absl::node_hash_map<std::pair<CUstream, uint64_t>, MarkRing> mark_rings_ ABSL_GUARDED_BY(mu_);
  // The ring found last (FindRing), until erased.
  std::pair<CUstream, uint64_t> ring_memo_key_ ABSL_GUARDED_BY(mu_);
  MarkRing* ring_memo_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Host copies: made, counted against the host limit, kept for reuse
  // (its own lock, taken inside mu_).
  HostStore host_store_{driver_};
  // What driver allocations and the program's VMM handles are charged
  // (its own lock, taken inside mu_ where both are held).
  ExternalCharges external_;
  // External allocations freed in stream order, charged until their free
  // ran (ForgetExternalAsync). `waiters`: host waits on its events in
  // progress, without the lock; the entry stays until they end.
  struct ExternalFree {
    int device = 0;
    uint64_t bytes = 0;
    std::vector<Use> uses;
    int waiters = 0;
  };
  std::list<ExternalFree> external_frees_ ABSL_GUARDED_BY(mu_);
  // Destroys the entry's events and erases it; the entry after it.
  std::list<ExternalFree>::iterator DropExternalFree(std::list<ExternalFree>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_MEMORY_MANAGER_H_
