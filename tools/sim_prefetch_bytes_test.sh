#!/usr/bin/env bash
# Prefetch never costs bytes, replayed: recorded uncapped access logs
# (tools/testdata: mlp_train --steps 20, mlp_train --hidden 2048 --steps 12,
# transformer_train --steps 12, from the fake driver) are replayed by
# `stensor sim` under belady at caps of 40-75 % of their working sets and
# with launches of 100 and 1000 us, with prefetch off and on; with it on, the
# bytes moved (device->host plus host->device plus served over the link,
# where a buffer is served rather than brought in) are at most 1.05 times those
# with it off plus one largest buffer of the program. The same log replayed
# twice gives the same bytes. (Logs, not live runs: the replay is what is
# checked, and the programs' own runs are tests/prefetch_test's.)
set -euo pipefail
sim=$1
shift
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
for log in "$@"; do
  name=$(basename "$log" .jsonl.gz)
  gzip -dc "$log" > "$tmp/$name.jsonl" || fail "$log: cannot decompress"
done

moved() {  # moved LOG CAP PREFETCH KERNEL_US: bytes out plus in plus served over the link
  "$sim" sim "$tmp/$1.jsonl" --limit "$2" --policy belady --prefetch "$3" --kernel-us "$4" \
    > "$tmp/run.sim" || fail "stensor sim $1 --limit $2 --prefetch $3: exit $?"
  awk '$1 == "moved" { m = $2 } $1 == "served" && $2 == "from" { s = $4 }
       END { if (m != "" && s != "") print m + s }' "$tmp/run.sim"
}

checked=0
for run in mlp20:40% mlp20:50% mlp20:60% mlp2048_12:50% mlp2048_12:75% transformer12:50% \
  transformer12:75%; do
  name=${run%%:*} cap=${run#*:}
  largest=$(grep -o '"bytes":[0-9]*' "$tmp/$name.jsonl" | cut -d: -f2 | sort -n | tail -n 1)
  [[ -n $largest ]] || fail "$name: no allocation in the log (is it in the test's data?)"
  for us in 100 1000; do
    off=$(moved "$name" "$cap" off "$us") on=$(moved "$name" "$cap" on "$us")
    again=$(moved "$name" "$cap" on "$us")
    [[ -n $off && -n $on ]] || fail "$name $cap: no 'moved' line"
    echo "$name at $cap, $us us per launch: prefetch off $off bytes, on $on"
    (( off > 0 )) || fail "$name at $cap: nothing moved (the check would be empty)"
    [[ $on == "$again" ]] || fail "$name at $cap: replayed twice, $on then $again bytes"
    awk -v on="$on" -v off="$off" -v b="$largest" 'BEGIN { exit !(on <= off * 1.05 + b) }' ||
      fail "$name at $cap, $us us: prefetch on moved $on bytes, off $off (largest buffer $largest)"
    checked=$((checked + 1))
  done
done
(( checked == 14 )) || fail "$checked of 14 checks ran"
echo PASS
