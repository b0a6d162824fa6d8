#!/usr/bin/env bash
# fork() under stensor (tests/fork_child.cc), capped and uncapped: the
# parent's access log has one header, one end record and only its own
# records (no line written twice by a child's exit), its statistics print
# once, a child that calls the driver gets CUDA_ERROR_NOT_INITIALIZED as
# from the real driver and, with %p in the path, its own log; without %p a
# child writes no log and says so. Repeated: a copy is in flight at the fork.
set -euo pipefail
prog=$1 fake=$2 stensor=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
# Under ASan no thread is in malloc at the fork (tests/fork_child.cc says why).
quiet=()
[[ $preload == *libasan* ]] && quiet=(--quiet-fork)

check_log() {  # check_log FILE: one header, one end, valid JSON lines, no repeats
  python3 - "$1" <<'PY' || fail "$1: $(tail -c 300 "$1")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
recs = [json.loads(l) for l in lines]
types = [r.get("type") for r in recs]
assert types.count("header") == 1, types.count("header")
assert types[0] == "header" and types[-1] == "end" and types.count("end") == 1, types[-3:]
allocs = [r["id"] for r in recs if r.get("type") == "alloc"]
assert len(allocs) == len(set(allocs)), "an alloc record written twice"
PY
}

for cap in "" 12MiB; do
  for i in $(seq 1 10); do
    rm -f "$tmp"/log.* "$tmp/child.err"
    STENSOR_MEMORY_LIMIT=$cap STENSOR_STATS=1 STENSOR_ACCESS_LOG="$tmp/log.%p" LD_PRELOAD="$preload" \
      "$prog" "$tmp/child.err" "${quiet[@]}" > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err" >&2; fail "cap '$cap': run $i failed"; }
    [[ $(cat "$tmp/out") == ok ]] || fail "cap '$cap': $(cat "$tmp/out")"
    logs=("$tmp"/log.*)
    # The parent's and child 2's; child 1 made no CUDA call.
    (( ${#logs[@]} == 2 )) || fail "cap '$cap': ${#logs[@]} logs: ${logs[*]}"
    for log in "${logs[@]}"; do check_log "$log"; done
    if [[ -n $cap ]]; then
      n=$(grep -c '^stensor: policy' "$tmp/err" || true)
      (( n == 1 )) || fail "cap '$cap': the statistics printed $n times"
    fi
  done
done

# One path for every process: only the parent writes it.
STENSOR_ACCESS_LOG="$tmp/single.jsonl" LD_PRELOAD="$preload" "$prog" "$tmp/child.err" "${quiet[@]}" > "$tmp/out" 2> "$tmp/err" ||
  { cat "$tmp/err" >&2; fail "single log: failed"; }
check_log "$tmp/single.jsonl"
grep -q 'a child of fork() writes no access log' "$tmp/child.err" ||
  fail "the child did not say why it writes no log: $(cat "$tmp/child.err")"
echo "fork_test: ok"
