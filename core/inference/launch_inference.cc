#include "core/inference/launch_inference.h"

#include <algorithm>
#include <cstring>

#include "absl/base/attributes.h"
#include "core/base/thread_cache.h"

namespace stensor {
namespace {

// Past this many parameters the layout query is assumed to be broken.
constexpr size_t kMaxParams = 4096;

void DedupeIds(IdList* ids) {
  size_t kept = 0;
  for (size_t i = 0; i < ids->size(); ++i) {
    bool seen = false;
    for (size_t j = 0; j < kept; ++j) seen |= (*ids)[j] == (*ids)[i];
    if (!seen) (*ids)[kept++] = (*ids)[i];
  }
  ids->resize(kept);
}

// Looks up every candidate word of a kernelParams launch, skipping null
// parameters, and appends the hits to `out` through local pointers, both
// lists' sizes set once at the end. `kFew`: at most LaunchMemo::kWords
// words, so room for all of them is made once (inline room, for a fresh
// `out`) and the loop checks none; otherwise the room is checked per hit,
// since a large struct parameter has many words and few hits.
template <bool kFew>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void LookUpWords(const KernelInfo& kernel, void** params,
                                                     const BufferRegistry& registry,
                                                     Accesses* out) {
  const BufferRegistry::Reader reader(registry);
  const size_t n = kernel.probes.size();
  if (kFew) {
    out->reads.reserve(out->reads.size() + n);
    out->writes.reserve(out->writes.size() + n);
  }
  uint64_t* r = out->reads.end();
  uint64_t* r_room = out->reads.room_end();
  uint64_t* w = out->writes.end();
  uint64_t* w_room = out->writes.room_end();
  for (size_t i = 0; i < n; ++i) {
    const WordProbe& p = kernel.probes[i];
    const unsigned char* base = static_cast<const unsigned char*>(params[p.param]);
    if (base == nullptr) continue;
    uint64_t word;
    std::memcpy(&word, base + p.offset, sizeof(word));
    const uint64_t id = reader.Lookup(word);
    if (id == 0) continue;
    if (!kFew && ABSL_PREDICT_FALSE(r == r_room)) {
      r = out->reads.GrowAt(r);
      r_room = out->reads.room_end();
    }
    *r++ = id;
    if (p.writes) {
      if (!kFew && ABSL_PREDICT_FALSE(w == w_room)) {
        w = out->writes.GrowAt(w);
        w_room = out->writes.room_end();
      }
      *w++ = id;
    }
  }
  out->reads.set_end(r);
  out->writes.set_end(w);
}

// Kernels with more words than a memo holds, and launches with a null
// first parameter: out of line, off the hot path's frame.
ABSL_ATTRIBUTE_NOINLINE void LookUpManyWords(const KernelInfo& kernel, void** params,
                                             const BufferRegistry& registry, Accesses* out) {
  LookUpWords<false>(kernel, params, registry, out);
}

// Looks up the words of a launch of at most LaunchMemo::kWords of them
// straight into `m` (words, hits and their liveness cells), then appends
// the hits to `out`. `m` is valid afterwards only when no parameter was
// null (then every word was read). Out of line: a steady state fills each
// slot once.
ABSL_ATTRIBUTE_NOINLINE void FillMemo(const KernelInfo& kernel, void** params, uint64_t generation,
                                      const BufferRegistry& registry, LaunchMemo* m,
                                      LaunchMemoCounts* counts, Accesses* out) {
  const BufferRegistry::Reader reader(registry);
  const size_t n = kernel.probes.size();
  uint32_t reads = 0, writes = 0, hit_words = 0;
  bool complete = true;
  m->registry = 0;
  for (size_t i = 0; i < n; ++i) {
    const WordProbe& p = kernel.probes[i];
    const unsigned char* base = static_cast<const unsigned char*>(params[p.param]);
    if (base == nullptr) {
      complete = false;
      continue;
    }
    uint64_t word;
    std::memcpy(&word, base + p.offset, sizeof(word));
    m->words[i] = word;
    const BufferRegistry::LivenessCell* cell = nullptr;
    const uint64_t id = reader.Lookup(word, &cell);
    if (id == 0) continue;
    // At most one hit per word, so the memo's arrays hold them.
    hit_words |= uint32_t{1} << i;
    m->cells[reads] = cell;
    m->read[reads++] = id;
    if (p.writes) m->written[writes++] = id;
  }
  m->reads = reads;
  m->writes = writes;
  m->hit_words = hit_words;
  out->reads.append(m->read, m->read + reads);
  out->writes.append(m->written, m->written + writes);
  if (!complete) return;
  m->generation = generation;
  m->registry = registry.instance();
  ++counts->fills;
}

// Whether the answer in `m` (filled, `n` words) still holds although the
// registry's generation moved: a buffer came or went, most often one that
// none of these words reaches (a per-step temporary). Out of line: once
// per slot and generation.
ABSL_ATTRIBUTE_NOINLINE bool StillValid(const LaunchMemo& m, size_t n,
                                        const BufferRegistry& registry, LaunchMemoCounts* counts) {
  uint32_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if ((m.hit_words >> i) & 1) {
      if (!BufferRegistry::StillLive(m.cells[k], m.read[k])) return false;
      ++k;
    } else if (!registry.OutsideBounds(m.words[i])) {
      return false;  // a buffer may have been added where it points
    }
  }
  ++counts->revalidations;
  return true;
}

// The common form, the hot path: kernelParams and no pointer-table
// parameter. A training step launches the same kernels on the same buffers
// over and over, so the answer for a kernel's words is kept in a per-thread
// memo (slot by kernel and first word); checking it costs a compare per
// word instead of a lookup. A launch seen for the first time only tags its
// slot (kernel and first word), and the second records the answer, so that
// launches on ever new words (a kernel walking a buffer) cost a plain
// lookup and a tag. While the registry's generation says no buffer came or
// went, a recorded answer is used as it is; after a change, it is checked
// once against its own buffers' liveness (StillValid) before it is used.
void InferFromParams(const KernelInfo& kernel, void** params, const BufferRegistry& registry,
                     Accesses* out) {
  const size_t n = kernel.probes.size();
  const WordProbe* const probes = kernel.probes.data();
  // Kernels with more candidate words than a memo holds go without one, as
  // does a launch whose first parameter pointer is null (skipped, not read:
  // the driver rejects such a launch).
  if (n == 0 || n > LaunchMemo::kWords || params[probes[0].param] == nullptr) {
    LookUpManyWords(kernel, params, registry, out);
    return;
  }
  uint64_t first;
  std::memcpy(&first, static_cast<const unsigned char*>(params[probes[0].param]) + probes[0].offset,
              sizeof(first));
  // Read before any lookup or check: a change during them makes the memo
  // stale.
  const uint64_t generation = registry.generation();
  LaunchMemos& memos = PerThread<LaunchMemos>::Get();
  LaunchMemo& m = memos.slots[((kernel.serial ^ (first >> 8)) * 0x9E3779B97F4A7C15ull) >> 56];
  if (m.kernel != kernel.serial || m.words[0] != first) {
    // A first sight: the tag only.
    m.registry = 0;
    m.kernel = kernel.serial;
    m.words[0] = first;
  } else if (m.registry != registry.instance()) {
    // The second sight (or the first since the slot was invalidated).
    FillMemo(kernel, params, generation, registry, &m, &memos.counts, out);
    return;
  } else {
    // Each word is compared as it is read.
    size_t i = 1;
    for (; i < n; ++i) {
      const unsigned char* base = static_cast<const unsigned char*>(params[probes[i].param]);
      uint64_t word;
      if (base == nullptr) break;
      std::memcpy(&word, base + probes[i].offset, sizeof(word));
      if (word != m.words[i]) break;
    }
    if (i == n) {
      if (ABSL_PREDICT_FALSE(m.generation != generation)) {
        if (!StillValid(m, n, registry, &memos.counts)) {
          FillMemo(kernel, params, generation, registry, &m, &memos.counts, out);
          return;
        }
        m.generation = generation;
      }
      out->reads.append(m.read, m.read + m.reads);
      out->writes.append(m.written, m.written + m.writes);
      return;
    }
    // Other words after the same first one: a first sight of these, so the
    // slot keeps only the tag.
    m.registry = 0;
  }
  LookUpWords<true>(kernel, params, registry, out);
}

}  // namespace

