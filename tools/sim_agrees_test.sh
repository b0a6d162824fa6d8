#!/usr/bin/env bash
# `stensor sim` agrees with the library: mlp_train --steps 20 runs under
# libstensor.so at a cap of 40 % of its working set (as `stensor sim` computes
# it from an uncapped log) with the access log and STENSOR_STATS=1, for the
# `version` and `lru` policies; replaying each run's log at the same cap and
# policy gives device->host and host->device bytes within 5 % of the
# library's own statistics, and both move something.
set -euo pipefail
train=$1 fake=$2 lib=$3 sim=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")

STENSOR_ACCESS_LOG="$tmp/uncapped.jsonl" LD_PRELOAD="$lib" "$train" --steps 20 > "$tmp/uncapped.out"
"$sim" sim "$tmp/uncapped.jsonl" --limit 40% --policy version > "$tmp/uncapped.sim" ||
  fail "stensor sim on the uncapped log: exit $?"
cap=$(awk '$1 == "cap" { print $2 }' "$tmp/uncapped.sim")
[[ $cap =~ ^[0-9]+$ ]] || fail "no cap in: $(cat "$tmp/uncapped.sim")"

# within A B: A is within 5 % of B (B in MiB with one decimal, so 0.05 MiB
# of rounding is allowed besides).
within() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05 * b + 0.05) }'; }

for policy in version lru; do
  STENSOR_MEMORY_LIMIT=$cap STENSOR_POLICY=$policy STENSOR_STATS=1 \
    STENSOR_ACCESS_LOG="$tmp/$policy.jsonl" LD_PRELOAD="$lib" "$train" --steps 20 \
    > "$tmp/$policy.out" 2> "$tmp/$policy.err" || fail "$policy: mlp_train exit $?"
  diff <(tail -n 1 "$tmp/uncapped.out") <(tail -n 1 "$tmp/$policy.out") > /dev/null ||
    fail "$policy: checksum differs from the uncapped run"
  lib_out=$(sed -n 's/.*swap-outs copied.*(\([0-9.]*\) MiB device->host).*/\1/p' "$tmp/$policy.err")
  lib_in=$(sed -n 's/.*swap-ins copied.*(\([0-9.]*\) MiB host->device.*/\1/p' "$tmp/$policy.err")
  [[ -n $lib_out && -n $lib_in ]] || fail "$policy: no statistics in: $(cat "$tmp/$policy.err")"
  "$sim" sim "$tmp/$policy.jsonl" --limit "$cap" --policy "$policy" > "$tmp/$policy.sim" ||
    fail "$policy: stensor sim exit $?"
  sim_out=$(awk '$1 == "device->host" { printf "%.3f", $2 / 1048576 }' "$tmp/$policy.sim")
  sim_in=$(awk '$1 == "host->device" { printf "%.3f", $2 / 1048576 }' "$tmp/$policy.sim")
  echo "$policy at $cap bytes: library D2H $lib_out MiB H2D $lib_in MiB; sim D2H $sim_out MiB H2D $sim_in MiB"
  awk -v a="$lib_out" -v b="$lib_in" 'BEGIN { exit !(a > 0 && b > 0) }' ||
    fail "$policy: nothing moved at 40 % (the check would be empty)"
  within "$sim_out" "$lib_out" || fail "$policy: device->host: sim $sim_out MiB, library $lib_out MiB"
  within "$sim_in" "$lib_in" || fail "$policy: host->device: sim $sim_in MiB, library $lib_in MiB"
done
echo "PASS"
