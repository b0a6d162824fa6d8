// GraphPlan read from a scripted graph: nodes in a topological order (not
// the listing order), kernel arguments copied out of the graph (a snapshot),
// child graphs inlined where they stand, nodes stensor cannot describe
// making the plan unknown, every failed query making it unknown, and node
// updates. Also CaptureState's bookkeeping against a scripted capture query.
#include "core/inference/graph_plan.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/capture.h"
#include "core/inference/launch_inference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/scripted_driver_testing.h"

namespace stensor {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using testing_support::FindKernel;
using testing_support::InstallScriptedKernels;
using testing_support::ScriptedKernel;

constexpr uintptr_t kAxpy = 0x1000;    // axpy(const float*, float*, int)
constexpr uintptr_t kOpaque = 0x2000;  // extern "C": no layout given
constexpr uintptr_t kPacked = 0x3000;  // scale(float*, float)

const ScriptedKernel* Scripted(uintptr_t handle, bool is_cukernel) {
  static const auto* const kernels = new std::vector<ScriptedKernel>{
      {kAxpy, false, "_Z4axpyPKfPfi", {{0, 8}, {8, 8}, {16, 4}}},
      {kOpaque, false, "opaque", {}, /*fail_from=*/0, CUDA_ERROR_NOT_SUPPORTED},
      {kPacked, false, "_Z5scalePff", {{0, 8}, {8, 4}}},
  };
  return FindKernel(*kernels, handle, is_cukernel);
}

// The scripted graph: nodes by handle, listed in `order`, with edges.
struct ScriptNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  CUDA_KERNEL_NODE_PARAMS kernel{};
  std::vector<unsigned char> args;  // backing of kernel.kernelParams
  std::vector<void*> arg_pointers;
  CUDA_MEMCPY3D copy{};
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUgraph child = nullptr;
};
struct ScriptGraph {
  std::vector<CUgraphNode> order;
  std::vector<std::pair<CUgraphNode, CUgraphNode>> edges;
};
std::map<CUgraphNode, ScriptNode>& Nodes() {
  static auto* nodes = new std::map<CUgraphNode, ScriptNode>;
  return *nodes;
}
std::map<CUgraph, ScriptGraph>& Graphs() {
  static auto* graphs = new std::map<CUgraph, ScriptGraph>;
  return *graphs;
}
CUresult g_fail_edges = CUDA_SUCCESS;  // the edge query's answer, when set

CUresult GetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  auto it = Graphs().find(g);
  if (it == Graphs().end() || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (nodes != nullptr) {
    for (size_t i = 0; i < std::min(*count, it->second.order.size()); ++i) {
      nodes[i] = it->second.order[i];
    }
  }
  *count = it->second.order.size();
  return CUDA_SUCCESS;
}
CUresult GetEdges(CUgraph g, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                  size_t* count) {
  if (g_fail_edges != CUDA_SUCCESS) return g_fail_edges;
  auto it = Graphs().find(g);
  if (it == Graphs().end() || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (from != nullptr) {
    for (size_t i = 0; i < std::min(*count, it->second.edges.size()); ++i) {
      from[i] = it->second.edges[i].first;
      to[i] = it->second.edges[i].second;
      if (data != nullptr) data[i] = CUgraphEdgeData{};
    }
  }
  *count = it->second.edges.size();
  return CUDA_SUCCESS;
}
CUresult GetType(CUgraphNode n, CUgraphNodeType* type) {
  auto it = Nodes().find(n);
  if (it == Nodes().end()) return CUDA_ERROR_INVALID_VALUE;
  *type = it->second.type;
  return CUDA_SUCCESS;
}
CUresult KernelParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS* p) {
  auto it = Nodes().find(n);
  if (it == Nodes().end() || it->second.type != CU_GRAPH_NODE_TYPE_KERNEL) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *p = it->second.kernel;
  return CUDA_SUCCESS;
}
CUresult CopyParams(CUgraphNode n, CUDA_MEMCPY3D* p) {
  *p = Nodes().at(n).copy;
  return CUDA_SUCCESS;
}
CUresult MemsetParams(CUgraphNode n, CUDA_MEMSET_NODE_PARAMS* p) {
  *p = Nodes().at(n).memset;
  return CUDA_SUCCESS;
}
CUresult ChildGraph(CUgraphNode n, CUgraph* g) {
  *g = Nodes().at(n).child;
  return CUDA_SUCCESS;
}

