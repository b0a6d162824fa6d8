// NextUsePredictor: the predicted logical time (operation index) of each
// buffer's next use, for `belady` (EvictionCandidate::next_use) and the
// prefetch planner. It learns per (phase, argument slot) the gap to the next
// use of whatever buffer sat in that slot, and predicts a buffer's next use
// as now + the learned gap of the slot it is used in now. That covers:
//   (a) persistent weights used at fixed phases each iteration;
//   (b) buffers used once every K iterations (dataset shards read in a
//       cycle): the slot learns the gap K * period once the first shard
//       comes round again, and then every buffer whose last use was in that
//       slot is re-predicted with it (last use + gap), not only the next one
//       used there;
//   (c) per-step temporaries that get new ids every iteration (an
//       activation written in forward and read in backward): the slot
//       learns the gap from the previous iteration's buffer, whatever its id.
// Rotating slots: when a slot holds a different buffer each iteration and
// its occupants walk, in order, through buffers last used together under one
// signature (the same kernel and argument: shards written one after another
// at start), or its occupant comes back to the use it had last time (a cycle
// read again, buffers used in turn), the buffer following the current
// occupant in that order of last uses is predicted for the slot's next
// occurrence (now + the time since the previous occupant). That predicts a
// cyclic dataset in its first cycle, before any shard was seen twice, and
// across the wrap to the next.
// Before an iteration is known (no phase), a buffer's own last gap is used,
// but never its first: from the use after its allocation (an
// initialisation) to the next says nothing about a period.
// Once one is known, an own gap is not a prediction: it is one sample, often
// spanning the program's set-up (a shard's first gap, from its
// initialisation to its first read, says nothing about its next), and a
// wrong "soon" makes the planner fetch and hold what is not needed.
// A buffer freed after its use in a slot teaches that slot "no next use".
// Bursts: a buffer first used in the fourth or a later of consecutive
// operations that each first-use a buffer under one signature (a dataset
// written shard by shard, same-shaped layers initialised in a row), and
// nothing predicts, is given its place in that sequence
// (EvictionCandidate::kInSequence + the time of its first use) until it is
// used again; the burst's first three get it too when the fourth comes.
// Nothing predicts -> EvictionCandidate::kNoNextUse.
//
// A buffer's prediction changes when it is used (OnUse returns it) or when
// one of the two rules above names it; TakeChanged() lists the latter, so a
// caller can keep buffers in an index ordered by next use.
//
// Work: O(1) per call (one look-up of the buffer; its slot and its place
// among the last uses of its signature are linked to it), plus the buffers
// re-predicted when a slot's learnt gap changes or a burst forms. Memory: a
// few entries per live buffer plus one per (phase, slot) seen since the
// last Reset().
//
// Thread-safety: not thread-safe; the caller serialises.
#ifndef STENSOR_POLICY_NEXT_USE_H_
#define STENSOR_POLICY_NEXT_USE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "policy/eviction_policy.h"

namespace stensor {

class NextUsePredictor {
 public:
  // Where in the iteration a use happens: the operation's phase (from the
  // IterationDetector) and the buffer's argument slot in that operation.
  struct Slot {
    size_t phase = 0;
    uint32_t slot = 0;
  };

  // Records that buffer `id` is used at logical time `now` (times never
  // decrease) and returns its predicted next use (kNoNextUse when unknown).
  // `slot` is nullopt while no iteration is known. `signature` names the
  // kind of use (the operation's key and the argument position), known or
  // not: rotating slots follow the order of uses of one signature. Call once
  // per buffer per operation, with the first slot it appears in; a second
  // call at the same time returns the first prediction unchanged.
  uint64_t OnUse(uint64_t id, uint64_t now, std::optional<Slot> slot, uint64_t signature = 0);

  // (id, new prediction) of the buffers other than the one used whose
  // prediction OnUse or OnFreed changed since the last call, in order (a
  // buffer may appear twice; the last entry counts).
  std::vector<std::pair<uint64_t, uint64_t>> TakeChanged() { return std::exchange(changed_, {}); }

  // The buffer is freed: its last slot learns "no next use" and the buffer
  // is forgotten.
  void OnFreed(uint64_t id);

