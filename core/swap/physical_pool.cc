#include "core/swap/physical_pool.h"

#include <algorithm>

namespace stensor {

uint64_t ChunkBytes(absl::Span<const PhysicalChunk> chunks) {
  uint64_t bytes = 0;
  for (const PhysicalChunk& c : chunks) bytes += c.bytes;
  return bytes;
}

void PhysicalPool::Put(Chunk c) {
  chunks_.push_back(c);
  bytes_ += c.bytes;
}

void PhysicalPool::PutAll(std::vector<Chunk>* chunks) {
  for (const Chunk& c : *chunks) Put(c);
  chunks->clear();
}

std::vector<size_t> PhysicalPool::Select(uint64_t need, First first) const {
  std::vector<size_t> at;
  // One chunk of the size asked: one handle, nothing left over.
  for (size_t i = chunks_.size(); i-- > 0;) {
    if (chunks_[i].bytes == need && !shadows_.contains(chunks_[i].handle)) return {i};
  }
  std::vector<size_t> idle, shadowed_first, shadowed_rest;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Handle h = chunks_[i].handle;
    if (!shadows_.contains(h)) {
      idle.push_back(i);
    } else if (first(h)) {
      shadowed_first.push_back(i);
    } else {
      shadowed_rest.push_back(i);
    }
  }
  std::stable_sort(idle.begin(), idle.end(), [&](size_t a, size_t b) {
    return chunks_[a].bytes != chunks_[b].bytes ? chunks_[a].bytes > chunks_[b].bytes : a > b;
  });
  uint64_t left = need;
  for (const std::vector<size_t>* group : {&idle, &shadowed_first, &shadowed_rest}) {
    for (size_t i : *group) {
      if (left == 0) return at;
      if (chunks_[i].bytes > left) continue;
      at.push_back(i);
      left -= chunks_[i].bytes;
    }
  }
  if (left == 0) return at;
  // Short of the need: a shadowed chunk of its size serves it whole.
  for (const std::vector<size_t>* group : {&shadowed_first, &shadowed_rest}) {
    for (size_t i : *group) {
      if (chunks_[i].bytes == need) return {i};
    }
  }
  return at;
}

PhysicalPool::Chunk PhysicalPool::Remove(size_t i) {
  const Chunk c = chunks_[i];
  chunks_.erase(chunks_.begin() + i);
  bytes_ -= c.bytes;
  return c;
}

uint64_t PhysicalPool::Take(uint64_t need, std::vector<Chunk>* out, std::vector<Handle>* shadowed,
                            First first) {
  const std::vector<size_t> at = Select(need, first);
  uint64_t taken = 0;
  for (size_t i : at) {
    out->push_back(chunks_[i]);
    taken += chunks_[i].bytes;
    if (shadowed != nullptr && shadows_.contains(chunks_[i].handle)) {
      shadowed->push_back(chunks_[i].handle);
    }
  }
  // Highest index first, so that the ones left keep theirs.
  std::vector<size_t> order = at;
  std::sort(order.begin(), order.end());
  for (size_t k = order.size(); k-- > 0;) Remove(order[k]);
  return taken;
}

uint64_t PhysicalPool::Fits(uint64_t need, First first) const {
  uint64_t bytes = 0;
  for (size_t i : Select(need, first)) bytes += chunks_[i].bytes;
  return bytes;
}

bool PhysicalPool::TakeBack(absl::Span<const Chunk> chunks) {
  std::vector<size_t> at;
  at.reserve(chunks.size());
  for (const Chunk& c : chunks) {
    auto it = std::find(chunks_.begin(), chunks_.end(), c);
    if (it == chunks_.end()) return false;
    at.push_back(it - chunks_.begin());
  }
  std::sort(at.begin(), at.end());
  for (size_t i = at.size(); i-- > 0;) Remove(at[i]);
  return true;
}

std::optional<PhysicalPool::Chunk> PhysicalPool::TakeIdle(uint64_t at_most) {
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (shadows_.contains(chunks_[i].handle)) continue;  // still mapped at an old address
    if (chunks_[i].bytes > at_most) continue;
    return Remove(i);
  }
  return std::nullopt;
}

std::optional<PhysicalPool::Chunk> PhysicalPool::TakeUnfit(uint64_t need, First first) {
  const std::vector<size_t> at = Select(need, first);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (shadows_.contains(chunks_[i].handle)) continue;
    if (std::find(at.begin(), at.end(), i) != at.end()) continue;
    return Remove(i);
  }
  return std::nullopt;
}

void PhysicalPool::Unshadow(Handle h) {
  auto it = shadows_.find(h);
  if (it != shadows_.end() && --it->second == 0) shadows_.erase(it);
}

}  // namespace stensor
