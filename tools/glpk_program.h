// What the GLPK 0-1 programs of tools/ (ExactOptimum, ServingOptimum) share:
// their costs in MiB, the problem's owner and the search's parameters.
//
// Thread-safety: reentrant (GLPK keeps its state per thread).
#ifndef STENSOR_TOOLS_GLPK_PROGRAM_H_
#define STENSOR_TOOLS_GLPK_PROGRAM_H_

#include <glpk.h>

#include <memory>

namespace stensor {

// Costs in MiB keep the solver's numbers small; the bytes are counted again
// from the chosen schedule, exactly.
inline constexpr double kGlpkCostUnit = 1024.0 * 1024.0;

struct GlpkProblemDeleter {
  void operator()(glp_prob* p) const { glp_delete_prob(p); }
};
using GlpkProblem = std::unique_ptr<glp_prob, GlpkProblemDeleter>;

// Branch and cut with MIR, cover and Gomory cuts, quiet, within
// `time_limit_ms` (a millisecond at least).
inline glp_iocp BranchAndCut(bool presolve, int time_limit_ms) {
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = presolve ? GLP_ON : GLP_OFF;
  parm.mir_cuts = GLP_ON;
  parm.cov_cuts = GLP_ON;
  parm.gmi_cuts = GLP_ON;
  parm.tm_lim = time_limit_ms < 1 ? 1 : time_limit_ms;
  return parm;
}

}  // namespace stensor

#endif  // STENSOR_TOOLS_GLPK_PROGRAM_H_
