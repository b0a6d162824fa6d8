#!/usr/bin/env bash
# A table rebuilt on the device longer than what stensor knew of its buffer
# (tests/table_regrow.cc): the launch through it must reach every target.
# At a cap that holds the targets but not the pressure beside them, host-
# located VMM on and off, the copy launched eagerly and as a graph's node:
# the uncapped checksum, and every launch through the table names all four
# targets among its writes.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

want=$("$program" "$kernels" | tail -n 1)
[[ $want == checksum* ]] || fail "the run without stensor printed no checksum"
cap=$((5 * 2097152 + 65536))
for run in 1: 0: 1:--graph 0:--graph; do
  vmm=${run%%:*} mode=${run#*:}
  name="vmm$vmm$mode"
  FAKECUDA_HOST_VMM=$vmm STENSOR_MEMORY_LIMIT=$cap STENSOR_ACCESS_LOG="$tmp/$name.jsonl" \
    LD_PRELOAD="$preload" "$program" "$kernels" $mode > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name: table_regrow failed"; }
  [[ $(tail -n 1 "$tmp/$name.out") == "$want" ]] || fail "$name: $(tail -n 1 "$tmp/$name.out"), want $want"
  launches=$(grep -c '"kernel":"_ZN7sources7add_allEPKPfii"' "$tmp/$name.jsonl" || true)
  (( launches == 4 )) || fail "$name: $launches launches through the table logged, want 4"
  grep '"kernel":"_ZN7sources7add_allEPKPfii"' "$tmp/$name.jsonl" | while read -r line; do
    writes=$(sed -E 's/.*"writes":\[([0-9,]*)\].*/\1/' <<< "$line")
    for id in 1 2 3 4; do
      [[ ",$writes," == *",$id,"* ]] || fail "$name: a launch through the table misses target $id: $line"
    done
  done
done
echo "PASS: a table rebuilt longer on the device reaches every target"
