#include "core/inference/graph_plan.h"

#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {

// Child graphs nest; a deeper nesting than this is taken as unknown rather
// than followed (a cycle would be a driver bug, but must not hang us).
constexpr int kMaxChildDepth = 16;

const char* NodeTypeName(CUgraphNodeType type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      return "external semaphore signal";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
      return "external semaphore wait";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
      return "batch memory operation";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      return "conditional";
    default:
      return "unrecognised";
  }
}

// The kernel a node launches: a CUkernel is named only when func is null.
CUfunction NodeFunction(const CUDA_KERNEL_NODE_PARAMS& p) {
  return p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
}

// The packed argument buffer of an `extra` array, or false.
bool PackedArgs(void** extra, const void** data, size_t* size) {
  const void* buffer = nullptr;
  const size_t* bytes = nullptr;
  for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (i > 64) return false;  // no terminator in sight
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) bytes = static_cast<const size_t*>(extra[i + 1]);
  }
  if (buffer == nullptr || bytes == nullptr) return false;
  *data = buffer;
  *size = *bytes;
  return true;
}

class Reader {
 public:
  Reader(const Driver& driver, KernelCache* kernels, GraphPlan* plan)
      : driver_(driver), kernels_(kernels), plan_(plan) {}

  void Read(CUgraph graph, int depth) {
    if (depth > kMaxChildDepth) return Unknown("child graphs nested too deeply");
    std::vector<CUgraphNode> order;
    if (!TopologicalOrder(graph, &order)) return;
    for (CUgraphNode node : order) {
      if (plan_->unknown) return;
      ReadNode(node, depth);
    }
  }

 private:
  void Unknown(std::string why) {
    if (plan_->unknown) return;
    plan_->unknown = true;
    plan_->why = std::move(why);
  }
  bool Failed(const char* what, CUresult r) {
    if (r == CUDA_SUCCESS) return false;
    Unknown(absl::StrCat(what, " failed (error ", static_cast<int>(r), ")"));
    return true;
  }

