#include "tools/serving_optimum.h"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/glpk_program.h"
#include "tools/keep_problem.h"
#include "tools/serving_bound.h"

namespace stensor {
namespace {

constexpr double kMiB = kGlpkCostUnit;

// As in exact_optimum.cc: past this many coefficients GLPK's memory (about
// 250 bytes each) and search are out of reach.
constexpr size_t kMaxCoefficients = size_t{1} << 21;

// A schedule: residency per use, keep per link.
struct Schedule {
  std::vector<bool> resident, kept;
};

// The column values of `s` for GLPK (1-based), write-backs included.
std::vector<double> Columns(const KeepProblem& problem, const Schedule& s) {
  const size_t uses = problem.uses.size(), links = problem.links.size();
  std::vector<double> x(1 + uses + links + problem.stretch_bytes.size(), 0.0);
  for (size_t u = 0; u < uses; ++u) x[1 + u] = s.resident[u] ? 1.0 : 0.0;
  for (size_t l = 0; l < links; ++l) {
    const KeepLink& link = problem.links[l];
    const bool k = s.kept[l] && s.resident[link.from] && (link.to < 0 || s.resident[link.to]);
    x[1 + uses + l] = k ? 1.0 : 0.0;
    if (!k && link.stretch >= 0 && s.resident[link.from] &&
        s.resident[problem.stretch_writer[link.stretch]]) {
      x[1 + uses + links + link.stretch] = 1.0;
    }
  }
  return x;
}

struct Search {
  const std::vector<double>* start = nullptr;
  bool offered = false;
};

// Offers the starting schedule once, so that a search cut short by the time
// limit still has one.
void Callback(glp_tree* tree, void* info) {
  auto* search = static_cast<Search*>(info);
  if (glp_ios_reason(tree) != GLP_IHEUR || search->offered || search->start == nullptr) return;
  search->offered = true;
  glp_ios_heur_sol(tree, search->start->data());
}

ServingOptimum FromSchedule(const KeepProblem& problem, const Schedule& s) {
  const ServeScheduleBytes bytes = CountServeSchedule(problem, s.resident, s.kept);
  ServingOptimum result;
  result.bytes_out = bytes.out;
  result.bytes_in = bytes.in;
  result.bytes_served = bytes.served;
  result.uses = static_cast<int64_t>(problem.uses.size());
  result.served_uses = bytes.served_uses;
  result.links = static_cast<int64_t>(problem.links.size());
  result.kept_links = bytes.kept_links;
  return result;
}

}  // namespace

absl::StatusOr<ServingOptimum> ComputeServingOptimum(const Workload& workload,
                                                     const ServingOptions& options) {
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(workload, options.cap, /*serving=*/true);
  if (!problem.ok()) return problem.status();
  return ComputeServingOptimum(*problem, options);
}

absl::StatusOr<ServingOptimum> ComputeServingOptimum(const KeepProblem& problem,
                                                     const ServingOptions& options) {
  const int uses = static_cast<int>(problem.uses.size());
  const int links = static_cast<int>(problem.links.size());
  const int stretches = static_cast<int>(problem.stretch_bytes.size());
  const int points = problem.points;
  auto r_col = [](int u) { return 1 + u; };
  auto k_col = [&](int l) { return 1 + uses + l; };
  auto w_col = [&](int s) { return 1 + uses + links + s; };

  // The starting schedule: every use served, or the whole-buffer one given.
  Schedule start{std::vector<bool>(uses, false), std::vector<bool>(links, false)};
  if (options.whole_schedule != nullptr && options.whole_schedule->size() == problem.gaps.size()) {
    Schedule whole{std::vector<bool>(uses, true), std::vector<bool>(links, true)};
    for (int l = 0; l < links; ++l) {
      const int gap = problem.links[l].gap;
      if (gap >= 0) whole.kept[l] = (*options.whole_schedule)[gap];
    }
    if (CountServeSchedule(problem, whole.resident, whole.kept).moved() <
        CountServeSchedule(problem, start.resident, start.kept).moved()) {
      start = std::move(whole);
    }
  }
  ServingOptimum result = FromSchedule(problem, start);
  if (uses == 0) {
    result.proven = true;
    return result;
  }

  GlpkProblem lp(glp_create_prob());
  glp_set_obj_dir(lp.get(), GLP_MIN);
  glp_add_cols(lp.get(), uses + links + stretches);
  double served_all = 0;
  for (int u = 0; u < uses; ++u) {
    const KeepUse& use = problem.uses[u];
    const double serve = use.allocation ? 0.0 : static_cast<double>(use.bytes) / kMiB;
    served_all += serve;
    glp_set_col_kind(lp.get(), r_col(u), GLP_BV);
    // Resident: its swap-in (given back where the link in is kept), not its serving.
    glp_set_obj_coef(lp.get(), r_col(u), static_cast<double>(use.swap_in) / kMiB - serve);
  }
  glp_set_obj_coef(lp.get(), 0, served_all);
  for (int l = 0; l < links; ++l) {
    const KeepLink& link = problem.links[l];
    if (link.gap >= 0) {
      glp_set_col_kind(lp.get(), k_col(l), GLP_BV);
    } else {
      glp_set_col_bnds(lp.get(), k_col(l), GLP_DB, 0.0, 1.0);
    }
    if (link.to >= 0) {
      glp_set_obj_coef(lp.get(), k_col(l),
                       -static_cast<double>(problem.uses[link.to].swap_in) / kMiB);
    }
  }
  for (int s = 0; s < stretches; ++s) {
    glp_set_col_bnds(lp.get(), w_col(s), GLP_DB, 0.0, 1.0);
    glp_set_obj_coef(lp.get(), w_col(s), static_cast<double>(problem.stretch_bytes[s]) / kMiB);
  }

  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  auto add_row = [&](int type, double lower, double upper) {
    const int row = glp_add_rows(lp.get(), 1);
    glp_set_row_bnds(lp.get(), row, type, lower, upper);
    return row;
  };
  auto put = [&](int row, int col, double value) {
    ia.push_back(row);
    ja.push_back(col);
    ar.push_back(value);
  };
  // A link is kept only where both its uses are resident; a buffer leaving
  // the device after a resident write of its stretch pays the write-back:
  // w_s >= r_from + r_writer - 1 - k.
  for (int l = 0; l < links; ++l) {
    const KeepLink& link = problem.links[l];
    int row = add_row(GLP_UP, 0.0, 0.0);
    put(row, k_col(l), 1.0);
    put(row, r_col(link.from), -1.0);
    if (link.to >= 0) {
      row = add_row(GLP_UP, 0.0, 0.0);
      put(row, k_col(l), 1.0);
      put(row, r_col(link.to), -1.0);
    }
    if (link.stretch >= 0) {
      const int writer = problem.stretch_writer[link.stretch];
      row = add_row(GLP_LO, -1.0, 0.0);
      put(row, w_col(link.stretch), 1.0);
      put(row, k_col(l), 1.0);
      if (writer == link.from) {
        put(row, r_col(link.from), -2.0);
      } else {
        put(row, r_col(link.from), -1.0);
        put(row, r_col(writer), -1.0);
      }
    }
  }
  // Capacity: at each point the kept gaps open there and the uses there.
  std::vector<int> gap_link(problem.gaps.size(), -1);
  for (int l = 0; l < links; ++l) {
    if (problem.links[l].gap >= 0) gap_link[problem.links[l].gap] = l;
  }
  std::vector<std::vector<int>> starts(points + 1), ends(points + 1), at(points);
  for (size_t i = 0; i < problem.gaps.size(); ++i) {
    starts[problem.gaps[i].first].push_back(static_cast<int>(i));
    ends[problem.gaps[i].last + 1].push_back(static_cast<int>(i));
  }
  for (int u = 0; u < uses; ++u) at[problem.uses[u].point].push_back(u);
  std::vector<char> open(problem.gaps.size(), 0);
  std::vector<int> covering;
  int64_t covered_units = 0;
  for (int t = 0; t < points; ++t) {
    for (int i : ends[t]) {
      open[i] = 0;
      covered_units -= problem.gaps[i].units;
    }
    for (int i : starts[t]) {
      open[i] = 1;
      covered_units += problem.gaps[i].units;
      covering.push_back(i);
    }
    int64_t here = covered_units;
    for (int u : at[t]) here += problem.uses[u].units;
    if (here <= problem.free_units[t]) continue;  // never binding
    covering.erase(
        std::remove_if(covering.begin(), covering.end(), [&](int i) { return !open[i]; }),
        covering.end());
    if (ia.size() + covering.size() + at[t].size() > kMaxCoefficients) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the 0-1 program with serving would take more than ", kMaxCoefficients,
                       " coefficients (its capacity rows reach that at operation ", t + 1, " of ",
                       points, "): not attempted"));
    }
    const int row = add_row(GLP_UP, 0.0, static_cast<double>(problem.free_units[t]));
    for (int i : covering) put(row, k_col(gap_link[i]), static_cast<double>(problem.gaps[i].units));
    for (int u : at[t]) put(row, r_col(u), static_cast<double>(problem.uses[u].units));
  }
  glp_load_matrix(lp.get(), static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());

  // A bound that stays cheap where the root LP does not (tools/serving_bound.h),
  // once the program is known to be within reach.
  const auto began = std::chrono::steady_clock::now();
  ServingBoundOptions relaxed_options;
  relaxed_options.upper = result.moved();
  relaxed_options.time_limit_ms = std::max(1, options.time_limit_ms / 4);
  ServingBound relaxation = ComputeServingBound(problem, relaxed_options);
  const uint64_t relaxed = relaxation.bytes;
  if (!relaxation.resident.empty() && relaxation.schedule_bytes < result.moved()) {
    // Its schedule made to fit: the search's start.
    start.resident = std::move(relaxation.resident);
    start.kept = std::move(relaxation.kept);
    result = FromSchedule(problem, start);
  }
  result.lower_bound = relaxed;
  result.rows = glp_get_num_rows(lp.get());

  // The root LP next: its value bounds every schedule from below, and the
  // search (without presolve, so that the start can be offered) needs it.
  auto spent_ms = [&began] {
    return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - began)
                                .count());
  };
  const int terminal = glp_term_out(GLP_OFF);
  glp_smcp simplex;
  glp_init_smcp(&simplex);
  simplex.msg_lev = GLP_MSG_OFF;
  simplex.tm_lim = std::max(1, options.time_limit_ms - spent_ms());
  // Dual simplex, primal where it fails: on training logs (tens of
  // thousands of uses) the primal one from the trivial basis stalls.
  simplex.meth = GLP_DUALP;
  const int lp_rc = glp_simplex(lp.get(), &simplex);
  if (lp_rc != 0 || glp_get_status(lp.get()) != GLP_OPT) {
    glp_term_out(terminal);
    // No LP in time: the start is the schedule, the relaxation the bound.
    result.rows = glp_get_num_rows(lp.get());
    return result;
  }
  const double lp_bytes = glp_get_obj_val(lp.get()) * kMiB;
  // Rounding of the solver's arithmetic must not lift the bound past a schedule.
  const uint64_t lower_bound = std::max(
      relaxed, lp_bytes <= 0 ? 0 : static_cast<uint64_t>(std::floor(lp_bytes * (1 - 1e-9))));

  const std::vector<double> start_columns = Columns(problem, start);
  Search search{&start_columns, false};
  // What the bounds left of the time limit, a second at least.
  glp_iocp parm =
      BranchAndCut(/*presolve=*/false, std::max(1000, options.time_limit_ms - spent_ms()));
  // The feasibility pump finds schedules on training logs where branching
  // alone finds none better than the start within a minute.
  parm.fp_heur = GLP_ON;
  parm.cb_func = Callback;
  parm.cb_info = &search;
  const int rc = glp_intopt(lp.get(), &parm);
  glp_term_out(terminal);
  const int status = glp_mip_status(lp.get());
  const bool found = (rc == 0 || rc == GLP_ETMLIM) && (status == GLP_OPT || status == GLP_FEAS);
  if (!found && rc != GLP_ETMLIM) {
    return absl::InternalError(
        absl::StrCat("GLPK could not solve the 0-1 program with serving (glp_intopt ", rc,
                     ", status ", status, ")"));
  }
  const int64_t rows = result.rows;
  if (found) {
    Schedule best{std::vector<bool>(uses), std::vector<bool>(links)};
    for (int u = 0; u < uses; ++u) best.resident[u] = glp_mip_col_val(lp.get(), r_col(u)) > 0.5;
    for (int l = 0; l < links; ++l) best.kept[l] = glp_mip_col_val(lp.get(), k_col(l)) > 0.5;
    ServingOptimum found_result = FromSchedule(problem, best);
    if (found_result.moved() <= result.moved()) result = found_result;
  }
  result.rows = rows;
  result.proven = found && rc == 0 && status == GLP_OPT;
  result.lower_bound = result.proven ? result.moved() : std::min(lower_bound, result.moved());
  return result;
}

}  // namespace stensor
