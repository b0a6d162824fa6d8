#!/usr/bin/env bash
# mlp_train on the fake device: prints its working set first, a falling loss
# (the last step below half the first) and the same checksum on every run;
# with --threads, one model per thread, each equal to a one-thread run's.
set -euo pipefail
train=$1
# As scripts/with-fake-gpu does: the binary names no path to its driver.
export LD_LIBRARY_PATH=$(cd "$(dirname "$2")" && pwd)
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

"$train" --steps 40 > "$tmp/run1.txt"
"$train" --steps 40 > "$tmp/run2.txt"

head -n 1 "$tmp/run1.txt" | grep -Eq '^working_set [0-9]+$' || fail "first line is not 'working_set <bytes>'"
ws=$(head -n 1 "$tmp/run1.txt" | cut -d' ' -f2)
(( ws >= 64 * 1024 * 1024 )) || fail "default working set $ws is below 64 MiB"
steps=$(grep -c '^step ' "$tmp/run1.txt")
(( steps == 40 )) || fail "expected 40 step lines, got $steps"
tail -n 1 "$tmp/run1.txt" | grep -Eq '^checksum [0-9a-f]{16}$' || fail "last line is not 'checksum <16 hex digits>'"

first=$(grep '^step ' "$tmp/run1.txt" | head -n 1 | awk '{print $4}')
last=$(grep '^step ' "$tmp/run1.txt" | tail -n 1 | awk '{print $4}')
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f / 2) }' || fail "loss fell from $first only to $last"

cmp -s "$tmp/run1.txt" "$tmp/run2.txt" || { diff "$tmp/run1.txt" "$tmp/run2.txt" >&2; fail "two runs differ"; }
echo "PASS: working_set $ws, loss $first -> $last, $(tail -n 1 "$tmp/run1.txt")"

# --threads 4: four models, each on a thread and a stream of its own, thread t
# seeded with seed + t. Output: the working set of all four, thread 0's step
# lines, a checksum per thread in order, then the checksum over all four; the
# same on every run, and each thread's model that of a one-thread run.
"$train" --threads 4 --steps 10 > "$tmp/threads1.txt"
"$train" --threads 4 --steps 10 > "$tmp/threads2.txt"
"$train" --steps 10 > "$tmp/seed1.txt"
"$train" --steps 10 --seed 2 > "$tmp/seed2.txt"
cmp -s "$tmp/threads1.txt" "$tmp/threads2.txt" || { diff "$tmp/threads1.txt" "$tmp/threads2.txt" >&2; fail "two --threads 4 runs differ"; }
(( $(wc -l < "$tmp/threads1.txt") == 1 + 10 + 4 + 1 )) || fail "--threads 4 --steps 10 printed $(wc -l < "$tmp/threads1.txt") lines, expected 16"
ws4=$(head -n 1 "$tmp/threads1.txt" | awk '$1 == "working_set" {print $2}')
ws1=$(head -n 1 "$tmp/seed1.txt" | cut -d' ' -f2)
[[ $ws4 == $((4 * ws1)) ]] || fail "--threads 4 working set '$ws4' is not 4 x $ws1"
cmp -s <(grep '^step ' "$tmp/threads1.txt") <(grep '^step ' "$tmp/seed1.txt") || fail "thread 0's step lines differ from a one-thread run's"
(( $(grep -Ec '^thread [0-9]+ checksum [0-9a-f]{16}$' "$tmp/threads1.txt") == 4 )) || fail "--threads 4: expected 4 'thread T checksum <16 hex digits>' lines"
[[ $(sed -n '12,15p' "$tmp/threads1.txt" | cut -d' ' -f1,2 | tr '\n' ,) == "thread 0,thread 1,thread 2,thread 3," ]] ||
  fail "--threads 4: lines 12-15 are not the thread checksums in thread order"
tail -n 1 "$tmp/threads1.txt" | grep -Eq '^checksum [0-9a-f]{16}$' || fail "--threads 4: last line is not 'checksum <16 hex digits>'"
thread_sum() { awk -v t="$1" '$1 == "thread" && $2 == t {print $4}' "$tmp/threads1.txt"; }
[[ $(thread_sum 0) == $(tail -n 1 "$tmp/seed1.txt" | cut -d' ' -f2) ]] || fail "thread 0's checksum differs from a --seed 1 run's"
[[ $(thread_sum 1) == $(tail -n 1 "$tmp/seed2.txt" | cut -d' ' -f2) ]] || fail "thread 1's checksum differs from a --seed 2 run's"
[[ $(tail -n 1 "$tmp/threads1.txt") != "$(tail -n 1 "$tmp/seed1.txt")" ]] || fail "--threads 4: the total checksum is thread 0's alone"
echo "PASS: --threads 4: working_set $ws4, $(tail -n 1 "$tmp/threads1.txt"), thread 0 = seed 1, thread 1 = seed 2"

# Bad flags are rejected with a usage message, not ignored.
for bad in "--steps nope" "--threads 0" "--threads 65"; do
  if "$train" $bad > /dev/null 2> "$tmp/err.txt"; then fail "$bad was accepted"; fi
  grep -qi usage "$tmp/err.txt" || fail "no usage message for $bad"
done
