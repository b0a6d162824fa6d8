// ForcedOutLog: the last evictions the cap forced (MakeRoom's S405), each as
// the predicted time it happened and how far off the evicted buffer's next
// use was. A buffer needed again no sooner than one the cap forced out
// within the last iteration would be pushed out before that use too (under
// belady, the farther the sooner): brought in, its bytes move in and, if
// written, out again for nothing, where serving moves them once a use. The
// demand path (ChooseReach) and the prefetch planner both read it, so
// neither brings in what the other would leave in host memory.
//
// Thread-safety: none of its own; the owner serialises every call.
#ifndef STENSOR_POLICY_FORCED_OUT_H_
#define STENSOR_POLICY_FORCED_OUT_H_

#include <array>
#include <cstddef>
#include <cstdint>

namespace stensor {

class ForcedOutLog {
 public:
  // The cap forced out, at predicted time `now`, a buffer needed again
  // `distance` operations later (> 0).
  void Note(uint64_t now, uint64_t distance) { kept_[next_++ % kKept] = {now, distance}; }
  // Whether, since time `since`, the cap forced out a buffer whose next use
  // was no farther off than `distance`.
  bool Within(uint64_t distance, uint64_t since) const {
    for (const Forced& f : kept_) {
      if (f.distance != 0 && f.time >= since && f.distance <= distance) return true;
    }
    return false;
  }

 private:
  struct Forced {
    uint64_t time = 0;
    uint64_t distance = 0;  // 0: an empty entry
  };
  static constexpr size_t kKept = 16;
  std::array<Forced, kKept> kept_{};
  size_t next_ = 0;
};

}  // namespace stensor

#endif  // STENSOR_POLICY_FORCED_OUT_H_
