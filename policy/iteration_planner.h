// IterationPlanner: S01/S02 and the planned swaps in one object, fed once per
// operation (kernel launch, copy, memset) by the memory manager and by
// `stensor sim` replaying an access log, so both run the same decisions.
// Per operation it
//   1. observes the operation's key with the IterationDetector (S01 order);
//   2. predicts the next use of every buffer it touches (NextUsePredictor;
//      the slot is the buffer's position among the touches), which the
//      caller gives `belady` as EvictionCandidate::next_use;
//   3. records the first whole iteration after the pattern is found into an
//      AccessProfile (S02): keys, buffers, bytes, and compute times that the
//      caller measures with events and hands back through OnComputeTime; the
//      profile is built at the next iteration boundary, or as soon after as
//      the last compute times arrived (never waiting for them), and a
//      changed pattern drops it and profiles again;
//   4. keeps the PrefetchPlanner's view current, and answers Plan().
// Logical time is the operation count: the first operation is time 0.
//
// Thread-safety: not thread-safe; the caller serialises (the manager's lock).
#ifndef STENSOR_POLICY_ITERATION_PLANNER_H_
#define STENSOR_POLICY_ITERATION_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "policy/access_profile.h"
#include "policy/iteration_detector.h"
#include "policy/next_use.h"
#include "policy/prefetch_planner.h"

namespace stensor {

class IterationPlanner {
 public:
  struct Options {
    Bandwidth bandwidth;  // both directions > 0
    // false: next uses are still predicted (belady), Plan proposes nothing.
    bool prefetch = true;
    IterationDetector::Options detector;
    PrefetchPlanner::Options planner;
    AccessProfile::Options profile;
    // After the profiled iteration ended, how many operations the profile
    // waits for compute times still in flight before it is built without
    // them (their phases then count as unknown).
    uint64_t compute_grace_ops = 256;
  };

  struct Stats {
    uint64_t operations = 0;
    uint64_t iterations = 0;          // boundaries of a known pattern
    uint64_t profiles = 0;            // profiles built
    uint64_t pattern_changes = 0;     // known patterns that broke
    uint64_t abandoned_profiles = 0;  // out of step with the detector
    size_t period = 0;                // of the pattern in use; 0 when none
    size_t last_period = 0;           // of the last profile built
    // Of the profile in use for the most operations: the program's
    // iteration, where a short pattern at its end (a loop of identical
    // read-backs) is profiled last.
    size_t main_period = 0;
    size_t unknown_phases = 0;  // of the current profile
    PrefetchPlanner::Stats planner;
  };

  // Rejects a bandwidth that is not > 0 and bad detector options.
  static absl::StatusOr<std::unique_ptr<IterationPlanner>> Create(Options options);

  // Whether a planner is wanted yet, asked at each operation until it is:
  // once a device holds half its cap (`held` of `cap` bytes: what eviction
  // could not take back, free room excluded) or anything was swapped out.
  // Before, nothing is evicted or fetched, and a launch pays nothing for a
  // planner (no next uses, no profile); the first iteration after is
  // profiled instead. The memory manager and `stensor sim` ask alike.
  static bool Wanted(uint64_t held, uint64_t cap, bool swapped_out) {
    return swapped_out || held >= cap / 2;
  }

  // One operation: `key` names the kernel and its argument shapes (not
  // buffer ids), `touches` the buffers it uses in argument order. Appends
  // each touch's predicted next use (kNoNextUse when unknown) to
  // `*next_uses` when not null, and (id, next use) of other buffers whose
  // prediction changed (NextUsePredictor::TakeChanged; the last entry of an
  // id counts) to `*repredicted` when not null. Returns the operation's
  // logical time.
  uint64_t OnOperation(uint64_t key, absl::Span<const BufferTouch> touches,
                       std::vector<uint64_t>* next_uses = nullptr,
                       std::vector<std::pair<uint64_t, uint64_t>>* repredicted = nullptr);
  // OnOperation in two halves, for a caller that decides with the
  // predictions before the operation's buffers are made resident (serving a
  // buffer rather than fetching it: EvictionPolicy::ServeRatherThanFetch).
  // Predict observes the operation and predicts, as OnOperation does; the
  // prefetch planner hears of its uses at Commit, after the OnResident
  // calls of its swap-ins, in the order OnOperation after them gives. A
  // Predict with one still uncommitted (another thread's operation, or one
  // that failed) commits that one first.
  uint64_t Predict(uint64_t key, absl::Span<const BufferTouch> touches,
                   std::vector<uint64_t>* next_uses = nullptr,
                   std::vector<std::pair<uint64_t, uint64_t>>* repredicted = nullptr);
  void Commit();

