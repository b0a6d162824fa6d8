#!/usr/bin/env bash
# Every entry point libstensor.so exports, called through the library on the
# fake driver (tests/hooks_all.cc), in three runs of the same program:
#   plain   without stensor: the fake's own answers;
#   nocap   stensor preloaded, no cap;
#   cap     stensor under a cap that holds two of its four 2 MiB buffers, so
#           every buffer a valid call touches is swapped out before it.
# Checked:
#   - every hook the library exports (nm -D) was called in both preloaded
#     runs: a hook added without a case here fails the test;
#   - the fake's CUresults (the plain run's) are a real driver's, recorded
#     on a GPU (tests/gpu/driver_580_h200.answers, compared by label with
#     tests/driver_answers.py, which lists the few labels allowed to differ
#     and why);
#   - each call's CUresult, and the values the program prints, are the
#     fake's (the plain run's), line for line; under the cap, the few that
#     must differ are listed below and checked by the program itself;
#   - the program's own checks (every byte of every buffer against a model,
#     attributes, handles) held;
#   - the access log holds exactly the records the calls must write, in order
#     (tests/hooks_check.py), and under the cap each marked buffer was
#     swapped out when its call began.
set -euo pipefail
prog=$1 fake=$2 stensor=$3 kernels=$4 checker=$5 driver_answers=$6 compare=$7
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

# The hooks, from the library itself: its defined dynamic functions but dlsym
# and PyTorch's allocator pair (not driver entry points: called by
# tests/torch_allocator_test.sh), which must be there, NVML's hooks
# (tests/nvml_test.sh) and the statistics (python/stensor's tests).
nm -D --defined-only "$stensor" | awk '$2 == "T" || $2 == "W" { print $3 }' | sort > "$tmp/all"
for name in stensor_torch_malloc stensor_torch_free; do
  grep -qx "$name" "$tmp/all" || fail "libstensor.so does not export $name"
done
grep -Evx 'stensor_torch_(malloc|free)|stensor_stats_json|nvml.*' "$tmp/all" > "$tmp/exported"
grep '^cu' "$tmp/exported" > "$tmp/hooks" || fail "libstensor.so exports no cu* symbol"
grep -qx dlsym "$tmp/exported" || fail "libstensor.so does not export dlsym"
(( $(wc -l < "$tmp/hooks") >= 100 )) || fail "only $(wc -l < "$tmp/hooks") hooks exported"

# Two 2 MiB buffers and 1 MiB for the driver's small allocations.
cap=$(( (2 << 20) * 2 + (1 << 20) ))
run() {  # run NAME [VAR=value...]
  local name=$1
  shift
  env "$@" "$prog" "$kernels" "$tmp/hooks" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
}
run plain
python3 "$compare" "$driver_answers" "$tmp/plain.out" || fail "the fake's answers are not the driver's"
run nocap LD_PRELOAD="$preload" STENSOR_ACCESS_LOG="$tmp/nocap.jsonl"
# lru and no prefetch: the program swaps a buffer out by writing two others.
run cap LD_PRELOAD="$preload" STENSOR_ACCESS_LOG="$tmp/cap.jsonl" STENSOR_MEMORY_LIMIT=$cap \
  STENSOR_POLICY=lru STENSOR_PREFETCH=off STENSOR_STATS=1

for name in nocap cap; do
  sed -n 's/^called //p' "$tmp/$name.out" | sort > "$tmp/$name.called"
  missing=$(comm -23 "$tmp/exported" "$tmp/$name.called")
  [[ -z $missing ]] || fail "$name: exported hooks never called: $(echo $missing)"
done

results() { grep -E '^(rc|val) ' "$tmp/$1.out" | grep -Ev "${2:-^$}" || true; }
diff <(results plain) <(results nocap) > "$tmp/nocap.diff" ||
  { head -20 "$tmp/nocap.diff" >&2; fail "stensor without a cap answers differently from the driver"; }
# Under the cap: the device's size is the cap (checked by the program); the
# buffers are VMM memory, so IPC is refused (at the base and inside),
# P2P tokens are refused, and cuMemRetainAllocationHandle works
# (docs/limits.md), and its handle is released; an allocation above the device's
# size as the program sees it (the cap) but within its memory is born in
# host memory, not refused.
differs='^(val cuMemGetInfo_v2/total|val cuDeviceTotalMem_v2/total|rc cuIpcGetMemHandle/(valid|interior)|rc cuPointerGetAttribute/p2p-tokens|rc cuMemRetainAllocationHandle/stensor-buffer|rc cuMemRelease/stensor-buffer|rc cuMemAlloc_v2/above-device) '
diff <(results plain "$differs") <(results cap "$differs") > "$tmp/cap.diff" ||
  { head -20 "$tmp/cap.diff" >&2; fail "stensor under a cap answers differently from the driver"; }
(( $(grep -Ec "$differs" "$tmp/cap.out") == 6 )) || fail "cap: the expected differences are not all there"
diff <(grep -E "$differs" "$tmp/plain.out" | grep '^rc ') <(grep -E "$differs" "$tmp/cap.out") \
  > /dev/null && fail "cap: the expected differences are not different"

python3 "$checker" "$tmp/nocap.jsonl" "$tmp/nocap.out" 0 || fail "nocap: access log"
python3 "$checker" "$tmp/cap.jsonl" "$tmp/cap.out" 1 | tee "$tmp/cap.check" || fail "cap: access log"
swapped=$(sed -n 's/.*; \([0-9]*\) buffers swapped out.*/\1/p' "$tmp/cap.check")
(( swapped >= 80 )) || fail "cap: only ${swapped:-0} calls found their buffer swapped out"
copied=$(sed -n 's/^stensor: swap-outs copied *\([0-9]*\) .*/\1/p' "$tmp/cap.err")
(( copied >= 50 )) || fail "cap: only ${copied:-0} swap-outs copied"
echo "PASS: $(wc -l < "$tmp/hooks") hooks and dlsym, $(grep -c '^rc ' "$tmp/plain.out") results" \
  "compared, $swapped calls on swapped-out buffers"
