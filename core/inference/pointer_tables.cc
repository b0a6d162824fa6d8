#include "core/inference/pointer_tables.h"

#include <algorithm>
#include <cstring>

namespace stensor {

void PointerTables::EraseRange(Table& t, uint64_t dst, uint64_t bytes) {
  auto first = t.entries.lower_bound(dst);
  auto last = bytes > UINT64_MAX - dst ? t.entries.end() : t.entries.lower_bound(dst + bytes);
  t.entries.erase(first, last);
}

size_t PointerTables::Scan(Table& t, uint64_t dst, const unsigned char* src, uint64_t bytes,
                           const BufferRegistry& registry) {
  // Entries sit at 8-byte-aligned device addresses, as a kernel reads them.
  const uint64_t skip = (8 - dst % 8) % 8;
  if (bytes < skip + 8) return 0;
  const uint64_t count = (bytes - skip) / 8;
  const unsigned char* p = src + skip;
  const uint64_t at = dst + skip;
  constexpr size_t kBatch = 512;
  uint64_t words[kBatch];
  size_t found = 0;
  for (uint64_t start = 0; start < count; start += kBatch) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBatch, count - start));
    std::memcpy(words, p + 8 * start, 8 * n);  // the source may be unaligned
    registry.FindAll(words, n, [&](size_t k, uint64_t) {
      t.entries[at + 8 * (start + k)] = words[k];
      ++found;
    });
  }
  return found;
}

const PointerTables::Mark& PointerTables::AnyWriter() {
  static const char anchor = 0;
  static const Mark* any = new Mark(&anchor, [](const void*) {});
  return *any;
}

void PointerTables::Split(Table& t, uint64_t at) {
  auto it = t.ranges.upper_bound(at);
  if (it == t.ranges.begin()) return;
  --it;
  if (it->first >= at || it->second.end <= at) return;
  Range tail = it->second;
  it->second.end = at;
  t.ranges.emplace(at, std::move(tail));
}

std::map<uint64_t, PointerTables::Range>::iterator PointerTables::Isolate(Table& t, uint64_t lo,
                                                                          uint64_t hi) {
  Split(t, lo);
  Split(t, hi);
  return t.ranges.lower_bound(lo);
}

void PointerTables::Cut(Table& t, uint64_t lo, uint64_t hi) {
  auto it = Isolate(t, lo, hi);
  while (it != t.ranges.end() && it->first < hi) it = t.ranges.erase(it);
}

void PointerTables::AddMark(Range& r, const Mark& mark) const {
  if (!mark || r.any) return;
  if (mark == AnyWriter()) {
    r.any = true;
    r.marks.clear();
    return;
  }
  if (std::find(r.marks.begin(), r.marks.end(), mark) != r.marks.end()) return;
  if (r.marks.size() >= kMaxMarks && done_) {
    r.marks.erase(std::remove_if(r.marks.begin(), r.marks.end(), done_), r.marks.end());
  }
  if (r.marks.size() >= kMaxMarks) {
    r.any = true;
    r.marks.clear();
    return;
  }
  r.marks.push_back(mark);
}

void PointerTables::Prune(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Table& t = it->second;
  // A current range without entries holds plain data, as the rest of the
  // buffer does; a stale one may hold pointers written meanwhile.
  for (auto r = t.ranges.begin(); r != t.ranges.end();) {
    auto e = t.entries.lower_bound(r->first);
    const bool holds = e != t.entries.end() && e->first < r->second.end;
    r = !r->second.stale && !holds ? t.ranges.erase(r) : std::next(r);
  }
  if (t.ranges.empty()) by_id_.erase(it);
}

void PointerTables::Publish() {
  ++changes_;
  tables_.store(by_id_.size(), std::memory_order_release);
}

uint64_t PointerTables::Changes() const {
  MutexLock lock(&mu_);
  return changes_;
}

void PointerTables::MarkAllStale() {
  if (empty()) return;
  MutexLock lock(&mu_);
  for (auto& [id, t] : by_id_) {
    for (auto& [start, r] : t.ranges) {
      r.stale = true;
      AddMark(r, AnyWriter());
    }
  }
  Publish();
}

