// MinCostFlow: minimum-cost flow by the primal-dual method. Unrouted supply
// is kept at its node as excess (demand as deficit); each phase runs
// Dijkstra on reduced costs from every node with excess to the nearest
// deficit, raises the node potentials by the distances, and moves a maximum
// flow from excesses to deficits over the arcs of zero reduced cost by
// push-relabel, until no excess is left. Potentials start from Bellman-Ford,
// so negative arc costs are allowed as long as no cycle is negative.
//
// Push-relabel moves excess in bulk: on a time line, where each unit of
// room is a path the length of the line, augmenting paths would carry it a
// unit at a time over the whole line (quadratic on a log of 100,000
// buffers). Arcs are kept in one array by tail node (compressed rows), and
// every search is a loop over its own queue: graphs of millions of nodes,
// no recursion. Integer capacities and costs, so the result is exact; the
// optimum it returns is integral.
//
// After a Solve, arc costs may change (SetCost) and Solve runs again from
// the flow it has: arcs the new costs make worth changing are saturated or
// emptied, and only the excess that creates is routed again. The optimum
// of `stensor sim` (tools/optimum.h) solves one graph for several cost
// weightings so.
//
// Used by the offline optimum of `stensor sim` (tools/optimum.h), where
// the graph is a time line with one arc per gap between uses of a buffer.
//
// Thread-safety: one thread per instance.
#ifndef STENSOR_TOOLS_MIN_COST_FLOW_H_
#define STENSOR_TOOLS_MIN_COST_FLOW_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stensor {

class MinCostFlow {
 public:
  explicit MinCostFlow(int nodes);

  // An arc of `capacity` >= 0 units at `cost` per unit; returns its index.
  // Before the first Solve.
  int AddArc(int from, int to, int64_t capacity, int64_t cost);
  // Adds to the node's supply (negative: demand). Before the first Solve.
  void AddSupply(int node, int64_t supply);
  // A new cost for arc `arc`, for the next Solve.
  void SetCost(int arc, int64_t cost);

  // The minimum total cost of a flow meeting every supply and demand.
  // InvalidArgument when supplies do not balance or an arc is malformed,
  // FailedPrecondition when no flow meets them or a cycle of negative cost
  // exists.
  absl::StatusOr<int64_t> Solve();

  // Units on arc `arc` after Solve.
  int64_t Flow(int arc) const;
  // Shortest-path phases the Solves took (each a Dijkstra and a maximum flow).
  int64_t phases() const { return phases_; }

 private:
  struct Arc {
    int to;
    int rev;  // index of the reverse arc in arcs_
    int64_t capacity;
    int64_t cost;
  };
  struct InputArc {
    int from, to;
    int64_t capacity, cost;
  };
  // Lays out the residual graph: the input arcs and their reverses, by
  // tail node.
  void Build();
  bool InitialPotentials();
  // Whether arc i, leaving v, has room and zero reduced cost.
  bool Admissible(int v, int i) const {
    const Arc& a = arcs_[i];
    return a.capacity > 0 && a.cost + potential_[v] - potential_[a.to] == 0;
  }
  int64_t Reduced(int v, int i) const {
    return arcs_[i].cost + potential_[v] - potential_[arcs_[i].to];
  }
  // Moves `units` over arc i, leaving v.
  void Push(int v, int i, int64_t units);
  // Applies SetCost's changes, saturating or emptying the arcs whose reduced
  // cost turned negative, so that the potentials stay feasible.
  void Reprice();
  // Routes what excess the arcs of zero reduced cost can carry to deficits.
  void MaxFlow();
  // Exact heights for MaxFlow: the admissible distance to the nearest
  // deficit; the node count for nodes that reach none.
  void GlobalRelabel();

  int nodes_;
  std::vector<InputArc> input_;
  std::vector<int64_t> supply_;
  std::vector<std::pair<int, int64_t>> repriced_;  // SetCost's, for the next Solve
  bool built_ = false;
  std::vector<int> first_;  // arcs_ of node v: [first_[v], first_[v + 1])
  std::vector<Arc> arcs_;
  std::vector<int> position_;  // input arc -> its place in arcs_
  std::vector<int64_t> potential_;
  std::vector<int64_t> excess_;  // supply not routed yet; negative: demand
  // MaxFlow's state, kept for its capacity.
  std::vector<int> height_, current_, queue_;
  bool bad_arc_ = false;
  int64_t phases_ = 0;
};

}  // namespace stensor

#endif  // STENSOR_TOOLS_MIN_COST_FLOW_H_
