#include "tools/min_cost_flow.h"

#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

TEST(MinCostFlowTest, TakesTheCheaperPathFirst) {
  // 0 -> 1 -> 3 costs 2 per unit (room 2), 0 -> 2 -> 3 costs 5 (room 5).
  MinCostFlow flow(4);
  int a = flow.AddArc(0, 1, 2, 1);
  flow.AddArc(1, 3, 2, 1);
  int c = flow.AddArc(0, 2, 5, 2);
  flow.AddArc(2, 3, 5, 3);
  flow.AddSupply(0, 3);
  flow.AddSupply(3, -3);
  absl::StatusOr<int64_t> cost = flow.Solve();
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(*cost, 2 * 2 + 1 * 5);
  EXPECT_EQ(flow.Flow(a), 2);
  EXPECT_EQ(flow.Flow(c), 1);
}

TEST(MinCostFlowTest, NegativeCostsAndReroutingThroughResiduals) {
  // Unit arcs; 0-1-2-3 costs -1 but blocks 2-3 for the unit leaving 0 by 0-2,
  // so the second augmentation undoes 1-2: 0-1-3 (6) + 0-2-3 (3).
  MinCostFlow flow(4);
  flow.AddArc(0, 1, 1, 1);
  flow.AddArc(0, 2, 1, 2);
  flow.AddArc(1, 2, 1, -3);
  flow.AddArc(1, 3, 1, 5);
  flow.AddArc(2, 3, 1, 1);
  flow.AddSupply(0, 2);
  flow.AddSupply(3, -2);
  absl::StatusOr<int64_t> cost = flow.Solve();
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(*cost, 9);
}