  // Kahn's algorithm over the graph's edges; among ready nodes the driver's
  // listing order is kept, so the order is stable from one read to the next.
  bool TopologicalOrder(CUgraph graph, std::vector<CUgraphNode>* order) {
    if (driver_.cuGraphGetNodes == nullptr ||
        (driver_.cuGraphGetEdges_v2 == nullptr && driver_.cuGraphGetEdges == nullptr)) {
      Unknown("the driver lacks the graph queries");
      return false;
    }
    size_t count = 0;
    if (Failed("cuGraphGetNodes", driver_.cuGraphGetNodes(graph, nullptr, &count))) return false;
    std::vector<CUgraphNode> nodes(count);
    if (count > 0 &&
        Failed("cuGraphGetNodes", driver_.cuGraphGetNodes(graph, nodes.data(), &count))) {
      return false;
    }
    nodes.resize(count);
    size_t edges = 0;
    // Edge data is asked for too: without it the driver refuses a graph
    // with edges of other kinds (programmatic dependencies) as a lossy
    // query. Every kind orders its nodes for us.
    std::vector<CUgraphEdgeData> data;
    auto get_edges = [&](CUgraphNode* from, CUgraphNode* to, size_t* n) {
      return driver_.cuGraphGetEdges_v2 != nullptr
                 ? driver_.cuGraphGetEdges_v2(graph, from, to, from ? data.data() : nullptr, n)
                 : driver_.cuGraphGetEdges(graph, from, to, n);
    };
    if (Failed("cuGraphGetEdges", get_edges(nullptr, nullptr, &edges))) return false;
    std::vector<CUgraphNode> from(edges), to(edges);
    data.resize(edges);
    if (edges > 0 && Failed("cuGraphGetEdges", get_edges(from.data(), to.data(), &edges))) {
      return false;
    }
    from.resize(edges);
    to.resize(edges);
    absl::flat_hash_map<CUgraphNode, size_t> index;
    for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
    std::vector<size_t> waiting(nodes.size(), 0);
    std::vector<std::vector<size_t>> next(nodes.size());
    for (size_t e = 0; e < from.size(); ++e) {
      auto f = index.find(from[e]);
      auto t = index.find(to[e]);
      if (f == index.end() || t == index.end()) {
        Unknown("an edge names a node the graph does not list");
        return false;
      }
      next[f->second].push_back(t->second);
      ++waiting[t->second];
    }
    // Ready nodes by listing index (a whole step's capture may hold tens
    // of thousands of nodes: no rescans).
    std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (waiting[i] == 0) ready.push(i);
    }
    order->reserve(nodes.size());
    while (!ready.empty()) {
      const size_t pick = ready.top();
      ready.pop();
      order->push_back(nodes[pick]);
      for (size_t t : next[pick]) {
        if (--waiting[t] == 0) ready.push(t);
      }
    }
    if (order->size() != nodes.size()) {
      Unknown("the graph's edges form a cycle");
      return false;
    }
    return true;
  }

  void ReadNode(CUgraphNode node, int depth) {
    CUgraphNodeType type;
    if (driver_.cuGraphNodeGetType == nullptr)
      return Unknown("the driver lacks cuGraphNodeGetType");
    if (Failed("cuGraphNodeGetType", driver_.cuGraphNodeGetType(node, &type))) return;
    switch (type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: {
        if (driver_.cuGraphKernelNodeGetParams_v2 == nullptr) {
          return Unknown("the driver lacks cuGraphKernelNodeGetParams_v2");
        }
        CUDA_KERNEL_NODE_PARAMS p{};
        if (Failed("cuGraphKernelNodeGetParams_v2",
                   driver_.cuGraphKernelNodeGetParams_v2(node, &p))) {
          return;
        }
        bool unknown = false;
        GraphNodePlan n = KernelNodePlan(kernels_, node, p, &unknown);
        if (unknown) {
          return Unknown(absl::StrCat("kernel node ", n.kernel != nullptr ? n.kernel->name : "?",
                                      ": its arguments cannot be described"));
        }
        plan_->nodes.push_back(std::move(n));
        return;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        if (driver_.cuGraphMemcpyNodeGetParams == nullptr) {
          return Unknown("the driver lacks cuGraphMemcpyNodeGetParams");
        }
        CUDA_MEMCPY3D p{};
        if (Failed("cuGraphMemcpyNodeGetParams", driver_.cuGraphMemcpyNodeGetParams(node, &p))) {
          return;
        }
        plan_->nodes.push_back(CopyNodePlan(node, p));
        return;
      }
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        if (driver_.cuGraphMemsetNodeGetParams == nullptr) {
          return Unknown("the driver lacks cuGraphMemsetNodeGetParams");
        }
        CUDA_MEMSET_NODE_PARAMS p{};
        if (Failed("cuGraphMemsetNodeGetParams", driver_.cuGraphMemsetNodeGetParams(node, &p))) {
          return;
        }
        plan_->nodes.push_back(MemsetNodePlan(node, p));
        return;
      }
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        if (driver_.cuGraphChildGraphNodeGetGraph == nullptr) {
          return Unknown("the driver lacks cuGraphChildGraphNodeGetGraph");
        }
        CUgraph child = nullptr;
        if (Failed("cuGraphChildGraphNodeGetGraph",
                   driver_.cuGraphChildGraphNodeGetGraph(node, &child))) {
          return;
        }
        // Inlined where the child node stands: the child runs as a whole
        // after its dependencies and before its dependents.
        return Read(child, depth + 1);
      }
      // Host code, ordering and event nodes touch no device buffer.
      case CU_GRAPH_NODE_TYPE_HOST:
        ++plan_->host_nodes;
        ++plan_->other_nodes;
        return;
      case CU_GRAPH_NODE_TYPE_EMPTY:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        ++plan_->other_nodes;
        return;
      case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
        ++plan_->alloc_nodes;
        return;
      case CU_GRAPH_NODE_TYPE_MEM_FREE:
        ++plan_->free_nodes;
        return;
      default:
        return Unknown(
            absl::StrCat("a ", NodeTypeName(type), " node (type ", static_cast<int>(type), ")"));
    }
  }

  const Driver& driver_;
  KernelCache* const kernels_;
  GraphPlan* const plan_;
};

}  // namespace

