#include "policy/eviction_order.h"

namespace stensor {

EvictionCandidate EvictionOrder::CandidateOf(const EvictionState& b) const {
  const bool free = Droppable(b);
  EvictionCandidate c;
  c.id = b.id;
  c.bytes = b.reserved;
  c.location = free ? Location::kCpuGpu : b.location;
  c.gpu_version = b.gpu_version;
  c.host_version = free ? b.gpu_version : b.host_version;
  c.last_use = b.last_use;
  c.next_use = b.next_use;
  return c;
}

void EvictionOrder::Remove(EvictionState& b) {
  if (b.rekey_) {
    // Off the re-key list: the last takes its place.
    rekey_[b.rekey_at_] = rekey_.back();
    rekey_[b.rekey_at_]->rekey_at_ = b.rekey_at_;
    rekey_.pop_back();
    b.rekey_ = false;
  }
  if (b.indexed_) evictable_.erase(b.index_key_);
  if (b.drop_indexed_) droppable_.erase(b.drop_key_);
  b.indexed_ = false;
  b.drop_indexed_ = false;
  b.eligible_ = false;
}

void EvictionOrder::Flush() {
  for (EvictionState* b : rekey_) {
    b->rekey_ = false;
    Rekey(*b);
  }
  rekey_.clear();
}

void EvictionOrder::Rekey(EvictionState& b) {
  if (b.eligible_) {
    auto key = std::make_tuple(policy_->Key(CandidateOf(b)), b.id, b.serial);
    if (!b.indexed_ || key != b.index_key_) {
      if (b.indexed_) evictable_.erase(b.index_key_);
      b.index_key_ = key;
      evictable_.emplace(key, &b);
      b.indexed_ = true;
    }
  } else if (b.indexed_) {
    evictable_.erase(b.index_key_);
    b.indexed_ = false;
  }
  if (b.eligible_ && Droppable(b)) {
    std::pair<uint64_t, uint64_t> key{b.last_use, b.serial};
    if (!b.drop_indexed_ || key != b.drop_key_) {
      if (b.drop_indexed_) droppable_.erase(b.drop_key_);
      b.drop_key_ = key;
      droppable_.emplace(key, &b);
      b.drop_indexed_ = true;
    }
  } else if (b.drop_indexed_) {
    droppable_.erase(b.drop_key_);
    b.drop_indexed_ = false;
  }
}

}  // namespace stensor
