// MinCostFlow: minimum-cost flow by successive shortest paths (Dijkstra on
// reduced costs with node potentials, all paths of one length augmented at
// once by a blocking flow, initialised by Bellman-Ford so that
// negative arc costs are allowed as long as no cycle is negative). Nodes
// have supplies (positive) and demands (negative) that must balance; Solve
// routes all of them at least cost. Integer capacities and costs, so the
// result is exact; the optimum it returns is integral.
//
// Used by the offline optimum of `stensor sim` (tools/optimum.h), where
// the graph is a time line with one arc per gap between uses of a buffer.
//
// Thread-safety: one thread per instance.
#ifndef STENSOR_TOOLS_MIN_COST_FLOW_H_
#define STENSOR_TOOLS_MIN_COST_FLOW_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace stensor {

class MinCostFlow {
 public:
  explicit MinCostFlow(int nodes);

  // An arc of `capacity` >= 0 units at `cost` per unit; returns its index.
  int AddArc(int from, int to, int64_t capacity, int64_t cost);
  // Adds to the node's supply (negative: demand).
  void AddSupply(int node, int64_t supply);

  // The minimum total cost of a flow meeting every supply and demand.
  // InvalidArgument when supplies do not balance or an arc is malformed,
  // FailedPrecondition when no flow meets them or a cycle of negative cost
  // exists. Call once.
  absl::StatusOr<int64_t> Solve();

  // Units on arc `arc` after Solve.
  int64_t Flow(int arc) const;
  // Augmenting paths Solve took (for reports and tests).
  int64_t augmentations() const { return augmentations_; }

 private:
  struct Arc {
    int to;
    int rev;  // index of the reverse arc in adj_[to]
    int64_t capacity;
    int64_t cost;
  };
  bool InitialPotentials();
  // One augmenting path of admissible arcs (zero reduced cost, next level)
  // from v; returns the units pushed (0: none left from v).
  int64_t Push(int v, int sink, int64_t limit, const std::vector<int>& level,
               std::vector<int>& next_arc, int64_t* cost);

  int nodes_;
  std::vector<std::vector<Arc>> adj_;
  std::vector<std::pair<int, int>> arcs_;  // (from, index in adj_[from])
  std::vector<int64_t> original_capacity_;
  std::vector<int64_t> supply_;
  std::vector<int64_t> potential_;
  bool bad_arc_ = false;
  int64_t augmentations_ = 0;
};

}  // namespace stensor

#endif  // STENSOR_TOOLS_MIN_COST_FLOW_H_