GraphNodePlan KernelNodePlan(KernelCache* kernels, CUgraphNode node,
                             const CUDA_KERNEL_NODE_PARAMS& params, bool* unknown) {
  GraphNodePlan n;
  n.kind = GraphNodePlan::Kind::kKernel;
  n.node = node;
  n.function = NodeFunction(params);
  n.grid[0] = params.gridDimX, n.grid[1] = params.gridDimY, n.grid[2] = params.gridDimZ;
  n.block[0] = params.blockDimX, n.block[1] = params.blockDimY, n.block[2] = params.blockDimZ;
  *unknown = n.function == nullptr;
  if (*unknown) return n;
  n.kernel = kernels->Get(n.function);
  const KernelInfo& k = *n.kernel;
  if (!k.layout_known) {
    *unknown = true;
    return n;
  }
  if (params.kernelParams != nullptr) {
    // Each value copied to its offset: the exec holds its own copy.
    n.args.assign(k.args_size, 0);
    for (size_t i = 0; i < k.params.size(); ++i) {
      const ParamSlot& s = k.params[i];
      if (params.kernelParams[i] == nullptr) {
        *unknown = true;
        return n;
      }
      std::memcpy(n.args.data() + s.offset, params.kernelParams[i], s.size);
    }
  } else if (params.extra != nullptr) {
    const void* data = nullptr;
    size_t size = 0;
    if (!PackedArgs(params.extra, &data, &size)) {
      *unknown = true;
      return n;
    }
    n.packed = true;
    n.args.assign(static_cast<const unsigned char*>(data),
                  static_cast<const unsigned char*>(data) + size);
  } else if (!k.params.empty()) {
    *unknown = true;  // arguments given nowhere: the driver would refuse it
  }
  return n;
}

GraphNodePlan CopyNodePlan(CUgraphNode node, const CUDA_MEMCPY3D& params) {
  GraphNodePlan n;
  n.kind = GraphNodePlan::Kind::kCopy;
  n.node = node;
  n.copy = CopyRangesOf(params);
  return n;
}

GraphNodePlan MemsetNodePlan(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS& params) {
  GraphNodePlan n;
  n.kind = GraphNodePlan::Kind::kMemset;
  n.node = node;
  n.memset_dst = params.dst;
  const MemsetRange range =
      MemsetRangeOf(params.elementSize, params.width, params.height, params.pitch);
  n.memset_extent = range.extent;
  n.memset_linear = range.linear();
  return n;
}

NodeChange PlanNode(KernelCache* kernels, CUgraphNode node, const CUgraphNodeParams& params,
                    GraphNodePlan* plan) {
  switch (params.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS_v3& k = params.kernel;
      CUDA_KERNEL_NODE_PARAMS v2{};
      v2.func = k.func;
      v2.kernelParams = k.kernelParams;
      v2.extra = k.extra;
      v2.kern = k.kern;
      bool unknown = false;
      *plan = KernelNodePlan(kernels, node, v2, &unknown);
      return unknown ? NodeChange::kUnknown : NodeChange::kPlanned;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      *plan = CopyNodePlan(node, params.memcpy.copyParams);
      return NodeChange::kPlanned;
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS_v2& m = params.memset;
      *plan = MemsetNodePlan(
          node, CUDA_MEMSET_NODE_PARAMS{m.dst, m.pitch, m.value, m.elementSize, m.width, m.height});
      return NodeChange::kPlanned;
    }
    case CU_GRAPH_NODE_TYPE_EMPTY:
    case CU_GRAPH_NODE_TYPE_HOST:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return NodeChange::kNoAccess;
    default:
      return NodeChange::kUnknown;
  }
}

CUgraphNodeParams NodeParams(const CUDA_KERNEL_NODE_PARAMS_v1& kernel) {
  CUDA_KERNEL_NODE_PARAMS v2{};
  v2.func = kernel.func;
  v2.kernelParams = kernel.kernelParams;
  v2.extra = kernel.extra;
  return NodeParams(v2);
}

