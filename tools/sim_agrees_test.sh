#!/usr/bin/env bash
# `stensor sim` decides as the library does: both make room with the same
# code (policy/make_room.h, policy/eviction_order.h), so replaying a capped
# run's access log at its cap, policy and prefetch setting must move the
# bytes the run moved.
#
# mlp_train --steps 20 at 40 % of its working set (as `stensor sim` computes
# it from an uncapped log), for the `version`, `lru` and `belady` policies,
# each with prefetch off and on: device->host and host->device bytes
# identical to the run's own (the sums of its log's swap_out and copied
# swap_in records), and something moves.
#
# The same with small allocations packed into slabs (STENSOR_SLABS=on,
# `stensor sim --slabs on`): identical bytes for every policy with prefetch
# off (with it on, whether a planned fetch finds its room depends on how
# far the fake device lags, so two runs of the library differ).
#
# STENSOR_SLABS=auto (the default of both) packs from the same allocation
# on: torchlike_train per tensor (more than an eighth of it small tensors)
# at 25 % and 100 % has as many allocations in slabs in the run as in the
# replay, none before the onset; mlp_train at 40 % (its few small buffers
# under the share) none in either, its bytes identical as with slabs off.
#
# transformer_train --steps 6 at 50 % (stream-ordered temporaries,
# allocations in pieces), every policy with prefetch off, at 50 % and at
# 75 % with small allocations packed from the onset (STENSOR_SLABS=auto:
# room comes from releasing the empty slab kept, and a small allocation
# then finds a fresh one, a new buffer to the planner): identical bytes
# on a fake device that has run each operation when its call returns
# (FAKECUDA_SYNC=1). The replay takes every free and every operation as
# done at once; on a device that lags, when the library sees a
# stream-ordered free settle or a served buffer's launch end is timing, an
# input the replay does not have (two runs of the library then differ too).
set -euo pipefail
mlp=$1 fake=$2 lib=$3 sim=$4 transformer=$5 torchlike=$6
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
source "$(dirname "$0")/../tests/preload.bash"
lib=$(preload_of "$lib")

# moved LOG: "D2H H2D", the bytes the run's swap records say it moved.
moved() {
  awk '/"type":"swap_out"/ { match($0, /"bytes":[0-9]+/); out += substr($0, RSTART + 8, RLENGTH - 8) }
       /"type":"swap_in"/ && /"copy":true/ { match($0, /"bytes":[0-9]+/); in_ += substr($0, RSTART + 8, RLENGTH - 8) }
       END { printf "%d %d\n", out, in_ }' "$1"
}
# replayed SIMOUT: "D2H H2D" as `stensor sim` printed them.
replayed() { awk '$1 == "device->host" { o = $2 } $1 == "host->device" { i = $2 } END { printf "%d %d\n", o, i }' "$1"; }
# check NAME PCT RUNS -- PROGRAM...
check() {
  local name=$1 pct=$2 runs=$3
  shift 4
  STENSOR_ACCESS_LOG="$tmp/$name.uncapped.jsonl" LD_PRELOAD="$lib" "$@" > "$tmp/$name.uncapped.out"
  "$sim" sim "$tmp/$name.uncapped.jsonl" --limit "$pct" --policy version > "$tmp/$name.uncapped.sim" ||
    fail "$name: stensor sim on the uncapped log: exit $?"
  local cap
  cap=$(awk '$1 == "cap" { print $2 }' "$tmp/$name.uncapped.sim")
  [[ $cap =~ ^[0-9]+$ ]] || fail "$name: no cap in: $(cat "$tmp/$name.uncapped.sim")"
  local run
  for run in $runs; do
    local policy prefetch slabs=off
    IFS=: read -r policy prefetch slabs <<< "$run"
    [[ -n $slabs ]] || slabs=off
    local log="$tmp/$name.$policy.$prefetch.$slabs.jsonl"
    STENSOR_MEMORY_LIMIT=$cap STENSOR_POLICY=$policy STENSOR_PREFETCH=$prefetch \
      STENSOR_SLABS=$slabs STENSOR_ACCESS_LOG="$log" LD_PRELOAD="$lib" "$@" > "$tmp/$name.$run.out" ||
      fail "$name $run: exit $?"
    diff <(tail -n 1 "$tmp/$name.uncapped.out") <(tail -n 1 "$tmp/$name.$run.out") > /dev/null ||
      fail "$name $run: checksum differs from the uncapped run"
    "$sim" sim "$log" --limit "$cap" --policy "$policy" --prefetch "$prefetch" --slabs "$slabs" \
      > "$tmp/$name.$run.sim" ||
      fail "$name $run: stensor sim exit $?"
    local lib_out lib_in sim_out sim_in
    read -r lib_out lib_in < <(moved "$log")
    read -r sim_out sim_in < <(replayed "$tmp/$name.$run.sim")
    echo "$name $run at $cap bytes: library D2H $lib_out H2D $lib_in; sim D2H $sim_out H2D $sim_in"
    ((lib_out > 0 && lib_in > 0)) || fail "$name $run: nothing moved (the check would be empty)"
    [[ "$sim_out $sim_in" == "$lib_out $lib_in" ]] || fail "$name $run: the replay moved other bytes"
  done
}

check mlp 40% "version:off lru:off belady:off version:on lru:on belady:on" -- "$mlp" --steps 20
check mlp 40% "version:off:on lru:off:on belady:off:on belady:on:auto" -- "$mlp" --steps 20
[[ $(grep -c '"type":"slab_alloc"' "$tmp/mlp.belady.on.auto.jsonl") == 0 ]] ||
  fail "mlp auto: small allocations in slabs below the share"

# packed PCT: the run's slab allocations (its slab_alloc records) against
# the replay's, at PCT of the working set.
torchlike_run() { "$torchlike" --alloc per-tensor --graphs eager --steps 2; }
STENSOR_ACCESS_LOG="$tmp/torchlike.uncapped.jsonl" LD_PRELOAD="$lib" torchlike_run > /dev/null
packed() {
  local log="$tmp/torchlike.${1%\%}.jsonl" cap
  cap=$("$sim" sim "$tmp/torchlike.uncapped.jsonl" --limit "$1" --policy version |
    awk '$1 == "cap" { print $2 }')
  [[ $cap =~ ^[0-9]+$ ]] || fail "torchlike: no cap at $1"
  STENSOR_MEMORY_LIMIT=$cap STENSOR_ACCESS_LOG="$log" LD_PRELOAD="$lib" torchlike_run \
    > "$tmp/torchlike.${1%\%}.out" || fail "torchlike at $1: exit $?"
  "$sim" sim "$log" --limit "$cap" > "$tmp/torchlike.${1%\%}.sim" ||
    fail "torchlike at $1: stensor sim exit $?"
  local in_run in_sim
  in_run=$(grep -c '"type":"slab_alloc"' "$log" || true)
  in_sim=$(awk '$1 == "slabs" { print $2 }' "$tmp/torchlike.${1%\%}.sim")
  echo "torchlike auto at $1 ($cap bytes): $in_run allocations in slabs in the run, ${in_sim:-0} in the replay"
  ((in_run > 0)) || fail "torchlike at $1: nothing packed (the check would be empty)"
  [[ $in_run == "${in_sim:-0}" ]] || fail "torchlike at $1: the replay packs other allocations"
}
packed 25%
packed 100%
FAKECUDA_SYNC=1 check transformer 50% "version:off lru:off belady:off" -- "$transformer" --steps 6
FAKECUDA_SYNC=1 check transformer75 75% "version:off:auto lru:off:auto belady:off:auto" -- "$transformer" --steps 6
echo "PASS"
