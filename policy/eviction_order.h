// EvictionOrder: one device's evictable buffers in the order evictions take
// them (S403: droppable ones, least recently used first; S405: the policy's
// order), and the rules that read a buffer's S03 fields for them: what may
// go without a copy, what the policy sees, whether an eviction copies, which
// buffer goes next. The memory manager and `stensor sim` both decide with
// it, so the simulator replays the library's choices, not an imitation.
//
// Keys are brought up to date when an eviction reads the order, not at each
// change: every operation changes the keys of the buffers it uses (last and
// next uses), and under a cap that does not bind nothing reads the order.
// A key depends on the buffer's fields only, so the order read is the one
// re-keying at every change would have made.
//
// Thread-safety: none of its own; the owner serialises every call (the
// memory manager under its lock).
#ifndef STENSOR_POLICY_EVICTION_ORDER_H_
#define STENSOR_POLICY_EVICTION_ORDER_H_

#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "policy/eviction_policy.h"
#include "policy/forced_out.h"

namespace stensor {

// The S03 fields eviction decisions read, and the buffer's place in an
// EvictionOrder. The memory manager's buffers and the simulator's derive
// from it.
struct EvictionState {
  uint64_t id = 0;        // what the policy sees
  uint64_t reserved = 0;  // device memory its eviction frees (granules, or the charge)
  uint64_t serial = 0;    // allocation order: the last tie-break, unique per order
  Location location = Location::kGpuOnly;
  uint64_t gpu_version = 0;
  uint64_t host_version = 0;
  uint64_t last_use = 0;
  uint64_t next_use = EvictionCandidate::kNoNextUse;  // predicted
  // Whether any operation may have written it since allocation: a
  // never-written buffer holds what fresh memory holds, so under a version
  // policy it moves without any copy.
  bool written = false;
  // Resident, but the device memory does not hold the data: the host copy
  // does. Evicted without a copy.
  bool stale_device = false;
  // Operations being prepared or submitted that hold it: never chosen.
  int pins = 0;
  // Fetched ahead of its use and not used yet: chosen only when nothing
  // else can go (else prefetching would just feed the next eviction).
  bool prefetched = false;
  uint64_t failed_round = 0;  // the round in which evicting it failed

  bool clean() const { return location == Location::kCpuGpu && host_version == gpu_version; }

 private:
  friend class EvictionOrder;
  bool eligible_ = false;  // as its owner last said (EvictionOrder::Update)
  bool indexed_ = false;
  std::tuple<EvictionKey, uint64_t, uint64_t> index_key_;
  bool drop_indexed_ = false;
  std::pair<uint64_t, uint64_t> drop_key_;  // (last use, serial)
  // Its keys may be out of date: listed for re-keying at `rekey_at_`.
  bool rekey_ = false;
  size_t rekey_at_ = 0;
};

class EvictionOrder {
 public:
  // `version_rules`: tensor version control (S403), every policy but `lru`.
  // `policy` outlives the order.
  EvictionOrder(const EvictionPolicy* policy, bool version_rules)
      : policy_(policy), version_rules_(version_rules) {}
  EvictionOrder(const EvictionOrder&) = delete;
  EvictionOrder& operator=(const EvictionOrder&) = delete;

  const EvictionPolicy& policy() const { return *policy_; }
  bool version_rules() const { return version_rules_; }

  // Whether the device copy may go without a transfer: the host copy is
  // current, or (version rules) nothing was ever written to it, or the
  // device copy is not the data.
  bool Droppable(const EvictionState& b) const {
    return b.stale_device || b.clean() || (version_rules_ && !b.written);
  }
  // What the policy sees: what may go without a copy is shown clean.
  EvictionCandidate CandidateOf(const EvictionState& b) const;
  // Whether evicting `b` copies it to the host: as the policy says, and
  // always when dropping would lose data.
  bool Copies(const EvictionState& b) const {
    return policy_->Copies(CandidateOf(b)) || !Droppable(b);
  }
  // Whether an operation about to use a buffer next needed at `next_use`
  // should reach it in host memory rather than displace `victim`.
  bool ServeRatherThanFetch(uint64_t next_use, const EvictionState& victim) const {
    return policy_->ServeRatherThanFetch(next_use, CandidateOf(victim));
  }

