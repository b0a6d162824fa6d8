#!/usr/bin/env bash
# Measures what the launch hook adds to cuLaunchKernel (six pointer
# parameters, 10,000 live buffers) against the fake driver called directly,
# in the same run, and prints the difference of the medians. Target: at most
# 60 ns. Extra arguments go to the benchmark (e.g. --benchmark_repetitions=20).
# The build is the one `bazel build //...` makes (.bazelrc: -c opt, -g).
#
#   scripts/bench.sh                 wall and CPU time per launch, the same
#                                    words every launch and new words every
#                                    launch (the hook's memo does not apply);
#                                    with --swappable the live buffers are
#                                    1,000 of 2 MiB (under a cap of 1 GiB,
#                                    one that binds)
#   scripts/bench.sh --instructions  instructions per launch under callgrind,
#                                    hooked minus direct in one process, each
#                                    without the fake driver's own share
#                                    (target: at most 700; under a cap,
#                                    STENSOR_MEMORY_LIMIT, at most 1,400);
#                                    needs valgrind. A third count has six
#                                    2 MiB buffers of 1,000: under a cap
#                                    stensor swaps those, and each use keeps
#                                    its eviction order current. Under a cap,
#                                    a fourth has the same buffers under one
#                                    of 1 GiB, which binds (half of them go
#                                    out as they are made, the planner is
#                                    fed): the launches' buffers resident,
#                                    what a launch costs while the cap binds;
#                                    and a fifth, under the same cap, has
#                                    the launches walk all 1,000 buffers, so
#                                    that each moves some in and out: less
#                                    the fourth, over the moves a launch,
#                                    what a move costs (300 launches: the
#                                    fake's work for a move is slow under
#                                    callgrind); a sixth walks them under
#                                    STENSOR_MEMORY_LIMIT itself: launches on
#                                    changing buffers while the cap does not
#                                    bind (8,192 launches at most)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
bazel build //bench:launch_hook_benchmark //bench:inference_benchmark
bin=$(readlink -f bazel-bin)
runfiles="$bin/bench/launch_hook_benchmark.runfiles/stensor"

if [[ "${1:-}" == "--instructions" ]]; then
  command -v valgrind >/dev/null || {
    echo "bench.sh: --instructions needs valgrind (apt-get install valgrind)" >&2
    exit 1
  }
  launches=${2:-20000}
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  kinds="same new swappable"
  target=700
  if [[ -n "${STENSOR_MEMORY_LIMIT:-}" ]]; then
    kinds+=" binding rotating changing"
    target=1400
  fi
  for words in $kinds; do
  # Only the two launch loops are counted (one pattern matches both); the
  # inclusive count of each is read from the one profile. "same": the same
  # six words every launch, as a training step repeats its launches (the
  # hook's memo applies); "new": other words every launch (it does not).
  flag=""
  [[ $words == new ]] && flag=--new_words
  [[ $words == swappable || $words == binding ]] && flag=--swappable
  [[ $words == rotating || $words == changing ]] && flag=--rotate
  limit=${STENSOR_MEMORY_LIMIT:-}
  [[ $words == binding || $words == rotating ]] && limit=1GiB
  n=$launches
  [[ $words == rotating ]] && n=$((launches < 300 ? launches : 300))
  [[ $words == changing ]] && n=$((launches < 8192 ? launches : 8192))
  (cd "$runfiles" &&
   if [[ -n $limit ]]; then export STENSOR_MEMORY_LIMIT=$limit; fi &&
   valgrind --tool=callgrind --callgrind-out-file="$dir/cg" --collect-atstart=no \
     --toggle-collect='*LaunchLoop*' \
     ../../launch_hook_benchmark --count_launches="$n" $flag) >"$dir/log" 2>&1 || {
    cat "$dir/log" >&2
    exit 1
  }
  # With the callers of each function: the fake driver's own share of each
  # loop is subtracted where it was measured, since its cost per launch
  # differs between the loops by up to ~200 instructions (how often its
  # stream worker has to be woken), which is not the hook's.
  callgrind_annotate --inclusive=yes --tree=caller "$dir/cg" >"$dir/annotated"
  python3 - "$dir/annotated" "$n" "$words" "$target" "$dir" <<'PY'