PointerTables::HostScan PointerTables::ScanHost(uint64_t dst, const void* src, uint64_t bytes,
                                                const BufferRegistry& registry) {
  HostScan scan;
  scan.dst = dst;
  scan.bytes = bytes;
  Table t;
  scan.found = Scan(t, dst, static_cast<const unsigned char*>(src), bytes, registry);
  scan.entries = std::move(t.entries);
  return scan;
}

size_t PointerTables::ApplyHostWrite(const Buffer& table, HostScan scan, bool settled,
                                     Mark landing) {
  MutexLock lock(&mu_);
  auto it = by_id_.find(table.id);
  if (it == by_id_.end()) {
    if (scan.found == 0) return 0;
    it = by_id_.emplace(table.id, Table{table.base, {}, {}}).first;
  }
  Table& t = it->second;
  const uint64_t end = scan.dst + scan.bytes;
  EraseRange(t, scan.dst, scan.bytes);
  Cut(t, scan.dst, end);
  t.entries.merge(scan.entries);
  // What lands may differ from what the source holds now: known only once
  // read back after the copy ran.
  if ((scan.found > 0 || !settled) && scan.bytes > 0) {
    Range& r = t.ranges.emplace(scan.dst, Range{end, !settled, false, {}}).first->second;
    AddMark(r, !settled && !landing ? AnyWriter() : landing);
  }
  Prune(table.id);
  Publish();
  return scan.found;
}

size_t PointerTables::OnHostWrite(const Buffer& table, uint64_t dst, const void* src,
                                  uint64_t bytes, bool settled, const BufferRegistry& registry,
                                  Mark landing) {
  // Most copies carry data, not pointers: scan before taking the lock.
  return ApplyHostWrite(table, ScanHost(dst, src, bytes, registry), settled, std::move(landing));
}

void PointerTables::OnDeviceCopy(const Buffer& to, uint64_t dst, const Buffer* from, uint64_t src,
                                 uint64_t bytes) {
  OnDeviceCopy(to, dst, from, src, bytes, [] { return AnyWriter(); });
}

void PointerTables::OnDeviceCopy(const Buffer& to, uint64_t dst, const Buffer* from, uint64_t src,
                                 uint64_t bytes, absl::FunctionRef<Mark()> make_landing) {
  if (empty() || bytes == 0) return;  // nothing known anywhere, nothing to carry
  MutexLock lock(&mu_);
  // Entries shifted off 8-byte alignment are no pointers a kernel reads.
  const bool aligned = (dst - src) % 8 == 0;
  // The source's ranges in the copied bytes, shifted to the destination.
  struct Piece {
    uint64_t lo, hi;
    bool stale;
  };
  std::vector<Piece> pieces;
  std::map<uint64_t, uint64_t> carried;
  auto from_it = from != nullptr ? by_id_.find(from->id) : by_id_.end();
  if (from_it != by_id_.end()) {
    const Table& f = from_it->second;
    auto r = f.ranges.upper_bound(src);
    if (r != f.ranges.begin()) --r;
    for (; r != f.ranges.end() && r->first < src + bytes; ++r) {
      const uint64_t lo = std::max(r->first, src);
      const uint64_t hi = std::min(r->second.end, src + bytes);
      if (lo >= hi) continue;
      pieces.push_back({lo - src + dst, hi - src + dst, r->second.stale || !aligned});
    }
    if (aligned) {
      for (auto e = f.entries.lower_bound(src); e != f.entries.end() && e->first - src < bytes;
           ++e) {
        carried[e->first - src + dst] = e->second;
      }
    }
  }
  auto it = by_id_.find(to.id);  // may invalidate from_it
  if (it == by_id_.end()) {
    if (pieces.empty()) return;  // plain data onto plain data
    it = by_id_.emplace(to.id, Table{to.base, {}, {}}).first;
  }
  Table& t = it->second;
  // Destination ranges overwritten by bytes of unknown make (device data
  // that may hold pointers the device wrote) stay ranges, now stale.
  std::vector<Piece> unknown;
  {
    auto r = Isolate(t, dst, dst + bytes);
    for (; r != t.ranges.end() && r->first < dst + bytes; ++r) {
      uint64_t lo = r->first;
      for (const Piece& p : pieces) {
        if (p.hi <= lo || p.lo >= r->second.end) continue;
        if (p.lo > lo) unknown.push_back({lo, p.lo, true});
        lo = std::max(lo, p.hi);
      }
      if (lo < r->second.end) unknown.push_back({lo, r->second.end, true});
    }
  }
  EraseRange(t, dst, bytes);
  Cut(t, dst, dst + bytes);
  t.entries.merge(carried);
  Mark landing;
  if (!pieces.empty() || !unknown.empty()) landing = make_landing();
  if (!landing) landing = AnyWriter();
  for (const std::vector<Piece>* list : {&pieces, &unknown}) {
    for (const Piece& p : *list) {
      Range& r = t.ranges.emplace(p.lo, Range{p.hi, p.stale, false, {}}).first->second;
      AddMark(r, landing);
    }
  }
  Prune(to.id);
  Publish();
}

