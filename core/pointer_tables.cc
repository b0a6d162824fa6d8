#include "core/pointer_tables.h"

#include <algorithm>
#include <cstring>

namespace stensor {

void PointerTables::EraseRange(Table& t, uint64_t dst, uint64_t bytes) {
  auto first = t.entries.lower_bound(dst);
  auto last = bytes > UINT64_MAX - dst ? t.entries.end() : t.entries.lower_bound(dst + bytes);
  t.entries.erase(first, last);
}

size_t PointerTables::Scan(Table& t, uint64_t dst, const unsigned char* src,
                           uint64_t bytes, const BufferRegistry& registry) {
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

void PointerTables::Prune(uint64_t id) {
  auto it = by_id_.find(id);
  if (it != by_id_.end() && it->second.entries.empty() && !it->second.stale) {
    by_id_.erase(it);
  }
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
  for (auto& [id, t] : by_id_) t.stale = true;
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

size_t PointerTables::ApplyHostWrite(const Buffer& table, HostScan scan, bool settled) {
  MutexLock lock(&mu_);
  auto it = by_id_.find(table.id);
  if (it == by_id_.end()) {
    if (scan.found == 0) return 0;
    it = by_id_.emplace(table.id, Table{table.base, {}, false}).first;
  }
  Table& t = it->second;
  EraseRange(t, scan.dst, scan.bytes);
  t.entries.merge(scan.entries);
  if (!settled) {
    // What lands may differ from what the source holds now: known only once
    // read back after the copy ran.
    t.stale = true;
  } else if (scan.dst == table.base && scan.bytes >= table.size) {
    // A copy over the whole buffer leaves nothing of what the device wrote.
    t.stale = false;
  }
  Prune(table.id);
  Publish();
  return scan.found;
}

size_t PointerTables::OnHostWrite(const Buffer& table, uint64_t dst, const void* src,
                                  uint64_t bytes, bool settled,
                                  const BufferRegistry& registry) {
  // Most copies carry data, not pointers: scan before taking the lock.
  return ApplyHostWrite(table, ScanHost(dst, src, bytes, registry), settled);
}

void PointerTables::OnDeviceCopy(const Buffer& to, uint64_t dst, const Buffer* from,
                                 uint64_t src, uint64_t bytes) {
  if (empty()) return;  // nothing known anywhere, nothing to carry
  MutexLock lock(&mu_);
  auto from_it = from != nullptr ? by_id_.find(from->id) : by_id_.end();
  const bool from_table = from_it != by_id_.end();
  // Device data of unknown make may hold pointers the device wrote.
  const bool source_unknown = !from_table || from_it->second.stale;
  std::map<uint64_t, uint64_t> carried;
  // Entries shifted off 8-byte alignment are no pointers a kernel reads.
  const bool aligned = (dst - src) % 8 == 0;
  if (from_table && aligned) {
    const auto& e = from_it->second.entries;
    for (auto it = e.lower_bound(src); it != e.end() && it->first - src < bytes; ++it) {
      carried[it->first - src + dst] = it->second;
    }
  }
  auto it = by_id_.find(to.id);  // may invalidate from_it
  if (it == by_id_.end()) {
    if (!from_table) return;  // plain data onto plain data
    it = by_id_.emplace(to.id, Table{to.base, {}, false}).first;
  }
  Table& t = it->second;
  EraseRange(t, dst, bytes);
  t.entries.merge(carried);
  // A table overwritten with device data of unknown make (it may hold
  // pointers the device wrote) stays a table, of unknown contents.
  if (source_unknown || (from_table && !aligned)) t.stale = true;
  Prune(to.id);
  Publish();
}

void PointerTables::OnClear(const Buffer& table, uint64_t dst, uint64_t bytes) {
  if (empty()) return;
  MutexLock lock(&mu_);
  auto it = by_id_.find(table.id);
  if (it == by_id_.end()) return;
  EraseRange(it->second, dst, bytes);
  if (dst == table.base && bytes >= table.size) it->second.stale = false;
  Prune(table.id);
  Publish();
}

void PointerTables::OnDeviceWrite(absl::Span<const uint64_t> ids) {
  if (empty()) return;
  MutexLock lock(&mu_);
  bool changed = false;
  for (uint64_t id : ids) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) continue;
    it->second.stale = true;
    changed = true;
  }
  if (changed) Publish();
}

void PointerTables::OnFree(uint64_t id) {
  if (empty()) return;
  MutexLock lock(&mu_);
  by_id_.erase(id);
  Publish();
}

size_t PointerTables::Rescan(const Buffer& table, const void* data, uint64_t since,
                             const BufferRegistry& registry) {
  Table scanned;
  size_t found = Scan(scanned, table.base, static_cast<const unsigned char*>(data),
                      table.size, registry);
  scanned.base = table.base;
  MutexLock lock(&mu_);
  auto it = by_id_.find(table.id);
  if (changes_ == since) {
    if (found == 0) {
      by_id_.erase(table.id);
    } else {
      by_id_[table.id] = std::move(scanned);
    }
  } else if (it != by_id_.end()) {
    // Newer entries win over what was read; nothing is vouched for.
    it->second.entries.merge(scanned.entries);
  } else if (found > 0) {
    scanned.stale = true;
    by_id_.emplace(table.id, std::move(scanned));
  }
  Publish();
  return found;
}

void PointerTables::DistinctWords(const Table& t, std::vector<uint64_t>* words) {
  const size_t first = words->size();
  for (const auto& [addr, word] : t.entries) words->push_back(word);
  std::sort(words->begin() + first, words->end());
  words->erase(std::unique(words->begin() + first, words->end()), words->end());
}

PointerTables::State PointerTables::Get(uint64_t id, std::vector<uint64_t>* words,
                                        uint64_t* base) const {
  MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return State::kNone;
  if (base != nullptr) *base = it->second.base;
  if (words != nullptr) DistinctWords(it->second, words);
  return it->second.stale ? State::kStale : State::kKnown;
}

void PointerTables::Collect(absl::Span<const uint64_t> ids, std::vector<Found>* found) const {
  MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) continue;
    Found f;
    f.id = id;
    f.state = it->second.stale ? State::kStale : State::kKnown;
    f.base = it->second.base;
    DistinctWords(it->second, &f.words);
    found->push_back(std::move(f));
  }
}

}  // namespace stensor
