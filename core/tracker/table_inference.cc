#include "core/tracker/table_inference.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace stensor {

TableInference::TableInference(const Driver* driver, MemoryManager* memory,
                               const CaptureState* capture, const BufferRegistry* registry,
                               const PinnedHost* pinned, bool whole,
                               std::function<void(std::string)> log)
    : driver_(driver),
      memory_(memory),
      registry_(registry),
      pinned_(pinned),
      whole_(whole),
      reader_(driver, memory, capture, &tables_, registry, pinned, std::move(log)) {
  // A range's marks, and a pending host write's, are events (MarkAfter);
  // one observed complete needs no wait.
  auto done = [this](const PointerTables::Mark& m) { return reader_.MarkDone(m); };
  tables_.SetMarkDone(done);
  host_writes_.SetMarkDone(done);
}

void TableInference::ChangedByKernel(const KernelInfo& kernel, const Accesses& accesses,
                                     CUstream stream) {
  // A kernel may rewrite the pointers of any table it writes, from the
  // pointers it writes through on; one whose accesses are unknown, those of
  // any table.
  PointerTables::Mark mark;  // one event for all of them
  auto after = [&] {
    if (!mark) mark = reader_.MarkAfter(stream);
    return mark;
  };
  if (!tables_.empty()) {
    absl::InlinedVector<PointerTables::Reach, 8> writes;
    for (const Accesses::Reach& w : accesses.write_reach) writes.push_back({w.id, w.from});
    // Written buffers the reach was not found for (no tables when the
    // launch began): whole.
    for (uint64_t id : accesses.writes) {
      if (std::none_of(writes.begin(), writes.end(),
                       [&](const PointerTables::Reach& w) { return w.id == id; })) {
        writes.push_back({id, 0});
      }
    }
    tables_.OnDeviceWrite(writes, after);
  }
  // And it may store pointers through its pointer-to-pointer parameters:
  // tables built on the device, as far as each buffer goes.
  for (const Accesses::TableParam& p : accesses.table_params) {
    if (p.slots_written && p.id != 0) OnPointerWrite(p.id, p.address, after);
  }
  if (!kernel.layout_known || accesses.unknown_tables) tables_.MarkAllStale();
}

void TableInference::OnPointerWrites(absl::Span<const std::pair<uint64_t, uint64_t>> writes) {
  for (const auto& [id, address] : writes) {
    OnPointerWrite(id, address, [] { return PointerTables::AnyWriter(); });
  }
}

void TableInference::OnPointerWrite(uint64_t id, uint64_t address,
                                    absl::FunctionRef<PointerTables::Mark()> mark) {
  std::optional<Buffer> table = registry_->Find(address);
  if (table && table->id == id) tables_.OnPointerWrite(*table, address, mark());
}

bool TableInference::SourceSettled(uint64_t src, uint64_t bytes, CUstream stream) {
  if (!IsDeviceReachableHost(src)) return true;  // pageable: read at the call
  // Work queued on the stream that cannot write the source does not matter.
  return !host_writes_.MayWrite(src, bytes) || reader_.StreamIdle(stream);
}

void TableInference::OnHostWrite(uint64_t dst, uint64_t bytes, CUstream stream) {
  if (memory_ == nullptr || bytes == 0) return;
  // Pageable memory is never an upload's pending source.
  if (bytes != HostWrites::kEverywhere && !IsDeviceReachableHost(dst)) return;
  host_writes_.Add(dst, bytes, reader_.MarkAfter(stream));
}

void TableInference::FindParamReach(const KernelInfo& kernel, void** params, void** extra,
                                    ParamReaches* reach) const {
  ForEachParamPointer(kernel, params, extra, [&](uint64_t id, uint64_t word, bool written) {
    auto it =
        std::find_if(reach->begin(), reach->end(), [&](const ParamReach& r) { return r.id == id; });
    if (it == reach->end()) {
      reach->push_back({id, word, UINT64_MAX});
      it = reach->end() - 1;
    }
    it->from = std::min(it->from, word);
    if (written) it->write_from = std::min(it->write_from, word);
  });
}

