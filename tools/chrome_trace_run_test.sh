#!/usr/bin/env bash
# `stensor trace` end to end (the stensor binary), each
# trace checked by check_chrome_trace.py with python3's json against its log:
# the recorded mlp_train --steps 20 log (from a file and through - / -o -),
# mlp_train with two threads (a track per stream), and mlp_train under a cap
# recorded here under the preload on the fake driver (swap track; resident
# bytes under the cap). A log cut mid-line and foreign files fail with one
# line naming the file and the line, exit 1, leaving no trace file; bad
# flags exit 2 with the usage.
set -euo pipefail
stensor=$1 recorded=$2 check=$3 train=$4 fake=$5 lib=$6
trace() { "$stensor" trace "$@"; }
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
source "$(dirname "$0")/../tests/preload.bash"
lib=$(preload_of "$lib")

# The recorded log, from a file and from standard input to standard output.
gzip -dc "$recorded" > "$tmp/mlp20.jsonl"
trace "$tmp/mlp20.jsonl" -o "$tmp/mlp20.json" || fail "mlp20: exit $?"
python3 "$check" "$tmp/mlp20.json" "$tmp/mlp20.jsonl" uncapped
gzip -dc "$recorded" | trace - -o - > "$tmp/stdin.json" || fail "- -o -: exit $?"
python3 "$check" "$tmp/stdin.json" "$tmp/mlp20.jsonl" uncapped

# Two threads, each on a stream of its own.
STENSOR_ACCESS_LOG="$tmp/threads.jsonl" LD_PRELOAD="$lib" "$train" --steps 3 --threads 2 \
  > /dev/null || fail "mlp_train --threads 2: exit $?"
trace "$tmp/threads.jsonl" -o "$tmp/threads.json" || fail "threads: exit $?"
python3 "$check" "$tmp/threads.json" "$tmp/threads.jsonl" uncapped
python3 - "$tmp/threads.json" <<'PY' || fail "threads: not two stream tracks with kernels"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
streams = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
           and e["args"]["name"].startswith("stream 0x")}
kernels = {e["tid"] for e in events if e["ph"] == "X" and e["cat"] == "kernel"}
sys.exit(not (len(streams) == 2 and kernels == streams))
PY

# Capped at 40 % of mlp_train's working set (76689860 bytes), and so with
# small allocations packed into slabs (STENSOR_SLABS=on).
for name in capped slabs; do
  slabs=off
  [[ $name == slabs ]] && slabs=on
  STENSOR_SLABS=$slabs STENSOR_MEMORY_LIMIT=30687232 STENSOR_STATS=1 \
    STENSOR_ACCESS_LOG="$tmp/$name.jsonl" LD_PRELOAD="$lib" "$train" --steps 6 > /dev/null \
    2> "$tmp/$name.err" || fail "$name mlp_train: exit $?"
  trace "$tmp/$name.jsonl" -o "$tmp/$name.json" || fail "$name: exit $?"
  python3 "$check" "$tmp/$name.json" "$tmp/$name.jsonl" capped
  # The resident curve counts what the library charges (tools/charge.h): its
  # peak is the library's own "peak resident", to the statistics' 0.1 MiB.
  stats_peak=$(sed -n 's/^stensor: peak resident *\([0-9.]*\) MiB$/\1/p' "$tmp/$name.err")
  trace_peak=$(python3 -c '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
print("%.1f" % (max(e["args"]["bytes"] for e in events
                    if e["ph"] == "C" and e["name"] == "device 0 resident") / 1048576))' "$tmp/$name.json")
  [[ -n $stats_peak && $stats_peak == "$trace_peak" ]] ||
    fail "$name: the trace's resident peak ${trace_peak} MiB, the library's ${stats_peak:-none} MiB"
done
grep -q '"type":"slab"' "$tmp/slabs.jsonl" || fail "slabs: no slab made"

# expect_error STATUS PATTERN ARGS...: exits STATUS with one line on stderr
# that matches PATTERN, and leaves no trace file behind.
expect_error() {
  local want=$1 pattern=$2 status=0
  shift 2
  rm -f "$tmp/bad.json"
  trace "$@" > "$tmp/bad.out" 2> "$tmp/bad.err" || status=$?
  ((status == want)) || fail "$*: exit $status, want $want: $(cat "$tmp/bad.err")"
  grep -q -- "$pattern" "$tmp/bad.err" || fail "$*: no '$pattern' in: $(cat "$tmp/bad.err")"
  [[ ! -e $tmp/bad.json ]] || fail "$*: left a trace file"
  echo "$* -> exit $status: $(head -n 1 "$tmp/bad.err")"
}

# Cut in the middle of line 41.
{ head -n 40 "$tmp/capped.jsonl"; sed -n 41p "$tmp/capped.jsonl" | head -c 30; } > "$tmp/cut.jsonl"
expect_error 1 "cut.jsonl:41: .*truncated" "$tmp/cut.jsonl" -o "$tmp/bad.json"
(($(wc -l < "$tmp/bad.err") == 1)) || fail "truncated: more than one line: $(cat "$tmp/bad.err")"
# A JSON file that is not an access log, pretty-printed and on one line.
printf '{\n  "traceEvents": []\n}\n' > "$tmp/pretty.json"
expect_error 1 "pretty.json:1: not a stensor access log" "$tmp/pretty.json" -o "$tmp/bad.json"
echo '{"type":"alloc","id":1,"bytes":4}' > "$tmp/nohead.jsonl"
expect_error 1 "nohead.jsonl:1: not a stensor access log" "$tmp/nohead.jsonl" -o "$tmp/bad.json"
expect_error 1 "missing.jsonl: cannot open" "$tmp/missing.jsonl" -o "$tmp/bad.json"

# Bad flags.
expect_error 2 "usage: stensor trace" "$tmp/mlp20.jsonl"
expect_error 2 "unknown flag --bogus" "$tmp/mlp20.jsonl" -o "$tmp/bad.json" --bogus
expect_error 2 "--op-us '0'" "$tmp/mlp20.jsonl" -o "$tmp/bad.json" --op-us 0
cp "$tmp/mlp20.jsonl" "$tmp/self.jsonl"
expect_error 2 "is the log itself" "$tmp/self.jsonl" -o "$tmp/self.jsonl"
cmp -s "$tmp/mlp20.jsonl" "$tmp/self.jsonl" || fail "-o LOG changed the log"
trace --help > "$tmp/help" || fail "--help: exit $?"
grep -q "ui.perfetto.dev" "$tmp/help" || fail "--help does not say how to open the trace"
echo "PASS"
