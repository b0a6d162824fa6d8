#!/usr/bin/env bash
# A training step replayed from captured CUDA graphs (tests/graph_train.cc)
# under caps of 100, 60 and 40 % of its working set, with every policy, with
# host-located VMM on and off: every run prints the checksum of the run
# without stensor, no device's high-water mark exceeds the cap, the capped
# runs swap, and stensor counts no failed driver call. Also: another thread
# swapping while the main thread captures in global mode, an exec whose
# kernel arguments are changed, and the access log's graph records.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4 adversary=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

mib=$((1 << 20))
working_set=$((45 * 2 * mib))  # 45 buffers of 2 MiB (graph_train.cc)

expect_checksum() {  # NAME ARGS...: the uncapped checksum without stensor
  local name=$1
  shift
  "$program" "$kernels" "$@" > "$tmp/$name.want" || fail "$name: plain run failed"
  grep -q '^checksum ' "$tmp/$name.want" || fail "$name: plain run printed $(cat "$tmp/$name.want")"
}
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }

run() {  # NAME WANT CAP POLICY HOST_VMM ARGS...
  local name=$1 want=$2 cap=$3 policy=$4 vmm=$5
  shift 5
  FAKECUDA_HOST_VMM=$vmm FAKECUDA_REPORT_PEAK=1 STENSOR_STATS=1 STENSOR_POLICY=$policy \
    STENSOR_MEMORY_LIMIT=$cap LD_PRELOAD="$preload" \
    "$program" "$kernels" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.err" >&2; fail "$name: graph_train failed"; }
  cmp -s "$tmp/$name.out" "$tmp/$want.want" ||
    fail "$name: $(cat "$tmp/$name.out"), want $(cat "$tmp/$want.want")"
  local peak errors
  peak=$(sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/$name.err")
  (( peak <= cap )) || fail "$name: high-water mark $peak above the cap $cap"
  errors=$(stat "$name" "driver errors")
  # An injected failure is counted there when stensor recovered from it.
  [[ -n ${FAKECUDA_FAIL:-} || -z $errors || $errors == 0 ]] ||
    fail "$name: $errors failed driver calls"
  if (( cap < working_set )); then
    (( $(stat "$name" "swap-ins copied") > 0 )) || fail "$name: nothing swapped in"
  fi
  echo "$name: $(cat "$tmp/$name.out"), peak $peak"
}

expect_checksum plain --steps 5
for vmm in 1 0; do
  for policy in belady lru version; do
    for pct in 100 60 40; do
      run "$policy-$pct-$vmm" plain $((working_set * pct / 100)) $policy $vmm --steps 5
    done
  done
done

# Swap-ins on another thread while the main thread captures globally: the
# capture must survive (stensor's own calls run in relaxed mode).
expect_checksum side --steps 3 --side-thread
run side-40 side $((working_set * 40 / 100)) belady 1 --steps 3 --side-thread
run side-40-novmm side $((working_set * 40 / 100)) lru 0 --steps 3 --side-thread

# An exec's kernel node given other arguments: followed.
expect_checksum update --steps 4 --update
run update-40 update $((working_set * 40 / 100)) belady 1 --steps 4 --update

# Failed driver calls stensor makes for graphs and captures (occurrences
# 1 and 3): a graph that could not be read is launched as work of unknown
# accesses (with host-located VMM, its swapped-out buffers are read through
# their host copies), a failed capture query handles the operation as run
# now, a side stream that could not be made leaves the copy to the driver.
# Every run prints the uncapped checksum.
# (The program makes three streams first: stensor's are the 4th to 6th.)
for sym in cuGraphGetNodes cuGraphGetEdges_v2 cuGraphNodeGetType cuGraphKernelNodeGetParams_v2 \
    cuGraphMemcpyNodeGetParams cuGraphMemsetNodeGetParams cuStreamIsCapturing cuStreamCreate; do
  for nth in 1 3 4 5 6; do
    [[ $sym == cuStreamCreate ]] || (( nth <= 3 && nth != 2 )) || continue
    [[ $sym != cuStreamCreate ]] || (( nth >= 4 )) || continue
    FAKECUDA_FAIL="$sym:$nth:999" run "fail-$sym-$nth" plain $((working_set * 40 / 100)) belady 1 \
      --steps 5
  done
done
# Without host-located VMM a graph that could not be read needs every
# buffer in: at the full working set it still runs right.
FAKECUDA_FAIL="cuGraphKernelNodeGetParams_v2:2:999" run fail-novmm plain $working_set belady 0 \
  --steps 5

# Programs aimed at single weak points (tests/graph_adversary.cc), under a
# cap of 16 MiB (8 of their 2 MiB buffers), host VMM on and off, 3 runs
# each: a table a graph's own copy rewrites between launches, a captured
# copy that never ran, two threads capturing their per-thread streams.
for mode in table-in-graph table-captured per-thread; do
  "$adversary" "$kernels" $mode > "$tmp/$mode.want" || fail "$mode: plain run failed"
  for vmm in 1 0; do
    for i in 1 2 3; do
      FAKECUDA_HOST_VMM=$vmm STENSOR_MEMORY_LIMIT=$((16 * mib)) LD_PRELOAD="$preload" \
        "$adversary" "$kernels" $mode > "$tmp/$mode.out" 2> "$tmp/$mode.err" ||
        { cat "$tmp/$mode.err" >&2; fail "$mode (host VMM $vmm): failed"; }
      cmp -s "$tmp/$mode.out" "$tmp/$mode.want" ||
        fail "$mode (host VMM $vmm): $(cat "$tmp/$mode.out"), want $(cat "$tmp/$mode.want")"
    done
  done
  echo "$mode: $(cat "$tmp/$mode.want")"
done

# The access log: every graph read (inferred), every launch of one with its
# buffers, and the captured operations marked as such.
STENSOR_ACCESS_LOG="$tmp/log.jsonl" LD_PRELOAD="$preload" \
  "$program" "$kernels" --steps 2 > "$tmp/log.out"
cmp -s "$tmp/log.out" "$tmp/plain.want" && fail "two steps gave five steps' checksum"
instantiated=$(grep -c '"type":"graph_instantiate".*"inferred":true' "$tmp/log.jsonl" || true)
launched=$(grep -c '"type":"graph_launch".*"inferred":true.*"reads":\[[0-9]' "$tmp/log.jsonl" || true)
captured=$(grep -c '"type":"launch".*"captured":true' "$tmp/log.jsonl" || true)
(( instantiated == 4 )) || fail "log: $instantiated graphs read, want 4"
(( launched == 8 )) || fail "log: $launched graph launches with their buffers, want 8"
(( captured == 4 * 8 )) || fail "log: $captured captured launches, want 32"
echo PASS
