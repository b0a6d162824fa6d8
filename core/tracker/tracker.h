// Tracker: what stensor knows about the process's device work. The hooks in
// interpose/ report every allocation, free, copy, memset, launch and
// synchronisation here; the tracker keeps the registry of live buffers,
// infers each launch's read and write sets, counts operations and writes the
// access log.
//
// Thread-safety: every method may be called from any thread.
#ifndef STENSOR_CORE_TRACKER_TRACKER_H_
#define STENSOR_CORE_TRACKER_TRACKER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "core/base/config.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/capture.h"
#include "core/inference/copy_ranges.h"
#include "core/inference/graph_plan.h"
#include "core/inference/launch_inference.h"
#include "core/swap/memory_manager.h"
#include "core/tracker/access_log.h"
#include "core/tracker/exact_sizes.h"
#include "core/tracker/graph_launcher.h"
#include "core/tracker/host_writes.h"
#include "core/tracker/leaks.h"
#include "core/tracker/pinned_host.h"
#include "core/tracker/table_inference.h"

namespace stensor {

// Where a stream handle came from: handle 0 means the legacy stream, or the
// calling thread's per-thread stream for _ptsz/_ptds entry points.
struct StreamRef {
  CUstream handle = nullptr;
  bool per_thread = false;
};

// The buffers one copy or memset touches, between Begin and End.
struct TransferScope {
  uint64_t dst_id = 0;
  uint64_t src_id = 0;
  // What the memory manager holds for it and what it writes: the two ids,
  // or of an allocation made of pieces the pieces a linear copy or memset
  // reaches (MemoryManager::Narrow).
  MemoryManager::Keys ids;
  MemoryManager::Keys written;
  bool served = false;    // done without the driver (read from a host copy)
  bool captured = false;  // pushed into a capturing stream: recorded, not run
  // For a captured one: stensor's own stream on which its buffers were
  // made resident while the driver records it (null: none were).
  CUstream side = nullptr;
  MemoryManager::OpTicket op;  // its place in the profiled iteration
};

// The kinds of operation counted and logged.
enum class OpType { kAlloc, kFree, kLaunch, kMemcpy, kMemset, kSync, kGraphLaunch, kCount };

class Tracker {
 public:
  // `driver` must outlive the tracker. Opens the access log if configured.
  static absl::StatusOr<std::unique_ptr<Tracker>> Create(const Config& config,
                                                         const Driver* driver);

  const Config& config() const { return config_; }
  const BufferRegistry& registry() const { return registry_; }

  // Whether a memory cap is set: allocations, launches, copies and memsets
  // then go through the swap machinery.
  bool capped() const { return memory_ != nullptr; }
  MemoryManager* memory() const { return memory_.get(); }
  // Kernel descriptions; module and library unloads expire them.
  KernelCache& kernels() { return kernels_; }

