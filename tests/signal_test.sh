#!/usr/bin/env bash
# An ending signal under stensor: mlp_train, capped and logging, is sent
# SIGTERM or SIGHUP mid-run (their default action, as a job scheduler's
# kill finds them). The process still dies of that signal, but first the
# access log gets its end record (the last line whole) and the statistics
# print. A signal the program ignores stays ignored. Repeated: the signal
# lands wherever the program happens to be.
set -euo pipefail
train=$1 fake=$2 stensor=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

ws=$("$train" --steps 1 | sed -n 's/^working_set \([0-9]*\)$/\1/p')
cap=$((ws * 40 / 100))

start() {  # start LOG: mlp_train in the background until killed; sets $pid
  rm -f "$1"
  STENSOR_MEMORY_LIMIT=$cap STENSOR_STATS=1 STENSOR_ACCESS_LOG="$1" LD_PRELOAD="$preload" \
    "$train" --steps 1000000 > /dev/null 2> "$tmp/err" &
  pid=$!
  # Until its log shows it is training (written within 100 ms of each record).
  for _ in $(seq 1 600); do
    grep -q '"type":"launch"' "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  kill -KILL "$pid"
  fail "mlp_train never started: $(cat "$tmp/err")"
}

for sig in TERM HUP; do
  for i in $(seq 1 5); do
    start "$tmp/log.jsonl"
    sleep "0.$((RANDOM % 10))"
    kill -"$sig" "$pid"
    status=0
    wait "$pid" || status=$?
    want=$((128 + $(kill -l "$sig")))
    (( status == want )) || fail "SIG$sig run $i: exit status $status, want $want: $(tail -3 "$tmp/err")"
    python3 - "$tmp/log.jsonl" <<'PY' || fail "SIG$sig run $i: the log does not end with its end record: $(tail -c 300 "$tmp/log.jsonl")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
recs = [json.loads(l) for l in lines]  # every line whole
assert recs[0]["type"] == "header" and recs[-1]["type"] == "end"
PY
    grep -q '^stensor: policy' "$tmp/err" || fail "SIG$sig run $i: no statistics: $(tail -3 "$tmp/err")"
  done
done

# Ignored by the program (as a shell's `trap '' TERM` leaves it): stensor
# does not take it over.
(
  trap '' TERM
  start "$tmp/ignored.jsonl"
  kill -TERM "$pid"
  sleep 1
  kill -0 "$pid" 2>/dev/null || fail "an ignored SIGTERM ended the program"
  kill -KILL "$pid"
  wait "$pid" || true
)
echo "signal_test: ok"
