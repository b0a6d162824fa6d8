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
// The launch path keeps, per thread, the answer for a kernel's last words
// (LaunchMemo): repeated launches on the same buffers, as a training step
// makes them, cost a compare per word. It records an answer only at the
// second launch with the same kernel and first word, so a stream of new
// words pays almost nothing for it, and keeps an answer across buffers
// added or removed elsewhere (per-step temporaries) by checking its own
// buffers' liveness once.
//
// Thread-safety: KernelCache (and UnloadScope) is thread-safe; KernelInfo is
// immutable; InferLaunchAccesses may run on any thread (the memo is the
// calling thread's own); IdList and Accesses are plain values.
#ifndef STENSOR_CORE_INFERENCE_LAUNCH_INFERENCE_H_
#define STENSOR_CORE_INFERENCE_LAUNCH_INFERENCE_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "core/base/mutex.h"
#include "core/base/thread_cache.h"
#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/kernel_signature.h"

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

// One 8-byte word of the kernelParams form that may hold a pointer: at byte
// `offset` of parameter `param`; a hit there is written too when `writes`.
struct WordProbe {
  uint32_t param = 0;
  uint32_t offset = 0;
  bool writes = false;
};

struct KernelInfo {
  std::string name;       // as the driver reports it (mangled)
  std::string demangled;  // for people; equals name when not mangled
  std::vector<ParamSlot> params;
  // Every candidate word of `params` in order (IndexProbes), flattened for
  // the launch path: one loop over words instead of one over parameters and
  // one over each parameter's words.
  std::vector<WordProbe> probes;
  // Process-unique, given by IndexProbes: what a launch memo names the
  // description by (an address could be reused by another description).
  uint64_t serial = 0;
  uint32_t args_size = 0;     // end of the last parameter
  bool layout_known = false;  // false: the driver could not describe it
  bool has_tables = false;    // some parameter points to pointers
};

// One slot of the per-thread memo of KernelCache::Get (at namespace scope:
// see BufferRegistry::ThreadCacheSlots).
struct KernelMemo {
  uint64_t cache = 0;       // KernelCache instance number; 0 = empty
  uint64_t generation = 0;  // the cache's generation when it was filled
  CUfunction f = nullptr;
  const struct KernelInfo* info = nullptr;
};
struct KernelMemos {
  KernelMemo slots[64];
};

// One slot of the per-thread memo of the launch path (see InferFromParams
// in launch_inference.cc): a kernel's candidate words at its last launch
// with them and the buffers they hit. `kernel` and words[0] alone are a tag
// (a launch seen once, not filled: registry 0); once filled, the answer is
// valid while the registry's instance and generation are those recorded,
// and past a generation change while every hit's liveness cell still holds
// its id and every missed word lies outside the registry's bounds.
struct LaunchMemo {
  static constexpr size_t kWords = 8;  // kernels with more are not memoized
  uint64_t registry = 0;               // BufferRegistry::instance(); 0 = not filled
  uint64_t generation = 0;
  uint64_t kernel = 0;     // KernelInfo::serial; 0 = empty
  uint32_t reads = 0;      // read[0, reads)
  uint32_t writes = 0;     // written[0, writes)
  uint32_t hit_words = 0;  // bit i: words[i] hit read[popcount below i]
  uint64_t words[kWords];
  uint64_t read[kWords];
  uint64_t written[kWords];
  const BufferRegistry::LivenessCell* cells[kWords];  // of read[k]
};
// What the calling thread's launch memo did, for tests and benchmarks.
struct LaunchMemoCounts {
  uint64_t fills = 0;          // answers recorded (second sight of a launch)
  uint64_t revalidations = 0;  // answers kept across a generation change
};
struct LaunchMemos {
  LaunchMemo slots[256];
  LaunchMemoCounts counts;
};
LaunchMemoCounts ThreadLaunchMemoCounts();

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
  const KernelInfo* Get(CUfunction f) ABSL_LOCKS_EXCLUDED(mu_) {
    // Descriptions are immutable and live as long as the cache, so a
    // per-thread memo of recent kernels can skip the shared lock on the
    // launch path (inline here: one per launch). Memo entries name the cache
    // by a process-unique instance number: a cache built where another was
    // destroyed never sees that one's entries. They also carry the
    // generation: an unload since they were filled may have given their
    // handle to another kernel.
    KernelMemo& m = PerThread<KernelMemos>::Get()
                        .slots[(reinterpret_cast<uintptr_t>(f) * 0x9E3779B97F4A7C15ull) >> 58];
    // Read before the lookup: an unload that starts later makes it stale.
    const uint64_t generation = generation_.load(std::memory_order_acquire);
    if (ABSL_PREDICT_TRUE(m.cache == instance_ && m.f == f && m.generation == generation)) {
      return m.info;
    }
    return GetMissed(f, generation, &m);
  }

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

  // Get's slow path: looks `f` up and memoizes it in `m` when it may be.
  ABSL_ATTRIBUTE_NOINLINE const KernelInfo* GetMissed(CUfunction f, uint64_t generation,
                                                      KernelMemo* m) ABSL_LOCKS_EXCLUDED(mu_);
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
  Mutex mu_;
  absl::flat_hash_map<CUfunction, Entry> cache_ ABSL_GUARDED_BY(mu_);
  int unloading_ ABSL_GUARDED_BY(mu_) = 0;  // open UnloadScopes
  std::vector<std::unique_ptr<KernelInfo>> retired_ ABSL_GUARDED_BY(mu_);
};

