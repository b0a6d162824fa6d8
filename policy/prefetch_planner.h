// PrefetchPlanner: the decisions of prefetch and planned eviction, driven by
// the memory manager (or `stensor sim`) once per operation. It decides; the
// caller does the swaps and reports back.
//
// The caller keeps the planner's view of its buffers current through
// callbacks, made under the caller's lock:
//   OnUse(id, bytes, now, next_use, write)  an operation at logical time
//       `now` uses the buffer; next_use is the NextUsePredictor's prediction
//       (kNoNextUse when unknown). Resident from then on, unless it was
//       swapped out and no OnResident came: the operation reached it in
//       host memory (served), and it stays swapped out;
//   OnNextUse(id, next_use)  a new prediction without a use;
//   OnResident(id)  a swap-in was issued (on demand or a planned fetch):
//       the buffer is resident with a current host copy (clean); every
//       swap-in is reported, before the use it is for;
//   OnEvicted(id)   its device copy is gone (any reason); of a buffer not
//       heard of yet, it is swapped out;
//   OnFreed(id)     the application freed it;
//   SetPinned(id, pinned)  not evictable for now (in flight, below the
//       granularity): the planner never proposes it;
//   CancelFetch(id)  a proposed fetch the caller did not issue (no room after
//       all, a failed copy): it may be proposed again.
// and asks, before submitting the operation at logical time `now` (after its
// OnUse calls and on-demand swap-ins):
//   Plan(now, free_bytes, h2d_queued_seconds) -> actions, in order.
//
// The link: the planner models the host->device queue itself, in its own
// time, like `stensor sim`'s copy engine: a modelled compute stream advances
// by each operation's profiled compute; a fetch queues its transfer time t
// on the link behind what is queued, and so does a write-back (one swap
// stream carries both in the library; the fetch into the memory a victim
// leaves waits for its copy in the sim); an operation using a fetched buffer
// whose modelled copy has not finished waits for it, and an on-demand swap-in
// (OnResident of a buffer not fetched) makes the stream wait for everything
// queued and for its own copy. The queue is what the link has left at the
// stream's time. No clock is read, so the same profile and sequence of
// operations give the same decisions (a queue read from the wall clock made
// the library's choices differ from run to run).
// Fetch: a swapped-out buffer with a predicted use u > now is fetched when
// waiting one more operation would leave less compute before u (from the
// profile) than its transfer time plus what is already queued on the
// host->device link, i.e. the fetch starts at least t of compute ahead of the
// use when the profile allows; or earlier (up to early_factor times that
// lead, within one iteration) while free memory above
// Options::free_reserve_bytes takes it without evicting.
// A fetch whose use has less compute before it than Options::min_cover of
// its transfer time is not made at all: it would barely shorten the stall
// and only hold memory (with no compute in the profile, nothing is fetched).
// Room for an urgent fetch comes from resident buffers whose next use is
// strictly later than the fetched buffer's, clean ones farthest first, then
// dirty ones farthest first (never one needed sooner, never one fetched and
// not yet used; a clean victim costs no write-back); if they cannot make the
// room, nothing is fetched. With a ForcedOutLog (a next-use policy, whose
// uses serve a buffer rather than displace one needed no later than its own
// next use: ChooseReach), victims must be needed later than the fetched
// buffer's use after the one it is fetched for, where the profile knows it.
// A buffer of the current operation may be among them:
// the caller queues its swap-out behind that operation's completion, as for
// every eviction, and the fetch into its memory then overlaps the operations
// after it. (Excluding them made worse victims: in replay_test it cost 30 %
// more weight traffic than belady alone.)
// Planned eviction: while the swapped-out buffers due soon (within
// early_factor times their lead) need more memory than is free, clean
// resident buffers whose last use has passed (not used by the current
// operation) and whose next use is predicted after everything due (far
// enough that the compute before it covers a fetch) or not at all are
// dropped early, farthest first. Dirty ones are left to the eviction
// policy: a planned write-back is a copy swapping on demand may never make.
// Back-off: a fetched buffer evicted before its use is thrash; each one
// doubles a pause (in operations) during which the planner proposes
// nothing; a fetch that was used halves it. stats() counts all of it.
// Cost cut-off: a fetch saves stall, never bytes (what it fetches would be
// swapped in on demand anyway), so the bytes the planner causes are pure
// cost. They are counted from the callbacks alone (no timing, so the same
// sequence of events gives the same decisions): a fetch evicted unused
// (its bytes); a victim that comes back (on demand or fetched) before the
// use it was evicted for, i.e. one needed sooner than what took its room
// (its bytes in, plus its write-back when it was dirty). Victims are the
// planner's own evictions (charged until the use of what they made room
// for) and the caller's evictions while fetched, unused buffers held memory
// (charged until the earliest predicted use among those). Once they exceed
// Options::cost_share of the bytes moved so far plus one largest buffer, the
// planner stops for good: prefetch falls back to swapping on demand instead
// of thrashing (stats().stopped).
// A prediction that passed without a use counts as "no next use" from then
// on (the planner re-keys its own indexes; the caller's belady keys keep the
// old value until the buffer's next use).
// Without a profile (SetProfile not called) Plan proposes nothing.
//
// Work per Plan: bounded by Options::max_scan (index entries looked at) and
// max_actions; callbacks are O(log n).
//
// Thread-safety: not thread-safe; the caller serialises (its lock).
#ifndef STENSOR_POLICY_PREFETCH_PLANNER_H_
#define STENSOR_POLICY_PREFETCH_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "policy/access_profile.h"
#include "policy/forced_out.h"

