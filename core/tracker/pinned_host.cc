#include "core/tracker/pinned_host.h"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace stensor {

namespace {

// The range of `ranges` (base -> bytes) holding `addr`.
std::map<uint64_t, uint64_t>::const_iterator Holding(const std::map<uint64_t, uint64_t>& ranges,
                                                     uint64_t addr) {
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return addr - it->first < it->second ? it : ranges.end();
}

}  // namespace

void PinnedHost::Allocated(uint64_t base, uint64_t bytes) {
  MutexLock lock(&mu_);
  allocated_[base] = bytes;
  allocated_bytes_ += bytes;
  PublishLocked();
}

uint64_t PinnedHost::Freed(uint64_t base) {
  MutexLock lock(&mu_);
  auto it = allocated_.find(base);
  if (it == allocated_.end()) return 0;
  const uint64_t bytes = it->second;
  allocated_bytes_ -= bytes;
  allocated_.erase(it);
  PublishLocked();
  return bytes;
}

void PinnedHost::Registered(uint64_t base, uint64_t bytes) {
  MutexLock lock(&mu_);
  registered_[base] = bytes;
  PublishLocked();
}

void PinnedHost::Unregistered(uint64_t base) {
  MutexLock lock(&mu_);
  registered_.erase(base);
  PublishLocked();
}

bool PinnedHost::Contains(uint64_t addr) const {
  MutexLock lock(&mu_);
  return ContainsLocked(addr);
}

bool PinnedHost::AnyWordIn(absl::Span<const unsigned char> words) const {
  MutexLock lock(&mu_);
  if (allocated_.empty() && registered_.empty()) return false;
  for (size_t at = 0; at + 8 <= words.size(); at += 8) {
    uint64_t word;
    std::memcpy(&word, words.data() + at, 8);
    if (ContainsLocked(word)) return true;
  }
  return false;
}

bool PinnedHost::HoldsPointer(uint64_t dst, const void* src, uint64_t bytes) const {
  MutexLock lock(&mu_);
  // Most words of data are far from all pinned memory: two compares.
  uint64_t low = UINT64_MAX, high = 0;
  for (const auto* ranges : {&allocated_, &registered_}) {
    if (ranges->empty()) continue;
    low = std::min(low, ranges->begin()->first);
    high = std::max(high, ranges->rbegin()->first + ranges->rbegin()->second);
  }
  if (low >= high) return false;
  const uint64_t skip = (8 - dst % 8) % 8;
  if (bytes < skip + 8) return false;
  const auto* p = static_cast<const unsigned char*>(src) + skip;
  for (uint64_t at = 0; at + 8 <= bytes - skip; at += 8) {
    uint64_t word;
    std::memcpy(&word, p + at, sizeof(word));
    if (word >= low && word < high && ContainsLocked(word)) return true;
  }
  return false;
}

std::optional<std::pair<uint64_t, uint64_t>> PinnedHost::AllocationAt(uint64_t addr) const {
  MutexLock lock(&mu_);
  auto it = Holding(allocated_, addr);
  if (it == allocated_.end()) return std::nullopt;
  return *it;
}

uint64_t PinnedHost::allocated_bytes() const {
  MutexLock lock(&mu_);
  return allocated_bytes_;
}

bool PinnedHost::ContainsLocked(uint64_t addr) const {
  return Holding(allocated_, addr) != allocated_.end() ||
         Holding(registered_, addr) != registered_.end();
}

void PinnedHost::PublishLocked() {
  any_.store(!allocated_.empty() || !registered_.empty(), std::memory_order_release);
}

}  // namespace stensor