void PointerTables::OnClear(const Buffer& table, uint64_t dst, uint64_t bytes) {
  if (empty()) return;
  MutexLock lock(&mu_);
  auto it = by_id_.find(table.id);
  if (it == by_id_.end()) return;
  EraseRange(it->second, dst, bytes);
  Cut(it->second, dst, bytes > UINT64_MAX - dst ? UINT64_MAX : dst + bytes);
  Prune(table.id);
  Publish();
}

void PointerTables::OnDeviceWrite(absl::Span<const Reach> writes, absl::FunctionRef<Mark()> mark) {
  if (empty()) return;
  MutexLock lock(&mu_);
  bool changed = false;
  Mark m;
  for (const Reach& w : writes) {
    auto it = by_id_.find(w.id);
    if (it == by_id_.end()) continue;
    Table& t = it->second;
    // Nothing before the pointer written through is reached.
    Split(t, w.from);
    for (auto r = t.ranges.lower_bound(w.from); r != t.ranges.end(); ++r) {
      if (!changed) {
        m = mark();
        if (!m) m = AnyWriter();
        changed = true;
      }
      r->second.stale = true;
      AddMark(r->second, m);
    }
  }
  if (changed) Publish();
}

void PointerTables::OnDeviceWrite(absl::Span<const uint64_t> ids) {
  std::vector<Reach> writes;
  for (uint64_t id : ids) writes.push_back({id, 0});
  OnDeviceWrite(writes, [] { return AnyWriter(); });
}

void PointerTables::OnPointerWrite(const Buffer& table, uint64_t from, const Mark& mark) {
  const uint64_t end = table.base + table.size;
  if (from < table.base || from >= end) return;
  MutexLock lock(&mu_);
  Table& t = by_id_.try_emplace(table.id, Table{table.base, {}, {}}).first->second;
  Range merged{end, true, false, {}};
  for (auto r = Isolate(t, from, end); r != t.ranges.end() && r->first < end;) {
    if (r->second.any) AddMark(merged, AnyWriter());
    for (const Mark& m : r->second.marks) AddMark(merged, m);
    r = t.ranges.erase(r);
  }
  AddMark(merged, mark ? mark : AnyWriter());
  t.ranges.emplace(from, std::move(merged));
  Publish();
}

void PointerTables::OnFree(uint64_t id) {
  if (empty()) return;
  MutexLock lock(&mu_);
  by_id_.erase(id);
  Publish();
}

size_t PointerTables::Rescan(const Buffer& table, absl::Span<const Window> windows,
                             const void* data, uint64_t since, const BufferRegistry& registry) {
  std::vector<Table> scanned(windows.size());
  size_t found = 0;
  {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < windows.size(); ++i) {
      const uint64_t bytes = windows[i].end - windows[i].start;
      found += Scan(scanned[i], windows[i].start, p, bytes, registry);
      p += bytes;
    }
  }
  MutexLock lock(&mu_);
  auto it = by_id_.find(table.id);
  if (it == by_id_.end()) {
    if (found == 0) return 0;
    it = by_id_.emplace(table.id, Table{table.base, {}, {}}).first;
  }
  Table& t = it->second;
  const bool current = changes_ == since;
  for (size_t i = 0; i < windows.size(); ++i) {
    const Window& w = windows[i];
    std::map<uint64_t, uint64_t>& e = scanned[i].entries;
    const uint64_t last = e.empty() ? w.start : std::prev(e.end())->first + 8;
    if (current) {
      // What the device holds now: the ranges read are current, with no
      // writer left to wait for.
      EraseRange(t, w.start, w.end - w.start);
      t.entries.merge(e);
      auto r = Isolate(t, w.start, w.end);
      for (; r != t.ranges.end() && r->first < w.end; ++r) {
        r->second.stale = false;
        r->second.any = false;
        r->second.marks.clear();
      }
      if (w.learn && last > w.start) {
        Cut(t, w.start, last);
        t.ranges.emplace(w.start, Range{last, false, false, {}});
      }
    } else {
      // Newer entries win over what was read; nothing is vouched for.
      for (const auto& [addr, word] : e) {
        if (!t.entries.emplace(addr, word).second) continue;
        auto r = t.ranges.upper_bound(addr);
        if (r != t.ranges.begin() && std::prev(r)->second.end > addr) continue;
        Range& added = t.ranges.emplace(addr, Range{addr + 8, true, false, {}}).first->second;
        AddMark(added, AnyWriter());
      }
    }
  }
  Prune(table.id);
  Publish();
  return found;
}