namespace stensor {

struct PlannedAction {
  enum class Kind : uint8_t {
    kEvict,  // take the device copy off (copy to host first when `copy`)
    kFetch,  // swap in now, ahead of its use
  };
  Kind kind = Kind::kFetch;
  uint64_t id = 0;
  bool copy = false;  // kEvict only: the device copy is dirty
  bool operator==(const PlannedAction& o) const {
    return kind == o.kind && id == o.id && copy == o.copy;
  }
};

class PrefetchPlanner {
 public:
  struct Options {
    // Fetches per Plan (the evictions making room for them come on top,
    // bounded by max_scan).
    size_t max_actions = 16;
    size_t max_scan = 64;  // index entries examined per Plan
    // Free memory an early (not yet urgent) fetch must leave untouched, for
    // the allocations of the step itself.
    uint64_t free_reserve_bytes = 0;
    // Multiplies the transfer time a fetch must be ahead by (> 1 leaves a
    // margin for a slower link than profiled).
    double lead_factor = 1.0;
    // How much earlier than strictly needed a fetch may start when memory
    // is free, and how far ahead planned evictions make room: a multiple of
    // the fetch's lead (transfer plus queue). Larger holds memory longer.
    double early_factor = 2.0;
    // First pause after thrash, in operations; doubled up to max_backoff.
    uint64_t min_backoff = 16;
    uint64_t max_backoff = uint64_t{1} << 16;
    // The share of the bytes moved that the planner's own extra bytes may
    // reach (plus one largest buffer) before it stops for good.
    double cost_share = 0.02;
    // The share of its transfer time a fetch must be able to hide (compute
    // before its use): a fetch that would hide less is left on demand.
    double min_cover = 0.5;
  };

  struct Stats {
    uint64_t plans = 0;
    uint64_t fetches = 0;            // kFetch proposed
    uint64_t fetch_hits = 0;         // fetched and then used while resident
    uint64_t fetches_wasted = 0;     // fetched, evicted before use (thrash)
    uint64_t fetch_evictions = 0;    // kEvict proposed to make room
    uint64_t planned_evictions = 0;  // kEvict after a last use
    uint64_t planned_copies = 0;     // of those, dirty (written back)
    uint64_t on_demand = 0;          // swapped in without a planned fetch
    uint64_t served = 0;             // used where it was, in host memory
    uint64_t left_to_use = 0;        // due, but its use serves it (ForcedOutLog)
    uint64_t backoffs = 0;           // pauses started
    uint64_t plans_paused = 0;       // Plan calls that proposed nothing for it
    uint64_t bytes_moved = 0;        // seen copied in and out (callbacks)
    uint64_t bytes_caused = 0;       // of those, extra bytes the plans caused
    bool stopped = false;            // the cost cut-off was reached
  };

  PrefetchPlanner() : PrefetchPlanner(Options{}) {}
  explicit PrefetchPlanner(Options options) : options_(options) {}

  // The profile Plan reads compute times from, and the logical time of an
  // operation with phase 0 (so phases of later times follow). nullptr
  // removes it (the pattern changed): Plan proposes nothing until the next.
  void SetProfile(std::shared_ptr<const AccessProfile> profile, uint64_t phase0_time);
  // Re-anchors phase 0 at `now` (an iteration boundary): one-off operations
  // do not shift the phases of later ones.
  void OnIterationBoundary(uint64_t now) { origin_ = now; }

  void OnUse(uint64_t id, uint64_t bytes, uint64_t now, uint64_t next_use, bool write);
  // A buffer's predicted next use changed without a use (the predictor
  // learnt more): re-keyed. Unknown ids are ignored.
  void OnNextUse(uint64_t id, uint64_t next_use);
  void OnResident(uint64_t id);
  void OnEvicted(uint64_t id);
  void OnFreed(uint64_t id);
  void SetPinned(uint64_t id, bool pinned);
  void CancelFetch(uint64_t id);

