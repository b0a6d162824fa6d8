#!/usr/bin/env bash
# transformer_train on the fake device: prints its working set first, one
# loss line per step with a falling loss, step times with --step-times, and
# the same checksum on every run; under libstensor.so capped at 50 % of the
# working set the output is bit-identical, something was swapped, and the
# access log shows per-step temporaries (buffers allocated and freed within
# each step, some stream-ordered). Bad flags are rejected.
set -euo pipefail
train=$1
# As scripts/with-fake-gpu does: the binary names no path to its driver.
export LD_LIBRARY_PATH=$(cd "$(dirname "$2")" && pwd)
stensor=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
source "$(dirname "$0")/../../tests/preload.bash"
preload=$(preload_of "$stensor")
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
steps=6

"$train" --steps $steps > "$tmp/run1.txt"
"$train" --steps $steps > "$tmp/run2.txt"

head -n 1 "$tmp/run1.txt" | grep -Eq '^working_set [0-9]+$' || fail "first line is not 'working_set <bytes>'"
ws=$(head -n 1 "$tmp/run1.txt" | cut -d' ' -f2)
(( ws >= 16 * 1024 * 1024 )) || fail "default working set $ws is below 16 MiB"
(( $(grep -c '^step ' "$tmp/run1.txt") == steps )) || fail "expected $steps step lines"
tail -n 1 "$tmp/run1.txt" | grep -Eq '^checksum [0-9a-f]{16}$' || fail "last line is not 'checksum <16 hex digits>'"
first=$(grep '^step ' "$tmp/run1.txt" | head -n 1 | awk '{print $4}')
last=$(grep '^step ' "$tmp/run1.txt" | tail -n 1 | awk '{print $4}')
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 1) }' || fail "loss fell from $first only to $last"
cmp -s "$tmp/run1.txt" "$tmp/run2.txt" || { diff "$tmp/run1.txt" "$tmp/run2.txt" >&2; fail "two runs differ"; }
want=$(tail -n 1 "$tmp/run1.txt")
echo "PASS: working_set $ws, loss $first -> $last, $want"

# --step-times adds one 'step_time <n> <seconds>' after each step line and
# changes nothing else.
"$train" --steps $steps --step-times > "$tmp/times.txt"
(( $(grep -Ec '^step_time [0-9]+ [0-9]+\.[0-9]+$' "$tmp/times.txt") == steps )) || fail "--step-times: expected $steps step_time lines"
cmp -s <(grep -v '^step_time ' "$tmp/times.txt") "$tmp/run1.txt" || fail "--step-times changed the other output"
[[ $(grep -A1 '^step 2 ' "$tmp/times.txt" | tail -n 1 | cut -d' ' -f1,2) == "step_time 2" ]] || fail "step_time 2 does not follow step 2"

# A different seed trains a different model.
"$train" --steps 2 --seed 2 > "$tmp/seed2.txt"
"$train" --steps 2 > "$tmp/seed1.txt"
[[ $(tail -n 1 "$tmp/seed2.txt") != "$(tail -n 1 "$tmp/seed1.txt")" ]] || fail "--seed 2 gave the --seed 1 checksum"

# Under stensor at 50 % of the working set: the same output, bit for bit,
# with swapping, within the cap, and an access log to read.
cap=$((ws / 2))
FAKECUDA_REPORT_PEAK=1 STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=$cap STENSOR_ACCESS_LOG="$tmp/log.jsonl" \
  LD_PRELOAD="$preload" "$train" --steps $steps > "$tmp/capped.txt" 2> "$tmp/capped.err" ||
  { cat "$tmp/capped.err" >&2; fail "transformer_train failed under a cap of $cap bytes"; }
cmp -s "$tmp/capped.txt" "$tmp/run1.txt" || { diff "$tmp/run1.txt" "$tmp/capped.txt" >&2; fail "output under a 50 % cap differs"; }
swapped=$(sed -n 's/^stensor: swap-outs copied *\([0-9]*\) .*/\1/p' "$tmp/capped.err")
dropped=$(sed -n 's/^stensor: clean drops *\([0-9]*\) .*/\1/p' "$tmp/capped.err")
(( swapped + dropped > 0 )) || { cat "$tmp/capped.err" >&2; fail "nothing was evicted under a 50 % cap"; }
peak=$(sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/capped.err")
(( peak <= cap )) || fail "device high-water mark $peak above the cap $cap"
echo "PASS: under a cap of $cap bytes: $want, $swapped swap-outs copied, $dropped clean drops, peak $peak"

# The access log, cut into steps at the stream synchronisation that ends
# each one: every step allocates and frees temporaries of its own (large ones
# with cuMemAlloc, small ones stream-ordered), the same ones every step; every
# other buffer is persistent: allocated before the first step ended and
# freed after the last.
python3 - "$tmp/log.jsonl" "$steps" <<'PY'
import json, sys
path, steps = sys.argv[1], int(sys.argv[2])
def fail(msg):
    print("FAIL: access log: " + msg, file=sys.stderr)
    sys.exit(1)
records = [json.loads(line) for line in open(path)]
step = 0           # syncs seen so far: the step in progress
born = {}          # live buffer id -> (step of its alloc, kind, bytes)
temporaries = {}   # step -> [(kind, bytes)] allocated and freed within it
persistent = 0
for r in records:
    t = r.get("type")
    if t == "sync" and r.get("api") == "cuStreamSynchronize":
        step += 1
    elif t == "alloc":
        if r["id"] == 0:
            fail("untracked allocation %r" % r)
        born[r["id"]] = (step, r["kind"], r["bytes"])
    elif t == "free" and r["id"] in born:
        s, kind, size = born.pop(r["id"])
        if s == step and step < steps:
            temporaries.setdefault(s, []).append((kind, size))
        elif s == 0 and step >= steps:
            persistent += 1
        else:
            fail("buffer %d allocated in step %d was freed in step %d" % (r["id"], s, step))
if step < steps:
    fail("saw %d stream synchronisations, expected at least %d" % (step, steps))
if born:
    fail("buffers %r were never freed" % sorted(born))
if persistent == 0:
    fail("no persistent buffers")
for s in range(steps):
    temps = temporaries.get(s, [])
    big = [b for k, b in temps if k == "device" and b >= 2 << 20]
    ordered = [b for k, b in temps if k == "stream_ordered"]
    if len(big) < 4:
        fail("step %d: %d cuMemAlloc temporaries of at least 2 MiB, expected 4 or more" % (s, len(big)))
    if not ordered:
        fail("step %d: no stream-ordered temporaries" % s)
    if temps != temporaries[0]:
        fail("step %d allocated other temporaries than step 0" % s)
print("PASS: access log: %d temporaries per step (%d of at least 2 MiB, %d stream-ordered), %d persistent buffers"
      % (len(temporaries[0]), len(big), len(ordered), persistent))
PY

# Bad flags are rejected with a usage message, not ignored.
for bad in "--steps nope" "--dim 0" "--vocab 1" "--layers -1" "--lr x" "--bogus 1" "extra"; do
  if "$train" $bad > /dev/null 2> "$tmp/err.txt"; then fail "$bad was accepted"; fi
  grep -qi usage "$tmp/err.txt" || fail "no usage message for $bad"
done
if "$train" --dim 65536 --seq 65536 > /dev/null 2> "$tmp/err.txt"; then fail "sizes past 2^31 elements were accepted"; fi
grep -q "too large" "$tmp/err.txt" || fail "no 'too large' message for oversized shapes"
echo "PASS: bad flags rejected"