  // After any change to `b`'s fields: `eligible` says whether it may be
  // evicted at all now (resident, and neither freed nor out of the owner's
  // control); pins, failed rounds and prefetches are looked at by Victim.
  void Update(EvictionState& b, bool eligible) {  // inline: every use of a buffer passes here
    b.eligible_ = eligible;
    // Never in either order and not going in: nothing to do.
    if (!eligible && !b.indexed_ && !b.drop_indexed_) return;
    if (!b.rekey_) {
      b.rekey_ = true;
      b.rekey_at_ = rekey_.size();
      rekey_.push_back(&b);
    }
  }
  // Takes `b` out of the order (before it is destroyed).
  void Remove(EvictionState& b);

  // The cap forced `b` out at predicted time `now` (MakeRoom's S405, in the
  // library and in `stensor sim` alike). Kept: how far off its next use was.
  // The latest Victim's pick is the `b` meant (as MakeRoom calls them).
  void NoteForcedOut(const EvictionState& b, uint64_t now) {
    // A next use nothing predicts, or overdue, says nothing of the pressure.
    if (b.next_use >= EvictionCandidate::kInSequence || b.next_use <= now) return;
    // Taken because buffers fetched ahead of their use, ranked before it,
    // were spared: the pressure was the fetches', not the cap's (a buffer
    // needed by the next operation, forced out while four fetched ones held
    // half the cap, made every use serve for an iteration).
    if (passed_prefetched_) return;
    forced_.Note(now, b.next_use - now);
  }
  // Whether, since time `since`, the cap forced out a buffer whose next use
  // was no farther off than `distance`: one fetched now and needed again
  // only that far off would be pushed out before then (ForcedOutLog).
  bool ForcedOutWithin(uint64_t distance, uint64_t since) const {
    return forced_.Within(distance, since);
  }
  const ForcedOutLog& forced_out() const { return forced_; }

  // Which buffers a look may take.
  struct Filter {
    // Skips the buffers whose eviction failed in this round.
    uint64_t round = std::numeric_limits<uint64_t>::max();
    // Takes buffers fetched ahead of their use too.
    bool spend_prefetched = false;
    // Bytes still short of the need (0: unknown) and the predictor's time
    // now: with both, Victim weighs sizes (see SizedVictim).
    uint64_t shortfall = 0;
    uint64_t now = 0;
  };
  // The first buffer in the policy's order (S405), or in the droppable
  // order (S403), that `filter` and `may_take` accept; null if none. Pinned
  // buffers are never taken. Given a shortfall, Victim may take a smaller
  // one that covers it instead (SizedVictim), under a policy that ranks by
  // predicted next uses.
  template <typename Accept>
  EvictionState* Victim(const Filter& filter, Accept may_take) {
    EvictionState* first = First(evictable_, filter, may_take);
    if (first == nullptr || filter.shortfall == 0 || !policy_->RanksByNextUse()) return first;
    return SizedVictim(*first, filter, may_take);
  }
  EvictionState* Victim(const Filter& filter) {
    return Victim(filter, [](const EvictionState&) { return true; });
  }
  template <typename Accept>
  EvictionState* DropVictim(const Filter& filter, Accept may_take) {
    return First(droppable_, filter, may_take);
  }
  EvictionState* DropVictim(const Filter& filter) {
    return DropVictim(filter, [](const EvictionState&) { return true; });
  }

  // How many buffers each order holds, once up to date (tests).
  size_t evictable_size() {
    Flush();
    return evictable_.size();
  }
  size_t droppable_size() {
    Flush();
    return droppable_.size();
  }

