// Fake driver: CUDA graphs (explicit construction, introspection,
// instantiation, launch) and stream capture with the driver's capture modes.
//
// Sources: the CUDA Driver API reference (cuda.h doc comments for
// cuStreamBeginCapture, cuStreamEndCapture, cuStreamIsCapturing,
// cuStreamGetCaptureInfo, cuThreadExchangeStreamCaptureMode, cuGraph*) and
// the programming guide's "Stream capture" section ("Cross-stream
// dependencies and events", "Prohibited and unhandled operations",
// "Invalidation"). README.md lists what is modelled and what is not.
//
// Thread-safety: every graph, node, exec and capture is guarded by one
// mutex (State::mu); the driver makes no promise for concurrent use of one
// graph either. `g_captures` counts the captures going, so that stream
// operations take no lock while nothing captures.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "tests/fakecuda/internal.h"

namespace fakecuda {
namespace {

struct Graph;

struct Node {
  Graph* graph = nullptr;
  NodeSpec spec;
  std::vector<Node*> deps;           // edges into this node, in order added
  std::vector<Node*> dependents;     // edges out of it
  Graph* child = nullptr;            // CHILD_GRAPH: the node's own clone of the graph
  std::vector<void*> kernel_params;  // what cuGraphKernelNodeGetParams hands out
};

struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;  // in the order added
  Node* owner = nullptr;                     // set for the graph embedded in a child graph node
  // cuGraphClone: the graph this was cloned from (nodes at the same
  // positions correspond), for cuGraphNodeFindInClone.
  const Graph* cloned_from = nullptr;
};

// An executable graph: a snapshot of the graph's nodes in a topological
// order, child graphs flattened in place.
struct Exec {
  std::vector<Node*> origins;  // the graph node each entry came from
  std::vector<std::shared_ptr<const NodeSpec>> specs;
  unsigned long long flags = 0;  // as instantiated
};

struct StreamCapture;

struct Capture {
  uint64_t id = 0;
  Graph* graph = nullptr;
  bool own_graph = true;  // false for cuStreamBeginCaptureToGraph
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;  // the thread that began it
  Stream* origin = nullptr;
  bool invalidated = false;
  std::vector<Stream*> streams;  // every stream taking part, origin first
};

// A stream taking part in a capture.
struct StreamCapture {
  Capture* capture = nullptr;
  std::vector<Node*> deps;  // what the next captured node depends on
  // The arrays cuStreamGetCaptureInfo hands out (valid until the next call
  // on the stream).
  std::vector<CUgraphNode> deps_out;
  std::vector<CUgraphEdgeData> edges_out;
};

struct State {
  std::mutex mu;
  std::unordered_set<Graph*> graphs;                   // guarded by mu
  std::unordered_set<Node*> nodes;                     // guarded by mu
  std::unordered_set<Exec*> execs;                     // guarded by mu
  std::vector<Capture*> captures;                      // guarded by mu; those going
  std::unordered_map<Stream*, StreamCapture> streams;  // guarded by mu
  uint64_t next_capture_id = 1;                        // guarded by mu
};

State& GetState() {
  static State* s = new State;
  return *s;
}

std::atomic<int> g_captures{0};

thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

Graph* LiveGraph(State& st, CUgraph h) {
  auto* g = reinterpret_cast<Graph*>(h);
  return st.graphs.count(g) ? g : nullptr;
}
Node* LiveNode(State& st, CUgraphNode h) {
  auto* n = reinterpret_cast<Node*>(h);
  return st.nodes.count(n) ? n : nullptr;
}
Exec* LiveExec(State& st, CUgraphExec h) {
  auto* e = reinterpret_cast<Exec*>(h);
  return st.execs.count(e) ? e : nullptr;
}

Graph* NewGraphLocked(State& st) {
  auto* g = new Graph;
  st.graphs.insert(g);
  return g;
}

Node* AddNodeLocked(State& st, Graph* g, NodeSpec spec, const std::vector<Node*>& deps) {
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->graph = g;
  n->spec = std::move(spec);
  n->deps = deps;
  for (Node* d : deps) d->dependents.push_back(n);
  g->nodes.push_back(std::move(node));
  st.nodes.insert(n);
  return n;
}

void DestroyGraphLocked(State& st, Graph* g) {
  for (auto& n : g->nodes) {
    if (n->child != nullptr) DestroyGraphLocked(st, n->child);
    st.nodes.erase(n.get());
  }
  st.graphs.erase(g);
  delete g;
}

// Copies `from`'s nodes and edges into the empty graph `to`.
void CloneGraphLocked(State& st, const Graph* from, Graph* to) {
  std::unordered_map<const Node*, Node*> map;
  for (const auto& n : from->nodes) {
    std::vector<Node*> deps;
    for (Node* d : n->deps) deps.push_back(map.at(d));
    Node* copy = AddNodeLocked(st, to, n->spec, deps);
    if (n->child != nullptr) {
      copy->child = NewGraphLocked(st);
      copy->child->owner = copy;
      CloneGraphLocked(st, n->child, copy->child);
    }
    map[n.get()] = copy;
  }
}

// Appends `g`'s nodes in a topological order (Kahn's, ties in the order
// added), child graphs flattened in place; false on a cycle.
bool FlattenLocked(const Graph* g, Exec* out) {
  std::unordered_map<const Node*, size_t> pending;
  std::vector<const Node*> ready;
  for (const auto& n : g->nodes) {
    pending[n.get()] = n->deps.size();
    if (n->deps.empty()) ready.push_back(n.get());
  }
  size_t done = 0;
  for (size_t i = 0; i < ready.size(); ++i) {
    const Node* n = ready[i];
    ++done;
    if (n->child != nullptr) {
      if (!FlattenLocked(n->child, out)) return false;
    } else {
      out->origins.push_back(const_cast<Node*>(n));
      out->specs.push_back(std::make_shared<const NodeSpec>(n->spec));
    }
    for (const Node* d : n->dependents) {
      if (--pending[d] == 0) ready.push_back(d);
    }
  }
  return done == g->nodes.size();
}

// Whether every node of `nodes` is in `roots` or an ancestor of one.
bool AllReach(const std::vector<Node*>& nodes, const std::vector<Node*>& roots) {
  std::unordered_set<const Node*> seen(roots.begin(), roots.end());
  std::vector<const Node*> todo(roots.begin(), roots.end());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    for (const Node* d : n->deps) {
      if (seen.insert(d).second) todo.push_back(d);
    }
  }
  for (const Node* n : nodes) {
    if (!seen.count(n)) return false;
  }
  return true;
}