CUgraphNodeParams NodeParams(const CUDA_KERNEL_NODE_PARAMS& kernel) {
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_KERNEL;
  p.kernel.func = kernel.func;
  p.kernel.kernelParams = kernel.kernelParams;
  p.kernel.extra = kernel.extra;
  p.kernel.kern = kernel.kern;
  return p;
}

CUgraphNodeParams NodeParams(const CUDA_MEMCPY3D& copy) {
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  p.memcpy.copyParams = copy;
  return p;
}

CUgraphNodeParams NodeParams(const CUDA_MEMSET_NODE_PARAMS& memset) {
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_MEMSET;
  p.memset.dst = memset.dst;
  p.memset.pitch = memset.pitch;
  p.memset.value = memset.value;
  p.memset.elementSize = memset.elementSize;
  p.memset.width = memset.width;
  p.memset.height = memset.height;
  return p;
}

std::shared_ptr<const GraphPlan> ReadGraphPlan(const Driver& driver, KernelCache* kernels,
                                               CUgraph graph) {
  auto plan = std::make_shared<GraphPlan>();
  Reader(driver, kernels, plan.get()).Read(graph, 0);
  if (plan->unknown) plan->nodes.clear();  // never used half-read
  return plan;
}

std::shared_ptr<const GraphPlan> WithNode(const GraphPlan& plan, CUgraphNode node,
                                          const GraphNodePlan& replacement) {
  auto updated = std::make_shared<GraphPlan>(plan);
  bool found = false;
  for (GraphNodePlan& n : updated->nodes) {
    if (n.node != node) continue;
    n = replacement;
    found = true;
  }
  if (!found) return nullptr;
  return updated;
}

std::shared_ptr<const GraphPlan> UpdatedPlan(const GraphPlan& exec, const GraphPlan& update) {
  auto updated = std::make_shared<GraphPlan>(update);
  if (exec.unknown || update.unknown) return updated;
  if (exec.nodes.size() != update.nodes.size()) {
    return MadeUnknown(update, "an update whose nodes do not pair with the exec's");
  }
  for (size_t i = 0; i < exec.nodes.size(); ++i) {
    if (exec.nodes[i].kind != update.nodes[i].kind) {
      return MadeUnknown(update, "an update whose nodes do not pair with the exec's");
    }
    updated->nodes[i].node = exec.nodes[i].node;
  }
  return updated;
}

std::shared_ptr<const GraphPlan> MadeUnknown(const GraphPlan& plan, std::string why) {
  auto updated = std::make_shared<GraphPlan>(plan);
  updated->unknown = true;
  updated->why = std::move(why);
  updated->nodes.clear();
  return updated;
}

void InferKernelNode(const GraphNodePlan& node, const BufferRegistry& registry, Accesses* out) {
  const KernelInfo& k = *node.kernel;
  if (node.packed) {
    size_t size = node.args.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<unsigned char*>(node.args.data()),
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    InferLaunchAccesses(k, nullptr, extra, registry, out);
    return;
  }
  absl::InlinedVector<void*, 16> params(k.params.size());
  for (size_t i = 0; i < k.params.size(); ++i) {
    params[i] = const_cast<unsigned char*>(node.args.data()) + k.params[i].offset;
  }
  InferLaunchAccesses(k, params.data(), nullptr, registry, out);
}

void GraphPlans::Set(CUgraphExec exec, std::shared_ptr<const GraphPlan> plan) {
  MutexLock lock(&mu_);
  plans_[exec] = std::move(plan);
}

std::shared_ptr<const GraphPlan> GraphPlans::Get(CUgraphExec exec) const {
  MutexLock lock(&mu_);
  auto it = plans_.find(exec);
  return it == plans_.end() ? nullptr : it->second;
}

void GraphPlans::Erase(CUgraphExec exec) {
  MutexLock lock(&mu_);
  plans_.erase(exec);
}

}  // namespace stensor
