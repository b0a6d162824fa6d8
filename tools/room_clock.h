// RoomClock: when memory handed back by write-backs is free in `stensor
// sim`'s time model. A buffer written back leaves the charge at once (the
// decision is made), but its memory holds its bytes until the copy out is
// done, as the library's does: a chunk goes to the next buffer in stream
// order, after the swap stream's copy. (So is the memory of a buffer
// dropped or freed while work issued before still uses it.) So whatever
// takes room (an allocation, a copy in) starts once the memory still held is
// no more than what the charge leaves free beside it.
//
// Thread-safety: none (one per replay or timed schedule).
#ifndef STENSOR_TOOLS_ROOM_CLOCK_H_
#define STENSOR_TOOLS_ROOM_CLOCK_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

namespace stensor {

class RoomClock {
 public:
  // `units` of memory (bytes or granules: the caller's one measure) are
  // free from `done` on.
  void Freed(double done, int64_t units) {
    if (units <= 0) return;
    // One copy engine queues the copies out: mostly in order already.
    auto at =
        std::upper_bound(pending_.begin(), pending_.end(), done,
                         [](double t, const std::pair<double, int64_t>& p) { return t < p.first; });
    pending_.insert(at, {done, units});
    held_ += units;
  }

  // The earliest time from `now` at which the memory still held by copies
  // out is at most `slack`: what the charge leaves free once the caller's
  // own room is counted in it.
  double ReadyFor(int64_t slack, double now) {
    while (!pending_.empty() && pending_.front().first <= now) {
      held_ -= pending_.front().second;
      pending_.pop_front();
    }
    const int64_t room = std::max<int64_t>(slack, 0);
    int64_t held = held_;
    double ready = now;
    for (const auto& p : pending_) {
      if (held <= room) break;
      held -= p.second;
      ready = p.first;
    }
    return ready;
  }

 private:
  std::deque<std::pair<double, int64_t>> pending_;  // (done, units), by done
  int64_t held_ = 0;                                // their units
};

}  // namespace stensor

#endif  // STENSOR_TOOLS_ROOM_CLOCK_H_
