#include "core/inference/buffer_registry.h"

#include <algorithm>

namespace stensor {

const char* BufferKindName(BufferKind kind) {
  switch (kind) {
    case BufferKind::kDeviceAlloc:
      return "device";
    case BufferKind::kStreamOrdered:
      return "stream_ordered";
    case BufferKind::kAppVmm:
      return "app_vmm";
  }
  return "unknown";
}

std::optional<uint64_t> BufferRegistry::Add(uint64_t base, uint64_t size, int device,
                                            BufferKind kind) {
  if (size == 0 || base + size < base) return std::nullopt;
  MutexLock lock(&mu_);
  auto pos = std::upper_bound(bases_.begin(), bases_.end(), base);
  size_t i = static_cast<size_t>(pos - bases_.begin());
  if (i > 0 && entries_[i - 1].base + entries_[i - 1].size > base) {
    return std::nullopt;
  }
  if (i < bases_.size() && bases_[i] < base + size) return std::nullopt;
  Buffer b{next_id_++, base, size, device, kind};
  bases_.insert(pos, base);
  entries_.insert(entries_.begin() + static_cast<std::ptrdiff_t>(i), b);
  cells_.insert(cells_.begin() + static_cast<std::ptrdiff_t>(i), TakeCell(b.id));
  lowest_ = bases_.front();
  highest_end_ = std::max(highest_end_, base + size);
  Published();
  return b.id;
}

std::optional<Buffer> BufferRegistry::Remove(uint64_t base) {
  MutexLock lock(&mu_);
  auto pos = std::lower_bound(bases_.begin(), bases_.end(), base);
  if (pos == bases_.end() || *pos != base) return std::nullopt;
  size_t i = static_cast<size_t>(pos - bases_.begin());
  Buffer b = entries_[i];
  ReleaseCell(cells_[i]);
  bases_.erase(pos);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
  cells_.erase(cells_.begin() + static_cast<std::ptrdiff_t>(i));
  lowest_ = bases_.empty() ? UINT64_MAX : bases_.front();
  if (bases_.empty()) highest_end_ = 0;  // otherwise a harmless upper bound
  Published();
  return b;
}

std::vector<Buffer> BufferRegistry::RemoveRange(uint64_t base, uint64_t size) {
  MutexLock lock(&mu_);
  auto first = std::lower_bound(bases_.begin(), bases_.end(), base);
  auto last = std::lower_bound(first, bases_.end(), base + size);
  size_t i = static_cast<size_t>(first - bases_.begin());
  size_t j = static_cast<size_t>(last - bases_.begin());
  std::vector<Buffer> removed(entries_.begin() + static_cast<std::ptrdiff_t>(i),
                              entries_.begin() + static_cast<std::ptrdiff_t>(j));
  for (size_t k = i; k < j; ++k) ReleaseCell(cells_[k]);
  bases_.erase(first, last);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i),
                 entries_.begin() + static_cast<std::ptrdiff_t>(j));
  cells_.erase(cells_.begin() + static_cast<std::ptrdiff_t>(i),
               cells_.begin() + static_cast<std::ptrdiff_t>(j));
  lowest_ = bases_.empty() ? UINT64_MAX : bases_.front();
  if (bases_.empty()) highest_end_ = 0;
  if (!removed.empty()) Published();
  return removed;
}

uint64_t BufferRegistry::NextInstance() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

BufferRegistry::Cell* BufferRegistry::TakeCell(uint64_t id) {
  if (free_cells_.empty()) {
    // A new chunk; the old ones stay where they are (cached pointers).
    cell_chunks_.push_back(std::make_unique<Cell[]>(kCellsPerChunk));
    Cell* chunk = cell_chunks_.back().get();
    for (size_t k = kCellsPerChunk; k-- > 0;) free_cells_.push_back(&chunk[k]);
  }
  Cell* cell = free_cells_.back();
  free_cells_.pop_back();
  cell->store(id, std::memory_order_relaxed);
  return cell;
}

void BufferRegistry::ReleaseCell(Cell* cell) {
  // From here no cached entry of the removed buffer is taken: a lookup that
  // happens after this Remove sees 0 or a later buffer's (different) id.
  cell->store(0, std::memory_order_relaxed);
  free_cells_.push_back(cell);
}

void BufferRegistry::Published() {
  lowest_atomic_.store(lowest_, std::memory_order_relaxed);
  highest_atomic_.store(highest_end_, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
}

std::optional<Buffer> BufferRegistry::Find(uint64_t addr) const {
  ReaderMutexLock lock(&mu_);
  size_t i = FindLocked(addr);
  if (i == kNotFound) return std::nullopt;
  return entries_[i];
}

uint64_t BufferRegistry::LookupMissed(uint64_t addr, CacheEntry* cache, const Cell** cell) const {
  ReaderMutexLock lock(&mu_);
  const size_t i = FindLocked(addr);
  if (i == kNotFound) return 0;
  const Buffer& b = entries_[i];
  cache[Slot(addr)] = CacheEntry{instance_, b.base, b.size, b.id, cells_[i]};
  if (cell != nullptr) *cell = cells_[i];
  return b.id;
}

size_t BufferRegistry::size() const {
  ReaderMutexLock lock(&mu_);
  return bases_.size();
}

size_t BufferRegistry::FindLocked(uint64_t addr) const {
  // Most parameter words are scalars; this rejects them without searching.
  if (addr < lowest_ || addr >= highest_end_) return kNotFound;
  auto pos = std::upper_bound(bases_.begin(), bases_.end(), addr);
  if (pos == bases_.begin()) return kNotFound;
  const size_t i = static_cast<size_t>(pos - bases_.begin()) - 1;
  return addr - entries_[i].base < entries_[i].size ? i : kNotFound;
}

}  // namespace stensor
