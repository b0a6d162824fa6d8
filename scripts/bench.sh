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
def medians(kind):
    return {r["run_name"].split("/")[0]: r[kind] for r in runs
            if r.get("aggregate_name") == "median"}
real, cpu = medians("real_time"), medians("cpu_time")
print("median per cuLaunchKernel                 wall       CPU of the calling thread")
for name, label in (("BM_LaunchDirect", "fake driver directly"),
                    ("BM_LaunchHooked", "through libstensor.so")):
    print("  %-38s %7.1f ns %7.1f ns" % (label, real[name], cpu[name]))
print("  %-38s %7.1f ns %7.1f ns   (target: at most 150)" % (
    "added by the launch hook",
    real["BM_LaunchHooked"] - real["BM_LaunchDirect"],
    cpu["BM_LaunchHooked"] - cpu["BM_LaunchDirect"]))
PY
bazel-out/k8-opt/bin/bench/inference_benchmark --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true 2>/dev/null | grep -E "median"
