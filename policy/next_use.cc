#include "policy/next_use.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

namespace stensor {

void NextUsePredictor::Repredict(uint64_t id, BufferState& b, uint64_t predicted) {
  if (b.predicted == predicted) return;
  b.predicted = predicted;
  changed_.emplace_back(id, predicted);
}

void NextUsePredictor::Learn(uint64_t key, uint64_t gap, uint64_t now) {
  auto [it, inserted] = slot_gaps_.try_emplace(key, gap);
  if (!inserted) {
    if (it->second == gap) return;  // nothing new: the usual case, O(1)
    it->second = gap;
  }
  // Every buffer last used in this slot comes back after the same gap: a
  // shard's cycle is learnt from the first shard seen twice, for all of them.
  auto members = slot_members_.find(key);
  if (members == slot_members_.end()) return;
  for (uint64_t id : members->second) {
    BufferState& m = buffers_.at(id);
    const uint64_t predicted = After(m.last_use, gap);
    // A prediction already in the past says nothing.
    Repredict(id, m, predicted <= now ? EvictionCandidate::kNoNextUse : predicted);
  }
}

bool NextUsePredictor::InBurst(uint64_t id, uint64_t signature, uint64_t now) {
  Burst& burst = bursts_[signature];
  if (burst.length > 0 && burst.last + 1 == now) {
    ++burst.length;
  } else {
    burst = Burst{now, now, 1};
  }
  burst.last = now;
  if (burst.length < kMinBurst) return false;
  if (burst.length == kMinBurst) {
    // The burst's earlier members that nothing predicts and that were not
    // used since join it.
    for (auto it = by_last_use_.lower_bound({signature, burst.start});
         it != by_last_use_.end() && it->first.first == signature && it->first.second < now; ++it) {
      BufferState& m = buffers_.at(it->second);
      if (it->second != id && m.uses == 1 && m.predicted == EvictionCandidate::kNoNextUse) {
        Repredict(it->second, m, EvictionCandidate::kInSequence + m.last_use);
      }
    }
  }
  return true;
}

uint64_t NextUsePredictor::OnUse(uint64_t id, uint64_t now, std::optional<Slot> slot,
                                 uint64_t signature) {
  auto [it, inserted] = buffers_.try_emplace(id);
  BufferState& b = it->second;
  std::optional<std::pair<uint64_t, uint64_t>> previous;  // (signature, time)
  // Used again in the slot of its last use, which learns nothing new (the
  // steady state of a repeating pattern): it stays that slot's member, so
  // no set changes and no other buffer is re-predicted.
  bool same_slot = false;
  if (!inserted) {
    if (now == b.last_use) return b.predicted;  // second slot of the same op
    previous.emplace(b.signature, b.last_use);
    // Its entry moves from its last use to this one; where this is the
    // last use of its signature (as it is in a repeating pattern), the
    // hint puts the new entry in place without a search.
    if (auto last = by_last_use_.find(*previous); last != by_last_use_.end()) {
      by_last_use_.insert(by_last_use_.erase(last), {{signature, now}, id});
    } else {
      by_last_use_[{signature, now}] = id;
    }
    const uint64_t gap = now - b.last_use;
    // The first gap, from the use after allocation (an initialisation) to
    // the next, is not a period of anything.
    if (b.uses > 1) b.own_gap = gap;
    if (b.has_slot) {
      if (slot.has_value() && SlotKey(*slot) == b.slot_key) {
        auto learnt = slot_gaps_.find(b.slot_key);
        same_slot = learnt != slot_gaps_.end() && learnt->second == gap;
      }
      if (!same_slot) {
        slot_members_[b.slot_key].erase(id);
        // The slot this buffer was last used in learns the gap to this use:
        // the next buffer in that slot (this one or a successor with a new
        // id), and every other buffer last used there, is predicted with it.
        Learn(b.slot_key, gap, now);
      }
    }
  } else {
    by_last_use_[{signature, now}] = id;
  }
  ++b.uses;
  b.last_use = now;
  b.signature = signature;
  uint64_t gap = kNoGap;
  if (slot.has_value()) {
    if (same_slot) {
      gap = now - previous->second;  // what the slot had learnt already
    } else {
      b.has_slot = true;
      b.slot_key = SlotKey(*slot);
      slot_members_[b.slot_key].insert(id);
      auto s = slot_gaps_.find(b.slot_key);
      // May be kNoGap: buffers in this slot get freed. Unlearnt: unknown,
      // not the own gap (see the header).
      if (s != slot_gaps_.end()) gap = s->second;
    }

    // A rotating slot: the previous occupant was another buffer, and either
    // both came to this slot from one order of earlier uses (the same
    // signature, this one later: shards read in the order they were
    // written), or this buffer comes back to the same use as last time (a
    // cycle read again in its order, or buffers used in turn). The buffer
    // after this one in that order is the slot's next occupant.
    Occupant& o = occupants_[b.slot_key];
    const bool walks = o.had_previous && previous.has_value() &&
                       o.previous_signature == previous->first &&
                       o.previous_time < previous->second;
    const bool returns = previous.has_value() && previous->first == signature;
    if (o.id != id && o.time < now && (walks || returns)) {
      auto next = by_last_use_.upper_bound(*previous);
      if (next != by_last_use_.end() && next->first.first == previous->first &&
          next->second != id) {
        BufferState& n = buffers_.at(next->second);
        Repredict(next->second, n, After(now, now - o.time));
      }
    }
    o = Occupant{id, now, previous.has_value(), previous ? previous->first : 0,
                 previous ? previous->second : 0};
  } else {
    b.has_slot = false;
    gap = b.own_gap;
  }
  b.predicted = After(now, gap);
  if (inserted && InBurst(id, signature, now) && b.predicted == EvictionCandidate::kNoNextUse) {
    b.predicted = EvictionCandidate::kInSequence + now;
  }
  return b.predicted;
}

void NextUsePredictor::OnFreed(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  BufferState& b = it->second;
  by_last_use_.erase({b.signature, b.last_use});
  if (b.has_slot) {
    slot_members_[b.slot_key].erase(id);
    // Its last use was its last: buffers in that slot are not used again.
    Learn(b.slot_key, kNoGap, b.last_use);
  }
  buffers_.erase(it);
}

uint64_t NextUsePredictor::Predicted(uint64_t id) const {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? EvictionCandidate::kNoNextUse : it->second.predicted;
}

void NextUsePredictor::Reset() {
  slot_gaps_.clear();
  slot_members_.clear();
  occupants_.clear();
  for (auto& [id, b] : buffers_) b.has_slot = false;
}

}  // namespace stensor
