// TraceLives: each swappable buffer's life in a Trace (allocation, end, the
// operations that use it) and the plain charges at every point, read
// straight from the operations, for the brute forces the optimum tests
// check the solvers against (independent of tools/keep_problem.h).
//
// Thread-safety: plain data.
#ifndef STENSOR_TOOLS_TRACE_LIVES_TESTING_H_
#define STENSOR_TOOLS_TRACE_LIVES_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tools/trace.h"

namespace stensor {

struct TraceLives {
  struct Use {
    int t;
    bool write, overwritten;
  };
  struct Life {
    const TraceBuffer* b;
    int alloc, end;         // points [alloc, end) of the trace
    std::vector<Use> uses;  // operations that use it, in order (not the allocation)
  };
  std::vector<Life> lives;
  std::vector<int64_t> plain;  // per point (and one past the end): plain charges
};

inline TraceLives ReadLives(const Trace& trace) {
  const int points = static_cast<int>(trace.ops.size());
  TraceLives out;
  out.plain.assign(points + 1, 0);
  absl::flat_hash_map<uint64_t, size_t> index;
  for (int t = 0; t < points; ++t) {
    const TraceOp& op = trace.ops[t];
    if (op.kind == TraceOp::Kind::kAlloc || op.kind == TraceOp::Kind::kFree) {
      const TraceBuffer& b = trace.buffers.at(op.buffer);
      const bool alloc = op.kind == TraceOp::Kind::kAlloc;
      if (!b.swappable) {
        const int64_t charge = static_cast<int64_t>(b.charge);
        for (int u = t; u <= points; ++u) out.plain[u] += alloc ? charge : -charge;
      } else if (alloc) {
        index[b.id] = out.lives.size();
        out.lives.push_back({&b, t, points, {}});
      } else {
        out.lives[index[b.id]].end = t;
      }
    } else if (op.kind != TraceOp::Kind::kHostRead) {
      for (uint64_t id : op.ids) {
        if (!trace.buffers.at(id).swappable) continue;
        auto has = [&](const std::vector<uint64_t>& v) {
          return std::find(v.begin(), v.end(), id) != v.end();
        };
        out.lives[index[id]].uses.push_back({t, has(op.writes), has(op.overwritten)});
      }
    }
  }
  return out;
}

}  // namespace stensor

#endif  // STENSOR_TOOLS_TRACE_LIVES_TESTING_H_
