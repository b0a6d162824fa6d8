// NextUsePredictor: the predicted logical time (operation index) of each
// buffer's next use, for `belady` (EvictionCandidate::next_use) and the
// prefetch planner. It learns per (phase, argument slot) the gap to the next
// use of whatever buffer sat in that slot, and predicts a buffer's next use
// as now + the learned gap of the slot it is used in now. That covers:
//   (a) persistent weights used at fixed phases each iteration;
//   (b) buffers used once every K iterations (dataset shards read in a
//       cycle): the slot learns the gap K * period once the first shard
//       comes round again;
//   (c) per-step temporaries that get new ids every iteration (an
//       activation written in forward and read in backward): the slot
//       learns the gap from the previous iteration's buffer, whatever its id.
// Before an iteration is known (no phase), a buffer's own last gap is used.
// A buffer freed after its use in a slot teaches that slot "no next use".
// Nothing predicts -> EvictionCandidate::kNoNextUse.
//
// A prediction changes only when its buffer is used (OnUse returns it), so a
// caller can keep buffers in an index ordered by next use.
//
// Work: O(1) expected per call (hash maps). Memory: one entry per live
// buffer plus one per (phase, slot) seen since the last Reset().
//
// Thread-safety: not thread-safe; the caller serialises.
#ifndef STENSOR_POLICY_NEXT_USE_H_
#define STENSOR_POLICY_NEXT_USE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
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
  // `slot` is nullopt while no iteration is known. Call once per buffer per
  // operation, with the first slot it appears in; a second call at the same
  // time returns the first prediction unchanged.
  uint64_t OnUse(uint64_t id, uint64_t now, std::optional<Slot> slot);

  // The buffer is freed: its last slot learns "no next use" and the buffer
  // is forgotten.
  void OnFreed(uint64_t id);

  // The last prediction made for `id` (kNoNextUse if unknown or untracked).
  uint64_t Predicted(uint64_t id) const;

  // Forgets every learned slot gap (the pattern changed; phases mean
  // something else now). Buffers keep their own last gap.
  void Reset();

  size_t buffers() const { return buffers_.size(); }
  size_t slots() const { return slot_gaps_.size(); }

 private:
  static constexpr uint64_t kNoGap = EvictionCandidate::kNoNextUse;
  struct BufferState {
    uint64_t last_use = 0;
    uint64_t own_gap = kNoGap;     // its last gap between uses
    bool has_slot = false;         // last use had a phase
    uint64_t slot_key = 0;         // (phase, slot) of the last use
    uint64_t predicted = 0;
  };
  // Slots past 2^20 - 1 share one key (no operation has that many buffers).
  static uint64_t SlotKey(Slot s) {
    return (uint64_t{s.phase} << 20) | std::min<uint32_t>(s.slot, (1u << 20) - 1);
  }

  absl::flat_hash_map<uint64_t, BufferState> buffers_;
  absl::flat_hash_map<uint64_t, uint64_t> slot_gaps_;  // kNoGap = "freed"
};

}  // namespace stensor

#endif  // STENSOR_POLICY_NEXT_USE_H_