  // --- Allocation calls: who answers each, cap or not. `call` is the
  // program's call to the real driver; each method makes it or answers for
  // it as it says, reports what happened and returns the program's result.
  using DriverCall = absl::FunctionRef<CUresult()>;
  // cuMemAlloc: under a cap stensor serves it (VMM-backed, swappable).
  CUresult Allocate(const char* api, CUdeviceptr* dptr, size_t bytes, DriverCall call);
  // cuMemAllocPitch: the driver's, charged against a cap (not swapped).
  CUresult AllocatePitch(const char* api, CUdeviceptr* dptr, size_t* pitch, size_t width,
                         size_t height, DriverCall call);
  // cuMemFree: stensor's buffer freed by the manager, anything else by the
  // driver (and no longer charged).
  CUresult Free(const char* api, CUdeviceptr dptr, DriverCall call);
  // cuMemAllocAsync on `stream`: under a cap, from half a granule up (the
  // device's default pool, stream not captured) served by stensor,
  // swappable (core/swap/stream_ordered.h); the others charged against the
  // cap and never swapped; a smaller one the cap finds no room for is
  // stensor's too, served from host memory.
  CUresult AllocateAsync(const char* api, CUdeviceptr* dptr, size_t bytes, StreamRef stream,
                         DriverCall call);
  // cuMemAllocFromPoolAsync: the driver's, charged against a cap.
  CUresult AllocateFromPool(const char* api, CUdeviceptr* dptr, size_t bytes, DriverCall call);
  // cuMemFreeAsync on `stream`: stensor's buffer freed in stream order;
  // anything else charged until the stream reached the free.
  CUresult FreeAsync(const char* api, CUdeviceptr dptr, StreamRef stream, DriverCall call);
  // cuMemCreate: under a cap the program's physical memory is charged
  // against it (device-located only).
  CUresult CreateMemory(CUmemGenericAllocationHandle* handle, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags, DriverCall call);
  // After a successful cuMemRelease, cuMemMap or cuMemUnmap by the program:
  // its own VMM mappings are tracked as buffers it owns, and charged.
  void OnRelease(CUmemGenericAllocationHandle handle);
  void OnMap(const char* api, uint64_t base, uint64_t size, CUmemGenericAllocationHandle handle);
  // The application unmapped [base, base+size): every mapping in it is gone.
  void OnUnmap(const char* api, uint64_t base, uint64_t size);
  // Handles that leave stensor's control: under a cap the buffer they
  // reach is made resident and never evicted again (another process, or
  // NCCL, maps its physical memory directly), then the driver answers.
  CUresult GetIpcHandle(const char* api, CUipcMemHandle* handle, CUdeviceptr ptr, DriverCall call);
  CUresult RetainHandle(const char* api, CUmemGenericAllocationHandle* handle, void* addr,
                        DriverCall call);
  CUresult ExportHandle(const char* api, CUmemGenericAllocationHandle handle, DriverCall call);
  // After the driver answered a query or change of memory: under a cap,
  // the cap is the device's memory (cuMemGetInfo, cuDeviceTotalMem) and a
  // device's default pool answers for what stensor serves from it too
  // (core/swap/stream_ordered.h).
  void OnMemGetInfo(size_t* free_bytes, size_t* total_bytes);
  void OnDeviceTotalMem(CUdevice device, size_t* bytes);
  void OnPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
  void OnPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr);
  void OnPoolTrimTo(CUmemoryPool pool, size_t keep);

  // A successful allocation of [base, base+size) by `api`; its buffer id
  // (0 when it could not be tracked).
  uint64_t OnAlloc(const char* api, uint64_t base, uint64_t size, BufferKind kind);
  // A successful free of the buffer at `base` by `api`.
  void OnFree(const char* api, uint64_t base);
  // Page-locked host memory the application allocated or freed (counted:
  // it competes with stensor's own host store for pinned memory).
  void OnHostAlloc(const char* api, const void* p, uint64_t size);
  // cuMemHostRegister / cuMemHostUnregister succeeded: host memory device
  // work may write (not counted as pinned allocations, not logged).
  void OnHostRegister(const void* p, uint64_t size);
  void OnHostUnregister(const void* p);
  void OnHostFree(const char* api, const void* p);
  uint64_t host_pinned_bytes() const;