  // Actions to take now, in order (an eviction before the fetch it makes
  // room for). `free_bytes`: device memory free under the cap now;
  // `h2d_queued_seconds`: host->device transfer time the caller knows to be
  // queued beyond the planner's own model of the link (the larger counts);
  // 0 leaves the decisions to the profile and the operations alone.
  // With `forced` (the cap's forced evictions, under a next-use policy), a
  // swapped-out buffer needed again after its coming use no sooner than one
  // the cap forced out within the last iteration is left to that use.
  std::vector<PlannedAction> Plan(uint64_t now, uint64_t free_bytes, double h2d_queued_seconds,
                                  const ForcedOutLog* forced = nullptr);

  const Stats& stats() const { return stats_; }
  size_t resident() {
    FlushResident();
    return resident_.size();
  }
  size_t swapped_out() const { return swapped_.size(); }

 private:
  // Index order: by next use; at equal next use a dirty buffer before a
  // clean one, so that taking from the far end takes the clean one first
  // (a drop, where the dirty one costs a write-back too); then by id.
  struct Entry {
    uint64_t next_use;
    bool clean;
    uint64_t id;
    bool operator==(const Entry& o) const {
      return next_use == o.next_use && clean == o.clean && id == o.id;
    }
    bool operator<(const Entry& o) const {
      return std::tie(next_use, clean, id) < std::tie(o.next_use, o.clean, o.id);
    }
  };
  struct Buffer {
    uint64_t bytes = 0;
    uint64_t next_use = 0;
    uint64_t last_use = 0;
    bool resident = true;
    bool dirty = true;
    bool pinned = false;
    bool fetched = false;  // fetched by the planner, not yet used
    double ready = 0;      // fetched: when its modelled copy finishes
    // Swapped out by a planned eviction or while fetched buffers held
    // memory: its return on demand is charged to the planner. Cleared by a
    // use. `charge` is what its return costs (bytes in, plus the write-back
    // when it was dirty); 0 when nothing is charged.
    uint64_t charge = 0;
    uint64_t charge_until = 0;  // a return before this time is charged
    // A kEvict of it was proposed for a use at this time (0: none pending).
    uint64_t proposed_for = 0;
    // Its entry in resident_ (`listed`), and whether that may be out of
    // date (listed in rekey_).
    bool listed = false;
    Entry listed_key{};
    bool rekey = false;
  };
  static Entry Key(uint64_t id, const Buffer& b) { return {b.next_use, !b.dirty, id}; }
  // Around a change of a buffer's fields. A swapped-out buffer's entry is
  // kept current at once; a resident one's is re-keyed when resident_ is
  // next read (FlushResident), since every use changes it and most plans
  // never read it: the stale sweep reads expiry_ instead.
  void Unindex(uint64_t id, Buffer& b);
  void Index(uint64_t id, Buffer& b);
  void MarkRekey(uint64_t id, Buffer& b);
  void FlushResident();
  // A fetched buffer was lost before its use: pause, doubling the pause.
  void Thrashed();
  // Adds planner-caused bytes; stops the planner past the cut-off.
  void Charge(uint64_t bytes);
  // A non-resident buffer becomes resident without a planned fetch.
  void Returned(Buffer& b, uint64_t now);
  // Compute seconds of operations [from, to); kNoNextUse -> infinite.
  double ComputeBetween(uint64_t from, uint64_t to) const;

  Options options_;
  std::shared_ptr<const AccessProfile> profile_;
  uint64_t origin_ = 0;
  absl::flat_hash_map<uint64_t, Buffer> buffers_;
  // B-trees: every use re-keys a buffer, and a node allocation each time
  // cost more than the rest of the use.
  absl::btree_set<Entry> resident_;  // evictable resident buffers by next use
  std::vector<uint64_t> rekey_;      // whose entry there may be out of date
  // Every key an evictable resident buffer took with a predicted use,
  // smallest first; those no longer a buffer's key are skipped when read.
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const { return b < a; }
  };
  std::priority_queue<Entry, std::vector<Entry>, Later> expiry_;
  absl::btree_set<Entry> swapped_;  // swapped-out buffers by next use
  uint64_t last_plan_ = 0;          // `now` of the latest Plan
  uint64_t backoff_ = 0;            // current pause length
  uint64_t paused_until_ = 0;
  // Fetched, resident, not yet used, by predicted next use.
  absl::btree_set<std::pair<uint64_t, uint64_t>> fetched_resident_;
  uint64_t largest_ = 0;  // largest buffer seen
  // The modelled compute stream and link, in seconds: the stream is at
  // `stream_` when the operation at logical time `stream_time_` starts; the
  // link is free from `link_free_` on.
  void AdvanceStream(uint64_t now);
  double stream_ = 0;
  uint64_t stream_time_ = 0;
  double link_free_ = 0;
  Stats stats_;
};

}  // namespace stensor

#endif  // STENSOR_POLICY_PREFETCH_PLANNER_H_