TEST(MinCostFlowTest, TellsInfeasibleAndUnbalanced) {
  MinCostFlow narrow(2);
  narrow.AddArc(0, 1, 1, 0);
  narrow.AddSupply(0, 2);
  narrow.AddSupply(1, -2);
  absl::StatusOr<int64_t> r = narrow.Solve();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();

  MinCostFlow unbalanced(2);
  unbalanced.AddArc(0, 1, 5, 0);
  unbalanced.AddSupply(0, 2);
  EXPECT_EQ(unbalanced.Solve().status().code(), absl::StatusCode::kInvalidArgument);

  MinCostFlow bad(2);
  bad.AddArc(0, 7, 1, 0);
  EXPECT_EQ(bad.Solve().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MinCostFlowTest, RefusesNegativeCycles) {
  MinCostFlow flow(3);
  flow.AddArc(0, 1, 1, -1);
  flow.AddArc(1, 2, 1, -1);
  flow.AddArc(2, 0, 1, -1);
  flow.AddSupply(0, 0);
  EXPECT_EQ(flow.Solve().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Brute force: every integer flow on every arc, conservation checked.
struct Instance {
  int nodes;
  struct A {
    int from, to;
    int64_t cap, cost;
  };
  std::vector<A> arcs;
  std::vector<int64_t> supply;
};

std::optional<int64_t> BruteForce(const Instance& in) {
  std::optional<int64_t> best;
  std::vector<int64_t> f(in.arcs.size(), 0);
  for (;;) {
    std::vector<int64_t> net(in.nodes, 0);
    int64_t cost = 0;
    for (size_t i = 0; i < in.arcs.size(); ++i) {
      net[in.arcs[i].from] += f[i];
      net[in.arcs[i].to] -= f[i];
      cost += f[i] * in.arcs[i].cost;
    }
    if (net == in.supply && (!best || cost < *best)) best = cost;
    size_t i = 0;
    while (i < f.size() && f[i] == in.arcs[i].cap) f[i++] = 0;
    if (i == f.size()) break;
    ++f[i];
  }
  return best;
}

Instance RandomDag(std::mt19937& rng) {
  Instance in;
  in.nodes = 3 + rng() % 3;
  const int arcs = 3 + rng() % 4;
  for (int i = 0; i < arcs; ++i) {
    int from = rng() % (in.nodes - 1);
    int to = from + 1 + rng() % (in.nodes - 1 - from);
    in.arcs.push_back(
        {from, to, static_cast<int64_t>(rng() % 3), static_cast<int64_t>(rng() % 11) - 5});
  }
  in.supply.assign(in.nodes, 0);
  const int64_t units = rng() % 3;
  in.supply[0] += units;
  in.supply[in.nodes - 1] -= units;
  if (rng() % 2) {  // a second source and sink
    int s = rng() % (in.nodes - 1);
    int t = s + 1 + rng() % (in.nodes - 1 - s);
    in.supply[s] += 1;
    in.supply[t] -= 1;
  }
  return in;
}

TEST(MinCostFlowTest, AgreesWithBruteForceOnRandomDags) {
  std::mt19937 rng(20261201);
  int feasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Instance in = RandomDag(rng);
    MinCostFlow flow(in.nodes);
    for (const Instance::A& a : in.arcs) flow.AddArc(a.from, a.to, a.cap, a.cost);
    for (int v = 0; v < in.nodes; ++v) flow.AddSupply(v, in.supply[v]);
    std::optional<int64_t> expected = BruteForce(in);
    absl::StatusOr<int64_t> got = flow.Solve();
    if (!expected) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << "trial " << trial;
      continue;
    }
    ++feasible;
    ASSERT_TRUE(got.ok()) << "trial " << trial << ": " << got.status();
    EXPECT_EQ(*got, *expected) << "trial " << trial;
  }
  EXPECT_GT(feasible, 100);  // the comparison really ran
}

// New costs after a Solve: the next Solve starts from the flow it has and
// must reach the optimum of the new costs, as a fresh solve would.
TEST(MinCostFlowTest, SolvesAgainAfterCostsChange) {
  std::mt19937 rng(20261204);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Instance in = RandomDag(rng);
    MinCostFlow flow(in.nodes);
    for (const Instance::A& a : in.arcs) flow.AddArc(a.from, a.to, a.cap, a.cost);
    for (int v = 0; v < in.nodes; ++v) flow.AddSupply(v, in.supply[v]);
    if (!flow.Solve().ok()) continue;
    for (int again = 0; again < 3; ++again) {
      for (size_t i = 0; i < in.arcs.size(); ++i) {
        if (rng() % 2) continue;
        in.arcs[i].cost = static_cast<int64_t>(rng() % 11) - 5;
        flow.SetCost(static_cast<int>(i), in.arcs[i].cost);
      }
      absl::StatusOr<int64_t> got = flow.Solve();
      ASSERT_TRUE(got.ok()) << "trial " << trial << ": " << got.status();
      EXPECT_EQ(*got, *BruteForce(in)) << "trial " << trial << " round " << again;
      ++compared;
    }
  }
  EXPECT_GT(compared, 300);
}

// A time line of 300,000 points with a chord over every other stretch, as
// the optimum of `stensor sim` builds for a long log: every unit runs the
// whole line, which a search recursing once per node could not follow on
// a thread's stack.
TEST(MinCostFlowTest, LongTimeLineOnAThreadStack) {
  constexpr int kPoints = 300000;
  int64_t cost = 0, expected = 0;
  std::thread solver([&] {
    MinCostFlow flow(kPoints + 1);
    for (int t = 0; t < kPoints; ++t) flow.AddArc(t, t + 1, 3, 0);
    for (int t = 0; t + 10 <= kPoints; t += 20) {
      flow.AddArc(t, t + 10, 2, -7);  // two of the three units take it
      expected -= 2 * 7;
    }
    flow.AddSupply(0, 3);
    flow.AddSupply(kPoints, -3);
    absl::StatusOr<int64_t> got = flow.Solve();
    cost = got.ok() ? *got : 1;
  });
  solver.join();
  EXPECT_EQ(cost, expected);
}

}  // namespace
}  // namespace stensor