void IdList::Grow(size_t n) {
  const size_t capacity = std::max(n, 2 * capacity_);
  auto* grown = new uint64_t[capacity];
  std::copy(data_, data_ + size_, grown);
  if (data_ != inline_) delete[] data_;
  data_ = grown;
  capacity_ = capacity;
}

LaunchMemoCounts ThreadLaunchMemoCounts() { return PerThread<LaunchMemos>::Get().counts; }

void Accesses::Dedupe() {
  DedupeIds(&reads);
  DedupeIds(&writes);
}

uint64_t KernelCache::NextInstance() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

const KernelInfo* KernelCache::GetMissed(CUfunction f, uint64_t generation, KernelMemo* m) {
  bool cacheable = false;
  const KernelInfo* info = Lookup(f, generation, &cacheable);
  *m = cacheable ? KernelMemo{instance_, generation, f, info} : KernelMemo{};
  return info;
}

const KernelInfo* KernelCache::Lookup(CUfunction f, uint64_t generation, bool* cacheable) {
  {
    // Entries are safe even while an unload runs: those that could change
    // meaning were forgotten when it began, and none is added until it ends.
    ReaderMutexLock lock(&mu_);
    auto it = cache_.find(f);
    if (it != cache_.end()) {
      *cacheable = true;
      return it->second.info.get();
    }
  }
  CUmodule module = nullptr;
  std::unique_ptr<KernelInfo> info = Describe(f, &module);
  MutexLock lock(&mu_);
  if (unloading_ > 0 || generation_.load(std::memory_order_relaxed) != generation) {
    // An unload overlapped the description: the handle may have changed
    // meaning while it was built. Use it once, keep it alive for the
    // caller, remember nothing.
    *cacheable = false;
    retired_.push_back(std::move(info));
    return retired_.back().get();
  }
  *cacheable = true;
  auto [it, inserted] = cache_.try_emplace(f, Entry{std::move(info), module});
  return it->second.info.get();
}

