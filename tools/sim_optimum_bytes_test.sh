#!/usr/bin/env bash
# The default policy against the exact optimum (the bytes target): the
# recorded uncapped log of mlp_train --steps 20 (tools/testdata) replayed by
# `stensor sim --compare --host-vmm off` (whole buffers: nothing served, as
# the optimum's rules) at caps of 40, 50 and 60 % of its working set;
# belady, with prefetch (the default) and without, moves at most 1.1 times
# the bytes of the exact optimum, proven by the 0-1 program. Without buffers
# written in a burst kept in sequence, the dataset's shards are evicted
# first-written first at start (the ones read first): 1.24 x at 60 %.
set -euo pipefail
sim=$1 log=$2
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
gzip -dc "$log" > "$tmp/mlp20.jsonl" || fail "$log: cannot decompress"
for cap in 40% 50% 60%; do
  "$sim" sim "$tmp/mlp20.jsonl" --limit "$cap" --compare --exact-seconds 60 --host-vmm off \
    > "$tmp/out" ||
    fail "stensor sim --compare at $cap: exit $?"
  grep -q '^exact: the optimum moves' "$tmp/out" ||
    fail "at $cap the optimum was not proven: $(grep '^exact' "$tmp/out")"
  exact=$(awk '$1 == "exact" && $2 == "-" { print $5 }' "$tmp/out")
  for prefetch in off on; do
    moved=$(awk -v p="$prefetch" '$1 == "belady" && $2 == p { print $5 }' "$tmp/out")
    [[ -n $moved && -n $exact ]] || fail "at $cap: no belady $prefetch or exact row in: $(cat "$tmp/out")"
    echo "at $cap, belady prefetch $prefetch: $moved MiB, exact optimum $exact MiB"
    awk -v m="$moved" -v e="$exact" 'BEGIN { exit !(e > 0 && m <= 1.1 * e) }' ||
      fail "at $cap belady prefetch $prefetch moved $moved MiB, more than 1.1 x the optimum $exact"
  done
done
echo PASS
