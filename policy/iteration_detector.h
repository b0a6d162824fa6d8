// IterationDetector: finds the training iteration in the stream of operations
// (S01 order, S02 "the first iteration is profiled"). The caller feeds one
// 64-bit key per operation (a hash of the kernel's identity and its argument
// shapes: not buffer ids, which change for per-step temporaries) and learns
// where iterations start and which phase (0..period-1) each operation has.
//
// Detection: the period is the smallest P <= max_period such that the last
// 2P keys repeat with period P (a long period allowed one mismatch in
// MissBudget's spacing, and an op up to Shift(P) places from where it stood
// one period back counted as matching, up to one in kShiftSpacing: a data
// loader on its own thread issues its copies a few operations earlier or
// later from one step to the next; a known iteration likewise takes such
// ops for no one-off). Candidate periods come from the
// distances to the last few occurrences of the current key; each candidate is checked against the
// key P operations back, so the work per operation is bounded by the number of candidates (O(1),
// not O(max_period)). A noisy prefix (warm-up, initialisation copies) only delays detection until
// two clean periods were seen. Once found, the detector follows the iteration and tolerates a few
// one-off operations per iteration (an extra copy, a skipped kernel, an
// operation a few places early: the ones up to it count as skipped); more
// than `max_one_offs` (or MissBudget of the period, if larger) mismatches in
// one iteration report kChanged and restart
// detection (an evaluation step, a new batch shape), so the caller
// re-profiles.
//
// Candidates keep running while an iteration is known. A shorter pattern
// inside the real iteration (identical layers repeated more than twice) is
// found first; once a longer period has repeated exactly twice over a stretch
// where the known pattern needed one-offs, it replaces it (kFound again, the
// caller re-profiles).
//
// Explicit marker (STENSOR_ITERATION_MARKER): the caller calls MarkBoundary()
// just before Observe() of each launch of the marker kernel. From the first
// call on, detection is off: iterations are exactly the stretches between
// markers, kFound is reported at the second marker; a stretch that differs
// from the known one (differences counted as the length difference plus the
// keys that differ position by position; more than max_one_offs) reports
// kChanged, and the stretch after it becomes the iteration (kFound at the
// marker that ends it). Stretches longer than max_period are never locked on.
//
// Memory: O(max_period) (a ring of the last max_period+1 keys, the template
// and a map of keys seen within the ring).
//
// Thread-safety: not thread-safe; the caller serialises (the memory manager
// calls it under its lock).
#ifndef STENSOR_POLICY_ITERATION_DETECTOR_H_
#define STENSOR_POLICY_ITERATION_DETECTOR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace stensor {

class IterationDetector {
 public:
  struct Options {
    // Longest iteration (in operations) that is looked for.
    size_t max_period = size_t{1} << 16;
    // Mismatching operations tolerated within one known iteration before
    // the pattern counts as changed.
    size_t max_one_offs = 4;
    // Fewest operations the repeating stretch must span (2 * period at
    // least) before it counts: keeps a run of identical warm-up copies from
    // passing for an iteration of period 1.
    size_t min_span = 8;
  };

  enum class Event : uint8_t {
    kNone,      // nothing new (searching, or inside a known iteration)
    kFound,     // an iteration became known (or replaced a shorter one);
                // this op is its phase 0
    kBoundary,  // this op starts another iteration of the known pattern
    kChanged,   // the known pattern broke: detection restarts from here
  };

  struct Observation {
    Event event = Event::kNone;
    bool known = false;  // an iteration is known and `phase` is valid
    size_t phase = 0;    // this op's index within the iteration
    size_t period = 0;   // operations per iteration; 0 while unknown
    // Number of iteration starts seen since the pattern was found (1 at
    // kFound, +1 per kBoundary).
    uint64_t iteration = 0;
    // An operation the known iteration does not hold at this place (taken
    // for an extra one: `phase` is the expected phase, still to come).
    bool extra = false;
  };

  // Rejects max_period == 0 or max_period > 1 << 24 (memory bound).
  static absl::StatusOr<IterationDetector> Create(Options options);
  IterationDetector() : IterationDetector(Options{}) {}

  // Feeds the next operation's key. Amortised O(1).
  Observation Observe(uint64_t key);

  // The next Observe() starts an iteration (the marker kernel launches).
  // Switches to marker mode for good.
  void MarkBoundary();