void KernelCache::Forget(CUmodule module) {
  for (auto it = cache_.begin(); it != cache_.end();) {
    Entry& e = it->second;
    if (module == nullptr || e.module == nullptr || e.module == module) {
      retired_.push_back(std::move(e.info));
      cache_.erase(it++);
    } else {
      ++it;
    }
  }
}

KernelCache::UnloadScope::UnloadScope(KernelCache* cache, CUmodule module)
    : cache_(cache), module_(module) {
  MutexLock lock(&cache_->mu_);
  ++cache_->unloading_;
  cache_->Forget(module_);
  cache_->generation_.fetch_add(1, std::memory_order_acq_rel);
}

KernelCache::UnloadScope::~UnloadScope() {
  MutexLock lock(&cache_->mu_);
  --cache_->unloading_;
  // A description begun while the scope was open and finished after it
  // closed must not be cached either: Lookup compares generations.
  cache_->generation_.fetch_add(1, std::memory_order_acq_rel);
}

std::unique_ptr<KernelInfo> KernelCache::Describe(CUfunction f, CUmodule* module) const {
  auto info = std::make_unique<KernelInfo>();
  const char* name = nullptr;
  // A CUkernel may be launched through cuLaunchKernel too; its handle is
  // not a CUfunction, which the function queries reject.
  bool as_function =
      driver_->cuFuncGetName != nullptr && driver_->cuFuncGetName(&name, f) == CUDA_SUCCESS;
  if (!as_function && driver_->cuKernelGetName != nullptr) {
    driver_->cuKernelGetName(&name, reinterpret_cast<CUkernel>(f));
  }
  // The module decides when the description expires; unknown (null) makes
  // it expire at any unload.
  *module = nullptr;
  if (as_function && driver_->cuFuncGetModule != nullptr &&
      driver_->cuFuncGetModule(module, f) != CUDA_SUCCESS) {
    *module = nullptr;
  }
  info->name = name != nullptr ? name : "";
  KernelSignature signature = ParseKernelSignature(info->name);
  info->demangled = signature.demangled_name;

  auto param_info = [&](size_t i, size_t* offset, size_t* size) -> CUresult {
    if (as_function) {
      if (driver_->cuFuncGetParamInfo == nullptr) return CUDA_ERROR_NOT_FOUND;
      return driver_->cuFuncGetParamInfo(f, i, offset, size);
    }
    if (driver_->cuKernelGetParamInfo == nullptr) return CUDA_ERROR_NOT_FOUND;
    return driver_->cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, offset, size);
  };
  // The documented way to count parameters: query until INVALID_VALUE.
  for (size_t i = 0; i <= kMaxParams; ++i) {
    size_t offset = 0, size = 0;
    CUresult r = param_info(i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) {
      info->layout_known = true;
      break;
    }
    if (r != CUDA_SUCCESS || i == kMaxParams) {
      info->params.clear();
      info->args_size = 0;
      return info;
    }
    ParamSlot slot;
    slot.offset = static_cast<uint32_t>(offset);
    slot.size = static_cast<uint32_t>(size);
    info->params.push_back(slot);
    info->args_size = std::max(info->args_size, slot.offset + slot.size);
  }
  // When the name and the driver disagree on the parameter count, the name
  // describes something else: trust neither and treat everything as written.
  const bool trust_name =
      !conservative_ && signature.parsed && signature.params.size() == info->params.size();
  for (size_t i = 0; i < info->params.size(); ++i) {
    ParamSlot& slot = info->params[i];
    // Words at 8-byte-aligned offsets of the argument buffer, as laid out on
    // the device: where a struct member holding a pointer can sit.
    slot.first_word = (8 - slot.offset % 8) % 8;
    slot.words = slot.size >= slot.first_word + 8 ? (slot.size - slot.first_word) / 8 : 0;
    if (slot.words == 0) {
      slot.access = ParamAccess::kNone;  // too small to hold a pointer
    } else if (!trust_name) {
      slot.access = ParamAccess::kReadWrite;
    } else {
      // An integer the size of a pointer may carry a device address
      // (uintptr_t); if it hits a buffer, nothing says it is only read.
      ParamAccess a = signature.params[i];
      slot.access = a == ParamAccess::kRead ? a : ParamAccess::kReadWrite;
      // A pointer to pointers is one word.
      if (slot.words == 1) slot.pointees = signature.PointeesFor(i);
    }
    info->has_tables |= slot.pointees != Pointees::kNone;
  }
  IndexProbes(info.get());
  return info;
}