Capture* FindCaptureLocked(State& st, uint64_t id) {
  for (Capture* c : st.captures) {
    if (c->id == id) return c;
  }
  return nullptr;
}

// Whether a blocking stream of `ctx` is capturing: the legacy stream is
// then unusable ("Stream capture", programming guide). Invalidates those
// captures when `invalidate`.
bool ImplicitLocked(State& st, Context* ctx, bool invalidate) {
  bool implicit = false;
  for (auto& entry : st.streams) {
    Stream* s = entry.first;
    if (s->context() == ctx && s->blocking() && !s->legacy()) {
      implicit = true;
      if (invalidate) entry.second.capture->invalidated = true;
    }
  }
  return implicit;
}

// Ends `c`: its streams leave capture mode. Does not free its graph.
void EndCaptureLocked(State& st, Capture* c) {
  for (Stream* s : c->streams) st.streams.erase(s);
  st.captures.erase(std::find(st.captures.begin(), st.captures.end(), c));
  g_captures.fetch_sub(1);
}

// Copies up to *count entries of `all` into `out` (when given), nulling the
// rest, and sets *count as the driver's list queries do.
template <typename T>
CUresult ListOut(const std::vector<T>& all, T* out, size_t* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (out == nullptr) {
    *count = all.size();
    return CUDA_SUCCESS;
  }
  size_t n = std::min(*count, all.size());
  for (size_t i = 0; i < n; ++i) out[i] = all[i];
  for (size_t i = n; i < *count; ++i) out[i] = T{};
  *count = n;
  return CUDA_SUCCESS;
}