// A list of buffer ids with room for a typical launch's inline: appending
// is a compare, a store and an increment, and no launch with up to
// kInline hits touches the heap. `data_` always points at the current
// storage (the inline array or a heap block), so the hot path never asks
// which one it is.
//
// Thread-safety: none; a value type.
class IdList {
 public:
  using value_type = uint64_t;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = uint64_t&;
  using const_reference = const uint64_t&;
  using pointer = uint64_t*;
  using const_pointer = const uint64_t*;
  using iterator = uint64_t*;
  using const_iterator = const uint64_t*;

  static constexpr size_t kInline = 16;

  IdList() = default;
  IdList(std::initializer_list<uint64_t> ids) { Assign(ids.begin(), ids.size()); }
  IdList(const IdList& other) { Assign(other.data_, other.size_); }
  IdList(IdList&& other) noexcept { Take(&other); }
  IdList& operator=(const IdList& other) {
    if (this != &other) {
      clear();
      Assign(other.data_, other.size_);
    }
    return *this;
  }
  IdList& operator=(IdList&& other) noexcept {
    if (this != &other) {
      Release();
      Take(&other);
    }
    return *this;
  }
  IdList& operator=(std::initializer_list<uint64_t> ids) {
    clear();
    Assign(ids.begin(), ids.size());
    return *this;
  }
  ~IdList() { Release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return capacity_; }
  uint64_t* data() { return data_; }
  const uint64_t* data() const { return data_; }
  uint64_t* begin() { return data_; }
  uint64_t* end() { return data_ + size_; }
  const uint64_t* begin() const { return data_; }
  const uint64_t* end() const { return data_ + size_; }
  uint64_t& operator[](size_t i) { return data_[i]; }
  const uint64_t& operator[](size_t i) const { return data_[i]; }

  void push_back(uint64_t id) {
    if (ABSL_PREDICT_FALSE(size_ == capacity_)) Grow(size_ + 1);
    data_[size_++] = id;
  }
  // Appends [first, last), which must not lie within this list.
  template <typename It>
  void append(It first, It last) {
    const size_t n = static_cast<size_t>(std::distance(first, last));
    reserve(size_ + n);
    std::copy(first, last, data_ + size_);
    size_ += n;
  }
  // Keeps the first `n` ids; growing fills with 0.
  void resize(size_t n) {
    if (n > size_) {
      reserve(n);
      std::fill(data_ + size_, data_ + n, 0);
    }
    size_ = n;
  }
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n > capacity_) Grow(n);
  }

  // For loops that append many ids: write through a local pointer from
  // end() up to room_end(), then set_end(); GrowAt(p) makes more room past
  // the ids ending at `p` and returns where they now end.
  uint64_t* room_end() { return data_ + capacity_; }
  void set_end(uint64_t* end) { size_ = static_cast<size_t>(end - data_); }
  uint64_t* GrowAt(uint64_t* end) {
    set_end(end);
    Grow(size_ + 1);
    return data_ + size_;
  }

 private:
  void Assign(const uint64_t* ids, size_t n) {
    reserve(n);
    std::copy(ids, ids + n, data_);
    size_ = n;
  }
  void Take(IdList* other) {
    if (other->data_ == other->inline_) {
      data_ = inline_;
      capacity_ = kInline;
      std::copy(other->inline_, other->inline_ + other->size_, inline_);
    } else {
      data_ = other->data_;
      capacity_ = other->capacity_;
      other->data_ = other->inline_;
      other->capacity_ = kInline;
    }
    size_ = other->size_;
    other->size_ = 0;
  }
  void Release() {
    if (data_ != inline_) delete[] data_;
    data_ = inline_;
    capacity_ = kInline;
  }
  // Room for at least `n`, doubling; out of line (the rare path).
  void Grow(size_t n);

  uint64_t* data_ = inline_;
  size_t size_ = 0;
  size_t capacity_ = kInline;
  uint64_t inline_[kInline];
};

