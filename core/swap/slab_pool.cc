#include "core/swap/slab_pool.h"

#include <algorithm>

namespace stensor {

void SlabPool::AddSlab(uint64_t slab, int device, CUdeviceptr base, uint64_t size) {
  MutexLock lock(&mu_);
  Slab& s = slabs_[slab];
  s.device = device;
  s.base = base;
  s.size = size;
  slab_at_[base] = slab;
  AddFree(s, 0, size);
}

void SlabPool::EraseFree(Slab& slab, std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase(SizeKey{slab.device, it->second, slab.base, it->first});
  slab.free.erase(it);
}

void SlabPool::AddFree(Slab& slab, uint64_t offset, uint64_t bytes) {
  // Merged with the ranges it touches, so a freed slab is one range again.
  auto next = slab.free.lower_bound(offset);
  if (next != slab.free.end() && next->first == offset + bytes) {
    bytes += next->second;
    EraseFree(slab, next);
  }
  auto prev = slab.free.lower_bound(offset);
  if (prev != slab.free.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      EraseFree(slab, prev);
    }
  }
  slab.free.emplace(offset, bytes);
  by_size_.insert(SizeKey{slab.device, bytes, slab.base, offset});
}

std::optional<SlabPool::Block> SlabPool::Take(int device, uint64_t size,
                                              std::optional<Order> order) {
  if (size == 0) return std::nullopt;
  const uint64_t span = (size + kAlign - 1) / kAlign * kAlign;
  MutexLock lock(&mu_);
  auto it = by_size_.lower_bound(SizeKey{device, span, 0, 0});
  const bool in_range = it != by_size_.end() && std::get<0>(*it) == device;
  // Space this stream freed: what follows on it runs after the free.
  std::deque<Pending>* queue = nullptr;
  std::deque<Pending>::iterator own;
  if (order) {
    auto q = pending_.find(device);
    if (q != pending_.end()) {
      queue = &q->second;
      own = queue->end();
      for (auto p = queue->begin(); p != queue->end(); ++p) {
        if (p->order == order && p->bytes >= span &&
            (own == queue->end() || p->bytes < own->bytes)) {
          own = p;
        }
      }
    }
  }
  const bool from_own =
      queue != nullptr && own != queue->end() && (!in_range || own->bytes <= std::get<1>(*it));
  if (!in_range && !from_own) return std::nullopt;
  uint64_t key = 0, offset = 0, ended_wait = 0;
  if (from_own) {
    key = own->slab;
    offset = own->offset;
    if (own->bytes > span) {
      own->offset += span;
      own->bytes -= span;
    } else {
      --slabs_.at(key).pending;
      --waiting_;
      ended_wait = own->wait;
      queue->erase(own);
    }
  } else {
    const auto [dev, bytes, base, at] = *it;
    key = slab_at_.at(base);
    offset = at;
    Slab& slab = slabs_.at(key);
    EraseFree(slab, slab.free.find(offset));
    if (bytes > span) AddFree(slab, offset + span, bytes - span);
  }
  Slab& slab = slabs_.at(key);
  ++slab.live;
  Block b;
  b.base = slab.base + offset;
  b.size = size;
  b.slab = key;
  b.stream_ordered = order.has_value();
  live_[b.base] = b;
  b.ended_wait = ended_wait;
  return b;
}

void SlabPool::Name(CUdeviceptr base, uint64_t id) {
  MutexLock lock(&mu_);
  auto it = live_.find(base);
  if (it != live_.end()) it->second.id = id;
}

std::optional<SlabPool::Block> SlabPool::Containing(CUdeviceptr addr) const {
  MutexLock lock(&mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (addr - it->second.base >= it->second.span()) return std::nullopt;
  return it->second;
}

std::optional<SlabPool::Block> SlabPool::Free(CUdeviceptr base, uint64_t wait,
                                              std::optional<Order> order) {
  MutexLock lock(&mu_);
  auto it = live_.find(base);
  if (it == live_.end()) return std::nullopt;
  const Block b = it->second;
  live_.erase(it);
  Slab& slab = slabs_.at(b.slab);
  --slab.live;
  if (wait == 0) {
    AddFree(slab, b.base - slab.base, b.span());
  } else {
    ++slab.pending;
    ++waiting_;
    pending_[slab.device].push_back(Pending{b.slab, b.base - slab.base, b.span(), wait, order});
  }
  return b;
}

void SlabPool::Reclaim(int device, bool all, absl::FunctionRef<bool(uint64_t wait)> done) {
  MutexLock lock(&mu_);
  auto q = pending_.find(device);
  if (q == pending_.end()) return;
  std::deque<Pending>& queue = q->second;
  for (auto it = queue.begin(); it != queue.end();) {
    auto s = slabs_.find(it->slab);
    if (s != slabs_.end() && !done(it->wait)) {
      if (!all) break;
      ++it;
      continue;
    }
    if (s != slabs_.end()) {
      --s->second.pending;
      AddFree(s->second, it->offset, it->bytes);
    }
    --waiting_;
    it = queue.erase(it);
  }
}

std::vector<uint64_t> SlabPool::TakeEmpty(int device, size_t keep) {
  MutexLock lock(&mu_);
  std::vector<std::pair<CUdeviceptr, uint64_t>> empty;  // by base: the same each run
  for (const auto& [key, slab] : slabs_) {
    if (slab.device == device && slab.live == 0 && slab.pending == 0) {
      empty.emplace_back(slab.base, key);
    }
  }
  std::sort(empty.begin(), empty.end());
  std::vector<uint64_t> taken;
  for (size_t i = keep; i < empty.size(); ++i) {
    const uint64_t key = empty[i].second;
    Slab& slab = slabs_.at(key);
    while (!slab.free.empty()) EraseFree(slab, slab.free.begin());
    slab_at_.erase(slab.base);
    slabs_.erase(key);
    taken.push_back(key);
  }
  return taken;
}

std::vector<std::pair<uint64_t, uint64_t>> SlabPool::LiveRanges(uint64_t slab) const {
  MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  auto s = slabs_.find(slab);
  if (s == slabs_.end()) return ranges;
  const Slab& in = s->second;
  for (auto it = live_.lower_bound(in.base); it != live_.end() && it->first < in.base + in.size;
       ++it) {
    const uint64_t offset = it->first - in.base, bytes = it->second.span();
    if (!ranges.empty() && ranges.back().first + ranges.back().second == offset) {
      ranges.back().second += bytes;
    } else {
      ranges.emplace_back(offset, bytes);
    }
  }
  return ranges;
}

bool SlabPool::empty() const {
  MutexLock lock(&mu_);
  return live_.empty() && waiting_ == 0;
}

}  // namespace stensor
