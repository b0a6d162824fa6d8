#include "core/tracker/graph_launcher.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "core/tracker/operation_keys.h"

namespace stensor {

GraphLauncher::GraphLauncher(const Driver* driver, KernelCache* kernels,
                             const CaptureState* capture, const BufferRegistry* registry,
                             const PinnedHost* pinned, MemoryManager* memory,
                             TableInference* tables)
    : driver_(driver),
      kernels_(kernels),
      capture_(capture),
      registry_(registry),
      pinned_(pinned),
      memory_(memory),
      tables_(tables) {}

uint64_t GraphLauncher::IdAt(uint64_t addr) const {
  auto b = registry_->Find(addr);
  return b ? b->id : 0;
}

std::shared_ptr<const GraphPlan> GraphLauncher::OnInstantiate(CUgraphExec exec, CUgraph graph,
                                                              unsigned long long flags) {
  RelaxedCaptureScope relaxed(*capture_);
  std::shared_ptr<const GraphPlan> plan = ReadGraphPlan(*driver_, kernels_, graph);
  if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) {
    plan = MadeUnknown(*plan, "instantiated for launches from the device, which are not seen");
  }
  graphs_.Set(exec, plan);
  return plan;
}

void GraphLauncher::OnExecNode(CUgraphExec exec, CUgraphNode node,
                               const CUgraphNodeParams& params) {
  std::shared_ptr<const GraphPlan> plan = graphs_.Get(exec);
  if (plan == nullptr || plan->unknown) return;
  GraphNodePlan replacement;
  std::shared_ptr<const GraphPlan> updated;
  switch (PlanNode(kernels_, node, params, &replacement)) {
    case NodeChange::kNoAccess:
      return;
    case NodeChange::kPlanned:
      updated = WithNode(*plan, node, replacement);
      // A node the plan does not hold: one of a kind it does not plan for
      // is now a kernel, copy or memset (the driver refuses that), or a
      // node of another graph. Nothing known to follow.
      if (updated != nullptr) break;
      [[fallthrough]];
    case NodeChange::kUnknown:
      updated = MadeUnknown(*plan, "a node was given parameters stensor cannot follow");
      break;
  }
  graphs_.Set(exec, std::move(updated));
}

void GraphLauncher::OnExecChildChanged(CUgraphExec exec) {
  std::shared_ptr<const GraphPlan> plan = graphs_.Get(exec);
  if (plan == nullptr || plan->unknown) return;
  graphs_.Set(exec, MadeUnknown(*plan, "a child graph node was given another graph"));
}

void GraphLauncher::OnExecUpdate(CUgraphExec exec, CUgraph graph) {
  std::shared_ptr<const GraphPlan> plan = graphs_.Get(exec);
  if (plan == nullptr) return;
  RelaxedCaptureScope relaxed(*capture_);
  // The update's nodes, named by the exec's own (which its setters name).
  graphs_.Set(exec, UpdatedPlan(*plan, *ReadGraphPlan(*driver_, kernels_, graph)));
}

void GraphLauncher::Walk(CUstream stream, GraphLaunchScope* scope) {
  Accesses& all = scope->accesses;
  // Buffers an earlier node of this launch writes on the device: a table
  // among them holds, when a later node reads it, what no one can read now
  // (a read-back would see its contents from before the launch).
  absl::InlinedVector<uint64_t, 16> device_written;
  auto written_here = [&](uint64_t id) {
    return id != 0 &&
           std::find(device_written.begin(), device_written.end(), id) != device_written.end();
  };
  // Host memory an earlier node (or one of unknown place: a host node) may
  // write: a later copy's host source is then only known once it ran.
  bool host_written = scope->plan->host_nodes > 0;
  int stream_idle = -1;  // asked once, at the first copy from host memory
  scope->nodes.reserve(scope->plan->nodes.size());
  for (const GraphNodePlan& n : scope->plan->nodes) {
    Accesses a;
    switch (n.kind) {
      case GraphNodePlan::Kind::kKernel: {
        if (!host_written) host_written = pinned_->AnyWordIn(n.args);
        // The node's arguments at their offsets, as a packed buffer.
        size_t size = n.args.size();
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<unsigned char*>(n.args.data()),
                         CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
        tables_->NoteHostPointers(*n.kernel, nullptr, extra);  // as for a direct launch
        InferKernelNode(n, *registry_, &a);
        if (n.kernel->has_tables || !tables_->empty()) {
          tables_->Expand(*n.kernel, nullptr, extra, stream, &a);
          for (const Accesses::TableUse& t : a.tables) a.unknown_tables |= written_here(t.id);
          for (const Accesses::TableParam& t : a.table_params) {
            a.unknown_tables |= written_here(t.id);
          }
        }
        all.unknown_tables |= a.unknown_tables;
        all.tables.insert(all.tables.end(), a.tables.begin(), a.tables.end());
        device_written.insert(device_written.end(), a.writes.begin(), a.writes.end());
        scope->kernel_writes.append(a.writes.begin(), a.writes.end());
        for (const Accesses::TableParam& t : a.table_params) {
          if (t.slots_written && t.id != 0) scope->pointer_writes.push_back({t.id, t.address});
        }
        break;
      }
      case GraphNodePlan::Kind::kCopy: {
        const uint64_t src = IdAt(n.copy.src.start), dst = IdAt(n.copy.dst.start);
        if (src != 0) a.reads.push_back(src);
        if (dst != 0) {
          a.reads.push_back(dst);
          a.writes.push_back(dst);
        }
        // The copy's pointers are learnt at the launch, as a direct copy's
        // are at its submission; from device data an earlier node wrote,
        // they are unknown.
        // A host source that work queued ahead of the graph may write is
        // settled by waiting for the stream (before the launch); one that
        // a node of the graph may write is known only once the graph ran.
        TableInference::HostCopy host;
        host.in_graph = true;
        if (memory_ && dst != 0 && src == 0 && tables_->IsDeviceReachableHost(n.copy.src.start)) {
          if (stream_idle < 0) stream_idle = tables_->StreamIdle(stream) ? 1 : 0;
          host.settled = stream_idle == 1 && !host_written;
          if (!host_written) {
            host.waitable = true;
            host.stream = stream;
          }
        }
        if (dst != 0) {
          const bool linear = n.copy.dst.extent == n.copy.bytes &&
                              n.copy.src.extent == n.copy.bytes && !written_here(src);
          tables_->OnCopy(n.copy.kind, n.copy.dst.start, n.copy.src.start, n.copy.bytes, linear,
                          &host);
          if (host.settled && host.waitable) stream_idle = 1;  // waited for
          scope->tables_changed = true;
          // What lands is unknown until this launch ran, as for device data.
          if (written_here(src) || !host.settled) device_written.push_back(dst);
        }
        if (dst == 0 && !host_written)
          host_written = tables_->IsDeviceReachableHost(n.copy.dst.start);
        break;
      }
      case GraphNodePlan::Kind::kMemset:
        if (IdAt(n.memset_dst) == 0 && !host_written) {
          host_written = tables_->IsDeviceReachableHost(n.memset_dst);
        }
        if (uint64_t dst = IdAt(n.memset_dst); dst != 0) {
          a.reads.push_back(dst);
          a.writes.push_back(dst);
          tables_->OnMemset(n.memset_dst, n.memset_extent, n.memset_linear);
          scope->tables_changed = true;
        }
        break;
    }
    all.reads.append(a.reads.begin(), a.reads.end());
    all.writes.append(a.writes.begin(), a.writes.end());
    scope->nodes.emplace_back(std::move(a.reads), std::move(a.writes));
  }
  all.Dedupe();
  if (all.unknown_tables) scope->unknown = true;
  scope->writes_host = host_written || scope->unknown;
}

