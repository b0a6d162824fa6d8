#include "policy/iteration_planner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

namespace stensor {

absl::StatusOr<std::unique_ptr<IterationPlanner>> IterationPlanner::Create(Options options) {
  if (!(options.bandwidth.h2d > 0) || !(options.bandwidth.d2h > 0) ||
      !std::isfinite(options.bandwidth.h2d) || !std::isfinite(options.bandwidth.d2h)) {
    return absl::InvalidArgumentError("the bandwidth must be positive in both directions");
  }
  absl::StatusOr<IterationDetector> detector = IterationDetector::Create(options.detector);
  if (!detector.ok()) return detector.status();
  return std::unique_ptr<IterationPlanner>(
      new IterationPlanner(std::move(options), std::move(*detector)));
}

IterationPlanner::IterationPlanner(Options options, IterationDetector detector)
    : options_(std::move(options)), detector_(std::move(detector)), planner_(options_.planner) {}

void IterationPlanner::DropRecording() {
  recording_.reset();
  recording_done_ = false;
  awaiting_ = 0;
  timed_.clear();
  recorded_at_.clear();
}

void IterationPlanner::RetireProfile() {
  if (profile_ != nullptr && profile_ops_ > main_ops_) {
    main_ops_ = profile_ops_;
    stats_.main_period = profile_->period();
  }
  profile_ops_ = 0;
}

void IterationPlanner::Forget() {
  DropRecording();
  RetireProfile();
  profile_.reset();
  planner_.SetProfile(nullptr, 0);
  predictor_.Reset();
}

void IterationPlanner::BuildProfile() {
  absl::StatusOr<AccessProfile> built =
      std::move(*recording_).Build(options_.bandwidth, options_.profile);
  DropRecording();
  if (!built.ok()) {
    ++stats_.abandoned_profiles;
    return;
  }
  RetireProfile();
  profile_ = std::make_shared<const AccessProfile>(std::move(*built));
  ++stats_.profiles;
  stats_.last_period = profile_->period();
  planner_.SetProfile(profile_, iteration_origin_);
}

namespace {
// Past this many buffers an operation's are looked up in a set, not scanned.
constexpr size_t kScanned = 16;

// The prefetch planner schedules by time: a sequence rank (kInSequence) is
// no time to fetch by.
uint64_t AsTime(uint64_t next_use) {
  return next_use < EvictionCandidate::kInSequence ? next_use : EvictionCandidate::kNoNextUse;
}
}  // namespace

uint64_t IterationPlanner::OnOperation(uint64_t key, absl::Span<const BufferTouch> touches,
                                       std::vector<uint64_t>* next_uses,
                                       std::vector<std::pair<uint64_t, uint64_t>>* repredicted) {
  const uint64_t time = Predict(key, touches, next_uses, repredicted);
  Commit();
  return time;
}

uint64_t IterationPlanner::Predict(uint64_t key, absl::Span<const BufferTouch> touches,
                                   std::vector<uint64_t>* next_uses,
                                   std::vector<std::pair<uint64_t, uint64_t>>* repredicted) {
  Commit();
  const uint64_t time = next_time_++;
  ++stats_.operations;
  if (profile_ != nullptr) ++profile_ops_;
  const IterationDetector::Observation seen = detector_.Observe(key);
  switch (seen.event) {
    case IterationDetector::Event::kFound:
      // Profile the first iteration of the pattern, from here.
      Forget();
      iteration_origin_ = time;
      recording_.emplace();
      break;
    case IterationDetector::Event::kBoundary:
      ++stats_.iterations;
      iteration_origin_ = time;
      planner_.OnIterationBoundary(time);
      if (recording_ && !recording_done_) {
        // The profiled iteration is complete (its last phases skipped, if
        // the detector saw them skipped): build it once its compute times
        // are in, or after a grace period without the late ones.
        RecordSkipped(seen.period, time);
        recording_done_ = true;
        build_deadline_ = time + options_.compute_grace_ops;
      }
      break;
    case IterationDetector::Event::kChanged:
      ++stats_.pattern_changes;
      Forget();
      break;
    case IterationDetector::Event::kNone:
      break;
  }

  profiling_now_ = false;
  if (recording_ && !recording_done_) {
    // The profile keeps the detector's phases: an operation the detector
    // took for an extra is left out, phases it saw skipped are recorded
    // without buffers. Anything else out of step with it drops the
    // recording, and the next iteration is profiled instead.
    if (seen.known && seen.extra && seen.phase == recording_->size()) {
      // Not part of the iteration.
    } else if (seen.known && !seen.extra && seen.phase >= recording_->size()) {
      RecordSkipped(seen.phase, time);
      Record(key, touches, time);
    } else {
      ++stats_.abandoned_profiles;
      DropRecording();  // tried again from the next boundary
    }
  }
  if (!recording_ && !profile_ && seen.event == IterationDetector::Event::kBoundary) {
    recording_.emplace();
    if (seen.known && seen.phase == 0) Record(key, touches, time);
  }
  if (recording_done_ && (awaiting_ == 0 || time >= build_deadline_)) BuildProfile();

  // A usual operation has few buffers: scanned for, with no set (and no
  // allocation).
  const bool few = touches.size() <= kScanned;
  absl::flat_hash_set<uint64_t> seen_ids;
  if (!few) {
    for (const BufferTouch& t : touches) seen_ids.insert(t.id);
  }
  const auto used_now = [&](uint64_t id) {
    if (!few) return seen_ids.contains(id);
    return std::any_of(touches.begin(), touches.end(),
                       [id](const BufferTouch& t) { return t.id == id; });
  };
  pending_ = true;
  pending_time_ = time;
  pending_touches_.assign(touches.begin(), touches.end());
  pending_next_.clear();
  pending_changed_.clear();
  for (size_t i = 0; i < touches.size(); ++i) {
    const BufferTouch& t = touches[i];
    std::optional<NextUsePredictor::Slot> slot;
    if (seen.known) {
      slot = NextUsePredictor::Slot{
          seen.phase, t.position == BufferTouch::kAtIndex ? static_cast<uint32_t>(i) : t.position};
    }
    // The kind of use, whatever the phase: the operation and the position.
    const uint64_t signature = (key ^ (uint64_t{i} + 1)) * 0x9e3779b97f4a7c15ull;
    uint64_t next = predictor_.OnUse(t.id, time, slot, signature);
    pending_next_.push_back(next);
    if (next_uses != nullptr) next_uses->push_back(next);
  }
  // Buffers not used now whose prediction changed (a slot learnt a gap, a
  // rotating slot named its next occupant, a free since the last operation).
  for (const auto& [id, next] : predictor_.TakeChanged()) {
    if (used_now(id)) continue;  // used now: its own prediction holds
    pending_changed_.emplace_back(id, next);
    if (repredicted != nullptr) repredicted->emplace_back(id, next);
  }
  return time;
}

void IterationPlanner::Commit() {
  if (!pending_) return;
  pending_ = false;
  const uint64_t time = pending_time_;
  const absl::Span<const BufferTouch> touches = pending_touches_;
  // Once per buffer, in its first slot: scanned for in a usual operation,
  // which has few buffers (no set, no allocation).
  const bool few = touches.size() <= kScanned;
  absl::flat_hash_set<uint64_t> seen_ids;
  for (size_t i = 0; i < touches.size(); ++i) {
    const BufferTouch& t = touches[i];
    bool first = true;
    if (!few) {
      first = seen_ids.insert(t.id).second;
    } else {
      for (size_t j = 0; j < i && first; ++j) first = touches[j].id != t.id;
    }
    if (first) planner_.OnUse(t.id, t.bytes, time, AsTime(pending_next_[i]), t.write);
  }
  for (const auto& [id, next] : pending_changed_) planner_.OnNextUse(id, AsTime(next));
}

void IterationPlanner::Record(uint64_t key, absl::Span<const BufferTouch> touches, uint64_t time) {
  recording_->Add(key, touches);
  timed_.push_back(false);
  recorded_at_.push_back(time);
  ++awaiting_;
  profiling_now_ = true;
}

void IterationPlanner::RecordSkipped(size_t phase, uint64_t time) {
  const std::vector<uint64_t>& pattern = detector_.pattern();
  while (recording_->size() < phase && recording_->size() < pattern.size()) {
    recording_->Add(pattern[recording_->size()], {});
    timed_.push_back(true);  // no operation: no compute time will come
    recorded_at_.push_back(time);
  }
}

void IterationPlanner::OnComputeTime(uint64_t time, double seconds) {
  if (!recording_ || !std::isfinite(seconds) || seconds < 0) return;
  // The phase recorded at `time`: the last one (skipped phases before an
  // operation share its time).
  auto it = std::upper_bound(recorded_at_.begin(), recorded_at_.end(), time);
  if (it == recorded_at_.begin() || *(it - 1) != time) return;
  const size_t phase = static_cast<size_t>(it - recorded_at_.begin()) - 1;
  if (timed_[phase]) return;
  if (!recording_->SetComputeSeconds(phase, seconds).ok()) return;
  timed_[phase] = true;
  --awaiting_;
  if (recording_done_ && awaiting_ == 0) BuildProfile();
}

void IterationPlanner::OnFreed(uint64_t id) {
  predictor_.OnFreed(id);
  planner_.OnFreed(id);
  // What the free taught its slot (no next use) reaches the planner and the
  // caller with the next operation's changes.
}

std::vector<PlannedAction> IterationPlanner::Plan(uint64_t free_bytes, const ForcedOutLog* forced) {
  if (!options_.prefetch || profile_ == nullptr || next_time_ == 0) return {};
  return planner_.Plan(next_time_ - 1, free_bytes, /*h2d_queued_seconds=*/0, forced);
}

IterationPlanner::Stats IterationPlanner::stats() const {
  Stats s = stats_;
  s.period = profile_ != nullptr ? profile_->period() : 0;
  s.last_period = stats_.last_period;
  if (profile_ != nullptr && profile_ops_ > main_ops_) s.main_period = profile_->period();
  s.unknown_phases = profile_ != nullptr ? profile_->unknown_phases() : 0;
  s.planner = planner_.stats();
  return s;
}

}  // namespace stensor
