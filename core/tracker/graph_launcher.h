// GraphLauncher: CUDA graphs under stensor. It keeps a plan of each
// instantiated graph (its nodes' kernels, arguments, copies and memsets:
// core/inference/graph_plan.h), follows the setters and updates that change
// a node, and at each cuGraphLaunch walks the plan into the buffers every
// node reaches at this launch (through pointer tables too), makes them
// resident together under a cap (a graph runs as one unit on the device)
// and tells the iteration planner its nodes in order. A graph stensor has no
// plan of is work of unknown accesses.
//
// Thread-safety: any thread; the plans have their own lock, the rest is the
// parts it is given.
#ifndef STENSOR_CORE_TRACKER_GRAPH_LAUNCHER_H_
#define STENSOR_CORE_TRACKER_GRAPH_LAUNCHER_H_

#include <memory>
#include <utility>
#include <vector>

#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/capture.h"
#include "core/inference/graph_plan.h"
#include "core/inference/launch_inference.h"
#include "core/swap/memory_manager.h"
#include "core/tracker/pinned_host.h"
#include "core/tracker/table_inference.h"

namespace stensor {

// One cuGraphLaunch, between GraphLauncher::Begin and End.
struct GraphLaunchScope {
  std::shared_ptr<const GraphPlan> plan;  // null: stensor has none
  // What its nodes touch together (known plans only), and what each node
  // touches, in order, for the iteration planner.
  Accesses accesses;
  std::vector<std::pair<IdList, IdList>> nodes;
  IdList kernel_writes;  // what its kernel nodes may write (tables go stale)
  // Where its kernel nodes may store pointers (TableInference::
  // OnPointerWrites): each a buffer's id and the pointer's address.
  std::vector<std::pair<uint64_t, uint64_t>> pointer_writes;
  bool writes_host = true;      // a node may write device-reachable host memory
  bool tables_changed = false;  // its copies and memsets were applied to tables
  bool unknown = true;          // treated as work of unknown accesses
  bool captured = false;        // launched into a capturing stream: a child graph
  int unknown_device = -1;      // MemoryManager::BeginUnknown's
  MemoryManager::OpTicket op;   // times the whole graph while profiling
};

class GraphLauncher {
 public:
  // `memory`: the manager of the cap, or null without one. The others
  // outlive the launcher. Used only while a cap or an access log needs
  // plans (the tracker's tracks_tables()).
  GraphLauncher(const Driver* driver, KernelCache* kernels, const CaptureState* capture,
                const BufferRegistry* registry, const PinnedHost* pinned, MemoryManager* memory,
                TableInference* tables);

  // `exec` was instantiated from `graph` with `flags`: its plan (unknown
  // for an exec made for launches from the device, which are not seen).
  std::shared_ptr<const GraphPlan> OnInstantiate(CUgraphExec exec, CUgraph graph,
                                                 unsigned long long flags);
  // Node `node` of `exec` got new parameters: that node's accesses are
  // read again, or the exec's become unknown when they cannot be described.
  void OnExecNode(CUgraphExec exec, CUgraphNode node, const CUgraphNodeParams& params);
  // A child graph node of `exec` was given another graph: unknown.
  void OnExecChildChanged(CUgraphExec exec);
  // cuGraphExecUpdate succeeded: `exec` now runs `graph`'s nodes, still
  // named by its own (UpdatedPlan).
  void OnExecUpdate(CUgraphExec exec, CUgraph graph);
  void OnExecDestroy(CUgraphExec exec) { graphs_.Erase(exec); }

  // Before cuGraphLaunch of `exec` on `stream`: under a cap its nodes'
  // buffers are made resident (CUDA_ERROR_OUT_OF_MEMORY when they do not
  // fit together: a graph cannot be split).
  CUresult Begin(CUgraphExec exec, CUstream stream, GraphLaunchScope* scope);
  // After it, `submitted` when the driver took it: completion, versions,
  // and what its nodes did to the tables and to host memory.
  void End(CUstream stream, const GraphLaunchScope& scope, bool submitted);

 private:
  // Begin's walk of a known plan: every node's accesses at this launch, in
  // order, and what its copies and memsets do to the tables.
  void Walk(CUstream stream, GraphLaunchScope* scope);
  uint64_t IdAt(uint64_t addr) const;

  const Driver* const driver_;
  KernelCache* const kernels_;
  const CaptureState* const capture_;
  const BufferRegistry* const registry_;
  const PinnedHost* const pinned_;
  MemoryManager* const memory_;
  TableInference* const tables_;
  GraphPlans graphs_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_GRAPH_LAUNCHER_H_