// Buffer ids touched by one operation. An id may appear more than once
// (a buffer passed twice); Dedupe() when that matters. The launch path does
// not pay for it.
struct Accesses {
  IdList reads;
  IdList writes;
  // Pointer-table parameters (filled only for kernels that have them): the
  // buffer each one points into, or 0 with the raw address in
  // `table_misses` when it points into memory stensor does not track.
  struct TableParam {
    uint64_t id = 0;
    uint64_t address = 0;
    Pointees pointees = Pointees::kWritable;
    // The kernel may store pointers through it (`T**`, `T const**`).
    bool slots_written = false;
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
  // Filled by the tracker while tables exist (`reach_known`): for each
  // buffer the launch may write, the lowest address it writes through (a
  // parameter, or a table's entry); a kernel reaches its buffer from that
  // address on (core/inference/pointer_tables.h).
  struct Reach {
    uint64_t id = 0;
    uint64_t from = 0;
  };
  absl::InlinedVector<Reach, 4> write_reach;
  bool reach_known = false;
  // Filled by the tracker while allocations are made of pieces or a log is
  // written (`pointers_known`): each parameter word that points into a
  // tracked buffer, with the buffer's id, in parameter order. Where the
  // tensors a kernel names start (MemoryManager::FarPieces).
  struct PointerWord {
    uint64_t id = 0;
    uint64_t word = 0;
  };
  absl::InlinedVector<PointerWord, 4> pointers;
  bool pointers_known = false;
  // Pushed into a stream being captured into a graph: recorded, not run
  // (core/inference/capture.h), so nothing is made resident or marked used for it.
  bool captured = false;
  // Under a cap: the device held from eviction while a launch of unknown
  // accesses is submitted (MemoryManager::BeginUnknown), or -1.
  int unknown_device = -1;
  // Under a cap: the launch's place in the profiled iteration while it is
  // timed (MemoryManager::OpTicket: a Profiler token, -1 when untimed, and
  // the operation's logical time).
  int op_timing = -1;
  uint64_t op_time = 0;
  // Under a cap: whether the manager holds anything for the launch
  // (MemoryManager::OpTicket::finish).
  bool op_finish = true;
  // Under a cap, before it presses: the launch's place in the manager's
  // operation journal (MemoryManager::OpTicket::journal), 0 when none.
  uint64_t op_journal = 0;
  // Launches: the kernel's description, set by the tracker before the launch
  // so that the end of it need not look the kernel up again.
  const KernelInfo* kernel = nullptr;

  // Drops repeated ids, keeping first occurrences in order.
  void Dedupe();
};

// The packed argument buffer of the `extra` launch form, with its size in
// `*size`; null when `extra` names anything else (the driver rejects that
// launch) or lacks the buffer or its size.
const unsigned char* PackedLaunchArgs(void** extra, size_t* size);

// Fills kernel->probes from kernel->params and gives the description a new
// serial. KernelCache does this for the descriptions it builds; one built
// by hand must call it, and again after any change to its params.
void IndexProbes(KernelInfo* kernel);

// Fills `out` for a launch of `kernel` with the arguments given either as
// kernelParams or as the `extra` packed buffer. When the layout is unknown,
// nothing can be inferred and `out` stays empty.
void InferLaunchAccesses(const KernelInfo& kernel, void** params, void** extra,
                         const BufferRegistry& registry, Accesses* out);

}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_LAUNCH_INFERENCE_H_
