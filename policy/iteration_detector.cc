#include "policy/iteration_detector.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace stensor {

absl::StatusOr<IterationDetector> IterationDetector::Create(Options options) {
  constexpr size_t kMaxPeriod = size_t{1} << 24;
  if (options.max_period == 0 || options.max_period > kMaxPeriod) {
    return absl::InvalidArgumentError(
        absl::StrCat("IterationDetector: max_period ", options.max_period,
                     " is out of range; accepted: 1 to ", kMaxPeriod));
  }
  return IterationDetector(options);
}

IterationDetector::IterationDetector(Options options)
    : options_(options), ring_(options.max_period + 1, 0) {
  candidates_.reserve(kMaxCandidates);
}

IterationDetector::Observation IterationDetector::Observe(uint64_t key) {
  Observation o = marker_mode_               ? FollowMarked(key)
                  : state_ == State::kLocked ? Follow(key)
                                             : Search(key);
  ++n_;
  return o;
}

void IterationDetector::MarkBoundary() {
  if (!marker_mode_) {
    // The marker overrides detection: whatever was found automatically is
    // dropped, iterations are the stretches between markers from now on.
    marker_mode_ = true;
    Restart();
    candidates_.clear();
    seen_.clear();
  }
  marker_pending_ = true;
}

void IterationDetector::Restart() {
  // Candidates are kept: they have been following the stream all along and
  // may already hold the new pattern's period.
  state_ = State::kSearching;
  template_.clear();
  phase_ = 0;
  one_offs_ = 0;
  shifted_ = 0;
  one_off_seen_ = false;
  iteration_ = 0;
}

IterationDetector::Observation IterationDetector::Locked(Event event) const {
  Observation o;
  o.event = event;
  o.known = true;
  o.period = template_.size();
  o.iteration = iteration_;
  return o;
}

IterationDetector::Seen& IterationDetector::Remember(uint64_t key) {
  const uint64_t n = n_;
  const size_t ring = ring_.size();
  // The slot about to be overwritten held position n - ring; a key whose
  // newest occurrence leaves the ring is forgotten, so seen_ stays bounded.
  if (n >= ring) {
    const uint64_t old = ring_[n % ring];
    auto it = seen_.find(old);
    if (it != seen_.end() && it->second.pos[0] == n - ring) seen_.erase(it);
  }
  ring_[n % ring] = key;
  Seen& seen = seen_[key];
  const size_t keep = std::min(seen.count, kOccurrences - 1);
  std::move_backward(seen.pos, seen.pos + keep, seen.pos + keep + 1);
  seen.pos[0] = n;
  seen.count = keep + 1;
  return seen;
}

bool IterationDetector::NearPhase(uint64_t key) const {
  const size_t p = template_.size();
  for (size_t d = 1; d <= Shift(p); ++d) {
    if (template_[(phase_ + d) % p] == key || template_[(phase_ + p - d) % p] == key) return true;
  }
  return false;
}

bool IterationDetector::Shifted(uint64_t n, size_t period, uint64_t key) const {
  for (size_t d = 1; d <= Shift(period); ++d) {
    if (KeyAt(n - period + d) == key) return true;  // it came d places late
    // d places early: still inside the ring and the stream.
    if (period + d <= options_.max_period && n >= period + d && KeyAt(n - period - d) == key) {
      return true;
    }
  }
  return false;
}

IterationDetector::Repeating IterationDetector::UpdateCandidates(uint64_t key) {
  const uint64_t n = n_;

  // Extend the runs of the candidates that still hold; drop the others.
  size_t kept = 0;
  for (Candidate c : candidates_) {
    if (c.run - c.window_run >= c.period) {  // a new window of one period
      c.window_run = c.run;
      c.misses = 0;
      c.shifted = 0;
    }
    const bool exact = KeyAt(n - c.period) == key;
    // Shifted matches are few for the true period (the ops a copy passed
    // over) and nearly all for its neighbours P +- 1, which they must not
    // make repeat: beyond an eighth of a window they count as misses.
    if (exact || (Shifted(n, c.period, key) && ++c.shifted <= ShiftBudget(c.period)) ||
        ++c.misses <= MissBudget(c.period)) {
      ++c.run;
      c.exact = c.exact && exact;
      candidates_[kept++] = c;
    }
  }
  candidates_.resize(kept);

  // New candidates: the distances to the earlier occurrences of this key.
  Seen& seen = Remember(key);
  for (size_t i = 1; i < seen.count; ++i) {
    const uint64_t d = n - seen.pos[i];
    if (d == 0 || d > options_.max_period) continue;
    const bool present = std::any_of(candidates_.begin(), candidates_.end(),
                                     [d](const Candidate& c) { return c.period == d; });
    if (present) continue;
    const Candidate fresh{static_cast<size_t>(d), 1, 0, 0, true};
    if (candidates_.size() < kMaxCandidates) {
      candidates_.push_back(fresh);
    } else {
      // Full: the candidate with the shortest run (the longest period at
      // equal run) has the least evidence; replace it.
      auto worst = std::min_element(candidates_.begin(), candidates_.end(),
                                    [](const Candidate& a, const Candidate& b) {
                                      return a.run != b.run ? a.run < b.run : a.period > b.period;
                                    });
      if (worst->run <= 1) *worst = fresh;
    }
  }
  // The last 2P keys repeat with period P (run >= P): smallest such P.
  Repeating best;
  for (const Candidate& c : candidates_) {
    if (c.run < c.period || c.run + c.period < options_.min_span) continue;
    if (best.nearly == 0 || c.period < best.nearly) best.nearly = c.period;
    if (c.exact && (best.exactly == 0 || c.period < best.exactly)) best.exactly = c.period;
  }
  return best;
}

