// MakeRoom: the order in which room is made under the cap (S401-S405). The
// memory manager and `stensor sim` supply the steps (the library's do the
// copies and the waits, the simulator's count and model them); this loop
// alone decides which step comes next, so both make room alike.
//
// Thread-safety: as the steps given; the loop keeps no state.
#ifndef STENSOR_POLICY_MAKE_ROOM_H_
#define STENSOR_POLICY_MAKE_ROOM_H_

namespace stensor {

class RoomSteps {
 public:
  // What a step did: nothing, made progress (look again from the top), or
  // ended the search (the caller knows why).
  enum class Outcome { kNothing, kProgress, kStop };

  virtual ~RoomSteps() = default;

  // S401/S402: whether the need fits under the cap now.
  virtual bool Fits() = 0;
  // Memory that is free or becoming free without evicting anything: freed
  // buffers kept for reuse, pooled chunks, frees that already ran.
  virtual Outcome Reclaim() { return Outcome::kNothing; }
  // S403 (version rules only): the least recently used buffer whose device
  // copy may go without a transfer goes. `spend_prefetched`: buffers
  // fetched ahead of their use may be taken too.
  virtual bool DropOneClean(bool spend_prefetched) = 0;
  // S404: freed buffers still in use are released, or handed on in stream
  // order, or waited for.
  virtual bool ReleaseGarbage() { return false; }
  // S405: the first buffer in the policy's order goes.
  virtual bool EvictByPolicy(bool spend_prefetched) = 0;
  // Whether buffers fetched ahead of their use may be taken now (false
  // stops the search: the caller may not wait for what that costs).
  virtual bool MayTakePrefetched() { return true; }
  // When nothing is left to evict: waits that may still make room, or the
  // error that kept the last candidate from going (kStop).
  virtual Outcome LastResort() { return Outcome::kNothing; }
};

enum class RoomResult {
  kFits,     // the need fits under the cap
  kStopped,  // a step ended the search (RoomSteps::Outcome::kStop)
  kNoRoom,   // nothing left to free
};

// Takes steps until the need fits or nothing is left. `version_rules`:
// tensor version control (S403), every policy but `lru`.
RoomResult MakeRoomLoop(RoomSteps& steps, bool version_rules);

}  // namespace stensor

#endif  // STENSOR_POLICY_MAKE_ROOM_H_