  // The last prediction made for `id` (kNoNextUse if unknown or untracked).
  uint64_t Predicted(uint64_t id) const;

  // Forgets every learned slot gap and slot occupant (the pattern changed;
  // phases mean something else now). Buffers keep their own last gap.
  void Reset();

  size_t buffers() const { return buffers_.size(); }
  size_t slots() const { return learnt_slots_; }

 private:
  static constexpr uint64_t kNoGap = EvictionCandidate::kNoNextUse;
  struct SlotState;
  struct Order;
  struct BufferState {
    uint64_t id = 0;
    uint64_t last_use = 0;
    uint64_t signature = 0;  // of the last use
    uint64_t uses = 0;
    uint64_t own_gap = kNoGap;  // its last gap between uses, not the first
    bool has_slot = false;      // last use had a phase
    uint64_t slot_key = 0;      // (phase, slot) of the last use
    SlotState* slot = nullptr;  // its state, while has_slot
    uint64_t predicted = 0;
    // Its place among the buffers last used under its signature, which are
    // in the order of those uses: a use is the latest, so it moves to the
    // end (the rotating-slot rule asks who followed a buffer there).
    Order* order = nullptr;
    BufferState* prev = nullptr;
    BufferState* next = nullptr;
  };
  // The last buffer used in a slot, and where its use before that was.
  struct Occupant {
    uint64_t id = 0;
    uint64_t time = 0;
    bool had_previous = false;
    uint64_t previous_signature = 0;
    uint64_t previous_time = 0;
  };
  struct SlotState {
    bool learnt = false;
    uint64_t gap = kNoGap;  // once learnt; kNoGap = "freed"
    // Buffers whose last use was in this slot (for Learn).
    absl::flat_hash_set<uint64_t> members;
    Occupant occupant;
  };
  struct Order {
    BufferState* first = nullptr;
    BufferState* last = nullptr;
  };
  // Slots past 2^20 - 1 share one key (no operation has that many buffers).
  static uint64_t SlotKey(Slot s) {
    return (uint64_t{s.phase} << 20) | std::min<uint32_t>(s.slot, (1u << 20) - 1);
  }
  // `now + gap`, kNoNextUse when there is no gap or it would leave the
  // range of times (EvictionCandidate::kInSequence and up are no times).
  static uint64_t After(uint64_t now, uint64_t gap) {
    return gap == kNoGap || gap >= EvictionCandidate::kInSequence -
                                       std::min(now, EvictionCandidate::kInSequence)
               ? EvictionCandidate::kNoNextUse
               : now + gap;
  }
  // The slot learnt `gap`: its other members are re-predicted with it.
  void Learn(SlotState& slot, uint64_t gap, uint64_t now);
  // Sets another buffer's prediction, noting the change.
  void Repredict(BufferState& b, uint64_t predicted);
  // Takes `b` out of its signature's order, and puts it last in that of
  // `signature` (its use now is the latest).
  void Unlink(BufferState& b);
  void Append(BufferState& b, uint64_t signature);

  // Node maps: buffers, slots and orders point at each other.
  absl::node_hash_map<uint64_t, BufferState> buffers_;
  absl::node_hash_map<uint64_t, SlotState> slots_;  // by slot key
  size_t learnt_slots_ = 0;
  absl::node_hash_map<uint64_t, Order> orders_;  // by signature; never empty
  // Per signature, the current burst of first uses in consecutive
  // operations (for EvictionCandidate::kInSequence).
  struct Burst {
    uint64_t start = 0;
    uint64_t last = 0;
    uint64_t length = 0;
  };
  static constexpr uint64_t kMinBurst = 4;
  absl::flat_hash_map<uint64_t, Burst> bursts_;
  // Notes a first use of `id` under `signature` at `now`; true when it is
  // part of a burst (the burst's earlier members are re-predicted when it
  // becomes one).
  bool InBurst(uint64_t id, uint64_t signature, uint64_t now);
  std::vector<std::pair<uint64_t, uint64_t>> changed_;
};

}  // namespace stensor

#endif  // STENSOR_POLICY_NEXT_USE_H_