  // Before a launch of `f` over `grid` blocks of `block` threads: infers
  // its accesses into `accesses` and, under a cap, makes the buffers
  // resident on `stream`. An error means: do not launch.
  CUresult BeginLaunch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                       StreamRef stream, void** params, void** extra, Accesses* accesses);
  // After it: `submitted` when the driver accepted it.
  void EndLaunch(const char* api, CUfunction f, const unsigned grid[3], const unsigned block[3],
                 StreamRef stream, const Accesses& accesses, bool submitted);

  // --- Copies and memsets: `call` is the program's call to the real driver.
  // A copy of what `c` describes (core/inference/copy_ranges.h) on `stream`.
  // One that runs past the requested end of a stensor buffer is refused as
  // the driver refuses it for a cuMemAlloc allocation (the VA behind is
  // rounded up to the granule, so the driver would not notice), without
  // calling it; under a cap the buffers it touches are made resident first
  // and marked used after, and a synchronous device-to-host copy of a
  // swapped-out buffer is served from its host copy. Then its tables, the
  // host memory it writes and its log record. `linear`: one contiguous
  // range (a write of a whole buffer is recognised, tables are scanned).
  CUresult Copy(const char* api, const CopyRanges& c, StreamRef stream, bool async, bool linear,
                DriverCall call);
  // A memset of `range` at `dst` (`range.extent`: the bytes from dst to the
  // last one set, with the pitch for 2D ones), the same way.
  CUresult Memset(const char* api, uint64_t dst, const MemsetRange& range, StreamRef stream,
                  bool async, DriverCall call);
  // A batch of copies `ops`: every operation's buffers resident before the
  // one driver call, released after it, and each operation then reported as
  // a copy; one that overruns a stensor buffer fails the whole batch before
  // the driver is called. No operations: the driver answers alone.
  CUresult CopyBatch(const char* api, absl::Span<const CopyRanges> ops, StreamRef stream,
                     DriverCall call);

  // Before and after a copy or memset of `bytes` at dst (from src; 0 for a
  // memset). `linear`: one contiguous range, so a write of a whole buffer is
  // recognised. `to_host`: a synchronous device-to-host copy, which for a
  // swapped-out buffer is served from its host copy (then scope->served, and
  // the driver is not called).
  CUresult BeginTransfer(uint64_t dst, uint64_t src, uint64_t bytes, StreamRef stream, bool linear,
                         bool to_host, TransferScope* scope);
  void EndTransfer(const TransferScope& scope, StreamRef stream, bool submitted);
  // A copy of `bytes` (for 2D/3D copies: the bytes of the whole region)
  // between the ranges starting at dst and src. `kind` is the direction as
  // the API states it (e.g. kHostToDevice, or kDefault for unified copies).
  // `table_entries`: pointers found in the copied data (OnCopyTables).
  // `captured`: pushed into a capturing stream (TransferScope::captured).
  void OnCopy(const char* api, CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes,
              StreamRef stream, bool async, size_t table_entries = 0, bool captured = false);
  void OnMemset(const char* api, uint64_t dst, uint64_t bytes, StreamRef stream, bool async,
                bool captured = false);
  // A synchronisation that returned successfully.
  void OnSync(const char* api, StreamRef stream);

  // --- Graphs and stream capture (core/inference/graph_plan.h, core/inference/capture.h).
  // A capture began on (or, when the driver says so, ended at) `origin`.
  void OnCaptureBegin(StreamRef origin) { capture_.OnBegin(Handle(origin)); }
  void OnCaptureEnd(StreamRef origin) { capture_.OnEnd(Handle(origin)); }
  // Whether work pushed into `stream` now is captured into a graph.
  bool Capturing(StreamRef stream) const { return capture_.Capturing(Handle(stream)); }
  // `exec` was instantiated from `graph` (by `api`): its nodes are read.
  // Only while a cap or an access log needs them.
  // `flags`: the instantiation flags (an exec made for device launches is
  // launched where stensor cannot see it: its accesses count as unknown).
  void OnGraphInstantiate(const char* api, CUgraphExec exec, CUgraph graph,
                          unsigned long long flags);
  // A child graph node of `exec` was given another graph: its accesses
  // become unknown.
  void OnGraphExecChildChanged(CUgraphExec exec) { graphs_->OnExecChildChanged(exec); }
  void OnGraphExecDestroy(CUgraphExec exec) { graphs_->OnExecDestroy(exec); }
  // Node `node` of `exec` got new parameters (core/inference/graph_plan.h NodeParams
  // gives every setter's in this form): that node's accesses are read
  // again, or the exec's become unknown when they cannot be described.
  void OnGraphExecNode(CUgraphExec exec, CUgraphNode node, const CUgraphNodeParams& params) {
    graphs_->OnExecNode(exec, node, params);
  }
  // cuGraphExecUpdate succeeded: `exec` now runs `graph`'s nodes, still
  // named by its own (UpdatedPlan).
  void OnGraphExecUpdate(CUgraphExec exec, CUgraph graph) { graphs_->OnExecUpdate(exec, graph); }
  // Before cuGraphLaunch: under a cap its nodes' buffers are made resident
  // on `stream` (CUDA_ERROR_OUT_OF_MEMORY when they do not fit together:
  // a graph cannot be split); with no plan, it is work of unknown accesses.
  CUresult BeginGraphLaunch(CUgraphExec exec, StreamRef stream, GraphLaunchScope* scope);
  void EndGraphLaunch(const char* api, CUgraphExec exec, StreamRef stream,
                      const GraphLaunchScope& scope, bool submitted);
  // The stream a handle names for the driver (CU_STREAM_PER_THREAD for a
  // per-thread entry point's 0).
  static CUstream Handle(StreamRef s) {
    return s.handle == nullptr && s.per_thread ? CU_STREAM_PER_THREAD : s.handle;
  }

  // Pointer tables (core/inference/pointer_tables.h): kept while they matter, under a
  // cap or for the access log.
  bool tracks_tables() const { return memory_ != nullptr || log_ != nullptr; }
  // A successful copy of `bytes` from src to dst, `kind` as for OnCopy, on
  // one contiguous range when `linear`: the source of a host-to-device copy
  // is scanned for pointers into live buffers, a device copy carries the
  // entries of its source along. Returns the number of entries found by a
  // scan (for the log).
  // `host`, for a host source: TableInference::HostCopy (its `settled`
  // from HostSourceSettled, asked before the copy was submitted).
  using HostCopy = TableInference::HostCopy;
  size_t OnCopyTables(CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes, bool linear,
                      HostCopy* host = nullptr);
  // Asked before a copy is submitted on `stream`: false when its source is
  // host memory that work queued ahead of the copy may still write (pinned,
  // mapped or registered memory, and an asynchronous copy with work ahead
  // of it), so the words it holds now need not be what lands. Pageable
  // memory is read by the driver at the call, and a synchronous copy has
  // run when the call returns: both settled.
  // `scope` is the copy's, from BeginTransfer.
  // Only work that may write the `bytes` read from `src` (HostWrites) makes
  // it unsettled: other work on the stream does not.
  bool HostSourceSettled(CopyKind kind, const TransferScope& scope, uint64_t src, uint64_t bytes,
                         StreamRef stream, bool async);
  // Submitted on `stream` (not captured): the asynchronous copy or memset
  // of `scope` writing [dst, dst+bytes). Where no tracked buffer holds it
  // and it is host memory a device reaches, the source of a later upload
  // may be written by it (HostWrites). Under a cap only.
  void OnHostWrite(const TransferScope& scope, uint64_t dst, uint64_t bytes, StreamRef stream);
  // A host function or stream callback submitted on `stream`: it may write
  // any host memory before the work queued after it runs.
  void OnHostFunction(StreamRef stream);
  // A successful memset: no pointers left in the range.
  void OnMemsetTables(uint64_t dst, uint64_t bytes, bool linear);
  // Exact sizes: stensor's buffers answer the driver's size and attribute
  // queries as the cuMemAlloc allocations the program asked for.
  const ExactSizes& exact_sizes() const { return *exact_sizes_; }

  // --- Contexts that end, taking their streams and events with them
  // (MemoryManager::BeforeContextEnds). `call` is the program's call, whose
  // result is returned: cuCtxDestroy of `ctx`; cuDevicePrimaryCtxReset
  // (`reset`) or cuDevicePrimaryCtxRelease of device `device`'s primary
  // context, which a release ends only when it was the last reference.
  // stensor's streams and events in it are retired around the call and
  // made again in a live context of the device when next needed.
  CUresult DestroyContext(CUcontext ctx, absl::FunctionRef<CUresult()> call);
  CUresult EndPrimaryContext(CUdevice device, bool reset, absl::FunctionRef<CUresult()> call);

  // Writes the final record and closes the access log; prints statistics
  // when STENSOR_STATS is on. Idempotent.
  void Shutdown();

  // fork() (pthread_atfork): the log's buffered lines are written before
  // the fork and none are inherited. In the child this tracker is the
  // parent's and is never used again (the interposer builds a fresh one).
  void BeforeFork();
  void AfterFork();

  uint64_t count(OpType type) const {
    return counts_[static_cast<int>(type)].load(std::memory_order_relaxed);
  }

 private:
  Tracker(const Config& config, const Driver* driver);

  void Count(OpType type) {
    counts_[static_cast<int>(type)].fetch_add(1, std::memory_order_relaxed);
  }
  // `call` allocating `bytes` (the driver's answer), then the buffer it
  // made registered as `kind`.
  CUresult DriverAllocation(const char* api, CUdeviceptr* dptr, size_t bytes, BufferKind kind,
                            DriverCall call);
  // cuMemAllocAsync under the cap: true when stensor served it, with
  // `*result` its outcome; false when the driver is to answer. `no_room`:
  // the driver's pool was refused room for it (ServeStreamOrdered's).
  bool AllocateAsyncCapped(const char* api, CUdeviceptr* dptr, uint64_t bytes, StreamRef stream,
                           CUresult* result, bool no_room = false);
  // Queues a record, preceded once by the header.
  void Log(std::string line);
  std::string Header() const;
  // The buffer id containing `addr`, or 0.
  uint64_t IdAt(uint64_t addr) const;
  // The pieces of the allocations the launch names that its pointer words
  // likely do not reach (MemoryManager::FarPieces), ascending; none for an
  // allocation also reached through a pointer table, whose entries are not
  // among the words.
  void FindFarPieces(const Accesses& accesses, MemoryManager::Keys* far);
  // The launch's pointer words (Accesses::pointers) into buffers entered in
  // the log as `pointers`, [id, "0x..."] pairs: those of each buffer some
  // word points into past its start; a buffer named only at its start is
  // not listed (`stensor sim` then takes its start).
  std::string PointersJson(const Accesses& accesses) const;
  // The launch path's parts that only a cap or an access log needs, out of
  // line so that the uncapped path keeps its few values in registers:
  // BeginLaunch's residency and iteration bookkeeping, EndLaunch's
  // completion and log record.
  // The launch is named for the iteration planner by its kernel and shape
  // (LaunchKey), hashed only when the planner asks.
  ABSL_ATTRIBUTE_NOINLINE CUresult PrepareLaunch(CUfunction f, const unsigned grid[3],
                                                 const unsigned block[3], const KernelInfo& kernel,
                                                 StreamRef stream, Accesses* accesses);
  ABSL_ATTRIBUTE_NOINLINE void FinishLaunch(const KernelInfo& kernel, StreamRef stream,
                                            const Accesses& accesses, bool submitted);
  ABSL_ATTRIBUTE_NOINLINE void LogLaunch(const char* api, const KernelInfo& kernel,
                                         const unsigned grid[3], const unsigned block[3],
                                         StreamRef stream, const Accesses& accesses);
  // Whether `kernel` is STENSOR_ITERATION_MARKER's.
  bool IsMarker(const KernelInfo& kernel) const;
  // The first launch refused for lack of room, named on stderr with its
  // footprint and the cap (once for the process).
  void SayRefusal(const KernelInfo& kernel, const Accesses& accesses) const;
  // `call` may end `ctx`; `ended(result)` says whether it did.
  CUresult EndContext(CUcontext ctx, absl::FunctionRef<CUresult()> call,
                      absl::FunctionRef<bool(CUresult)> ended);

  const Config config_;
  const Driver* const driver_;
  BufferRegistry registry_;
  KernelCache kernels_;
  CaptureState capture_;
  std::unique_ptr<AccessLog> log_;
  // Buffers never freed, when a report is wanted (STENSOR_STATS or a log).
  std::unique_ptr<Leaks> leaks_;
  std::unique_ptr<MemoryManager> memory_;
  std::unique_ptr<ExactSizes> exact_sizes_;  // made with memory_, never null after
  // The pointer tables, read back and followed (made with memory_, never
  // null after).
  std::unique_ptr<TableInference> tables_;
  // CUDA graphs' plans, walked at each launch (likewise).
  std::unique_ptr<GraphLauncher> graphs_;
  std::once_flag header_once_;
  std::once_flag shutdown_once_;
  std::atomic<uint64_t> counts_[static_cast<int>(OpType::kCount)] = {};
  // The program's page-locked host memory (its own lock).
  PinnedHost pinned_;
};

const char* OpTypeName(OpType type);

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_TRACKER_H_