void TableInference::Expand(const KernelInfo& kernel, void** params, void** extra, CUstream stream,
                            Accesses* a) {
  // Every buffer the launch reaches directly may be a table, and so may the
  // targets of a table (`T***`), a few levels deep. A kernel reaches a
  // buffer from the lowest pointer into it that it is given on.
  constexpr int kMaxDepth = 4;
  const size_t direct_end = a->reads.size();  // targets are appended after
  ParamReaches direct;
  FindParamReach(kernel, params, extra, &direct);
  // Conservative inference trusts no pointer to bound a kernel's reach
  // either: whole buffers.
  const bool whole = whole_;
  if (whole) {
    for (ParamReach& p : direct) {
      p.from = 0;
      if (p.write_from != UINT64_MAX) p.write_from = 0;
    }
  }
  a->write_reach.clear();
  for (const ParamReach& p : direct) {
    if (p.write_from != UINT64_MAX) a->write_reach.push_back({p.id, p.write_from});
  }
  // What inference found and this walk did not (it reads the same words):
  // whole buffers.
  for (size_t i = 0; i < direct_end; ++i) {
    const uint64_t id = a->reads[i];
    if (std::none_of(direct.begin(), direct.end(),
                     [&](const ParamReach& p) { return p.id == id; })) {
      direct.push_back({id, 0, UINT64_MAX});
    }
  }
  for (uint64_t id : a->writes) {
    if (std::none_of(a->write_reach.begin(), a->write_reach.end(),
                     [&](const Accesses::Reach& w) { return w.id == id; })) {
      a->write_reach.push_back({id, 0});
    }
  }
  a->reach_known = true;
  auto write_from = [&](uint64_t id, uint64_t from) {
    for (Accesses::Reach& w : a->write_reach) {
      if (w.id == id) {
        w.from = std::min(w.from, from);
        return;
      }
    }
    a->write_reach.push_back({id, from});
  };
  using Reaches = absl::InlinedVector<PointerTables::Reach, 8>;
  Reaches level;
  Reaches seen;  // the lowest address each buffer was followed from
  for (const ParamReach& p : direct) {
    level.push_back({p.id, p.from});
    seen.push_back({p.id, p.from});
  }
  std::vector<PointerTables::Found> found;
  std::vector<uint64_t> words;
  auto add_refs = [&](uint64_t table, bool writes, Reaches* next) {
    Accesses::TableUse use{table, writes, {}};
    registry_->FindAll(words.data(), words.size(), [&](size_t k, uint64_t id) {
      const uint64_t at = whole ? 0 : words[k];
      if (std::find(use.refs.begin(), use.refs.end(), id) == use.refs.end()) {
        use.refs.push_back(id);
        a->reads.push_back(id);
        if (writes) a->writes.push_back(id);
      }
      if (writes) write_from(id, at);
      auto s = std::find_if(seen.begin(), seen.end(),
                            [&](const PointerTables::Reach& r) { return r.id == id; });
      if (s != seen.end() && s->from <= at) return;
      if (s == seen.end()) {
        seen.push_back({id, at});
      } else {
        s->from = at;
      }
      auto n = std::find_if(next->begin(), next->end(),
                            [&](const PointerTables::Reach& r) { return r.id == id; });
      if (n == next->end()) {
        next->push_back({id, at});
      } else {
        n->from = std::min(n->from, at);
      }
    });
    a->tables.push_back(std::move(use));
  };
  for (int depth = 0; depth < kMaxDepth && !level.empty(); ++depth) {
    found.clear();
    tables_.Collect(level, &found);
    // Where a read-back learns a new range: a table parameter at the first
    // level into bytes no range covers is a table of unknown contents.
    absl::InlinedVector<uint64_t, 8> learn(found.size(), 0);
    if (depth == 0) {
      for (const Accesses::TableParam& p : a->table_params) {
        if (p.id == 0 || tables_.Covers(p.id, p.address)) continue;
        auto known = std::find_if(found.begin(), found.end(),
                                  [&](const PointerTables::Found& f) { return f.id == p.id; });
        if (known == found.end()) {
          found.push_back({p.id, PointerTables::State::kNone, 0, p.address, {}, {}});
          learn.push_back(p.address);
        } else {
          uint64_t& l = learn[known - found.begin()];
          l = l == 0 ? p.address : std::min(l, p.address);
        }
      }
    }
    Reaches next;
    for (size_t i = 0; i < found.size(); ++i) {
      PointerTables::Found& f = found[i];
      // The targets are only read when every direct hit on this buffer came
      // through a parameter that makes them const (`T const* const*`).
      bool writes = true;
      uint64_t address = f.base;
      if (depth == 0) {
        size_t hits = std::count(a->reads.begin(), a->reads.begin() + direct_end, f.id);
        size_t const_hits = 0;
        for (const Accesses::TableParam& p : a->table_params) {
          if (p.id != f.id) continue;
          if (address == 0) address = p.address;
          if (p.pointees == Pointees::kConst) ++const_hits;
        }
        writes = const_hits < hits;
      }
      words = std::move(f.words);
      if (f.state == PointerTables::State::kStale || learn[i] != 0) {
        // Written on the device since its pointers were known (or never
        // known): read it back, or count the launch's accesses as unknown.
        std::optional<Buffer> table = registry_->Find(address);
        if (!table || table->id != f.id ||
            !reader_.ReadBack(*table, f.stale, learn[i], f.from, stream, &words)) {
          a->unknown_tables = true;
        }
      }
      if (!words.empty()) add_refs(f.id, writes, &next);
    }
    level = std::move(next);
  }
  // Targets deeper than followed may be tables too.
  if (!level.empty() && !tables_.empty()) {
    found.clear();
    tables_.Collect(level, &found);
    if (!found.empty()) a->unknown_tables = true;
  }
  // Tables outside tracked buffers: memory the driver can describe (pinned
  // or registered host memory, device memory stensor does not track) is
  // read; anything else is memory nobody knows.
  for (const Accesses::TableParam& p : a->table_params) {
    if (p.id != 0) continue;
    words.clear();
    if (!reader_.ReadUntracked(p.address, stream, &words)) {
      a->unknown_tables = true;
      continue;
    }
    Reaches ignored;  // targets of host tables: one level
    if (!words.empty()) add_refs(0, p.pointees != Pointees::kConst, &ignored);
  }
  // A table nobody can read: every buffer whose address would fault if
  // the kernel reached it comes in first (without host-located VMM, every
  // swappable one, since any could be evicted before the launch; the launch
  // fails with out of memory if that does not fit under the cap); the rest
  // of the care is BeginUnknown's and MarkAllWritten's.
  if (a->unknown_tables && memory_) {
    const size_t before = a->reads.size();
    memory_->AppendUnreadable(&a->reads);
    a->writes.append(a->reads.begin() + before, a->reads.end());
  }
}

