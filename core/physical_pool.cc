#include "core/physical_pool.h"

#include <algorithm>

namespace stensor {

void PhysicalPool::PutAll(std::vector<Handle>* chunks) {
  chunks_.insert(chunks_.end(), chunks->begin(), chunks->end());
  chunks->clear();
}

size_t PhysicalPool::Take(size_t n, std::vector<Handle>* out, std::vector<Handle>* shadowed,
                          absl::FunctionRef<bool(Handle)> first) {
  size_t taken = 0;
  auto take = [&](size_t i) {
    out->push_back(chunks_[i]);
    if (shadowed != nullptr && shadows_.contains(chunks_[i])) shadowed->push_back(chunks_[i]);
    chunks_.erase(chunks_.begin() + i);
    ++taken;
  };
  for (size_t i = chunks_.size(); i-- > 0 && taken < n;) {
    if (!shadows_.contains(chunks_[i])) take(i);
  }
  // What is left is all shadowed (the pass above took the rest).
  for (size_t i = 0; i < chunks_.size() && taken < n;) {
    if (first(chunks_[i])) {
      take(i);
    } else {
      ++i;
    }
  }
  while (taken < n && !chunks_.empty()) take(0);
  return taken;
}

bool PhysicalPool::TakeBack(absl::Span<const Handle> chunks) {
  std::vector<size_t> at;
  at.reserve(chunks.size());
  for (Handle h : chunks) {
    auto it = std::find(chunks_.begin(), chunks_.end(), h);
    if (it == chunks_.end()) return false;
    at.push_back(it - chunks_.begin());
  }
  std::sort(at.begin(), at.end());
  for (size_t i = at.size(); i-- > 0;) chunks_.erase(chunks_.begin() + at[i]);
  return true;
}

std::optional<PhysicalPool::Handle> PhysicalPool::TakeIdle() {
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (shadows_.contains(chunks_[i])) continue;  // still mapped at an old address
    Handle h = chunks_[i];
    chunks_.erase(chunks_.begin() + i);
    return h;
  }
  return std::nullopt;
}

void PhysicalPool::Unshadow(Handle h) {
  auto it = shadows_.find(h);
  if (it != shadows_.end() && --it->second == 0) shadows_.erase(it);
}

}  // namespace stensor
