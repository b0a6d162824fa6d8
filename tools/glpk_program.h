// What the GLPK 0-1 programs of tools/ (ExactOptimum, ServingOptimum) share:
// their costs in MiB and the problem's owner.
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

}  // namespace stensor

#endif  // STENSOR_TOOLS_GLPK_PROGRAM_H_