IterationDetector::Observation IterationDetector::Lock(uint64_t key, size_t p) {
  // Phase 0 is this op: the iteration is this key followed by the P - 1 keys
  // that followed its occurrence one period ago.
  const uint64_t n = n_;
  template_.resize(p);
  template_[0] = key;
  for (size_t i = 1; i < p; ++i) template_[i] = KeyAt(n - p + i);
  state_ = State::kLocked;
  phase_ = 1 % p;
  misaligned_ = 0;
  one_offs_ = 0;
  shifted_ = 0;
  one_off_seen_ = false;
  iteration_ = 1;
  Observation o = Locked(Event::kFound);
  o.phase = 0;
  return o;
}

IterationDetector::Observation IterationDetector::Search(uint64_t key) {
  const size_t p = UpdateCandidates(key).nearly;
  return p == 0 ? Observation{} : Lock(key, p);
}

IterationDetector::Observation IterationDetector::Follow(uint64_t key) {
  // Candidates keep running while an iteration is known: a shorter pattern
  // inside the real iteration (identical layers) may have been found first,
  // and is replaced once a longer period has repeated exactly over a stretch
  // where the known one needed one-offs. (Not one that repeats only
  // nearly: multiples of the layers' period would pass, one after another.)
  const uint64_t n = n_;
  const size_t best = UpdateCandidates(key).exactly;
  const size_t p = template_.size();
  if (best > p && one_off_at_ + 2 * best > n && one_off_seen_) {
    return Lock(key, best);
  }
  size_t phase;
  if (key == template_[phase_]) {
    phase = phase_;
    misaligned_ = 0;
  } else {
    // An op a few places from its phase (a loader copy issued a little
    // earlier or later) is no one-off, up to an eighth of the iteration.
    if (!(NearPhase(key) && ++shifted_ <= ShiftBudget(p))) {
      ++one_offs_;
      one_off_at_ = n;
      one_off_seen_ = true;
    }
    if (one_offs_ > std::max(options_.max_one_offs, MissBudget(p))) {
      Restart();
      Observation o;
      o.event = Event::kChanged;
      return o;
    }
    size_t realigned = p;  // none
    if (key == template_[(phase_ + 1) % p]) {
      realigned = (phase_ + 1) % p;  // one expected op was skipped
    } else if (++misaligned_ >= kRealign) {
      // The last kRealign ops ran on past where the iteration was expected
      // to be (ops skipped, or an op of another thread that came early
      // and was taken for an extra): where they stand consecutively in the
      // template a little ahead, the iteration goes on from there.
      for (size_t q = phase_ + kRealign - 1; q < p && q < phase_ + kLookAhead; ++q) {
        size_t i = 0;
        while (i < kRealign && KeyAt(n - i) == template_[q - i]) ++i;
        if (i == kRealign) {
          realigned = q;
          break;
        }
      }
    }
    if (realigned == p) {
      // An extra op (or a different one): it takes the expected phase's
      // place without consuming it.
      Observation o = Locked(Event::kNone);
      o.phase = phase_;
      o.extra = true;
      return o;
    }
    phase = realigned;
    misaligned_ = 0;
  }
  phase_ = (phase + 1) % p;
  Event event = Event::kNone;
  if (phase == 0) {
    event = Event::kBoundary;
    ++iteration_;
    one_offs_ = 0;
    shifted_ = 0;
  }
  Observation o = Locked(event);
  o.phase = phase;
  return o;
}

IterationDetector::Observation IterationDetector::FollowMarked(uint64_t key) {
  Event event = Event::kNone;
  if (marker_pending_) {
    marker_pending_ = false;
    if (!marker_seen_) {
      marker_seen_ = true;
    } else if (stretch_overflow_ || stretch_.empty()) {
      // Nothing usable to lock on; a known pattern broke.
      if (state_ == State::kLocked) {
        Restart();
        event = Event::kChanged;
      }
    } else if (state_ != State::kLocked) {
      template_ = stretch_;
      state_ = State::kLocked;
      iteration_ = 1;
      event = Event::kFound;
    } else {
      const size_t common = std::min(stretch_.size(), template_.size());
      size_t diff = std::max(stretch_.size(), template_.size()) - common;
      for (size_t i = 0; i < common && diff <= options_.max_one_offs; ++i) {
        diff += stretch_[i] != template_[i];
      }
      if (diff <= options_.max_one_offs) {
        ++iteration_;
        event = Event::kBoundary;
      } else {
        Restart();
        event = Event::kChanged;
      }
    }
    stretch_.clear();
    stretch_overflow_ = false;
  }
  const size_t position = stretch_.size();
  if (!marker_seen_) {
    // Before the first marker nothing is an iteration.
  } else if (stretch_.size() < options_.max_period) {
    stretch_.push_back(key);
  } else {
    stretch_overflow_ = true;
  }
  if (state_ != State::kLocked) {
    Observation o;
    o.event = event;
    return o;
  }
  Observation o = Locked(event);
  o.phase = std::min(position, template_.size() - 1);
  return o;
}

}  // namespace stensor
