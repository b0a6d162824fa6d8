#include "tools/exact_optimum.h"

#include <glpk.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/glpk_program.h"
#include "tools/keep_problem.h"

namespace stensor {
namespace {

constexpr double kMiB = kGlpkCostUnit;

// A capacity row lists every gap open at its point: with 100,000 buffers
// live, that is billions of coefficients, past any memory and any search.
// GLPK takes about 250 bytes a coefficient: this bound is 250 MiB.
constexpr size_t kMaxCoefficients = size_t{1} << 20;

// The result of schedule `kept`, its bytes counted exactly.
ExactOptimum FromSchedule(const KeepProblem& problem, const std::vector<bool>& kept) {
  const ScheduleBytes bytes = CountSchedule(problem, kept);
  ExactOptimum result;
  result.gaps = static_cast<int64_t>(problem.gaps.size());
  result.kept_gaps = bytes.kept_gaps;
  result.bytes_out = bytes.out;
  result.bytes_in = bytes.in;
  result.bytes_moved = bytes.moved();
  result.schedule = kept;
  return result;
}

}  // namespace

absl::StatusOr<ExactOptimum> ComputeExactOptimum(const Workload& workload,
                                                 const ExactOptions& options) {
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(workload, options.cap);
  if (!problem.ok()) return problem.status();
  return ComputeExactOptimum(*problem, options);
}

absl::StatusOr<ExactOptimum> ComputeExactOptimum(const KeepProblem& problem,
                                                 const ExactOptions& options) {
  const std::vector<KeepGap>& gaps = problem.gaps;
  const int points = problem.points;
  const OptimumBound* bound = options.bound;
  const bool bound_fits =
      bound != nullptr && bound->has_schedule && bound->schedule.size() == gaps.size();
  if (bound_fits && bound->proven()) {
    ExactOptimum result = FromSchedule(problem, bound->schedule);
    result.proven = true;
    result.by_bound = true;
    return result;
  }
  ExactOptimum result;
  result.gaps = static_cast<int64_t>(gaps.size());

  // Columns 1..n: keep gap i; n+1..: write-back of stretch s.
  GlpkProblem lp(glp_create_prob());
  glp_set_obj_dir(lp.get(), GLP_MIN);
  const int n = static_cast<int>(gaps.size());
  const int stretches = static_cast<int>(problem.stretch_bytes.size());
  if (n + stretches > 0) glp_add_cols(lp.get(), n + stretches);
  for (int i = 0; i < n; ++i) {
    glp_set_col_kind(lp.get(), i + 1, GLP_BV);
    // Keeping saves the swap-in (the constant "every gap evicted" is added back below).
    glp_set_obj_coef(lp.get(), i + 1, -static_cast<double>(gaps[i].swap_in) / kMiB);
  }
  for (int s = 0; s < stretches; ++s) {
    // Continuous in [0, 1]: at an optimum it is the largest "evicted" of its gaps.
    glp_set_col_bnds(lp.get(), n + s + 1, GLP_DB, 0.0, 1.0);
    glp_set_obj_coef(lp.get(), n + s + 1, static_cast<double>(problem.stretch_bytes[s]) / kMiB);
  }

  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  auto add_row = [&](double upper, double lower, int type) {
    const int row = glp_add_rows(lp.get(), 1);
    glp_set_row_bnds(lp.get(), row, type, lower, upper);
    return row;
  };
  // Capacity: gaps covering each point, swept along the time line. A point
  // that starts no gap and has no less room than the one before it is
  // implied by that one; a row whose gaps all fit is never binding.
  std::vector<std::vector<int>> starts(points + 1), ends(points + 1);
  for (int i = 0; i < n; ++i) {
    starts[gaps[i].first].push_back(i);
    ends[gaps[i].last + 1].push_back(i);
  }
  size_t write_back_coefficients = 0;  // two a gap in a written stretch (below)
  for (const KeepGap& gap : gaps) write_back_coefficients += gap.stretch >= 0 ? 2 : 0;
  std::vector<char> open(n, 0);
  std::vector<int> covering;
  int64_t covered_units = 0;
  for (int t = 0; t < points; ++t) {
    for (int i : ends[t]) {
      open[i] = 0;
      covered_units -= gaps[i].units;
    }
    for (int i : starts[t]) {
      open[i] = 1;
      covered_units += gaps[i].units;
      covering.push_back(i);
    }
    const bool implied = starts[t].empty() && t > 0 && problem.room[t] >= problem.room[t - 1];
    if (implied || covered_units <= problem.room[t]) continue;
    // Gaps that ended leave `covering` here, not at every point.
    covering.erase(
        std::remove_if(covering.begin(), covering.end(), [&](int i) { return !open[i]; }),
        covering.end());
    if (ia.size() + covering.size() + write_back_coefficients > kMaxCoefficients) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the 0-1 program would take more than ", kMaxCoefficients,
                       " coefficients (its capacity rows reach that at operation ", t + 1, " of ",
                       points, "): not attempted"));
    }
    const int row = add_row(static_cast<double>(problem.room[t]), 0.0, GLP_UP);
    for (int i : covering) {
      ia.push_back(row);
      ja.push_back(i + 1);
      ar.push_back(static_cast<double>(gaps[i].units));
    }
  }
  // Write-back: w_s + keep_i >= 1 for every gap of a written stretch.
  for (int i = 0; i < n; ++i) {
    if (gaps[i].stretch < 0) continue;
    const int row = add_row(0.0, 1.0, GLP_LO);
    ia.push_back(row), ja.push_back(i + 1), ar.push_back(1.0);
    ia.push_back(row), ja.push_back(n + gaps[i].stretch + 1), ar.push_back(1.0);
  }
  result.rows = glp_get_num_rows(lp.get());

  std::vector<bool> kept(n, false);
  bool proven = true;
  if (n > 0) {
    glp_load_matrix(lp.get(), static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    glp_iocp parm = BranchAndCut(/*presolve=*/true, options.time_limit_ms);
    // The cut generators print counts on stdout whatever msg_lev says; the
    // command's own output is there.
    const int terminal = glp_term_out(GLP_OFF);
    const int rc = glp_intopt(lp.get(), &parm);
    glp_term_out(terminal);
    const int status = glp_mip_status(lp.get());
    const bool found = (rc == 0 || rc == GLP_ETMLIM) && (status == GLP_OPT || status == GLP_FEAS);
    if (!found && rc == GLP_ETMLIM && bound_fits) {
      // Nothing found in time: the bound's whole schedule is one.
      ExactOptimum fallback = FromSchedule(problem, bound->schedule);
      fallback.rows = result.rows;
      return fallback;
    }
    if (!found && rc == GLP_ETMLIM) {
      return absl::DeadlineExceededError(absl::StrCat("no schedule found within the time limit of ",
                                                      parm.tm_lim / 1000.0,
                                                      " s (--exact-seconds)"));
    }
    if (!found) {
      return absl::InternalError(
          absl::StrCat("GLPK could not solve the keep/evict program (glp_intopt ", rc, ", status ",
                       status, ")"));
    }
    proven = rc == 0 && status == GLP_OPT;
    for (int i = 0; i < n; ++i) kept[i] = glp_mip_col_val(lp.get(), i + 1) > 0.5;
  }
  const int64_t rows = result.rows;
  result = FromSchedule(problem, kept);
  result.rows = rows;
  result.proven = proven;
  return result;
}

}  // namespace stensor
