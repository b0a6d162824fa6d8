// GraphPlan: what an instantiated CUDA graph does to device memory, read
// from the graph when it is instantiated (S01: its kernel, copy and memset
// nodes in a topological order), so that each cuGraphLaunch can be treated
// like the sequence of launches, copies and memsets it runs: the buffers
// its nodes touch made resident first, kept from eviction until it
// completed, and the versions of what its nodes write bumped.
//
// A kernel node's argument values are copied out of the graph at
// instantiation (the exec is a snapshot: later edits to the graph, or its
// destruction, do not change it) and resolved against the live buffers at
// each launch, exactly as a direct launch's arguments are
// (core/inference/launch_inference.h): interior pointers count, `const T*` reads.
// A node stensor cannot describe (a kernel whose layout the driver does not
// give, conditional or batch memory-operation nodes, external semaphores)
// makes the whole plan unknown: its launches are then treated as work of
// unknown accesses (MemoryManager::BeginUnknown), as every graph launch was
// before plans existed.
//
// Thread-safety: ReadGraphPlan may run on any thread (the kernel cache is
// thread-safe); a GraphPlan is immutable once built and shared read-only;
// GraphPlans is thread-safe.
#ifndef STENSOR_CORE_INFERENCE_GRAPH_PLAN_H_
#define STENSOR_CORE_INFERENCE_GRAPH_PLAN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/copy_ranges.h"
#include "core/inference/launch_inference.h"

namespace stensor {

struct GraphNodePlan {
  enum class Kind : uint8_t { kKernel, kCopy, kMemset };
  Kind kind = Kind::kKernel;
  // In the instantiated graph: the exec's setters name it, after an update
  // too (UpdatedPlan).
  CUgraphNode node = nullptr;
  // kKernel: the description, and the argument bytes, each parameter at its
  // offset (kernelParams form) or the packed buffer (`packed`: extra form).
  CUfunction function = nullptr;
  const KernelInfo* kernel = nullptr;
  unsigned grid[3] = {0, 0, 0};   // the launch's shape: part of the planner's
  unsigned block[3] = {0, 0, 0};  // key, as for a direct launch
  std::vector<unsigned char> args;
  bool packed = false;
  // kCopy: both sides; kMemset: the destination and the extent set.
  CopyRanges copy;
  uint64_t memset_dst = 0;
  uint64_t memset_extent = 0;
  bool memset_linear = true;  // one row: every byte of the extent is set
};

struct GraphPlan {
  std::vector<GraphNodePlan> nodes;  // topological order, child graphs inlined
  // Some node's accesses cannot be inferred: `why` says which and how.
  bool unknown = false;
  std::string why;
  // Nodes with no access to tracked memory, counted for the log.
  uint64_t other_nodes = 0;
  // Host nodes among them: code that may write any host memory, e.g. the
  // source of a later host-to-device copy node.
  uint64_t host_nodes = 0;
  // Graph memory nodes (cuGraphAddMemAllocNode/FreeNode, or captured
  // cuMemAllocAsync/FreeAsync): the driver's memory, counted, not swapped.
  uint64_t alloc_nodes = 0;
  uint64_t free_nodes = 0;
};

// Reads `graph` through the driver's graph queries. Never fails: what
// cannot be read makes the plan unknown (with the reason).
std::shared_ptr<const GraphPlan> ReadGraphPlan(const Driver& driver, KernelCache* kernels,
                                               CUgraph graph);

// The plan of one node from its parameters; for a kernel, `unknown` is set
// when they cannot be described.
GraphNodePlan KernelNodePlan(KernelCache* kernels, CUgraphNode node,
                             const CUDA_KERNEL_NODE_PARAMS& params, bool* unknown);
GraphNodePlan CopyNodePlan(CUgraphNode node, const CUDA_MEMCPY3D& params);
GraphNodePlan MemsetNodePlan(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS& params);

// New parameters of a node of an exec (cuGraphExec*NodeSetParams, every
// form, as cuGraphExecNodeSetParams gives them): its new plan (kPlanned),
// nothing stensor tracks (host, event and empty nodes), or parameters that
// cannot be described.
enum class NodeChange { kPlanned, kNoAccess, kUnknown };
NodeChange PlanNode(KernelCache* kernels, CUgraphNode node, const CUgraphNodeParams& params,
                    GraphNodePlan* plan);
// The typed setters' parameters in cuGraphExecNodeSetParams's form.
CUgraphNodeParams NodeParams(const CUDA_KERNEL_NODE_PARAMS_v1& kernel);
CUgraphNodeParams NodeParams(const CUDA_KERNEL_NODE_PARAMS& kernel);
CUgraphNodeParams NodeParams(const CUDA_MEMCPY3D& copy);
CUgraphNodeParams NodeParams(const CUDA_MEMSET_NODE_PARAMS& memset);

// `plan` with the node named `node` replaced by `replacement`. Null when
// the plan has no such node.
std::shared_ptr<const GraphPlan> WithNode(const GraphPlan& plan, CUgraphNode node,
                                          const GraphNodePlan& replacement);
// The plan of an exec after cuGraphExecUpdate from a graph whose plan is
// `update`, `exec` its plan until then. The update's parameters run, but
// the exec's nodes keep the handles of the graph it was instantiated from:
// the exec setters take those ("the corresponding node hNode in the
// non-executable graph from which the executable graph was instantiated"),
// the driver refuses the update graph's. The driver pairs the two graphs'
// nodes by topology and order of addition, from which a plan's order is
// made, so the nodes at one position correspond: each of the update's
// nodes is named by the exec node at its position. Plans that do not pair
// (other kinds, another count) make it unknown; an unknown exec plan has
// no nodes to name them by, and the update's plan is kept as read (a
// setter then finds no node: unknown from there, WithNode).
std::shared_ptr<const GraphPlan> UpdatedPlan(const GraphPlan& exec, const GraphPlan& update);
// `plan` made unknown, saying why.
std::shared_ptr<const GraphPlan> MadeUnknown(const GraphPlan& plan, std::string why);

// The buffers one kernel node reaches directly through its arguments, as
// for a launch (pointer tables are the caller's: TableInference::Expand).
void InferKernelNode(const GraphNodePlan& node, const BufferRegistry& registry, Accesses* out);

// The plans of live graph execs, by handle.
class GraphPlans {
 public:
  void Set(CUgraphExec exec, std::shared_ptr<const GraphPlan> plan) ABSL_LOCKS_EXCLUDED(mu_);
  // Null for an exec stensor has no plan of.
  std::shared_ptr<const GraphPlan> Get(CUgraphExec exec) const ABSL_LOCKS_EXCLUDED(mu_);
  void Erase(CUgraphExec exec) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable Mutex mu_;
  absl::flat_hash_map<CUgraphExec, std::shared_ptr<const GraphPlan>> plans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_GRAPH_PLAN_H_