bool TableInference::ParamsReachHost(const KernelInfo& kernel, void** params, void** extra) const {
  absl::InlinedVector<uint64_t, 16> words;
  ForEachParamWord(kernel, params, extra, [&](uint64_t word, bool) {
    if (word != 0) words.push_back(word);
  });
  if (words.empty()) return false;
  // A word into a tracked buffer is device memory; any other may be host
  // memory the program pinned, registered or mapped (the driver knows).
  absl::InlinedVector<bool, 16> device(words.size(), false);
  registry_->FindAll(words.data(), words.size(), [&](size_t i, uint64_t) { device[i] = true; });
  for (size_t i = 0; i < words.size(); ++i) {
    if (!device[i] && IsDeviceReachableHost(words[i])) return true;
  }
  return false;
}

bool TableInference::IsDeviceReachableHost(uint64_t addr) const {
  if (pinned_->Contains(addr)) return true;
  unsigned type = 0;
  return driver_->cuPointerGetAttribute != nullptr &&
         driver_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) ==
             CUDA_SUCCESS &&
         type == CU_MEMORYTYPE_HOST;
}

size_t TableInference::OnCopy(CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes,
                              bool linear, HostCopy* host) {
  std::optional<Buffer> to = registry_->Find(dst);
  std::optional<Buffer> from = registry_->Find(src);
  bool from_host = kind == CopyKind::kHostToDevice;
  if (!from && kind == CopyKind::kDefault) {
    // Unified addressing: host memory if the driver does not know it as
    // device memory (pageable memory is unknown to it).
    unsigned type = 0;
    CUresult r = driver_->cuPointerGetAttribute != nullptr
                     ? driver_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, src)
                     : CUDA_ERROR_NOT_FOUND;
    from_host = pinned_->Contains(src) || r == CUDA_ERROR_INVALID_VALUE ||
                (r == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST);
  }
  // A word pointing into pinned memory, landing where a kernel can read it
  // (rows of a region are not scanned: any might): HostWrites.
  if (memory_ && from_host && !host_writes_.escaped() &&
      (linear ? pinned_->HoldsPointer(dst, reinterpret_cast<const void*>(src), bytes)
              : pinned_->Any())) {
    host_writes_.Escaped();
  }
  if (!to) return 0;  // into host memory or untracked device memory
  // What tells that the copy landed: an event after it on its stream; for
  // a graph's node, or a caller that names no stream, nothing (unknown).
  auto landing = [&]() -> PointerTables::Mark {
    if (host == nullptr || !host->waitable || host->in_graph) {
      return PointerTables::AnyWriter();
    }
    return reader_.MarkAfter(host->stream);
  };
  if (!linear) {
    // Rows of a region: whatever landed there is not scanned.
    const PointerTables::Reach reach{to->id, dst};
    tables_.OnDeviceWrite(absl::MakeConstSpan(&reach, 1), landing);
    return 0;
  }
  if (from_host) {
    const void* p = reinterpret_cast<const void*>(src);
    PointerTables::HostScan scan = PointerTables::ScanHost(dst, p, bytes, *registry_);
    bool settled = host == nullptr || host->settled;
    // A table lands (the destination is one, or the source holds pointers
    // now) from a source that queued work may still write: once the stream
    // ran all of that, the source holds what the copy copied.
    const bool lands = scan.found > 0 || (!settled && tables_.Get(to->id, nullptr, nullptr) !=
                                                          PointerTables::State::kNone);
    bool waited = false;
    if (!settled && host->waitable && lands && reader_.WaitForStream(host->stream)) {
      scan = PointerTables::ScanHost(dst, p, bytes, *registry_);
      settled = true;
      waited = true;
    }
    if (host != nullptr) host->settled = settled;
    // A range learnt from a copy still in flight: a read-back of it, once
    // something may have written it, waits for the copy too.
    PointerTables::Mark mark = lands && !waited ? landing() : nullptr;
    return tables_.ApplyHostWrite(*to, std::move(scan), settled, std::move(mark));
  }
  tables_.OnDeviceCopy(*to, dst, from ? &*from : nullptr, src, bytes, landing);
  return 0;
}

void TableInference::OnMemset(uint64_t dst, uint64_t bytes, bool linear) {
  if (tables_.empty()) return;
  std::optional<Buffer> b = registry_->Find(dst);
  if (!b) return;
  if (linear) {
    tables_.OnClear(*b, dst, bytes);
  } else {
    const PointerTables::Reach reach{b->id, dst};
    tables_.OnDeviceWrite(absl::MakeConstSpan(&reach, 1),
                          [] { return PointerTables::AnyWriter(); });
  }
}

}  // namespace stensor
