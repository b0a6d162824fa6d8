#!/usr/bin/env bash
# Measures what the launch hook adds to cuLaunchKernel (six pointer
# parameters, 10,000 live buffers) against the fake driver called directly,
# in the same run, and prints the difference of the medians. Target: at most
# 150 ns. Extra arguments go to the benchmark (e.g. --benchmark_repetitions=20).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
bazel build -c opt //bench:launch_hook_benchmark //bench:inference_benchmark
out=$(mktemp)
trap 'rm -f "$out"' EXIT
(cd bazel-out/k8-opt/bin/bench/launch_hook_benchmark.runfiles/stensor &&
 ../../launch_hook_benchmark --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true \
   --benchmark_report_aggregates_only=true --benchmark_format=json "$@") > "$out"
python3 - "$out" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
median = {r["run_name"].split("/")[0]: r["real_time"] for r in runs
          if r.get("aggregate_name") == "median"}
direct, hooked = median["BM_LaunchDirect"], median["BM_LaunchHooked"]
print("cuLaunchKernel, fake driver directly:   %7.1f ns (median)" % direct)
print("cuLaunchKernel, through libstensor.so:  %7.1f ns (median)" % hooked)
print("added by the launch hook:               %7.1f ns (target: at most 150)" % (hooked - direct))
PY
bazel-out/k8-opt/bin/bench/inference_benchmark --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true 2>/dev/null | grep -E "median"