import os, re, sys
n = int(sys.argv[2])
words = sys.argv[3]
target = int(sys.argv[4])
keep = sys.argv[5]  # the binding count, for the rotating one's cost per move
loop, fake = {}, {}
block = []
for line in open(sys.argv[1]).read().split("\n") + [""]:
    if line.strip():
        block.append(line)
        continue
    for l in block:
        m = re.match(r"\s*([\d,]+) .*\*\s+.*::(LaunchLoopDirect|LaunchLoopHooked)\(", l)
        if m:
            loop[m.group(2)] = int(m.group(1).replace(",", "")) / n
    if any(re.search(r"\*\s+\S*:cuLaunchKernel \[.*libcuda\.so\.1\]", l) for l in block):
        for l in block:
            m = re.match(r"\s*([\d,]+) .*<\s+(.*)", l)
            if m:
                key = "LaunchLoopDirect" if "LaunchLoopDirect" in m.group(2) else "LaunchLoopHooked"
                fake[key] = fake.get(key, 0) + int(m.group(1).replace(",", "")) / n
    block = []
if len(loop) != 2 or len(fake) != 2:
    sys.exit("bench.sh: callgrind did not report both launch loops and the fake's share of each")
direct, hooked = loop["LaunchLoopDirect"], loop["LaunchLoopHooked"]
added = (hooked - fake["LaunchLoopHooked"]) - (direct - fake["LaunchLoopDirect"])
print("instructions per cuLaunchKernel (callgrind, %d launches each), %s"
      % (n, {"same": "same words each launch", "new": "new words each launch",
             "swappable": "same words each launch, six 2 MiB (swappable) buffers",
             "binding": "six 2 MiB buffers, resident, under a 1 GiB cap that binds",
             "rotating": "six 2 MiB buffers of 1,000 in turn, under a 1 GiB cap that binds",
             "changing": "six 2 MiB buffers of 1,000 in turn, under the cap given"}[words]))
print("  %-38s %7.0f   (of which the fake driver %.0f)" % ("fake driver directly", direct, fake["LaunchLoopDirect"]))
print("  %-38s %7.0f   (of which the fake driver %.0f)" % ("through libstensor.so", hooked, fake["LaunchLoopHooked"]))
print("  %-38s %7.0f   (%s)" % ("added by the launch hook", added,
      "target: at most {:,}".format(target) if words not in ("binding", "rotating") else "no target"))
if words == "binding":
    open(os.path.join(keep, "binding"), "w").write(str(added))
if words == "rotating":
    m = re.search(r"moves per launch: in ([\d.]+) out ([\d.]+) served ([\d.]+)",
                  open(os.path.join(keep, "log")).read())
    moves = float(m.group(1)) + float(m.group(2)) if m else 0
    print("  %-38s %7.2f   (in %s, out %s, served %s)" % ("moves per launch", moves, *m.groups()) if m
          else "  moves per launch: not reported")
    binding_path = os.path.join(keep, "binding")
    if moves > 0 and os.path.exists(binding_path):
        print("  %-38s %7.0f   (less the binding launch's, over the moves)" % (
            "added per move", (added - float(open(binding_path).read())) / moves))
PY
  done
  exit 0
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
(cd "$runfiles" &&
 ../../launch_hook_benchmark --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true \
   --benchmark_report_aggregates_only=true --benchmark_format=json "$@") > "$out"
python3 - "$out" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
def medians(kind):
    return {r["run_name"].split("/")[0]: r[kind] for r in runs
            if r.get("aggregate_name") == "median"}
real, cpu = medians("real_time"), medians("cpu_time")
for suffix, words in (("", "same words each launch"), ("NewWords", "new words each launch")):
    direct, hooked = "BM_LaunchDirect" + suffix, "BM_LaunchHooked" + suffix
    if direct not in real or hooked not in real:
        continue  # filtered out by --benchmark_filter
    print("median per cuLaunchKernel, %-24s wall       CPU of the calling thread" % words)
    for name, label in ((direct, "fake driver directly"), (hooked, "through libstensor.so")):
        print("  %-38s %7.1f ns %7.1f ns" % (label, real[name], cpu[name]))
    print("  %-38s %7.1f ns %7.1f ns   (target: at most 60)" % (
        "added by the launch hook", real[hooked] - real[direct], cpu[hooked] - cpu[direct]))
PY
"$bin/bench/inference_benchmark" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true 2>/dev/null | grep -E "median"