CUstreamCaptureStatus g_capture_status = CU_STREAM_CAPTURE_STATUS_NONE;
CUresult g_capture_query = CUDA_SUCCESS;
int g_mode_exchanges = 0;
CUstreamCaptureMode g_thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
CUresult IsCapturing(CUstream, CUstreamCaptureStatus* status) {
  *status = g_capture_status;
  return g_capture_query;
}
CUresult ExchangeMode(CUstreamCaptureMode* mode) {
  ++g_mode_exchanges;
  std::swap(*mode, g_thread_mode);
  return CUDA_SUCCESS;
}

const Driver* ScriptedDriver() {
  static const Driver* const driver = [] {
    auto* d = new Driver;
    InstallScriptedKernels(&Scripted, d);
    d->cuGraphGetNodes = &GetNodes;
    d->cuGraphGetEdges_v2 = &GetEdges;
    d->cuGraphNodeGetType = &GetType;
    d->cuGraphKernelNodeGetParams_v2 = &KernelParams;
    d->cuGraphMemcpyNodeGetParams = &CopyParams;
    d->cuGraphMemsetNodeGetParams = &MemsetParams;
    d->cuGraphChildGraphNodeGetGraph = &ChildGraph;
    d->cuStreamIsCapturing = &IsCapturing;
    d->cuThreadExchangeStreamCaptureMode = &ExchangeMode;
    return d;
  }();
  return driver;
}

CUgraphNode NodeHandle(uintptr_t h) { return reinterpret_cast<CUgraphNode>(h); }
CUgraph GraphHandle(uintptr_t h) { return reinterpret_cast<CUgraph>(h); }

// A kernel node of axpy(x, y, n), its argument values held by the script.
CUgraphNode AddAxpy(uintptr_t handle, uint64_t x, uint64_t y, int n) {
  ScriptNode& s = Nodes()[NodeHandle(handle)];
  s = ScriptNode{};
  s.type = CU_GRAPH_NODE_TYPE_KERNEL;
  s.args.assign(24, 0);
  std::memcpy(s.args.data(), &x, 8);
  std::memcpy(s.args.data() + 8, &y, 8);
  std::memcpy(s.args.data() + 16, &n, 4);
  s.arg_pointers = {s.args.data(), s.args.data() + 8, s.args.data() + 16};
  s.kernel.func = reinterpret_cast<CUfunction>(kAxpy);
  s.kernel.kernelParams = s.arg_pointers.data();
  return NodeHandle(handle);
}

CUgraphNode AddNode(uintptr_t handle, CUgraphNodeType type) {
  ScriptNode& s = Nodes()[NodeHandle(handle)];
  s = ScriptNode{};
  s.type = type;
  return NodeHandle(handle);
}

class GraphPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Nodes().clear();
    Graphs().clear();
    g_fail_edges = CUDA_SUCCESS;
  }
  std::shared_ptr<const GraphPlan> Read(uintptr_t graph) {
    return ReadGraphPlan(*ScriptedDriver(), &kernels_, GraphHandle(graph));
  }
  // The ids a node's accesses resolve to now.
  Accesses Infer(const GraphNodePlan& n) {
    Accesses a;
    InferKernelNode(n, registry_, &a);
    return a;
  }

  static KernelCache kernels_;
  static BufferRegistry registry_;
};
// Never destroyed: both keep per-thread caches keyed by their address.
KernelCache GraphPlanTest::kernels_(ScriptedDriver(), /*conservative=*/false);
BufferRegistry GraphPlanTest::registry_;

