#!/usr/bin/env bash
# Operations over the cap served from host memory (tests/serve_host.cc):
# with host-located VMM, a kernel whose buffers do not fit under the cap
# together, and buffers larger than the cap, run, and every word matches the
# host model and the uncapped run, under each policy, with frees behind
# queued work (cuMemFree and cuMemFreeAsync), and in runs two at a time;
# the statistics count what was served and no out-of-memory error; with
# stensor's own driver calls failing one at a time. Without host-located
# VMM the same program gets a clean CUDA_ERROR_OUT_OF_MEMORY.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICE_MEMORY=1GiB
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
cap=$((32 << 20))  # two of the three 24 MiB buffers do not fit; the 40 MiB one never

"$program" "$kernels" 2 > "$tmp/plain.out" 2> "$tmp/plain.err" ||
  { cat "$tmp/plain.err" >&2; fail "uncapped without stensor"; }
want=$(grep '^checksum' "$tmp/plain.out")
"$program" "$kernels" 1 > "$tmp/plain1.out" 2> "$tmp/plain1.err" ||
  { cat "$tmp/plain1.err" >&2; fail "uncapped without stensor, one round"; }
want1=$(grep '^checksum' "$tmp/plain1.out")
stat() { sed -n "s/^stensor: $2 *\([0-9]*\).*/\1/p" "$tmp/$1.err"; }
run() {  # run NAME ITERATIONS [async] -- VAR=value...
  local name=$1 iters=$2 mode=${3:-}
  shift 3
  env "$@" LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap STENSOR_STATS=1 \
    "$program" "$kernels" "$iters" $mode > "$tmp/$name.out" 2> "$tmp/$name.err"
}
for policy in belady version lru; do
  for mode in sync async; do
    name=$policy-$mode
    run "$name" 2 "$([[ $mode == async ]] && echo async)" FAKECUDA_HOST_VMM=1 STENSOR_POLICY=$policy ||
      { tail -n 20 "$tmp/$name.err" >&2; fail "$name: the program failed"; }
    [[ $(grep '^checksum' "$tmp/$name.out") == "$want" ]] || fail "$name: checksum differs"
    grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
    served=$(stat "$name" "served from host")
    (( ${served:-0} >= 4 )) || fail "$name: only ${served:-0} buffers served from host"
    [[ $(stat "$name" "out of memory") == 0 ]] || fail "$name: out-of-memory errors counted"
    echo "$name: $served buffers served from host, same checksum"
  done
done

# Racy: runs two at a time, frees behind queued work.
pids=()
for i in $(seq 1 8); do
  mode=$([[ $((i % 2)) == 0 ]] && echo async || echo sync)
  (run "race$i" 1 "$([[ $mode == async ]] && echo async)" FAKECUDA_HOST_VMM=1 &&
     [[ $(grep '^checksum' "$tmp/race$i.out") == "$want1" ]]) &
  pids+=($!)
  if (( ${#pids[@]} == 2 )); then
    for p in "${pids[@]}"; do wait "$p" || fail "a racing run failed"; done
    pids=()
  fi
done
echo "8 racing runs: same checksum"

# stensor's own driver calls on these paths failing, one at a time, at
# early, middle and late occurrences (counted from cuInit; the program's own
# calls among them fail too): each run either gives the uncapped checksum,
# every word checked, or stops on a driver error it was handed (exit 1, or
# 3 for out of memory); never a wrong word, never a crash.
failed=0 passed=0
for spec in cuMemCreate:2 cuMemCreate:8 cuMemCreate:14 cuMemMap:5 cuMemMap:60 cuMemMap:120 \
    cuMemSetAccess:3 cuMemSetAccess:12 cuMemSetAccess:20 cuMemUnmap:4 cuMemUnmap:15 \
    cuMemsetD8Async:1 cuMemsetD8Async:3 cuMemcpyDtoHAsync_v2:2 cuMemcpyHtoDAsync_v2:3 \
    cuEventRecord:5 cuEventRecord:20 cuStreamWaitEvent:4 cuMemAddressReserve:6; do
  name=fail-${spec/:/-}
  if run "$name" 1 "" FAKECUDA_HOST_VMM=1 FAKECUDA_FAIL="$spec"; then
    [[ $(grep '^checksum' "$tmp/$name.out") == "$want1" ]] || fail "$name: checksum differs"
    grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
    passed=$((passed + 1))
  else
    rc=$?
    (( rc == 1 || rc == 3 )) || { tail -n 5 "$tmp/$name.err" >&2; fail "$name: exit $rc"; }
    grep -Eq 'failed|wrong' "$tmp/$name.err" || grep -q '^oom ' "$tmp/$name.out" ||
      { tail -n 5 "$tmp/$name.err" >&2; fail "$name: exit $rc without the error said"; }
    ! grep -q 'words wrong' "$tmp/$name.err" || fail "$name: wrong words"
    failed=$((failed + 1))
  fi
done
echo "injected failures: $passed runs recovered with the uncapped checksum, $failed stopped on the error"

# Without host-located VMM: the error the driver gives, said once.
if run nohost 1 "" FAKECUDA_HOST_VMM=0; then
  fail "nohost: the program ran over the cap without host-located VMM"
else
  rc=$?
fi
(( rc == 3 )) || { tail -n 5 "$tmp/nohost.err" >&2; fail "nohost: exit $rc, want 3 (out of memory)"; }
grep -q '^oom ' "$tmp/nohost.out" || fail "nohost: no out-of-memory error seen"
echo "PASS"