 private:
  static bool Skipped(const EvictionState& b, const Filter& filter) {
    return b.pins > 0 || b.failed_round == filter.round ||
           (b.prefetched && !filter.spend_prefetched);
  }
  template <typename Map, typename Accept>
  EvictionState* First(Map& order, const Filter& filter, Accept& may_take) {
    Flush();
    passed_prefetched_ = false;
    for (auto& [key, b] : order) {
      if (!Skipped(*b, filter) && may_take(*b)) return b;
      if (b->prefetched && !filter.spend_prefetched) passed_prefetched_ = true;
    }
    return nullptr;
  }
  // Belady's order ignores sizes: short of 1 MiB, it evicts a 24 MiB tensor
  // needed a little after a 2 MiB one, and moves 48 MiB (out and back in)
  // where 4 would do; or it copies out a 24 MiB gradient nothing uses again
  // rather than move 4. So among the first kSizedLook candidates, one that
  // covers the shortfall alone at a smaller cost goes instead. The cost is
  // bytes moved: out when dirty, and back in when a next use is predicted
  // (none is for a buffer whose slot saw its occupants freed). Only a
  // candidate with a predicted next use may replace the first, and only if
  // that is at least half as far off as the farthest predicted one's: else
  // it would be the next thing needed back, and would only move the
  // eviction to a later operation. A first ranked in a sequence
  // (EvictionCandidate::kInSequence) is taken as the order says.
  static constexpr int kSizedLook = 64;
  static bool InSequence(const EvictionState& b) {
    return b.next_use >= EvictionCandidate::kInSequence &&
           b.next_use != EvictionCandidate::kNoNextUse;
  }
  uint64_t MoveCost(const EvictionState& b) const {
    return b.reserved *
           ((Copies(b) ? 1 : 0) + (b.next_use != EvictionCandidate::kNoNextUse ? 1 : 0));
  }
  template <typename Accept>
  EvictionState* SizedVictim(EvictionState& first, const Filter& filter, Accept& may_take) {
    if (first.reserved <= filter.shortfall || InSequence(first)) return &first;
    EvictionState* best = &first;
    uint64_t best_cost = MoveCost(first);
    uint64_t horizon = 0;  // of the farthest predicted next use (the order's first)
    int looked = 0;
    for (auto& [key, b] : evictable_) {
      if (best_cost == 0 || ++looked > kSizedLook) break;
      const bool predicted = b->next_use < EvictionCandidate::kInSequence;
      if (predicted) {
        if (b->next_use <= filter.now) continue;  // overdue: says nothing
        if (horizon == 0) horizon = b->next_use - filter.now;
        if (2 * (b->next_use - filter.now) < horizon) break;  // the rest come sooner still
      } else {
        // Nothing predicts its next use: it may be the next operation's.
        // Taken only in the order's turn (least recently used among such).
        continue;
      }
      if (b == &first || b->reserved < filter.shortfall || Skipped(*b, filter)) continue;
      if (const uint64_t cost = MoveCost(*b); cost < best_cost && may_take(*b)) {
        best = b;
        best_cost = cost;
      }
    }
    return best;
  }
  void Flush();
  void Rekey(EvictionState& b);

  const EvictionPolicy* const policy_;
  const bool version_rules_;
  absl::btree_map<std::tuple<EvictionKey, uint64_t, uint64_t>, EvictionState*> evictable_;
  absl::btree_map<std::pair<uint64_t, uint64_t>, EvictionState*> droppable_;
  std::vector<EvictionState*> rekey_;
  ForcedOutLog forced_;  // the last forced evictions (NoteForcedOut)
  // The latest look passed over a buffer fetched ahead of its use.
  bool passed_prefetched_ = false;
};

}  // namespace stensor

#endif  // STENSOR_POLICY_EVICTION_ORDER_H_