const unsigned char* PackedLaunchArgs(void** extra, size_t* size) {
  const void* buffer = nullptr;
  const size_t* buffer_size = nullptr;
  for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      buffer = extra[i + 1];
    } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      buffer_size = static_cast<const size_t*>(extra[i + 1]);
    } else {
      return nullptr;  // unknown key: the driver will reject the launch
    }
  }
  if (buffer == nullptr || buffer_size == nullptr) return nullptr;
  *size = *buffer_size;
  return static_cast<const unsigned char*>(buffer);
}

void IndexProbes(KernelInfo* kernel) {
  static std::atomic<uint64_t> serials{0};
  kernel->serial = serials.fetch_add(1, std::memory_order_relaxed) + 1;
  kernel->probes.clear();
  for (size_t i = 0; i < kernel->params.size(); ++i) {
    const ParamSlot& slot = kernel->params[i];
    if (slot.access == ParamAccess::kNone) continue;
    for (uint32_t k = 0; k < slot.words; ++k) {
      kernel->probes.push_back({static_cast<uint32_t>(i), slot.first_word + 8 * k,
                                slot.access == ParamAccess::kReadWrite});
    }
  }
}

namespace {

// Every other form: the `extra` packed buffer, or kernels with pointer-table
// parameters. Out of line, so that its batching arrays do not cost the hot
// path's frame anything.
ABSL_ATTRIBUTE_NOINLINE void InferGeneral(const KernelInfo& kernel, void** params, void** extra,
                                          const BufferRegistry& registry, Accesses* out) {
  const unsigned char* packed = nullptr;
  size_t packed_size = 0;
  if (params == nullptr) {
    if (extra == nullptr) return;
    packed = PackedLaunchArgs(extra, &packed_size);
    if (packed == nullptr) return;
  }
  // Candidate words with the access of the parameter they sit in, looked up
  // a batch at a time (plain arrays, no heap). Hits go
  // straight into `out`, whose inline capacity holds a typical launch's.
  constexpr size_t kBatch = 64;
  uint64_t words[kBatch];
  ParamAccess access[kBatch];
  size_t n = 0;
  auto flush = [&] {
    registry.FindAll(words, n, [&](size_t i, uint64_t id) {
      out->reads.push_back(id);
      if (access[i] == ParamAccess::kReadWrite) out->writes.push_back(id);
    });
    n = 0;
  };
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    const ParamSlot& slot = kernel.params[i];
    if (slot.access == ParamAccess::kNone) continue;
    const unsigned char* base;
    if (packed != nullptr) {
      if (slot.offset + slot.size > packed_size) continue;
      base = packed + slot.offset;
    } else {
      base = static_cast<const unsigned char*>(params[i]);
      if (base == nullptr) continue;
    }
    if (slot.pointees != Pointees::kNone) {
      // Off the batch: the table itself is looked up on its own, and a
      // table in untracked memory is recorded as such.
      uint64_t word;
      std::memcpy(&word, base + slot.first_word, sizeof(word));
      if (word == 0) continue;
      std::optional<Buffer> b = registry.Find(word);
      out->table_params.push_back(
          {b ? b->id : 0, word, slot.pointees, slot.access == ParamAccess::kReadWrite});
      if (!b) continue;
      out->reads.push_back(b->id);
      if (slot.access == ParamAccess::kReadWrite) out->writes.push_back(b->id);
      continue;
    }
    for (uint32_t k = 0; k < slot.words; ++k) {
      std::memcpy(&words[n], base + slot.first_word + 8 * k, sizeof(uint64_t));
      access[n] = slot.access;
      if (++n == kBatch) flush();
    }
  }
  if (n > 0) flush();
}

}  // namespace

void InferLaunchAccesses(const KernelInfo& kernel, void** params, void** extra,
                         const BufferRegistry& registry, Accesses* out) {
  if (!kernel.layout_known) return;
  if (params != nullptr && !kernel.has_tables) {
    InferFromParams(kernel, params, registry, out);
    return;
  }
  InferGeneral(kernel, params, extra, registry, out);
}

}  // namespace stensor
