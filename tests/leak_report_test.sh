#!/usr/bin/env bash
# The leak report: a program that exits with device buffers allocated
# (tests/leaky.cc) gets, at exit with STENSOR_STATS=1 or an access log, one
# summary line and a line per buffer, largest first, naming the size, the
# allocating call and the first kernel that used it; uncapped and capped.
# Without either, nothing is said; a program that frees everything gets no
# report (mlp_train).
set -euo pipefail
leaky=$1 fake=$2 stensor=$3 kernels=$4 train=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

axpy="testk::axpy(float, float const*, float*, int)"
want="stensor: 3 device buffers never freed, 3211264 bytes (3.1 MiB) in all:
stensor:   buffer 2: 2097152 bytes on device 0, from cuMemAlloc_v2, first used by $axpy
stensor:   buffer 1: 1048576 bytes on device 0, from cuMemAlloc_v2, first used by $axpy
stensor:   buffer 4: 65536 bytes on device 0, from cuMemAllocAsync, first used by no kernel"
for setting in STENSOR_STATS=1 "STENSOR_ACCESS_LOG=$tmp/log.jsonl" "STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=5MiB"; do
  # shellcheck disable=SC2086
  env $setting LD_PRELOAD="$preload" "$leaky" "$kernels" > "$tmp/out.txt" 2> "$tmp/err.txt" ||
    fail "$setting: exit $?: $(cat "$tmp/err.txt")"
  grep -qx ok "$tmp/out.txt" || fail "$setting: no ok"
  grep -A3 'never freed' "$tmp/err.txt" > "$tmp/got.txt" || true
  diff <(echo "$want") "$tmp/got.txt" > "$tmp/diff.txt" ||
    fail "$setting: the leak report differs: $(cat "$tmp/diff.txt") (stderr: $(cat "$tmp/err.txt"))"
done

LD_PRELOAD="$preload" "$leaky" "$kernels" > /dev/null 2> "$tmp/err.txt"
! grep -q "never freed" "$tmp/err.txt" || fail "a report without STENSOR_STATS or a log"
STENSOR_STATS=1 LD_PRELOAD="$preload" "$train" --steps 2 > /dev/null 2> "$tmp/err.txt"
! grep -q "never freed" "$tmp/err.txt" || fail "mlp_train frees everything, yet: $(cat "$tmp/err.txt")"
echo PASS