  bool known() const { return state_ == State::kLocked; }
  size_t period() const { return known() ? template_.size() : 0; }
  // The keys of the known iteration, phase 0 first (empty while unknown).
  const std::vector<uint64_t>& pattern() const { return template_; }
  // Operations observed so far.
  uint64_t operations() const { return n_; }

 private:
  explicit IterationDetector(Options options);
  enum class State : uint8_t { kSearching, kLocked };
  struct Candidate {
    size_t period;
    size_t run;             // ops since it began, each key[i] == key[i - period] but
                            // at most MissBudget(period) of each period's
    size_t misses = 0;      // mismatches in the current window
    size_t window_run = 0;  // `run` when the current window began
    bool exact = true;      // no mismatch since it began
    size_t shifted = 0;     // matches a few places off in the current window
  };
  // Mismatches a period of `period` ops may hold and still count as
  // repeating (in detection) or as the same iteration (once known): none
  // for short periods, one in kMissSpacing for long ones, whose operations
  // issued by other threads (a data loader's copies) land a few places off
  // from one iteration to the next.
  static constexpr size_t kMissSpacing = 32;
  static size_t MissBudget(size_t period) { return period / kMissSpacing; }
  // In detection, an operation of a long period that stands up to
  // Shift(period) places from where it stood one period back still matches:
  // one loader copy issued a place early would otherwise cost two misses
  // (where it was, where it is), and a few of them per step keep the
  // training iteration from ever being found. None for periods below
  // kMissSpacing (a shifted match there would pass for a shorter period).
  static constexpr size_t kMaxShift = 2;
  static constexpr size_t kShiftSpacing = 8;  // shifted matches: one in 8 at most
  static size_t Shift(size_t period) { return std::min(kMaxShift, period / kMissSpacing); }
  static size_t ShiftBudget(size_t period) { return period / kShiftSpacing; }
  bool Shifted(uint64_t n, size_t period, uint64_t key) const;
  // Whether `key` stands in the template within Shift places of phase_.
  bool NearPhase(uint64_t key) const;
  // Once kRealign operations in a row missed the template (none the one
  // expected, nor the one after it), the known iteration goes on from
  // where they stand consecutively in it, up to kLookAhead places ahead.
  static constexpr size_t kRealign = 3;
  static constexpr size_t kLookAhead = 16;
  static constexpr size_t kOccurrences = 4;     // distances tried per key
  static constexpr size_t kMaxCandidates = 32;  // periods checked per op
  struct Seen {
    uint64_t pos[kOccurrences] = {};  // most recent first; [0, count) valid
    size_t count = 0;
  };

  uint64_t KeyAt(uint64_t pos) const { return ring_[pos % ring_.size()]; }
  // Writes the key of op n_ into the ring and its occurrence list (pos[0]
  // becomes n_; pos[1..] are the earlier occurrences).
  Seen& Remember(uint64_t key);
  // The smallest candidate periods that now repeat twice (0 if none): with
  // at most MissBudget mismatches per period, and with none.
  struct Repeating {
    size_t nearly = 0;
    size_t exactly = 0;
  };
  // Advances the candidate periods by op n_.
  Repeating UpdateCandidates(uint64_t key);
  Observation Lock(uint64_t key, size_t period);
  Observation Search(uint64_t key);
  Observation Follow(uint64_t key);
  Observation FollowMarked(uint64_t key);
  void Restart();
  Observation Locked(Event event) const;

  Options options_;
  State state_ = State::kSearching;
  uint64_t n_ = 0;                            // ops observed
  std::vector<uint64_t> ring_;                // last max_period + 1 keys, by position
  absl::flat_hash_map<uint64_t, Seen> seen_;  // keys within the ring
  std::vector<Candidate> candidates_;
  // Known iteration.
  std::vector<uint64_t> template_;
  size_t phase_ = 0;         // phase of the next op
  size_t one_offs_ = 0;      // mismatches in the current iteration
  size_t shifted_ = 0;       // ops a few places off in it (no one-offs, up to ShiftBudget)
  size_t misaligned_ = 0;    // consecutive ops that missed the template
  uint64_t one_off_at_ = 0;  // position of the latest mismatch
  bool one_off_seen_ = false;
  uint64_t iteration_ = 0;
  // Marker mode.
  bool marker_mode_ = false;
  bool marker_pending_ = false;
  bool marker_seen_ = false;
  bool stretch_overflow_ = false;  // more than max_period ops since the marker
  std::vector<uint64_t> stretch_;  // keys since the last marker
};

}  // namespace stensor

#endif  // STENSOR_POLICY_ITERATION_DETECTOR_H_
