#include "policy/next_use.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

namespace stensor {

void NextUsePredictor::Repredict(BufferState& b, uint64_t predicted) {
  if (b.predicted == predicted) return;
  b.predicted = predicted;
  changed_.emplace_back(b.id, predicted);
}

void NextUsePredictor::Learn(SlotState& slot, uint64_t gap, uint64_t now) {
  if (slot.learnt) {
    if (slot.gap == gap) return;  // nothing new: the usual case, O(1)
  } else {
    slot.learnt = true;
    ++learnt_slots_;
  }
  slot.gap = gap;
  // Every buffer last used in this slot comes back after the same gap: a
  // shard's cycle is learnt from the first shard seen twice, for all of them.
  for (uint64_t id : slot.members) {
    BufferState& m = buffers_.at(id);
    const uint64_t predicted = After(m.last_use, gap);
    // A prediction already in the past says nothing.
    Repredict(m, predicted <= now ? EvictionCandidate::kNoNextUse : predicted);
  }
}

void NextUsePredictor::Unlink(BufferState& b) {
  Order& order = *b.order;
  (b.prev != nullptr ? b.prev->next : order.first) = b.next;
  (b.next != nullptr ? b.next->prev : order.last) = b.prev;
  b.prev = b.next = nullptr;
  b.order = nullptr;
  if (order.first == nullptr) orders_.erase(b.signature);
}

void NextUsePredictor::Append(BufferState& b, uint64_t signature) {
  Order& order = orders_[signature];
  b.order = &order;
  b.prev = order.last;
  b.next = nullptr;
  (order.last != nullptr ? order.last->next : order.first) = &b;
  order.last = &b;
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
    // used since join it: the buffers last used under the signature from
    // the burst's start on, in the order of those uses (`id`, used now, is
    // last).
    BufferState* first = buffers_.at(id).order->last;
    while (first->prev != nullptr && first->prev->last_use >= burst.start) first = first->prev;
    for (BufferState* m = first; m != nullptr && m->last_use < now; m = m->next) {
      if (m->id != id && m->uses == 1 && m->predicted == EvictionCandidate::kNoNextUse) {
        Repredict(*m, EvictionCandidate::kInSequence + m->last_use);
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
  // The buffer after it in the order of last uses of its signature, before
  // this use moves it to the end (or of another signature's).
  BufferState* successor = nullptr;
  // Used again in the slot of its last use, which learns nothing new (the
  // steady state of a repeating pattern): it stays that slot's member, so
  // no set changes and no other buffer is re-predicted.
  bool same_slot = false;
  if (!inserted) {
    if (now == b.last_use) return b.predicted;  // second slot of the same op
    previous.emplace(b.signature, b.last_use);
    successor = b.next;
    // The last of its signature used again under it (a repeating pattern,
    // where each use has its own kind) stays where it is.
    if (successor != nullptr || b.signature != signature) {
      Unlink(b);
      Append(b, signature);
    }
    const uint64_t gap = now - b.last_use;
    // The first gap, from the use after allocation (an initialisation) to
    // the next, is not a period of anything.
    if (b.uses > 1) b.own_gap = gap;
    if (b.has_slot) {
      if (slot.has_value() && SlotKey(*slot) == b.slot_key) {
        same_slot = b.slot->learnt && b.slot->gap == gap;
      }
      if (!same_slot) {
        b.slot->members.erase(id);
        // The slot this buffer was last used in learns the gap to this use:
        // the next buffer in that slot (this one or a successor with a new
        // id), and every other buffer last used there, is predicted with it.
        Learn(*b.slot, gap, now);
      }
    }
  } else {
    b.id = id;
    Append(b, signature);
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
      b.slot = &slots_[b.slot_key];
      b.slot->members.insert(id);
      // May be kNoGap: buffers in this slot get freed. Unlearnt: unknown,
      // not the own gap (see the header).
      if (b.slot->learnt) gap = b.slot->gap;
    }

    // A rotating slot: the previous occupant was another buffer, and either
    // both came to this slot from one order of earlier uses (the same
    // signature, this one later: shards read in the order they were
    // written), or this buffer comes back to the same use as last time (a
    // cycle read again in its order, or buffers used in turn). The buffer
    // after this one in that order is the slot's next occupant.
    Occupant& o = b.slot->occupant;
    const bool walks = o.had_previous && previous.has_value() &&
                       o.previous_signature == previous->first &&
                       o.previous_time < previous->second;
    const bool returns = previous.has_value() && previous->first == signature;
    if (o.id != id && o.time < now && (walks || returns) && successor != nullptr) {
      Repredict(*successor, After(now, now - o.time));
    }
    o = Occupant{id, now, previous.has_value(), previous ? previous->first : 0,
                 previous ? previous->second : 0};
  } else {
    b.has_slot = false;
    b.slot = nullptr;
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
  Unlink(b);
  if (b.has_slot) {
    b.slot->members.erase(id);
    // Its last use was its last: buffers in that slot are not used again.
    Learn(*b.slot, kNoGap, b.last_use);
  }
  buffers_.erase(it);
}

uint64_t NextUsePredictor::Predicted(uint64_t id) const {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? EvictionCandidate::kNoNextUse : it->second.predicted;
}

void NextUsePredictor::Reset() {
  slots_.clear();
  learnt_slots_ = 0;
  for (auto& [id, b] : buffers_) {
    b.has_slot = false;
    b.slot = nullptr;
  }
}

}  // namespace stensor