  // One buffer an operation uses, as the planner is told of it: `planned`,
  // the id it is planned under (for each piece of an allocation, `piece`,
  // the allocation's), `bytes` what the planner counts for that id, and
  // `pinned` when it is never swapped (never planned for).
  struct Use {
    uint64_t planned = 0;
    uint64_t bytes = 0;
    bool write = false;
    bool piece = false;
    bool pinned = false;
    uint32_t position = BufferTouch::kAtIndex;  // BufferTouch::position
  };
  // The planner's answers to PredictUses, kept by the caller between
  // operations so that a prediction allocates nothing; `repredicted` is
  // the caller's to read.
  struct Scratch {
    std::vector<uint64_t> next_uses;  // per touch
    std::vector<std::pair<uint64_t, uint64_t>> repredicted;
  };
  // Predict for an operation's buffers, as the memory manager and
  // `stensor sim` both tell it: `use(i)` gives the i-th of `n` uses, and
  // `next(i, next_use)` hears its predicted next use. One touch per
  // allocation (its pieces merged, a write winning), buffers never swapped
  // pinned in the plan, and in `scratch->repredicted` (planned id, next
  // use) of buffers the predictor learnt more of without a use (a shard's
  // cycle, the next shard of a rotating slot). Returns the operation's
  // logical time. Inline: the capped launch path runs it.
  template <typename UseAt, typename NextUse>
  uint64_t PredictUses(uint64_t key, size_t n, UseAt use, NextUse next, Scratch* scratch) {
    absl::InlinedVector<BufferTouch, 16> touches;
    // Per use: which of `touches`, and whether it is never swapped.
    struct Touched {
      uint32_t touch;
      bool pinned;
    };
    absl::InlinedVector<Touched, 16> touched;
    // An allocation's pieces are neighbours among the uses (AddTouch).
    for (size_t i = 0; i < n; ++i) {
      const Use u = use(i);
      const size_t t =
          AddTouch(&touches, BufferTouch{u.planned, u.bytes, u.write, u.position}, u.piece);
      touched.push_back({static_cast<uint32_t>(t), u.pinned});
    }
    scratch->next_uses.clear();
    scratch->repredicted.clear();
    const uint64_t time = Predict(key, touches, &scratch->next_uses, &scratch->repredicted);
    for (size_t i = 0; i < n; ++i) {
      if (touched[i].pinned) SetPinned(touches[touched[i].touch].id, true);
      next(i, scratch->next_uses[touched[i].touch]);
    }
    return time;
  }
  // Whether the operation just observed is part of the iteration being
  // profiled, so its compute time is wanted (time it; else do not).
  bool profiling() const { return profiling_now_; }
  // The compute time of the operation at logical time `time` (an event pair
  // completed). Ignored when that operation is not in the profiled
  // iteration, or the seconds are negative or not finite.
  void OnComputeTime(uint64_t time, double seconds);
  // STENSOR_ITERATION_MARKER: call before OnOperation of the marker kernel.
  void MarkBoundary() { detector_.MarkBoundary(); }

  // The planned swaps to issue before submitting the last observed
  // operation (empty without a profile or with prefetch off). The link's
  // queue is the planner's own model (PrefetchPlanner), never the caller's.
  std::vector<PlannedAction> Plan(uint64_t free_bytes, const ForcedOutLog* forced = nullptr);

  // What happened to a buffer (see PrefetchPlanner).
  void OnResident(uint64_t id) { planner_.OnResident(id); }
  void OnEvicted(uint64_t id) { planner_.OnEvicted(id); }
  void OnFreed(uint64_t id);
  void SetPinned(uint64_t id, bool pinned) { planner_.SetPinned(id, pinned); }
  // A proposed fetch the caller could not issue.
  void CancelFetch(uint64_t id) { planner_.CancelFetch(id); }

  // The last predicted next use of `id` (kNoNextUse when unknown).
  uint64_t NextUse(uint64_t id) const { return predictor_.Predicted(id); }
  bool has_profile() const { return profile_ != nullptr; }
  const AccessProfile* profile() const { return profile_.get(); }
  uint64_t now() const { return next_time_; }  // time of the next operation
  Stats stats() const;

 private:
  IterationPlanner(Options options, IterationDetector detector);
  // Drops the profile and whatever was being recorded.
  void Forget();
  // Drops what was being recorded.
  void DropRecording();
  // Before the profile in use is dropped or replaced: counts what it served.
  void RetireProfile();
  // Builds the recorded profile and hands it to the planner.
  void BuildProfile();

  const Options options_;
  IterationDetector detector_;
  NextUsePredictor predictor_;
  PrefetchPlanner planner_;
  uint64_t next_time_ = 0;
  bool profiling_now_ = false;
  // The operation at `time` as the recording's next phase.
  void Record(uint64_t key, absl::Span<const BufferTouch> touches, uint64_t time);
  // Phases up to `phase` (excluded) the detector saw skipped, recorded
  // without buffers.
  void RecordSkipped(size_t phase, uint64_t time);

  // The iteration being recorded.
  std::optional<AccessProfile::Builder> recording_;
  bool recording_done_ = false;  // its last operation was seen
  uint64_t build_deadline_ = 0;  // build without late compute times after
  size_t awaiting_ = 0;          // compute times not yet arrived
  // Predict's uses for Commit (kept between operations: no allocation).
  bool pending_ = false;
  uint64_t pending_time_ = 0;
  std::vector<BufferTouch> pending_touches_;
  std::vector<uint64_t> pending_next_;
  std::vector<std::pair<uint64_t, uint64_t>> pending_changed_;
  std::vector<bool> timed_;            // per recorded phase: a compute time came
  std::vector<uint64_t> recorded_at_;  // per recorded phase: its time
  uint64_t iteration_origin_ = 0;      // phase 0 of the current iteration
  std::shared_ptr<const AccessProfile> profile_;
  uint64_t profile_ops_ = 0;  // operations observed while profile_ was in use
  uint64_t main_ops_ = 0;     // the most any retired profile was in use for
  Stats stats_;
};

}  // namespace stensor

#endif  // STENSOR_POLICY_ITERATION_PLANNER_H_
