// WorkloadLives: each swappable buffer's life in a Workload (allocation, end, the
// operations that use it) and the plain charges at every point, read
// straight from the operations, for the brute forces the optimum tests
// check the solvers against (independent of tools/keep_problem.h).
//
// Thread-safety: plain data.
#ifndef STENSOR_TOOLS_WORKLOAD_LIVES_TESTING_H_
#define STENSOR_TOOLS_WORKLOAD_LIVES_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tools/workload.h"

namespace stensor {

struct WorkloadLives {
  struct Use {
    int t;
    bool write, overwritten;
  };
  struct Life {
    const WorkloadBuffer* b;
    int alloc, end;         // points [alloc, end) of the workload
    std::vector<Use> uses;  // operations that use it, in order (not the allocation)
  };
  std::vector<Life> lives;
  std::vector<int64_t> plain;  // per point (and one past the end): plain charges
};

inline WorkloadLives ReadLives(const Workload& workload) {
  const int points = static_cast<int>(workload.ops.size());
  WorkloadLives out;
  out.plain.assign(points + 1, 0);
  absl::flat_hash_map<uint64_t, size_t> index;
  for (int t = 0; t < points; ++t) {
    const WorkloadOp& op = workload.ops[t];
    if (op.kind == WorkloadOp::Kind::kAlloc || op.kind == WorkloadOp::Kind::kFree) {
      const WorkloadBuffer& b = workload.buffers.at(op.buffer);
      const bool alloc = op.kind == WorkloadOp::Kind::kAlloc;
      if (!b.swappable) {
        const int64_t charge = static_cast<int64_t>(b.charge);
        for (int u = t; u <= points; ++u) out.plain[u] += alloc ? charge : -charge;
      } else if (alloc) {
        index[b.id] = out.lives.size();
        out.lives.push_back({&b, t, points, {}});
      } else {
        out.lives[index[b.id]].end = t;
      }
    } else if (op.kind != WorkloadOp::Kind::kHostRead) {
      for (uint64_t id : op.ids) {
        if (!workload.buffers.at(id).swappable) continue;
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

#endif  // STENSOR_TOOLS_WORKLOAD_LIVES_TESTING_H_