constexpr uint64_t kX = 0x70000000, kY = 0x70100000, kZ = 0x70200000;

TEST_F(GraphPlanTest, NodesComeInDependencyOrderNotListingOrder) {
  // Listed c, b, a; edges a -> b -> c, and a -> c.
  CUgraphNode a = AddAxpy(1, kX, kY, 4), b = AddAxpy(2, kY, kZ, 4), c = AddAxpy(3, kZ, kX, 4);
  Graphs()[GraphHandle(100)] = {{c, b, a}, {{b, c}, {a, b}, {a, c}}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown) << plan->why;
  ASSERT_EQ(plan->nodes.size(), 3u);
  EXPECT_EQ(plan->nodes[0].node, a);
  EXPECT_EQ(plan->nodes[1].node, b);
  EXPECT_EQ(plan->nodes[2].node, c);
}

TEST_F(GraphPlanTest, KernelArgumentsAreASnapshotResolvedAtEachLaunch) {
  const uint64_t x = *registry_.Add(kX, 0x1000, 0, BufferKind::kDeviceAlloc);
  const uint64_t y = *registry_.Add(kY, 0x1000, 0, BufferKind::kDeviceAlloc);
  CUgraphNode a = AddAxpy(1, kX + 0x10, kY, 4);  // an interior pointer counts
  Graphs()[GraphHandle(100)] = {{a}, {}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown) << plan->why;
  // The graph's own copy changes afterwards: the plan keeps the snapshot.
  Nodes()[a].args.assign(24, 0);
  Accesses got = Infer(plan->nodes[0]);
  EXPECT_THAT(got.reads, UnorderedElementsAre(x, y));
  EXPECT_THAT(got.writes, ElementsAre(y));  // x is const float*
  // A buffer freed and another allocated at its address: resolved anew.
  registry_.Remove(kY);
  const uint64_t y2 = *registry_.Add(kY, 0x1000, 0, BufferKind::kDeviceAlloc);
  got = Infer(plan->nodes[0]);
  EXPECT_THAT(got.writes, ElementsAre(y2));
  registry_.Remove(kX);
  registry_.Remove(kY);
}

TEST_F(GraphPlanTest, PackedArgumentsAreCopiedToo) {
  const uint64_t z = *registry_.Add(kZ, 0x1000, 0, BufferKind::kDeviceAlloc);
  ScriptNode& s = Nodes()[NodeHandle(7)];
  s.type = CU_GRAPH_NODE_TYPE_KERNEL;
  s.args.assign(12, 0);
  std::memcpy(s.args.data(), &kZ, 8);
  static size_t size = 12;
  static void* extra[5];
  extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
  extra[1] = s.args.data();
  extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
  extra[3] = &size;
  extra[4] = CU_LAUNCH_PARAM_END;
  s.kernel.func = reinterpret_cast<CUfunction>(kPacked);
  s.kernel.extra = extra;
  Graphs()[GraphHandle(100)] = {{NodeHandle(7)}, {}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown) << plan->why;
  ASSERT_TRUE(plan->nodes[0].packed);
  Nodes()[NodeHandle(7)].args.assign(12, 0);
  EXPECT_THAT(Infer(plan->nodes[0]).writes, ElementsAre(z));
  registry_.Remove(kZ);
}

