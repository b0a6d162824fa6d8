// TableInference: the program's pointer tables (buffers of device pointers a
// kernel follows: attention and grouped-GEMM pointer arrays, multi-tensor
// argument structs) as its copies, memsets and kernels change them, and what
// a launch reaches through them. It owns the tables, the record of queued
// work that may write host memory (a table upload's source) and the reader
// that reads a stale table back before a launch follows it.
//
// Uncapped it only keeps what the access log reports; under a cap a launch's
// reach through its tables decides what must be resident, so a table whose
// contents nobody can know makes every swappable buffer come in.
//
// Thread-safety: any thread; its parts each have their own lock.
#ifndef STENSOR_CORE_TRACKER_TABLE_INFERENCE_H_
#define STENSOR_CORE_TRACKER_TABLE_INFERENCE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/capture.h"
#include "core/inference/copy_ranges.h"
#include "core/inference/launch_inference.h"
#include "core/inference/pointer_tables.h"
#include "core/swap/memory_manager.h"
#include "core/tracker/host_writes.h"
#include "core/tracker/pinned_host.h"
#include "core/tracker/table_reader.h"

namespace stensor {

class TableInference {
 public:
  // `memory`: the manager of the cap, or null without one. `whole`: every
  // pointer is taken to reach its buffer from the start (conservative write
  // inference). `log`: takes an access-log record, or empty without a log.
  // The others outlive this.
  TableInference(const Driver* driver, MemoryManager* memory, const CaptureState* capture,
                 const BufferRegistry* registry, const PinnedHost* pinned, bool whole,
                 std::function<void(std::string)> log);

  // No table known: a launch of a kernel without pointer-to-pointer
  // parameters has nothing to follow.
  bool empty() const { return tables_.empty(); }

  // Adds to `accesses` the buffers reached through the pointer tables the
  // launch touches (each buffer it reaches directly may be a table, and so
  // may a table's targets, a few levels deep), and the lowest address it
  // writes each buffer through (Accesses::write_reach). A stale table is
  // read back after the work that could have written it; one nobody can
  // read makes the launch's tables unknown (and, under a cap, appends
  // every buffer that would fault if reached).
  void Expand(const KernelInfo& kernel, void** params, void** extra, CUstream stream,
              Accesses* accesses);
  // Calls fn(id, word, written) for each parameter word of the launch that
  // points into a tracked buffer (`written`: through a written parameter).
  template <typename Fn>
  void ForEachParamPointer(const KernelInfo& kernel, void** params, void** extra, Fn&& fn) const;

  // A kernel handed a pointer into pinned host memory may write it, and
  // store it where later kernels find it; one of unknown parameters may
  // have been handed one: then no queued work is known not to write host
  // memory (HostWrites::Escaped).
  void NoteHostPointers(const KernelInfo& kernel, void** params, void** extra) {
    if (memory_ == nullptr || host_writes_.escaped()) return;
    if (!kernel.layout_known || (pinned_->Any() && ParamsReachHost(kernel, params, extra))) {
      host_writes_.Escaped();
    }
  }
  // A launch submitted on `stream`: the tables it may have rewritten (from
  // the pointers it writes through on; every table when its accesses are
  // unknown) go stale, and so does whatever it may have stored pointers in
  // through a pointer-to-pointer parameter (PointerTables::OnPointerWrite).
  void OnKernel(const KernelInfo& kernel, const Accesses& accesses, CUstream stream) {
    // Inline: the uncapped launch path pays one test when no table is known.
    if (!tables_.empty() || !accesses.table_params.empty() || !kernel.layout_known ||
        accesses.unknown_tables) {
      ChangedByKernel(kernel, accesses, stream);
    }
  }
  // A graph's kernel nodes may have written `writes`; every table goes
  // stale after a graph of unknown nodes, or one whose changes to the
  // tables were applied before it failed to launch.
  void OnDeviceWrites(absl::Span<const uint64_t> writes) { tables_.OnDeviceWrite(writes); }
  // Its kernel nodes may have stored pointers through pointer-to-pointer
  // parameters, each (buffer id, address): as OnKernel, writers unknown.
  void OnPointerWrites(absl::Span<const std::pair<uint64_t, uint64_t>> writes);
  void MarkAllStale() { tables_.MarkAllStale(); }
  // Work of unknown accesses (a graph's unknown nodes) may have handed the
  // device a pointer into pinned memory.
  void OnUnknownWork() { host_writes_.Escaped(); }
  // Buffer `id` is gone: no longer a table.
  void OnFree(uint64_t id) { tables_.OnFree(id); }