size_t PointerTables::Rescan(const Buffer& table, const void* data, uint64_t since,
                             const BufferRegistry& registry) {
  const Window whole{table.base, table.base + table.size, true};
  return Rescan(table, absl::MakeConstSpan(&whole, 1), data, since, registry);
}

void PointerTables::DistinctWords(const Table& t, uint64_t from, std::vector<uint64_t>* words) {
  const size_t first = words->size();
  for (auto e = t.entries.lower_bound(from); e != t.entries.end(); ++e) {
    words->push_back(e->second);
  }
  std::sort(words->begin() + first, words->end());
  words->erase(std::unique(words->begin() + first, words->end()), words->end());
}

PointerTables::State PointerTables::Get(uint64_t id, std::vector<uint64_t>* words,
                                        uint64_t* base) const {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return State::kNone;
  if (base != nullptr) *base = it->second.base;
  if (words != nullptr) DistinctWords(it->second, 0, words);
  for (const auto& [start, r] : it->second.ranges) {
    if (r.stale) return State::kStale;
  }
  return State::kKnown;
}

void PointerTables::CollectOne(const Reach& reach, std::vector<Found>* found) const {
  auto it = by_id_.find(reach.id);
  if (it == by_id_.end()) return;
  const Table& t = it->second;
  auto r = t.ranges.upper_bound(reach.from);
  if (r != t.ranges.begin() && std::prev(r)->second.end > reach.from) --r;
  if (r == t.ranges.end()) return;  // every range lies before the pointer
  Found f;
  f.id = reach.id;
  f.base = t.base;
  f.from = reach.from;
  f.state = State::kKnown;
  for (; r != t.ranges.end(); ++r) {
    if (!r->second.stale) continue;
    f.state = State::kStale;
    const uint64_t lo = std::max(r->first, reach.from);
    if (!f.stale.empty() && f.stale.back().end == lo) {
      // Adjacent: one read.
      StaleRange& s = f.stale.back();
      s.end = r->second.end;
      s.any |= r->second.any;
      s.marks.insert(s.marks.end(), r->second.marks.begin(), r->second.marks.end());
    } else {
      f.stale.push_back({lo, r->second.end, r->second.any, r->second.marks});
    }
  }
  DistinctWords(t, reach.from, &f.words);
  found->push_back(std::move(f));
}

void PointerTables::Collect(absl::Span<const Reach> reach, std::vector<Found>* found) const {
  MutexLock lock(&mu_);
  for (const Reach& r : reach) CollectOne(r, found);
}

void PointerTables::Collect(absl::Span<const uint64_t> ids, std::vector<Found>* found) const {
  MutexLock lock(&mu_);
  for (uint64_t id : ids) CollectOne({id, 0}, found);
}

bool PointerTables::Covers(uint64_t id, uint64_t addr) const {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  auto r = it->second.ranges.upper_bound(addr);
  return r != it->second.ranges.begin() && std::prev(r)->second.end > addr;
}

std::vector<std::array<uint64_t, 3>> PointerTables::Ranges(uint64_t id) const {
  MutexLock lock(&mu_);
  std::vector<std::array<uint64_t, 3>> out;
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return out;
  for (const auto& [start, r] : it->second.ranges) {
    out.push_back({start, r.end, r.stale ? 1u : 0u});
  }
  return out;
}

}  // namespace stensor
