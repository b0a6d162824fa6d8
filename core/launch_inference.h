// Access inference for kernel launches: which live buffers a launch reads and
// which it may write.
//
// Per kernel (cached): the parameter layout from cuFuncGetParamInfo (or
// cuKernelGetParamInfo for CUkernel handles) and the read/write class of each
// parameter from its mangled name. Per launch: every 8-byte-aligned word of
// every parameter of 8 bytes or more is looked up in the registry; interior
// pointers count. A `const T*` parameter reads its buffer; any other hit
// (plain pointers, structs, integers carrying an address) reads and writes
// it, and so does every parameter of a kernel whose name says nothing
// (extern "C"), whose name disagrees with the driver's parameter count, or
// under STENSOR_WRITE_INFERENCE=conservative.
//
// Thread-safety: KernelCache (and UnloadScope) is thread-safe; KernelInfo is
// immutable.
#ifndef STENSOR_CORE_LAUNCH_INFERENCE_H_
#define STENSOR_CORE_LAUNCH_INFERENCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "core/buffer_registry.h"
#include "core/driver.h"
#include "core/kernel_signature.h"

namespace stensor {

struct ParamSlot {
  uint32_t offset = 0;
  uint32_t size = 0;
  ParamAccess access = ParamAccess::kReadWrite;
  // The 8-byte-aligned words of the parameter that may hold a pointer:
  // `words` of them, the first at byte `first_word` of the parameter.
  uint32_t first_word = 0;
  uint32_t words = 0;
  // For a pointer-to-pointers parameter (a pointer table), what the kernel
  // may do to the entries' targets; kNone for anything else (and for every
  // parameter of a kernel whose name is not trusted).
  Pointees pointees = Pointees::kNone;
};

struct KernelInfo {
  std::string name;       // as the driver reports it (mangled)
  std::string demangled;  // for people; equals name when not mangled
  std::vector<ParamSlot> params;
  uint32_t args_size = 0;  // end of the last parameter
  bool layout_known = false;  // false: the driver could not describe it
  bool has_tables = false;    // some parameter points to pointers
};

// One slot of the per-thread memo of KernelCache::Get (at namespace scope:
// see BufferRegistry::ThreadCacheSlots).
struct KernelMemo {
  uint64_t cache = 0;  // KernelCache instance number; 0 = empty
  uint64_t generation = 0;  // the cache's generation when it was filled
  CUfunction f = nullptr;
  const struct KernelInfo* info = nullptr;
};
struct KernelMemos {
  KernelMemo slots[64];
};

// Descriptions follow module lifetime: once a module is unloaded, the driver
// may hand one of its function handles to a different kernel of a module
// loaded later. Each description records the module its function belongs to
// (cuFuncGetModule; unknown for CUkernel handles or when the query fails),
// and an UnloadScope around cuModuleUnload/cuLibraryUnload forgets the
// descriptions of that module, of unknown modules, or (a library) all of
// them. Forgotten descriptions are retired, never freed: a launch on another
// thread may still be reading one.
class KernelCache {
 public:
  // `conservative` marks every pointer-holding parameter read-write.
  KernelCache(const Driver* driver, bool conservative)
      : driver_(driver), conservative_(conservative), instance_(NextInstance()) {}

  // The description of `f`, built on first use. Never null; valid as long
  // as the cache.
  const KernelInfo* Get(CUfunction f) ABSL_LOCKS_EXCLUDED(mu_);

  // Lives across one real cuModuleUnload (`module`) or cuLibraryUnload
  // (`module` null: every description is forgotten, since which functions
  // belong to a library cannot be asked reliably). While any scope is open,
  // descriptions not cached already are built afresh on every Get and
  // cached nowhere: the driver may reuse a handle as soon as it has freed
  // it, before the scope closes. Both ends bump the generation, which
  // empties every thread's memo.
  class UnloadScope {
   public:
    UnloadScope(KernelCache* cache, CUmodule module);
    ~UnloadScope();
    UnloadScope(const UnloadScope&) = delete;
    UnloadScope& operator=(const UnloadScope&) = delete;

   private:
    KernelCache* const cache_;
    const CUmodule module_;
  };

 private:
  struct Entry {
    std::unique_ptr<KernelInfo> info;
    CUmodule module = nullptr;  // null: unknown
  };

  // `generation`: read before the call. `cacheable` is set false when an
  // unload overlapped: the answer must not be memoized.
  const KernelInfo* Lookup(CUfunction f, uint64_t generation, bool* cacheable)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<KernelInfo> Describe(CUfunction f, CUmodule* module) const;
  // Retires the descriptions of `module` (null: all) and of unknown modules.
  void Forget(CUmodule module) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static uint64_t NextInstance();

  const Driver* const driver_;
  const bool conservative_;
  const uint64_t instance_;
  // Starts at 1 so that a memo filled for generation 0 never matches.
  std::atomic<uint64_t> generation_{1};
  absl::Mutex mu_;
  absl::flat_hash_map<CUfunction, Entry> cache_ ABSL_GUARDED_BY(mu_);
  int unloading_ ABSL_GUARDED_BY(mu_) = 0;  // open UnloadScopes
  std::vector<std::unique_ptr<KernelInfo>> retired_ ABSL_GUARDED_BY(mu_);
};

// Buffer ids touched by one operation. An id may appear more than once
// (a buffer passed twice); Dedupe() when that matters. The launch path does
// not pay for it.
struct Accesses {
  absl::InlinedVector<uint64_t, 8> reads;
  absl::InlinedVector<uint64_t, 8> writes;
  // Pointer-table parameters (filled only for kernels that have them): the
  // buffer each one points into, or 0 with the raw address in
  // `table_misses` when it points into memory stensor does not track.
  struct TableParam {
    uint64_t id = 0;
    uint64_t address = 0;
    Pointees pointees = Pointees::kWritable;
  };
  absl::InlinedVector<TableParam, 2> table_params;
  // Filled by the tracker: the tables the launch reached (their targets are
  // in reads, and in writes unless only const-pointee parameters reached
  // them), and whether some table's contents could not be known.
  struct TableUse {
    uint64_t id = 0;
    bool writes = false;
    absl::InlinedVector<uint64_t, 4> refs;
  };
  absl::InlinedVector<TableUse, 1> tables;
  bool unknown_tables = false;
  // Under a cap: the device held from eviction while a launch of unknown
  // accesses is submitted (MemoryManager::BeginUnknown), or -1.
  int unknown_device = -1;
  // Under a cap: the launch's place in the profiled iteration while it is
  // timed (MemoryManager::OpTicket: a Profiler token, -1 when untimed, and
  // the operation's logical time).
  int op_timing = -1;
  uint64_t op_time = 0;
  // Launches: the kernel's description, set by the tracker before the launch
  // so that the end of it need not look the kernel up again.
  const KernelInfo* kernel = nullptr;

  // Drops repeated ids, keeping first occurrences in order.
  void Dedupe();
};

// Fills `out` for a launch of `kernel` with the arguments given either as
// kernelParams or as the `extra` packed buffer. When the layout is unknown,
// nothing can be inferred and `out` stays empty.
void InferLaunchAccesses(const KernelInfo& kernel, void** params, void** extra,
                         const BufferRegistry& registry, Accesses* out);

}  // namespace stensor

#endif  // STENSOR_CORE_LAUNCH_INFERENCE_H_