bool ZeroEdgeData(const CUgraphEdgeData* data, size_t n) {
  if (data == nullptr) return true;
  for (size_t i = 0; i < n; ++i) {
    if (data[i].from_port != 0 || data[i].to_port != 0 || data[i].type != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

// --- Capture hooks (internal.h) ------------------------------------------------
CUresult CaptureCheck(Stream* s, bool* capturing, bool sync) {
  *capturing = false;
  if (g_captures.load() == 0) return CUDA_SUCCESS;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  if (s->legacy()) {
    return ImplicitLocked(st, s->context(), true) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
                                                  : CUDA_SUCCESS;
  }
  auto it = st.streams.find(s);
  if (it == st.streams.end()) return CUDA_SUCCESS;
  Capture* c = it->second.capture;
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (sync) {
    c->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  *capturing = true;
  return CUDA_SUCCESS;
}

CUresult CaptureAdd(Stream* s, NodeSpec node) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.streams.find(s);
  // The capture ended between the check and now (another thread ended a
  // relaxed capture): the operation is lost, as it would be on a GPU.
  if (it == st.streams.end()) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  StreamCapture& sc = it->second;
  if (sc.capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  Node* n = AddNodeLocked(st, sc.capture->graph, std::move(node), sc.deps);
  sc.deps = {n};
  return CUDA_SUCCESS;
}

CUresult CaptureUnsupported(Stream* s, CUresult error) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.streams.find(s);
  if (it != st.streams.end()) it->second.capture->invalidated = true;
  return error;
}

CUresult CheckUnsafeCall() {
  if (g_captures.load() == 0) return CUDA_SUCCESS;
  const CUstreamCaptureMode mode = t_capture_mode;
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const std::thread::id self = std::this_thread::get_id();
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  bool prohibited = false;
  for (Capture* c : st.captures) {
    bool own = c->thread == self && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    bool other = mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->thread != self &&
                 c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || other) {
      c->invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult CheckStreamWait(Stream* s) {
  if (g_captures.load() == 0) return CUDA_SUCCESS;
  {
    State& st = GetState();
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.streams.find(s);
    if (it != st.streams.end()) {
      it->second.capture->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  if (s->legacy()) {
    State& st = GetState();
    std::lock_guard<std::mutex> lock(st.mu);
    if (ImplicitLocked(st, s->context(), true)) {
      return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  }
  return CUDA_SUCCESS;
}

CUresult CheckContextWait(Context* ctx) {
  if (g_captures.load() == 0) return CUDA_SUCCESS;
  {
    State& st = GetState();
    std::lock_guard<std::mutex> lock(st.mu);
    bool capturing = false;
    for (auto& entry : st.streams) {
      if (entry.first->context() == ctx) {
        entry.second.capture->invalidated = true;
        capturing = true;
      }
    }
    if (capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return CheckUnsafeCall();
}

CUresult CaptureEventRecord(Stream* s, uint64_t* capture_id, std::vector<CUgraphNode>* nodes) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.streams.find(s);
  if (it == st.streams.end()) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (it->second.capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  *capture_id = it->second.capture->id;
  nodes->clear();
  for (Node* n : it->second.deps) nodes->push_back(reinterpret_cast<CUgraphNode>(n));
  return CUDA_SUCCESS;
}

CUresult CaptureWaitEvent(Stream* s, uint64_t capture_id, const std::vector<CUgraphNode>& nodes) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Capture* c = FindCaptureLocked(st, capture_id);
  auto it = st.streams.find(s);
  if (c == nullptr) {
    // The event's capture has ended: it stands for no work that can run.
    if (it != st.streams.end()) it->second.capture->invalidated = true;
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  std::vector<Node*> event_nodes;
  for (CUgraphNode h : nodes) event_nodes.push_back(reinterpret_cast<Node*>(h));
  if (it != st.streams.end()) {
    if (it->second.capture != c) {
      // Two capture sequences would merge.
      it->second.capture->invalidated = true;
      c->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    std::vector<Node*>& deps = it->second.deps;
    for (Node* n : event_nodes) {
      if (std::find(deps.begin(), deps.end(), n) == deps.end()) deps.push_back(n);
    }
    return CUDA_SUCCESS;
  }
  if (s->legacy()) {
    c->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  // The stream joins the capture (a fork): its next node depends on the
  // event's nodes.
  StreamCapture& sc = st.streams[s];
  sc.capture = c;
  sc.deps = std::move(event_nodes);
  c->streams.push_back(s);
  return CUDA_SUCCESS;
}

void InvalidateCapture(uint64_t capture_id) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  if (Capture* c = FindCaptureLocked(st, capture_id)) c->invalidated = true;
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

// --- Stream capture ------------------------------------------------------------
namespace {

bool ValidMode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

CUresult BeginCapture(CUstream h, CUgraph into, const CUgraphNode* deps,
                      const CUgraphEdgeData* edge_data, size_t num_deps, CUstreamCaptureMode mode,
                      bool pt) {
  if (!ValidMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  // "Capture may not be initiated if stream is CU_STREAM_LEGACY."
  if (s->legacy()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.streams.count(s)) return CUDA_ERROR_ILLEGAL_STATE;
  auto* c = new Capture;
  std::vector<Node*> first_deps;
  if (into != nullptr) {
    Graph* g = LiveGraph(st, into);
    if (g == nullptr || (num_deps > 0 && deps == nullptr) || !ZeroEdgeData(edge_data, num_deps)) {
      delete c;
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < num_deps; ++i) {
      Node* n = LiveNode(st, deps[i]);
      if (n == nullptr || n->graph != g) {
        delete c;
        return CUDA_ERROR_INVALID_VALUE;
      }
      first_deps.push_back(n);
    }
    c->graph = g;
    c->own_graph = false;
  } else {
    c->graph = NewGraphLocked(st);
  }
  c->id = st.next_capture_id++;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->streams.push_back(s);
  StreamCapture& sc = st.streams[s];
  sc.capture = c;
  sc.deps = std::move(first_deps);
  st.captures.push_back(c);
  g_captures.fetch_add(1);
  return CUDA_SUCCESS;
}

CUresult EndCapture(CUstream h, CUgraph* phGraph, bool pt) {
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.streams.find(s);
  if (it == st.streams.end()) return CUDA_ERROR_ILLEGAL_STATE;
  Capture* c = it->second.capture;
  if (c->origin != s) {
    c->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  CUresult result = CUDA_SUCCESS;
  if (c->invalidated) {
    result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  } else {
    // Every stream that joined must have been joined back: its last nodes
    // are ancestors of the origin stream's.
    const std::vector<Node*>& origin_deps = it->second.deps;
    for (Stream* other : c->streams) {
      if (other == s) continue;
      if (!AllReach(st.streams.at(other).deps, origin_deps)) {
        result = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
      }
    }
  }
  EndCaptureLocked(st, c);
  if (result == CUDA_SUCCESS) {
    *phGraph = reinterpret_cast<CUgraph>(c->graph);
  } else {
    if (c->own_graph) DestroyGraphLocked(st, c->graph);
    *phGraph = nullptr;
  }
  delete c;
  return result;
}

CUresult IsCapturing(CUstream h, CUstreamCaptureStatus* status, bool pt) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (g_captures.load() == 0) return CUDA_SUCCESS;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  // The legacy stream: "will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ...
  // The blocking stream capture is not invalidated."
  if (s->legacy()) {
    return ImplicitLocked(st, s->context(), false) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
                                                   : CUDA_SUCCESS;
  }
  auto it = st.streams.find(s);
  if (it != st.streams.end()) {
    *status = it->second.capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                              : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  }
  return CUDA_SUCCESS;
}

CUresult GetCaptureInfo(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                        const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num,
                        bool pt) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (s->legacy() && ImplicitLocked(st, s->context(), false)) {
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  auto it = st.streams.find(s);
  if (it == st.streams.end()) {
    if (id != nullptr) *id = 0;
    if (graph != nullptr) *graph = nullptr;
    if (deps != nullptr) *deps = nullptr;
    if (edges != nullptr) *edges = nullptr;
    if (num != nullptr) *num = 0;
    return CUDA_SUCCESS;
  }
  StreamCapture& sc = it->second;
  Capture* c = sc.capture;
  *status = c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id != nullptr) *id = c->id;
  if (graph != nullptr) *graph = reinterpret_cast<CUgraph>(c->graph);
  sc.deps_out.clear();
  for (Node* n : sc.deps) sc.deps_out.push_back(reinterpret_cast<CUgraphNode>(n));
  sc.edges_out.assign(sc.deps.size(), CUgraphEdgeData{});
  if (deps != nullptr) *deps = sc.deps_out.empty() ? nullptr : sc.deps_out.data();
  if (edges != nullptr) *edges = sc.edges_out.empty() ? nullptr : sc.edges_out.data();
  if (num != nullptr) *num = sc.deps.size();
  return CUDA_SUCCESS;
}

CUresult Impl_cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode, bool pt) {
  return BeginCapture(h, nullptr, nullptr, nullptr, 0, mode, pt);
}
CUresult Impl_cuStreamBeginCapture(CUstream h, bool pt) {
  return BeginCapture(h, nullptr, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, pt);
}
CUresult Impl_cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode* deps,
                                          const CUgraphEdgeData* data, size_t n,
                                          CUstreamCaptureMode mode, bool pt) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return BeginCapture(h, g, deps, data, n, mode, pt);
}
CUresult Impl_cuStreamEndCapture(CUstream h, CUgraph* g, bool pt) { return EndCapture(h, g, pt); }
CUresult Impl_cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* s, bool pt) {
  return IsCapturing(h, s, pt);
}
CUresult Impl_cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* s, cuuint64_t* id,
                                     bool pt) {
  return GetCaptureInfo(h, s, id, nullptr, nullptr, nullptr, nullptr, pt);
}
CUresult Impl_cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus* s, cuuint64_t* id,
                                        CUgraph* g, const CUgraphNode** deps, size_t* n, bool pt) {
  return GetCaptureInfo(h, s, id, g, deps, nullptr, n, pt);
}
CUresult Impl_cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus* s, cuuint64_t* id,
                                        CUgraph* g, const CUgraphNode** deps,
                                        const CUgraphEdgeData** edges, size_t* n, bool pt) {
  return GetCaptureInfo(h, s, id, g, deps, edges, n, pt);
}

}  // namespace

FAKECUDA_STREAM_PAIR(cuStreamBeginCapture, (CUstream hStream), hStream)
FAKECUDA_STREAM_PAIR(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode), hStream,
                     mode)
FAKECUDA_STREAM_PAIR(cuStreamBeginCaptureToGraph,
                     (CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                      const CUgraphEdgeData* dependencyData, size_t numDependencies,
                      CUstreamCaptureMode mode),
                     hStream, hGraph, dependencies, dependencyData, numDependencies, mode)
FAKECUDA_STREAM_PAIR(cuStreamEndCapture, (CUstream hStream, CUgraph* phGraph), hStream, phGraph)
FAKECUDA_STREAM_PAIR(cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus* captureStatus),
                     hStream, captureStatus)
FAKECUDA_STREAM_PAIR(cuStreamGetCaptureInfo,
                     (CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                      cuuint64_t* id_out),
                     hStream, captureStatus_out, id_out)
FAKECUDA_STREAM_PAIR(cuStreamGetCaptureInfo_v2,
                     (CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                      cuuint64_t* id_out, CUgraph* graph_out, const CUgraphNode** dependencies_out,
                      size_t* numDependencies_out),
                     hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                     numDependencies_out)
FAKECUDA_STREAM_PAIR(cuStreamGetCaptureInfo_v3,
                     (CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                      cuuint64_t* id_out, CUgraph* graph_out, const CUgraphNode** dependencies_out,
                      const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out),
                     hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                     numDependencies_out)

FAKECUDA_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKECUDA_ENTER("cuThreadExchangeStreamCaptureMode");
  if (mode == nullptr || !ValidMode(*mode)) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

// --- Graph construction ----------------------------------------------------------
namespace {

// Adds a node built by the caller (validated) to `hGraph` after `deps`.
CUresult AddNode(CUgraphNode* out, CUgraph hGraph, const CUgraphNode* deps, size_t num_deps,
                 NodeSpec spec, const CUgraph child = nullptr) {
  if (out == nullptr || (num_deps > 0 && deps == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Node*> dep_nodes;
  for (size_t i = 0; i < num_deps; ++i) {
    Node* n = LiveNode(st, deps[i]);
    if (n == nullptr || n->graph != g ||
        std::find(dep_nodes.begin(), dep_nodes.end(), n) != dep_nodes.end()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    dep_nodes.push_back(n);
  }
  Graph* child_graph = nullptr;
  if (child != nullptr) {
    child_graph = LiveGraph(st, child);
    if (child_graph == nullptr || child_graph == g) return CUDA_ERROR_INVALID_VALUE;
  }
  Node* n = AddNodeLocked(st, g, std::move(spec), dep_nodes);
  if (child_graph != nullptr) {
    // The node embeds a clone of the graph, as the driver's does.
    n->child = NewGraphLocked(st);
    n->child->owner = n;
    CloneGraphLocked(st, child_graph, n->child);
  }
  *out = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}

CUresult KernelSpec(const CUDA_KERNEL_NODE_PARAMS_v1* p, NodeSpec* spec) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  if (CUresult r =
          MakeKernelNode(p->func, grid, block, p->sharedMemBytes, p->kernelParams, p->extra, spec);
      r != CUDA_SUCCESS) {
    return r;
  }
  spec->ctx = CurrentContext();
  return CUDA_SUCCESS;
}

CUresult KernelSpec2(const CUDA_KERNEL_NODE_PARAMS_v2* p, NodeSpec* spec) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // CUkernel (library) handles are not modelled: a node names a CUfunction.
  if (p->kern != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUDA_KERNEL_NODE_PARAMS_v1 v1{};
  v1.func = p->func;
  v1.gridDimX = p->gridDimX;
  v1.gridDimY = p->gridDimY;
  v1.gridDimZ = p->gridDimZ;
  v1.blockDimX = p->blockDimX;
  v1.blockDimY = p->blockDimY;
  v1.blockDimZ = p->blockDimZ;
  v1.sharedMemBytes = p->sharedMemBytes;
  v1.kernelParams = p->kernelParams;
  v1.extra = p->extra;
  if (CUresult r = KernelSpec(&v1, spec); r != CUDA_SUCCESS) return r;
  if (p->ctx != nullptr) {
    if (!IsLiveContext(reinterpret_cast<Context*>(p->ctx))) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    spec->ctx = reinterpret_cast<Context*>(p->ctx);
  }
  return CUDA_SUCCESS;
}

// The node `h` if live and of `type`.
Node* TypedNode(State& st, CUgraphNode h, CUgraphNodeType type) {
  Node* n = LiveNode(st, h);
  return n != nullptr && n->spec.type == type ? n : nullptr;
}

template <typename Params>
void KernelParamsOut(Node* n, Params* p) {
  const NodeSpec& s = n->spec;
  p->func = s.func;
  p->gridDimX = s.grid[0];
  p->gridDimY = s.grid[1];
  p->gridDimZ = s.grid[2];
  p->blockDimX = s.block[0];
  p->blockDimY = s.block[1];
  p->blockDimZ = s.block[2];
  p->sharedMemBytes = s.shared_mem;
  // The driver's own copies of the argument values.
  n->kernel_params.clear();
  auto* base = const_cast<unsigned char*>(s.args->data());
  for (size_t off : s.param_offsets) n->kernel_params.push_back(base + off);
  p->kernelParams = n->kernel_params.empty() ? nullptr : n->kernel_params.data();
  p->extra = nullptr;
}

}  // namespace

FAKECUDA_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  FAKECUDA_ENTER("cuGraphCreate");
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  *phGraph = reinterpret_cast<CUgraph>(NewGraphLocked(st));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  FAKECUDA_ENTER("cuGraphDestroy");
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  // A child graph node's graph goes with its node; a graph being captured
  // into is not the caller's to destroy.
  if (g == nullptr || g->owner != nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (Capture* c : st.captures) {
    if (c->graph == g) return CUDA_ERROR_ILLEGAL_STATE;
  }
  DestroyGraphLocked(st, g);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  FAKECUDA_ENTER("cuGraphAddKernelNode");
  NodeSpec spec;
  if (CUresult r = KernelSpec(nodeParams, &spec); r != CUDA_SUCCESS) return r;
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode* dependencies,
                                                 size_t numDependencies,
                                                 const CUDA_KERNEL_NODE_PARAMS_v2* nodeParams) {
  FAKECUDA_ENTER("cuGraphAddKernelNode_v2");
  NodeSpec spec;
  if (CUresult r = KernelSpec2(nodeParams, &spec); r != CUDA_SUCCESS) return r;
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              const CUDA_MEMCPY3D* copyParams, CUcontext ctx) {
  FAKECUDA_ENTER("cuGraphAddMemcpyNode");
  if (ctx != nullptr && !IsLiveContext(reinterpret_cast<Context*>(ctx))) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  NodeSpec spec;
  if (CUresult r = MakeCopyNode(copyParams, &spec); r != CUDA_SUCCESS) return r;
  spec.ctx = ctx != nullptr ? reinterpret_cast<Context*>(ctx) : CurrentContext();
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              const CUDA_MEMSET_NODE_PARAMS* memsetParams,
                                              CUcontext ctx) {
  FAKECUDA_ENTER("cuGraphAddMemsetNode");
  if (ctx != nullptr && !IsLiveContext(reinterpret_cast<Context*>(ctx))) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  NodeSpec spec;
  if (CUresult r = MakeMemsetNode(memsetParams, &spec); r != CUDA_SUCCESS) {
    return r;
  }
  spec.ctx = ctx != nullptr ? reinterpret_cast<Context*>(ctx) : CurrentContext();
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                             const CUgraphNode* dependencies,
                                             size_t numDependencies) {
  FAKECUDA_ENTER("cuGraphAddEmptyNode");
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, NodeSpec{});
}

FAKECUDA_EXPORT CUresult cuGraphAddHostNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                            const CUgraphNode* dependencies, size_t numDependencies,
                                            const CUDA_HOST_NODE_PARAMS* nodeParams) {
  FAKECUDA_ENTER("cuGraphAddHostNode");
  if (nodeParams == nullptr || nodeParams->fn == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  NodeSpec spec;
  spec.type = CU_GRAPH_NODE_TYPE_HOST;
  spec.host = *nodeParams;
  CUhostFn fn = nodeParams->fn;
  void* data = nodeParams->userData;
  spec.run = [fn, data](Stream*) { fn(data); };
  spec.label = OpLabel{OpKind::kHostFunc};
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                  const CUgraphNode* dependencies,
                                                  size_t numDependencies, CUgraph childGraph) {
  FAKECUDA_ENTER("cuGraphAddChildGraphNode");
  if (childGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec spec;
  spec.type = CU_GRAPH_NODE_TYPE_GRAPH;
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(spec), childGraph);
}

namespace {
CUresult AddDependencies(CUgraph hGraph, const CUgraphNode* from, const CUgraphNode* to,
                         const CUgraphEdgeData* data, size_t n) {
  if (n > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (!ZeroEdgeData(data, n)) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<Node*, Node*>> edges;
  for (size_t i = 0; i < n; ++i) {
    Node* a = LiveNode(st, from[i]);
    Node* b = LiveNode(st, to[i]);
    if (a == nullptr || b == nullptr || a->graph != g || b->graph != g || a == b ||
        std::find(b->deps.begin(), b->deps.end(), a) != b->deps.end() ||
        std::find(edges.begin(), edges.end(), std::make_pair(a, b)) != edges.end()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    edges.emplace_back(a, b);
  }
  for (auto& e : edges) {
    e.second->deps.push_back(e.first);
    e.first->dependents.push_back(e.second);
  }
  return CUDA_SUCCESS;
}

CUresult GetEdges(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                  size_t* num) {
  if (num == nullptr || ((from == nullptr) != (to == nullptr)) ||
      (data != nullptr && from == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> a, b;
  for (const auto& n : g->nodes) {
    for (Node* d : n->deps) {
      a.push_back(reinterpret_cast<CUgraphNode>(d));
      b.push_back(reinterpret_cast<CUgraphNode>(n.get()));
    }
  }
  if (from == nullptr) {
    *num = a.size();
    return CUDA_SUCCESS;
  }
  size_t count = *num;
  ListOut(a, from, &count);
  count = *num;
  ListOut(b, to, &count);
  if (data != nullptr) {
    for (size_t i = 0; i < *num; ++i) data[i] = CUgraphEdgeData{};
  }
  *num = count;
  return CUDA_SUCCESS;
}

CUresult NodeNeighbours(CUgraphNode hNode, bool dependents, CUgraphNode* out, CUgraphEdgeData* data,
                        size_t* num) {
  if (num == nullptr || (data != nullptr && out == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = LiveNode(st, hNode);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> list;
  for (Node* m : dependents ? n->dependents : n->deps) {
    list.push_back(reinterpret_cast<CUgraphNode>(m));
  }
  if (data != nullptr) {
    for (size_t i = 0; i < *num; ++i) data[i] = CUgraphEdgeData{};
  }
  return ListOut(list, out, num);
}
}  // namespace

FAKECUDA_EXPORT CUresult cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode* from,
                                                const CUgraphNode* to, size_t numDependencies) {
  FAKECUDA_ENTER("cuGraphAddDependencies");
  return AddDependencies(hGraph, from, to, nullptr, numDependencies);
}

FAKECUDA_EXPORT CUresult cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                                   const CUgraphNode* to,
                                                   const CUgraphEdgeData* edgeData,
                                                   size_t numDependencies) {
  FAKECUDA_ENTER("cuGraphAddDependencies_v2");
  return AddDependencies(hGraph, from, to, edgeData, numDependencies);
}

// --- Graph introspection ---------------------------------------------------------
FAKECUDA_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  FAKECUDA_ENTER("cuGraphGetNodes");
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> list;
  for (const auto& n : g->nodes) list.push_back(reinterpret_cast<CUgraphNode>(n.get()));
  return ListOut(list, nodes, numNodes);
}

FAKECUDA_EXPORT CUresult cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode* rootNodes,
                                             size_t* numRootNodes) {
  FAKECUDA_ENTER("cuGraphGetRootNodes");
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> list;
  for (const auto& n : g->nodes) {
    if (n->deps.empty()) list.push_back(reinterpret_cast<CUgraphNode>(n.get()));
  }
  return ListOut(list, rootNodes, numRootNodes);
}

FAKECUDA_EXPORT CUresult cuGraphGetEdges(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                                         size_t* numEdges) {
  FAKECUDA_ENTER("cuGraphGetEdges");
  return GetEdges(hGraph, from, to, nullptr, numEdges);
}

FAKECUDA_EXPORT CUresult cuGraphGetEdges_v2(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                                            CUgraphEdgeData* edgeData, size_t* numEdges) {
  FAKECUDA_ENTER("cuGraphGetEdges_v2");
  return GetEdges(hGraph, from, to, edgeData, numEdges);
}

FAKECUDA_EXPORT CUresult cuGraphNodeGetDependencies(CUgraphNode hNode, CUgraphNode* dependencies,
                                                    size_t* numDependencies) {
  FAKECUDA_ENTER("cuGraphNodeGetDependencies");
  return NodeNeighbours(hNode, false, dependencies, nullptr, numDependencies);
}

FAKECUDA_EXPORT CUresult cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode* dependencies,
                                                       CUgraphEdgeData* edgeData,
                                                       size_t* numDependencies) {
  FAKECUDA_ENTER("cuGraphNodeGetDependencies_v2");
  return NodeNeighbours(hNode, false, dependencies, edgeData, numDependencies);
}

FAKECUDA_EXPORT CUresult cuGraphNodeGetDependentNodes(CUgraphNode hNode,
                                                      CUgraphNode* dependentNodes,
                                                      size_t* numDependentNodes) {
  FAKECUDA_ENTER("cuGraphNodeGetDependentNodes");
  return NodeNeighbours(hNode, true, dependentNodes, nullptr, numDependentNodes);
}

FAKECUDA_EXPORT CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode hNode,
                                                         CUgraphNode* dependentNodes,
                                                         CUgraphEdgeData* edgeData,
                                                         size_t* numDependentNodes) {
  FAKECUDA_ENTER("cuGraphNodeGetDependentNodes_v2");
  return NodeNeighbours(hNode, true, dependentNodes, edgeData, numDependentNodes);
}

FAKECUDA_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  FAKECUDA_ENTER("cuGraphNodeGetType");
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = LiveNode(st, hNode);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = n->spec.type;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode,
                                                    CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  FAKECUDA_ENTER("cuGraphKernelNodeGetParams");
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = TypedNode(st, hNode, CU_GRAPH_NODE_TYPE_KERNEL);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  KernelParamsOut(n, nodeParams);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                                       CUDA_KERNEL_NODE_PARAMS_v2* nodeParams) {
  FAKECUDA_ENTER("cuGraphKernelNodeGetParams_v2");
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = TypedNode(st, hNode, CU_GRAPH_NODE_TYPE_KERNEL);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  KernelParamsOut(n, nodeParams);
  nodeParams->kern = nullptr;
  nodeParams->ctx = reinterpret_cast<CUcontext>(n->spec.ctx);
  return CUDA_SUCCESS;
}

// A node's parameters of one kind, copied out.
template <typename Params>
CUresult NodeParamsOut(CUgraphNode hNode, CUgraphNodeType type, Params NodeSpec::*field,
                       Params* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = TypedNode(st, hNode, type);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = n->spec.*field;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D* nodeParams) {
  FAKECUDA_ENTER("cuGraphMemcpyNodeGetParams");
  return NodeParamsOut(hNode, CU_GRAPH_NODE_TYPE_MEMCPY, &NodeSpec::copy, nodeParams);
}

FAKECUDA_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode hNode,
                                                    CUDA_MEMSET_NODE_PARAMS* nodeParams) {
  FAKECUDA_ENTER("cuGraphMemsetNodeGetParams");
  return NodeParamsOut(hNode, CU_GRAPH_NODE_TYPE_MEMSET, &NodeSpec::memset, nodeParams);
}

FAKECUDA_EXPORT CUresult cuGraphHostNodeGetParams(CUgraphNode hNode,
                                                  CUDA_HOST_NODE_PARAMS* nodeParams) {
  FAKECUDA_ENTER("cuGraphHostNodeGetParams");
  return NodeParamsOut(hNode, CU_GRAPH_NODE_TYPE_HOST, &NodeSpec::host, nodeParams);
}

FAKECUDA_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph* phGraph) {
  FAKECUDA_ENTER("cuGraphChildGraphNodeGetGraph");
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = TypedNode(st, hNode, CU_GRAPH_NODE_TYPE_GRAPH);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *phGraph = reinterpret_cast<CUgraph>(n->child);
  return CUDA_SUCCESS;
}

// --- Executable graphs -------------------------------------------------------------
namespace {

CUresult Instantiate(CUgraphExec* out, CUgraph hGraph, unsigned long long flags = 0) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto exec = std::make_unique<Exec>();
  if (!FlattenLocked(g, exec.get())) return CUDA_ERROR_INVALID_VALUE;  // a cycle
  exec->flags = flags;
  Exec* e = exec.release();
  st.execs.insert(e);
  *out = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

CUresult InstantiateLegacy(CUgraphExec* out, CUgraph hGraph, CUgraphNode* error_node, char* log,
                           size_t log_size) {
  CUresult r = Instantiate(out, hGraph);
  if (error_node != nullptr) *error_node = nullptr;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return r;
}

constexpr unsigned long long kInstantiateFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

CUresult InstantiateWithParams(CUgraphExec* out, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* p,
                               bool pt) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  p->hErrNode_out = nullptr;
  p->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
  if (p->flags & ~(kInstantiateFlags | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) {
    // Uploading does nothing here, but the stream must be one.
    Stream* s = nullptr;
    if (CUresult r = ResolveStream(p->hUploadStream, pt, &s); r != CUDA_SUCCESS) {
      return r;
    }
  }
  CUresult r = Instantiate(out, hGraph, p->flags);
  if (r == CUDA_SUCCESS) p->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
  return r;
}

CUresult Impl_cuGraphInstantiateWithParams(CUgraphExec* out, CUgraph g,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS* p, bool pt) {
  return InstantiateWithParams(out, g, p, pt);
}

CUresult Impl_cuGraphLaunch(CUgraphExec hExec, CUstream h, bool pt) {
  std::vector<std::shared_ptr<const NodeSpec>> specs;
  {
    State& st = GetState();
    std::lock_guard<std::mutex> lock(st.mu);
    Exec* e = LiveExec(st, hExec);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    specs = e->specs;  // the nodes as they are now: later updates wait
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  // Capturing a graph launch (a child graph node on a GPU) is not modelled.
  if (capturing) return CaptureUnsupported(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  // One stream operation runs every node in the exec's topological order:
  // a serialisation that respects every edge, in stream order with the
  // stream's other work; copies use the copy engines as ordinary ones do.
  Submit(
      s,
      [specs = std::move(specs), s] {
        for (const auto& spec : specs) {
          if (spec->run) spec->run(s);
        }
      },
      {}, OpLabel{OpKind::kGraph});
  return CUDA_SUCCESS;
}

CUresult ExecKernelSetParams(CUgraphExec hExec, CUgraphNode hNode, NodeSpec spec) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Exec* e = LiveExec(st, hExec);
  Node* n = TypedNode(st, hNode, CU_GRAPH_NODE_TYPE_KERNEL);
  if (e == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = std::find(e->origins.begin(), e->origins.end(), n);
  if (it == e->origins.end()) return CUDA_ERROR_INVALID_VALUE;
  e->specs[it - e->origins.begin()] = std::make_shared<const NodeSpec>(std::move(spec));
  return CUDA_SUCCESS;
}

}  // namespace

FAKECUDA_EXPORT CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                            CUgraphNode* phErrorNode, char* logBuffer,
                                            size_t bufferSize) {
  FAKECUDA_ENTER("cuGraphInstantiate");
  return InstantiateLegacy(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

FAKECUDA_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                               CUgraphNode* phErrorNode, char* logBuffer,
                                               size_t bufferSize) {
  FAKECUDA_ENTER("cuGraphInstantiate_v2");
  return InstantiateLegacy(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

FAKECUDA_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     unsigned long long flags) {
  FAKECUDA_ENTER("cuGraphInstantiateWithFlags");
  // Device launch and upload at instantiation are not modelled.
  if (flags & ~kInstantiateFlags) return CUDA_ERROR_INVALID_VALUE;
  return Instantiate(phGraphExec, hGraph, flags);
}

FAKECUDA_STREAM_PAIR(cuGraphInstantiateWithParams,
                     (CUgraphExec * phGraphExec, CUgraph hGraph,
                      CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams),
                     phGraphExec, hGraph, instantiateParams)

FAKECUDA_STREAM_PAIR(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), hGraphExec, hStream)

FAKECUDA_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FAKECUDA_ENTER("cuGraphExecDestroy");
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Exec* e = LiveExec(st, hGraphExec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Launches in flight hold their own references to the nodes.
  st.execs.erase(e);
  delete e;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphExecKernelNodeSetParams(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  FAKECUDA_ENTER("cuGraphExecKernelNodeSetParams");
  NodeSpec spec;
  if (CUresult r = KernelSpec(nodeParams, &spec); r != CUDA_SUCCESS) return r;
  return ExecKernelSetParams(hGraphExec, hNode, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v2* nodeParams) {
  FAKECUDA_ENTER("cuGraphExecKernelNodeSetParams_v2");
  NodeSpec spec;
  if (CUresult r = KernelSpec2(nodeParams, &spec); r != CUDA_SUCCESS) return r;
  return ExecKernelSetParams(hGraphExec, hNode, std::move(spec));
}

// --- Further graph and capture calls -------------------------------------------
namespace {

CUresult UpdateCaptureDependencies(CUstream h, CUgraphNode* deps, const CUgraphEdgeData* data,
                                   size_t n, unsigned flags, bool pt) {
  if ((n > 0 && deps == nullptr) || !ZeroEdgeData(data, n) ||
      (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES &&
       flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.streams.find(s);
  if (it == st.streams.end()) return CUDA_ERROR_ILLEGAL_STATE;
  StreamCapture& sc = it->second;
  if (sc.capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  std::vector<Node*> add;
  for (size_t i = 0; i < n; ++i) {
    Node* node = LiveNode(st, deps[i]);
    if (node == nullptr || node->graph != sc.capture->graph) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    add.push_back(node);
  }
  if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) sc.deps.clear();
  for (Node* node : add) {
    if (std::find(sc.deps.begin(), sc.deps.end(), node) == sc.deps.end()) {
      sc.deps.push_back(node);
    }
  }
  return CUDA_SUCCESS;
}

CUresult Impl_cuStreamUpdateCaptureDependencies(CUstream h, CUgraphNode* deps, size_t n,
                                                unsigned flags, bool pt) {
  return UpdateCaptureDependencies(h, deps, nullptr, n, flags, pt);
}
CUresult Impl_cuStreamUpdateCaptureDependencies_v2(CUstream h, CUgraphNode* deps,
                                                   const CUgraphEdgeData* data, size_t n,
                                                   unsigned flags, bool pt) {
  return UpdateCaptureDependencies(h, deps, data, n, flags, pt);
}

// Uploading prepares device resources; here there are none, but the exec
// and the stream must be valid, and the stream must not be capturing.
CUresult Impl_cuGraphUpload(CUgraphExec hExec, CUstream h, bool pt) {
  {
    State& st = GetState();
    std::lock_guard<std::mutex> lock(st.mu);
    if (LiveExec(st, hExec) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  if (capturing) return CaptureUnsupported(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  return CUDA_SUCCESS;
}

// Whether `to` may replace `from` in an exec (cuGraphExecUpdate's rules
// that the fake can see): same type; a copy keeps its memory types and a
// kernel its context.
CUgraphExecUpdateResult UpdateCheck(const NodeSpec& from, const NodeSpec& to) {
  if (from.type != to.type) return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
  switch (to.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return from.ctx == to.ctx ? CU_GRAPH_EXEC_UPDATE_SUCCESS
                                : CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return from.copy.srcMemoryType == to.copy.srcMemoryType &&
                     from.copy.dstMemoryType == to.copy.dstMemoryType
                 ? CU_GRAPH_EXEC_UPDATE_SUCCESS
                 : CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
    case CU_GRAPH_NODE_TYPE_MEMSET:
      // "For 2d memsets, only address and assigned value may be updated."
      return (from.memset.height > 1 || to.memset.height > 1) &&
                     (from.memset.height != to.memset.height ||
                      from.memset.width != to.memset.width ||
                      from.memset.elementSize != to.memset.elementSize)
                 ? CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED
                 : CU_GRAPH_EXEC_UPDATE_SUCCESS;
    default:
      return CU_GRAPH_EXEC_UPDATE_SUCCESS;
  }
}

// The positions, in the exec's order, of each entry's dependencies.
std::vector<std::vector<size_t>> DepIndices(const Exec& e) {
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < e.origins.size(); ++i) index[e.origins[i]] = i;
  std::vector<std::vector<size_t>> out(e.origins.size());
  for (size_t i = 0; i < e.origins.size(); ++i) {
    for (const Node* d : e.origins[i]->deps) {
      auto it = index.find(d);
      if (it != index.end()) out[i].push_back(it->second);
    }
  }
  return out;
}

// cuGraphExecUpdate: nodes are paired in the exec's topological order (the
// order of addition breaks ties, as at instantiation).
CUresult ExecUpdate(CUgraphExec hExec, CUgraph hGraph, CUgraphExecUpdateResultInfo* info) {
  info->result = CU_GRAPH_EXEC_UPDATE_ERROR;
  info->errorNode = nullptr;
  info->errorFromNode = nullptr;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Exec* e = LiveExec(st, hExec);
  Graph* g = LiveGraph(st, hGraph);
  if (e == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Exec fresh;
  if (!FlattenLocked(g, &fresh)) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  if (fresh.specs.size() != e->specs.size()) {
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  const auto old_deps = DepIndices(*e);
  const auto new_deps = DepIndices(fresh);
  for (size_t i = 0; i < fresh.specs.size(); ++i) {
    CUgraphNode node = reinterpret_cast<CUgraphNode>(fresh.origins[i]);
    if (old_deps[i] != new_deps[i]) {
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
      info->errorNode = node;
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    CUgraphExecUpdateResult r = UpdateCheck(*e->specs[i], *fresh.specs[i]);
    if (r != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
      info->result = r;
      info->errorNode = node;
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
  }
  // The exec keeps its own nodes (the handles cuGraphExec*SetParams take
  // are still those of the graph it was instantiated from).
  e->specs = std::move(fresh.specs);
  info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

FAKECUDA_STREAM_PAIR(cuStreamUpdateCaptureDependencies,
                     (CUstream hStream, CUgraphNode* dependencies, size_t numDependencies,
                      unsigned int flags),
                     hStream, dependencies, numDependencies, flags)
FAKECUDA_STREAM_PAIR(cuStreamUpdateCaptureDependencies_v2,
                     (CUstream hStream, CUgraphNode* dependencies,
                      const CUgraphEdgeData* dependencyData, size_t numDependencies,
                      unsigned int flags),
                     hStream, dependencies, dependencyData, numDependencies, flags)
FAKECUDA_STREAM_PAIR(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream), hGraphExec, hStream)

FAKECUDA_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                              CUgraphExecUpdateResultInfo* resultInfo) {
  FAKECUDA_ENTER("cuGraphExecUpdate_v2");
  if (resultInfo == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ExecUpdate(hGraphExec, hGraph, resultInfo);
}

FAKECUDA_EXPORT CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph,
                                           CUgraphNode* hErrorNode_out,
                                           CUgraphExecUpdateResult* updateResult_out) {
  FAKECUDA_ENTER("cuGraphExecUpdate");
  if (hErrorNode_out == nullptr || updateResult_out == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUgraphExecUpdateResultInfo info{};
  CUresult r = ExecUpdate(hGraphExec, hGraph, &info);
  *hErrorNode_out = info.errorNode;
  *updateResult_out = info.result;
  return r;
}

FAKECUDA_EXPORT CUresult cuGraphExecGetFlags(CUgraphExec hGraphExec, cuuint64_t* flags) {
  FAKECUDA_ENTER("cuGraphExecGetFlags");
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Exec* e = LiveExec(st, hGraphExec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = e->flags;
  return CUDA_SUCCESS;
}

namespace {
CUresult KernelNodeSetParams(CUgraphNode hNode, NodeSpec spec) {
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Node* n = TypedNode(st, hNode, CU_GRAPH_NODE_TYPE_KERNEL);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->spec = std::move(spec);
  return CUDA_SUCCESS;
}
}  // namespace

FAKECUDA_EXPORT CUresult cuGraphKernelNodeSetParams(CUgraphNode hNode,
                                                    const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  FAKECUDA_ENTER("cuGraphKernelNodeSetParams");
  NodeSpec spec;
  if (CUresult r = KernelSpec(nodeParams, &spec); r != CUDA_SUCCESS) return r;
  return KernelNodeSetParams(hNode, std::move(spec));
}

FAKECUDA_EXPORT CUresult
cuGraphKernelNodeSetParams_v2(CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v2* nodeParams) {
  FAKECUDA_ENTER("cuGraphKernelNodeSetParams_v2");
  NodeSpec spec;
  if (CUresult r = KernelSpec2(nodeParams, &spec); r != CUDA_SUCCESS) return r;
  return KernelNodeSetParams(hNode, std::move(spec));
}

FAKECUDA_EXPORT CUresult cuGraphClone(CUgraph* phGraphClone, CUgraph originalGraph) {
  FAKECUDA_ENTER("cuGraphClone");
  if (phGraphClone == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* g = LiveGraph(st, originalGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* clone = NewGraphLocked(st);
  CloneGraphLocked(st, g, clone);
  clone->cloned_from = g;
  *phGraphClone = reinterpret_cast<CUgraph>(clone);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphNodeFindInClone(CUgraphNode* phNode, CUgraphNode hOriginalNode,
                                                CUgraph hClonedGraph) {
  FAKECUDA_ENTER("cuGraphNodeFindInClone");
  if (phNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  Graph* clone = LiveGraph(st, hClonedGraph);
  Node* original = LiveNode(st, hOriginalNode);
  if (clone == nullptr || original == nullptr || clone->cloned_from != original->graph) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // A clone's nodes are in the original's order of addition.
  const Graph* g = original->graph;
  for (size_t i = 0; i < g->nodes.size() && i < clone->nodes.size(); ++i) {
    if (g->nodes[i].get() == original) {
      *phNode = reinterpret_cast<CUgraphNode>(clone->nodes[i].get());
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}