CUresult GraphLauncher::Begin(CUgraphExec exec, CUstream stream, GraphLaunchScope* scope) {
  // Launched into a capture, it becomes a child graph node: nothing runs now.
  if (capture_->Capturing(stream)) {
    scope->captured = true;
    return CUDA_SUCCESS;
  }
  RelaxedCaptureScope relaxed(*capture_);
  scope->plan = graphs_.Get(exec);
  scope->unknown = scope->plan == nullptr || scope->plan->unknown;
  if (!scope->unknown) Walk(stream, scope);
  if (!memory_) return CUDA_SUCCESS;
  // Nodes nobody knows may hand the device a pointer into pinned memory.
  if (scope->unknown) tables_->OnUnknownWork();
  if (scope->unknown) {
    // As for a launch through a table nobody can read: whatever could
    // fault if a node reached it comes in first.
    const size_t before = scope->accesses.reads.size();
    memory_->AppendUnreadable(&scope->accesses.reads);
    scope->accesses.writes.append(scope->accesses.reads.begin() + before,
                                  scope->accesses.reads.end());
  }
  // Every node's buffers at once: a graph runs as one unit on the device.
  if (CUresult r = memory_->Prepare(scope->accesses.reads, {}, stream); r != CUDA_SUCCESS) {
    return r;
  }
  if (scope->unknown) {
    scope->unknown_device = memory_->BeginUnknown(stream);
    return CUDA_SUCCESS;
  }
  // S01/S02: the planner sees the nodes in order, under the keys their
  // direct forms would have. The graph is timed as a whole, against its
  // first node (the nodes cannot be timed apart from the host).
  for (size_t i = 0; i < scope->nodes.size(); ++i) {
    const GraphNodePlan& n = scope->plan->nodes[i];
    const auto& [reads, writes] = scope->nodes[i];
    const uint64_t key =
        n.kind == GraphNodePlan::Kind::kKernel
            ? LaunchKey(n.function, n.grid, n.block)
            : TransferKey(n.kind == GraphNodePlan::Kind::kCopy ? n.copy.bytes : n.memset_extent,
                          false, n.kind == GraphNodePlan::Kind::kMemset);
    MemoryManager::OpTicket ticket;
    memory_->NoteOperation(key, reads, writes, /*marker=*/false, stream, &ticket);
    if (i == 0) {
      scope->op = ticket;
    } else {
      memory_->EndOperation(ticket, stream, /*submitted=*/false);
    }
  }
  return CUDA_SUCCESS;
}

void GraphLauncher::End(CUstream stream, const GraphLaunchScope& scope, bool submitted) {
  if (scope.captured) return;  // a child graph node: nothing ran
  if (memory_) {
    RelaxedCaptureScope relaxed(*capture_);
    memory_->Finish(scope.accesses.reads, scope.accesses.writes, stream, submitted);
    // Nothing known about what it wrote: no host copy can be trusted.
    if (submitted && scope.unknown) memory_->MarkAllWritten(stream);
    memory_->EndUnknown(scope.unknown_device);
    memory_->EndOperation(scope.op, stream, submitted);
  }
  if (!submitted) {
    // Its copies and memsets were applied to the tables before it was
    // submitted: undone the safe way.
    if (scope.tables_changed) tables_->MarkAllStale();
    return;
  }
  if (memory_ && scope.writes_host) tables_->OnHostWrite(0, HostWrites::kEverywhere, stream);
  if (scope.unknown) {
    tables_->MarkAllStale();
  } else {
    if (!tables_->empty()) tables_->OnDeviceWrites(scope.kernel_writes);
    tables_->OnPointerWrites(scope.pointer_writes);
  }
}

}  // namespace stensor