TEST_F(GraphPlanTest, CopiesAndMemsetsKeepTheirRanges) {
  ScriptNode& c = Nodes()[NodeHandle(1)];
  c.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  c.copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.copy.srcDevice = kX;
  c.copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.copy.dstDevice = kY + 64;
  c.copy.WidthInBytes = 256;
  c.copy.Height = 1;
  c.copy.Depth = 1;
  ScriptNode& m = Nodes()[NodeHandle(2)];
  m.type = CU_GRAPH_NODE_TYPE_MEMSET;
  m.memset.dst = kZ;
  m.memset.elementSize = 4;
  m.memset.width = 100;
  m.memset.height = 1;
  Graphs()[GraphHandle(100)] = {{NodeHandle(1), NodeHandle(2)}, {{NodeHandle(1), NodeHandle(2)}}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown) << plan->why;
  ASSERT_EQ(plan->nodes.size(), 2u);
  EXPECT_EQ(plan->nodes[0].kind, GraphNodePlan::Kind::kCopy);
  EXPECT_EQ(plan->nodes[0].copy.src.start, kX);
  EXPECT_EQ(plan->nodes[0].copy.dst.start, kY + 64);
  EXPECT_EQ(plan->nodes[0].copy.bytes, 256u);
  EXPECT_EQ(plan->nodes[1].kind, GraphNodePlan::Kind::kMemset);
  EXPECT_EQ(plan->nodes[1].memset_dst, kZ);
  EXPECT_EQ(plan->nodes[1].memset_extent, 400u);
}

TEST_F(GraphPlanTest, ChildGraphsAreInlinedWhereTheyStand) {
  CUgraphNode first = AddAxpy(1, kX, kY, 1), last = AddAxpy(3, kZ, kX, 1);
  CUgraphNode inner_a = AddAxpy(10, kY, kZ, 1), inner_b = AddAxpy(11, kY, kX, 1);
  Graphs()[GraphHandle(200)] = {{inner_b, inner_a}, {{inner_a, inner_b}}};
  CUgraphNode child = AddNode(2, CU_GRAPH_NODE_TYPE_GRAPH);
  Nodes()[child].child = GraphHandle(200);
  Graphs()[GraphHandle(100)] = {{last, child, first}, {{first, child}, {child, last}}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown) << plan->why;
  std::vector<CUgraphNode> order;
  for (const GraphNodePlan& n : plan->nodes) order.push_back(n.node);
  EXPECT_THAT(order, ElementsAre(first, inner_a, inner_b, last));
}

