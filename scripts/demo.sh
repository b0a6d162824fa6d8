#!/usr/bin/env bash
# What stensor does, in one command: builds, then trains the example MLP
# (examples/mlp) twice, without stensor and under stensor with a device
# memory cap of 40 % of its working set, and prints both checksums side by
# side (the same: swapping changes nothing the program computes), stensor's
# statistics, and where the access log, the timeline (`stensor trace`) and
# the report (`stensor report`) were written.
# On a machine with an NVIDIA GPU and nvcc it runs on the GPU (the kernels
# built as a fatbin); elsewhere on the fake driver (tests/fakecuda).
# usage: scripts/demo.sh [--steps N] [--cap PERCENT] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=20 cap=40 out=/tmp/stensor-demo
while (($#)); do
  case $1 in
    --steps) steps=${2:?--steps needs a value}; shift ;;
    --cap) cap=${2:?--cap needs a value}; shift ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "demo.sh: --steps '$steps': expected a positive integer" >&2; exit 2; }
[[ $cap =~ ^[1-9][0-9]?$ ]] || { echo "demo.sh: --cap '$cap': expected a percentage from 1 to 99" >&2; exit 2; }

scripts/setup.sh > /dev/null
echo "demo: building (bazel build //...)"
bazel build //... 2>&1 | tail -n 1
bin=bazel-bin
mkdir -p "$out"
rm -f "$out"/access.jsonl "$out"/trace.json "$out"/report.html

nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
run=(scripts/with-fake-gpu "$bin/examples/mlp/mlp_train") where="the fake GPU (tests/fakecuda)"
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && [[ -x $nvcc ]]; then
  "$nvcc" -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -o "$out/mlp_kernels.fatbin" examples/mlp/mlp_kernels.cu
  run=("$bin/examples/mlp/mlp_train" --module "$out/mlp_kernels.fatbin")
  where="$(nvidia-smi -L | head -n 1)"
fi
echo "demo: mlp_train --steps $steps on $where"

"${run[@]}" --steps "$steps" > "$out/plain.txt"
ws=$(sed -n 's/^working_set //p' "$out/plain.txt")
limit=$((ws * cap / 100))
echo "demo: working set $ws bytes; the capped run gets $limit ($cap %)"
"$bin/tools/stensor" run --limit "$limit" --stats --log "$out/access.jsonl" -- \
  "${run[@]}" --steps "$steps" > "$out/capped.txt" 2> "$out/stats.txt"

plain=$(sed -n 's/^checksum //p' "$out/plain.txt")
capped=$(sed -n 's/^checksum //p' "$out/capped.txt")
printf '\n%-30s %-30s\n' "without stensor" "under stensor, cap $cap %"
printf '%-30s %-30s\n' "$(grep '^step 0 ' "$out/plain.txt")" "$(grep '^step 0 ' "$out/capped.txt")"
printf '%-30s %-30s\n' "$(grep "^step $((steps - 1)) " "$out/plain.txt")" "$(grep "^step $((steps - 1)) " "$out/capped.txt")"
printf '%-30s %-30s\n\n' "checksum $plain" "checksum $capped"
grep '^stensor: ' "$out/stats.txt" | grep -E 'peak|swap-outs|clean drops|swap-ins copied|host waited|prefetches|profiled' || true

"$bin/tools/stensor" trace "$out/access.jsonl" -o "$out/trace.json"
"$bin/tools/stensor" report "$out/access.jsonl" -o "$out/report.html"
echo
echo "demo: access log  $out/access.jsonl"
echo "demo: timeline    $out/trace.json   (open in https://ui.perfetto.dev)"
echo "demo: report      $out/report.html"
if [[ $plain != "$capped" ]]; then
  echo "demo: the checksums differ: that is a bug, please report it" >&2
  exit 1
fi
echo "demo: same checksum with $cap % of the memory"