  // A copy's host source: `settled` (SourceSettled, asked before the copy
  // was submitted) is false when work queued ahead of the copy may still
  // write the source, whose scan is then only a guess. If a table lands
  // there and `waitable`, the copy's `stream` is waited for, the source
  // scanned again and `settled` set; otherwise the table stays stale until
  // read back. `in_graph`: a node of a graph launched after this call, so
  // nothing recorded on the stream now tells when the copy landed.
  struct HostCopy {
    bool settled = true;
    bool waitable = false;
    CUstream stream = nullptr;
    bool in_graph = false;
  };
  // A successful copy of `bytes` from src to dst, `kind` as the API states
  // it, on one contiguous range when `linear`: a host source is scanned for
  // pointers into live buffers, a device copy carries the entries of its
  // source along. Returns the number of entries found by a scan (for the
  // log).
  size_t OnCopy(CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes, bool linear,
                HostCopy* host);
  // A successful memset: no pointers left in the range.
  void OnMemset(uint64_t dst, uint64_t bytes, bool linear);
  // Asked before an asynchronous copy from host memory at `src` into a
  // tracked buffer is submitted on `stream`: false when that is memory a
  // device reaches and work queued that may write those `bytes` has not
  // run, so the words it holds now need not be what lands. Under a cap only.
  bool SourceSettled(uint64_t src, uint64_t bytes, CUstream stream);
  // Device work queued on `stream` may write [dst, dst+bytes) (everywhere,
  // when `bytes` is HostWrites::kEverywhere and dst 0) of host memory a
  // device reaches: the source of a later upload there is settled once it
  // ran. Under a cap only.
  void OnHostWrite(uint64_t dst, uint64_t bytes, CUstream stream);

  // Host memory the driver can reach (pinned, mapped, registered), which
  // device work may write; false for pageable memory.
  bool IsDeviceReachableHost(uint64_t addr) const;
  // True when nothing is queued on `stream` (TableReader::StreamIdle).
  bool StreamIdle(CUstream stream) { return reader_.StreamIdle(stream); }

 private:
  // The lowest address at which the launch's parameters reach each buffer,
  // and whether some parameter reaching it is written through.
  struct ParamReach {
    uint64_t id = 0;
    uint64_t from = 0;
    uint64_t write_from = UINT64_MAX;  // none
  };
  using ParamReaches = absl::InlinedVector<ParamReach, 8>;
  void FindParamReach(const KernelInfo& kernel, void** params, void** extra,
                      ParamReaches* reach) const;
  // A pointer store through a parameter at `address` into buffer `id`
  // (still that buffer), marked `mark()`.
  void OnPointerWrite(uint64_t id, uint64_t address, absl::FunctionRef<PointerTables::Mark()> mark);
  // OnKernel's work where there is some.
  void ChangedByKernel(const KernelInfo& kernel, const Accesses& accesses, CUstream stream);
  // Calls fn(word, written) for each word of the launch's pointer
  // parameters, whatever it points to.
  template <typename Fn>
  void ForEachParamWord(const KernelInfo& kernel, void** params, void** extra, Fn&& fn) const;
  // Whether a launch's pointer parameters may point into host memory a
  // device reaches: words that hit no tracked buffer, in the pinned and
  // registered ranges or, where not, as the driver tells.
  bool ParamsReachHost(const KernelInfo& kernel, void** params, void** extra) const;

  const Driver* const driver_;
  MemoryManager* const memory_;
  const BufferRegistry* const registry_;
  const PinnedHost* const pinned_;
  const bool whole_;
  PointerTables tables_;
  HostWrites host_writes_;
  TableReader reader_;
};

template <typename Fn>
void TableInference::ForEachParamWord(const KernelInfo& kernel, void** params, void** extra,
                                      Fn&& fn) const {
  const unsigned char* packed = nullptr;
  size_t packed_size = 0;
  if (params == nullptr) {
    if (extra == nullptr) return;
    packed = PackedLaunchArgs(extra, &packed_size);
    if (packed == nullptr) return;
  }
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
    for (uint32_t k = 0; k < slot.words; ++k) {
      uint64_t word;
      std::memcpy(&word, base + slot.first_word + 8 * k, sizeof(uint64_t));
      fn(word, slot.access == ParamAccess::kReadWrite);
    }
  }
}

template <typename Fn>
void TableInference::ForEachParamPointer(const KernelInfo& kernel, void** params, void** extra,
                                         Fn&& fn) const {
  constexpr size_t kBatch = 64;
  uint64_t words[kBatch];
  bool written[kBatch];
  size_t n = 0;
  auto flush = [&] {
    registry_->FindAll(words, n, [&](size_t i, uint64_t id) { fn(id, words[i], written[i]); });
    n = 0;
  };
  ForEachParamWord(kernel, params, extra, [&](uint64_t word, bool w) {
    words[n] = word;
    written[n] = w;
    if (++n == kBatch) flush();
  });
  if (n > 0) flush();
}

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_TABLE_INFERENCE_H_
