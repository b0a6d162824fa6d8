#!/usr/bin/env bash
# Tensors of one segment under a cap (tests/segment_reach.cc): with
# host-located VMM, of a swapped-out segment only what a kernel's pointers
# likely reach is fetched and the rest served, and kernels that reach past
# that guess still read and write every word right: the same checksum as
# without stensor under each policy, with the pieces left on host counted.
# The access log lists where the kernels' pointers start inside buffers,
# and `stensor sim` leaves the same pieces on host as the library. Then two
# threads at once on tensors of the same segment, each on its own stream,
# run after run: the same checksum every time.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4 cli=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICE_MEMORY=1GiB
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
rounds=4

"$program" "$kernels" $rounds > "$tmp/plain.out" 2> "$tmp/plain.err" ||
  { cat "$tmp/plain.err" >&2; fail "uncapped without stensor"; }
want=$(grep '^checksum' "$tmp/plain.out")
for policy in belady lru; do
  name=$policy
  env FAKECUDA_HOST_VMM=1 LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=24MiB STENSOR_STATS=1 \
    STENSOR_POLICY=$policy STENSOR_ACCESS_LOG="$tmp/$name.jsonl" \
    "$program" "$kernels" $rounds > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  [[ $(grep '^checksum' "$tmp/$name.out") == "$want" ]] || fail "$name: checksum differs"
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
  far=$(sed -n 's/.* \([0-9][0-9]*\) of them, pieces a kernel held but likely did not touch.*/\1/p' "$tmp/$name.err")
  (( ${far:-0} > 0 )) || fail "$name: no piece left on host for a kernel that did not name it"
  grep -q '"pointers":\[\[' "$tmp/$name.jsonl" || fail "$name: no interior pointer in the access log"
  "$cli" sim "$tmp/$name.jsonl" --limit 24MiB --policy "$policy" > "$tmp/$name.sim" 2>&1 ||
    { cat "$tmp/$name.sim" >&2; fail "$name: stensor sim failed"; }
  sim_far=$(sed -n 's/.* \([0-9][0-9]*\) of them, pieces no pointer of a launch reached.*/\1/p' "$tmp/$name.sim")
  (( ${sim_far:-0} > 0 )) || fail "$name: stensor sim served no piece the launches' pointers left out"
  grep -q '^stensor: out of memory  *0$' "$tmp/$name.err" || fail "$name: out-of-memory errors counted"
  echo "$name: $far pieces served rather than fetched ($sim_far in the sim's replay), same checksum"
done

"$program" "$kernels" $rounds threads > "$tmp/plain-threads.out" 2> "$tmp/plain-threads.err" ||
  { cat "$tmp/plain-threads.err" >&2; fail "two threads, uncapped without stensor"; }
want=$(grep '^checksum' "$tmp/plain-threads.out")
for i in $(seq 1 8); do
  name=threads$i policy=$([[ $((i % 2)) == 0 ]] && echo belady || echo lru)
  env FAKECUDA_HOST_VMM=1 LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=24MiB STENSOR_STATS=1 \
    STENSOR_POLICY=$policy "$program" "$kernels" $rounds threads > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name ($policy): the program failed"; }
  [[ $(grep '^checksum' "$tmp/$name.out") == "$want" ]] || fail "$name ($policy): checksum differs"
  grep -qx ok "$tmp/$name.out" || fail "$name ($policy): no ok"
done
far=$(sed -n 's/.* \([0-9][0-9]*\) of them, pieces a kernel held but likely did not touch.*/\1/p' "$tmp/threads1.err")
echo "two threads: 8 runs, same checksum ($far pieces served rather than fetched in the first)"
echo PASS
