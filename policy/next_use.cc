#include "policy/next_use.h"

#include <algorithm>
#include <cstdint>
#include <optional>

namespace stensor {

uint64_t NextUsePredictor::OnUse(uint64_t id, uint64_t now,
                                 std::optional<Slot> slot) {
  constexpr uint64_t kNoNextUse = EvictionCandidate::kNoNextUse;
  auto [it, inserted] = buffers_.try_emplace(id);
  BufferState& b = it->second;
  if (!inserted) {
    if (now == b.last_use) return b.predicted;  // second slot of the same op
    const uint64_t gap = now - b.last_use;
    b.own_gap = gap;
    // The slot this buffer was last used in learns the gap to this use: the
    // next buffer in that slot (this one or a successor with a new id) will
    // be predicted with it.
    if (b.has_slot) slot_gaps_[b.slot_key] = gap;
  }
  b.last_use = now;
  uint64_t gap = kNoGap;
  bool learned = false;
  if (slot.has_value()) {
    b.has_slot = true;
    b.slot_key = SlotKey(*slot);
    auto s = slot_gaps_.find(b.slot_key);
    if (s != slot_gaps_.end()) {
      gap = s->second;  // may be kNoGap: buffers in this slot get freed
      learned = true;
    }
  } else {
    b.has_slot = false;
  }
  if (!learned) gap = b.own_gap;
  b.predicted = gap == kNoGap || gap > kNoNextUse - now ? kNoNextUse : now + gap;
  return b.predicted;
}

void NextUsePredictor::OnFreed(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  // Its last use was its last: buffers in that slot are not used again.
  if (it->second.has_slot) slot_gaps_[it->second.slot_key] = kNoGap;
  buffers_.erase(it);
}

uint64_t NextUsePredictor::Predicted(uint64_t id) const {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? EvictionCandidate::kNoNextUse
                              : it->second.predicted;
}

void NextUsePredictor::Reset() {
  slot_gaps_.clear();
  for (auto& [id, b] : buffers_) b.has_slot = false;
}

}  // namespace stensor
