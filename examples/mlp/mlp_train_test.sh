#!/usr/bin/env bash
# mlp_train on the fake device: prints its working set first, a falling loss
# (the last step below half the first) and the same checksum on every run.
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

# Bad flags are rejected with a usage message, not ignored.
if "$train" --steps nope > /dev/null 2> "$tmp/err.txt"; then fail "--steps nope was accepted"; fi
grep -qi usage "$tmp/err.txt" || fail "no usage message for a bad flag"