TEST_F(GraphPlanTest, NodesWithoutDeviceAccessAreCountedNotPlanned) {
  CUgraphNode k = AddAxpy(1, kX, kY, 1);
  AddNode(2, CU_GRAPH_NODE_TYPE_HOST);
  AddNode(3, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  AddNode(4, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
  AddNode(5, CU_GRAPH_NODE_TYPE_MEM_FREE);
  AddNode(6, CU_GRAPH_NODE_TYPE_EMPTY);
  Graphs()[GraphHandle(100)] = {
      {k, NodeHandle(2), NodeHandle(3), NodeHandle(4), NodeHandle(5), NodeHandle(6)}, {}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown) << plan->why;
  EXPECT_EQ(plan->nodes.size(), 1u);
  EXPECT_EQ(plan->other_nodes, 3u);
  EXPECT_EQ(plan->alloc_nodes, 1u);
  EXPECT_EQ(plan->free_nodes, 1u);
}

TEST_F(GraphPlanTest, WhatCannotBeDescribedMakesThePlanUnknown) {
  // A conditional node, a batch memory operation (writes device memory),
  // a kernel the driver cannot describe.
  for (CUgraphNodeType type : {CU_GRAPH_NODE_TYPE_CONDITIONAL, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP,
                               CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT}) {
    SetUp();
    AddAxpy(1, kX, kY, 1);
    AddNode(2, type);
    Graphs()[GraphHandle(100)] = {{NodeHandle(1), NodeHandle(2)}, {}};
    auto plan = Read(100);
    EXPECT_TRUE(plan->unknown) << type;
    EXPECT_TRUE(plan->nodes.empty());
    EXPECT_FALSE(plan->why.empty());
  }
  SetUp();
  ScriptNode& s = Nodes()[NodeHandle(1)];
  s.type = CU_GRAPH_NODE_TYPE_KERNEL;
  s.kernel.func = reinterpret_cast<CUfunction>(kOpaque);
  Graphs()[GraphHandle(100)] = {{NodeHandle(1)}, {}};
  auto plan = Read(100);
  EXPECT_TRUE(plan->unknown);
  EXPECT_THAT(plan->why, ::testing::HasSubstr("opaque"));
}

TEST_F(GraphPlanTest, AFailedOrMissingQueryMakesThePlanUnknown) {
  AddAxpy(1, kX, kY, 1);
  Graphs()[GraphHandle(100)] = {{NodeHandle(1)}, {}};
  g_fail_edges = CUDA_ERROR_INVALID_VALUE;
  auto plan = Read(100);
  EXPECT_TRUE(plan->unknown);
  EXPECT_THAT(plan->why, ::testing::HasSubstr("cuGraphGetEdges"));
  g_fail_edges = CUDA_SUCCESS;
  EXPECT_TRUE(Read(999)->unknown);  // a graph the driver does not know
  // A driver without the graph queries at all.
  Driver bare;
  KernelCache* cache = new KernelCache(&bare, false);  // never destroyed (see above)
  EXPECT_TRUE(ReadGraphPlan(bare, cache, GraphHandle(100))->unknown);
  // A cycle (a driver bug) is not followed for ever.
  AddAxpy(2, kX, kY, 1);
  Graphs()[GraphHandle(100)] = {{NodeHandle(1), NodeHandle(2)},
                                {{NodeHandle(1), NodeHandle(2)}, {NodeHandle(2), NodeHandle(1)}}};
  EXPECT_TRUE(Read(100)->unknown);
}

TEST_F(GraphPlanTest, NodeUpdatesReplaceEveryUseOfTheNode) {
  const uint64_t x = *registry_.Add(kX, 0x1000, 0, BufferKind::kDeviceAlloc);
  const uint64_t z = *registry_.Add(kZ, 0x1000, 0, BufferKind::kDeviceAlloc);
  CUgraphNode a = AddAxpy(1, kX, kY, 1);
  Graphs()[GraphHandle(100)] = {{a}, {}};
  auto plan = Read(100);
  ASSERT_FALSE(plan->unknown);
  // cuGraphExecKernelNodeSetParams: now axpy(x, z).
  uint64_t args[2] = {kX, kZ};
  int n = 1;
  void* pointers[] = {&args[0], &args[1], &n};
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = reinterpret_cast<CUfunction>(kAxpy);
  p.kernelParams = pointers;
  bool unknown = true;
  GraphNodePlan replacement = KernelNodePlan(&kernels_, a, p, &unknown);
  ASSERT_FALSE(unknown);
  auto updated = WithNode(*plan, a, replacement);
  ASSERT_NE(updated, nullptr);
  EXPECT_THAT(Infer(updated->nodes[0]).writes, ElementsAre(z));
  EXPECT_THAT(Infer(plan->nodes[0]).writes, ::testing::IsEmpty());  // kY untracked
  EXPECT_EQ(WithNode(*plan, NodeHandle(42), replacement), nullptr);
  EXPECT_TRUE(MadeUnknown(*plan, "why")->unknown);
  // A kernel node with its arguments given nowhere cannot be described.
  p.kernelParams = nullptr;
  KernelNodePlan(&kernels_, a, p, &unknown);
  EXPECT_TRUE(unknown);
  (void)x;
  registry_.Remove(kX);
  registry_.Remove(kZ);
}

// cuGraphExecUpdate: the update graph's parameters, named by the exec's
// nodes (those of the graph it was instantiated from), which the setters
// go on naming.
TEST_F(GraphPlanTest, AnUpdateKeepsTheExecsNodeHandles) {
  const uint64_t x = *registry_.Add(kX, 0x1000, 0, BufferKind::kDeviceAlloc);
  const uint64_t y = *registry_.Add(kY, 0x1000, 0, BufferKind::kDeviceAlloc);
  const uint64_t z = *registry_.Add(kZ, 0x1000, 0, BufferKind::kDeviceAlloc);
  // Instantiated from a -> m -> b (m a memset); updated from c -> n -> d.
  CUgraphNode a = AddAxpy(1, kX, kY, 1), b = AddAxpy(2, kY, kX, 1);
  CUgraphNode m = AddNode(3, CU_GRAPH_NODE_TYPE_MEMSET);
  Nodes()[m].memset = CUDA_MEMSET_NODE_PARAMS{kX, 0, 0, 1, 16, 1};
  Graphs()[GraphHandle(100)] = {{a, m, b}, {{a, m}, {m, b}}};
  CUgraphNode c = AddAxpy(11, kZ, kX, 1), d = AddAxpy(12, kX, kZ, 1);
  CUgraphNode n = AddNode(13, CU_GRAPH_NODE_TYPE_MEMSET);
  Nodes()[n].memset = CUDA_MEMSET_NODE_PARAMS{kZ, 0, 0, 1, 16, 1};
  Graphs()[GraphHandle(200)] = {{c, n, d}, {{c, n}, {n, d}}};
  auto exec = Read(100);
  auto updated = UpdatedPlan(*exec, *Read(200));
  ASSERT_FALSE(updated->unknown) << updated->why;
  ASSERT_EQ(updated->nodes.size(), 3u);
  EXPECT_EQ(updated->nodes[0].node, a);
  EXPECT_EQ(updated->nodes[1].node, m);
  EXPECT_EQ(updated->nodes[2].node, b);
  EXPECT_THAT(Infer(updated->nodes[0]).writes, ElementsAre(x));  // c's arguments
  EXPECT_EQ(updated->nodes[1].memset_dst, kZ);
  // The setters name the original nodes: b is now axpy(x, y).
  uint64_t args[2] = {kX, kY};
  int count = 1;
  void* pointers[] = {&args[0], &args[1], &count};
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = reinterpret_cast<CUfunction>(kAxpy);
  p.kernelParams = pointers;
  bool unknown = true;
  auto set = WithNode(*updated, b, KernelNodePlan(&kernels_, b, p, &unknown));
  ASSERT_FALSE(unknown);
  ASSERT_NE(set, nullptr);
  EXPECT_THAT(Infer(set->nodes[2]).writes, ElementsAre(y));
  EXPECT_EQ(WithNode(*updated, d, set->nodes[2]), nullptr);  // the driver refuses d
  // A second update: still a, m, b.
  auto again = UpdatedPlan(*set, *Read(100));
  ASSERT_FALSE(again->unknown);
  EXPECT_EQ(again->nodes[2].node, b);
  EXPECT_THAT(Infer(again->nodes[2]).writes, ElementsAre(x));
  // Plans that do not pair: unknown; an unknown exec plan names nothing.
  Graphs()[GraphHandle(300)] = {{c, d}, {{c, d}}};
  EXPECT_TRUE(UpdatedPlan(*exec, *Read(300))->unknown);
  Graphs()[GraphHandle(400)] = {{c, d, n}, {{c, d}, {d, n}}};
  EXPECT_TRUE(UpdatedPlan(*exec, *Read(400))->unknown);
  auto from_unknown = UpdatedPlan(*MadeUnknown(*exec, "why"), *Read(200));
  ASSERT_FALSE(from_unknown->unknown);
  EXPECT_EQ(from_unknown->nodes[0].node, c);
  (void)z;
  registry_.Remove(kX);
  registry_.Remove(kY);
  registry_.Remove(kZ);
}

TEST_F(GraphPlanTest, EverySetterFormIsPlannedAlike) {
  const uint64_t z = *registry_.Add(kZ, 0x1000, 0, BufferKind::kDeviceAlloc);
  uint64_t args[2] = {kX, kZ};
  int n = 1;
  void* pointers[] = {&args[0], &args[1], &n};
  CUDA_KERNEL_NODE_PARAMS_v1 v1{};
  v1.func = reinterpret_cast<CUfunction>(kAxpy);
  v1.kernelParams = pointers;
  GraphNodePlan plan;
  ASSERT_EQ(PlanNode(&kernels_, NodeHandle(1), NodeParams(v1), &plan), NodeChange::kPlanned);
  EXPECT_EQ(plan.node, NodeHandle(1));
  EXPECT_THAT(Infer(plan).writes, ElementsAre(z));
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = kZ + 8;
  m.elementSize = 2;
  m.width = 10;
  m.height = 1;
  ASSERT_EQ(PlanNode(&kernels_, NodeHandle(2), NodeParams(m), &plan), NodeChange::kPlanned);
  EXPECT_EQ(plan.kind, GraphNodePlan::Kind::kMemset);
  EXPECT_EQ(plan.memset_dst, kZ + 8);
  EXPECT_EQ(plan.memset_extent, 20u);
  CUDA_MEMCPY3D c{};
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = kZ;
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = &n;
  c.WidthInBytes = 4;
  c.Height = 1;
  c.Depth = 1;
  ASSERT_EQ(PlanNode(&kernels_, NodeHandle(3), NodeParams(c), &plan), NodeChange::kPlanned);
  EXPECT_EQ(plan.copy.dst.start, kZ);
  CUgraphNodeParams other{};
  other.type = CU_GRAPH_NODE_TYPE_HOST;
  EXPECT_EQ(PlanNode(&kernels_, NodeHandle(4), other, &plan), NodeChange::kNoAccess);
  other.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  EXPECT_EQ(PlanNode(&kernels_, NodeHandle(4), other, &plan), NodeChange::kUnknown);
  v1.func = reinterpret_cast<CUfunction>(kOpaque);
  EXPECT_EQ(PlanNode(&kernels_, NodeHandle(1), NodeParams(v1), &plan), NodeChange::kUnknown);
  registry_.Remove(kZ);
}

TEST(CaptureStateTest, AsksTheDriverOnlyWhileACaptureIsInProgress) {
  CaptureState state(ScriptedDriver());
  const CUstream s = reinterpret_cast<CUstream>(0x10);
  g_capture_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  EXPECT_FALSE(state.any());
  EXPECT_FALSE(state.Capturing(s));  // nothing began: not even asked
  state.OnBegin(s);
  state.OnBegin(s);  // once per origin
  EXPECT_TRUE(state.any());
  EXPECT_TRUE(state.Capturing(s));
  g_capture_query = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;  // legacy stream: capturing
  EXPECT_TRUE(state.Capturing(nullptr));
  g_capture_query = CUDA_ERROR_UNKNOWN;  // a failed query: run now, writes recorded
  EXPECT_FALSE(state.Capturing(s));
  g_capture_query = CUDA_SUCCESS;
  state.OnEnd(s);  // the driver says it still captures (a failed end)
  EXPECT_TRUE(state.any());
  g_capture_status = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_FALSE(state.Capturing(s));
  state.OnEnd(s);
  EXPECT_FALSE(state.any());
}

TEST(CaptureStateTest, RelaxesTheThreadOnlyDuringACaptureAndRestoresItsMode) {
  CaptureState state(ScriptedDriver());
  const CUstream s = reinterpret_cast<CUstream>(0x10);
  g_mode_exchanges = 0;
  g_thread_mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  { RelaxedCaptureScope relaxed(state); }
  EXPECT_EQ(g_mode_exchanges, 0);
  g_capture_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  state.OnBegin(s);
  {
    RelaxedCaptureScope relaxed(state);
    EXPECT_EQ(g_thread_mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  }
  EXPECT_EQ(g_thread_mode, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  EXPECT_EQ(g_mode_exchanges, 2);
  g_capture_status = CU_STREAM_CAPTURE_STATUS_NONE;
  state.OnEnd(s);
}

}  // namespace
}  // namespace stensor
