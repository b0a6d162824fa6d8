#!/usr/bin/env bash
# exit() from a worker thread while three others call the driver
# (tests/exit_race.cc), uncapped and under a cap that makes them swap: the
# process ends with status 0 every time and its access log ends with the
# end record. Repeated: exit lands wherever the others happen to be.
set -euo pipefail
prog=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

for cap in "" 12MiB; do
  for i in $(seq 1 15); do
    status=0
    timeout 60 env STENSOR_MEMORY_LIMIT=$cap STENSOR_STATS=1 STENSOR_ACCESS_LOG="$tmp/log.jsonl" \
      LD_PRELOAD="$preload" "$prog" "$kernels" $((i * 3)) > /dev/null 2> "$tmp/err" || status=$?
    (( status == 0 )) || fail "cap '$cap', run $i: exit status $status: $(grep -v "^stensor:  " "$tmp/err" | head -40)"
    python3 - "$tmp/log.jsonl" <<'PY' || fail "cap '$cap', run $i: $(tail -c 300 "$tmp/log.jsonl")"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
assert recs[0]["type"] == "header" and recs[-1]["type"] == "end", (recs[0], recs[-1])
PY
  done
done
echo "exit_race_test: ok"
