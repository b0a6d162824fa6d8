#!/usr/bin/env bash
# torchlike_train on the fake device under libstensor.so.
#
#   1. Without stensor: every mode (caching or per-tensor allocation, fused
#      or per-parameter AdamW, eager, whole-step or per-layer graphs) prints
#      the same loss lines and checksum (the arithmetic is exact), twice the
#      same, and each its own working set.
#   2. Under stensor without a cap: the same output, the per-tensor mode
#      now through stensor_torch_malloc / stensor_torch_free.
#   3. Under caps of 100/75/50/25 % of each mode's working set, with
#      host-located VMM on (FAKECUDA_HOST_VMM=1) and off: every run prints the
#      baseline's loss lines and checksum bit for bit, no device high-water
#      mark exceeds the cap, and runs below 100 % evicted something. With
#      host VMM off stensor may refuse a combination (a driver call returns
#      CUDA_ERROR_OUT_OF_MEMORY: something one launch reaches does not fit,
#      e.g. the fused AdamW's metadata naming more tensors than the cap
#      holds); that is recorded as "refused", not a failure. With host VMM
#      on nothing may be refused.
#      With the caching allocator, stensor synchronises no context but
#      when it ends: a pointer table read back waits for the streams that
#      wrote it (its segment's uses), not for all work. (Per tensor, the
#      router's device-built table lies in memory the driver's pool holds,
#      whose writers stensor does not record: those read-backs wait for the
#      context.)
#   4. Bad flags are rejected.
#
# The default matrix keeps the test near a minute on two cores:
#   caching  eager fused      100 75 50 25
#   per-tensor eager fused    100 75 50 25
#   caching  eager per-param          50 25
#   caching  step  fused      100    50
#   caching  layer fused      100    50
# each with host VMM on and off. TORCHLIKE_FULL=1 runs every mode at every
# cap (and more steps, TORCHLIKE_STEPS).
set -euo pipefail
train=$1
# As scripts/with-fake-gpu does: the binary names no path to its driver.
export LD_LIBRARY_PATH=$(cd "$(dirname "$2")" && pwd)
stensor=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
source "$(dirname "$0")/../../tests/preload.bash"
preload=$(preload_of "$stensor")
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
steps=${TORCHLIKE_STEPS:-4}
full=${TORCHLIKE_FULL:-0}

declare -A mode_flags=(
  [caching-eager]="--alloc caching --graphs eager"
  [pertensor-eager]="--alloc per-tensor --graphs eager"
  [caching-eager-perparam]="--alloc caching --graphs eager --optimizer per-param"
  [pertensor-eager-perparam]="--alloc per-tensor --graphs eager --optimizer per-param"
  [caching-step]="--alloc caching --graphs step"
  [caching-layer]="--alloc caching --graphs layer"
  [pertensor-eager-slabs]="--alloc per-tensor --graphs eager"
)
# Modes that differ in stensor's settings only.
declare -A mode_env=([pertensor-eager-slabs]="STENSOR_SLABS=on")
modes="caching-eager pertensor-eager caching-eager-perparam caching-step caching-layer pertensor-eager-slabs"
[[ $full == 1 ]] && modes="$modes pertensor-eager-perparam"

# What must match between runs: the loss lines and the checksum.
result() { grep -E '^(step|eval) [0-9]+ loss |^checksum ' "$1"; }
field() { sed -n "s/^$2 \([0-9.]*\)$/\1/p" "$1"; }

# 1. Baselines without stensor.
for mode in $modes; do
  "$train" --steps $steps ${mode_flags[$mode]} > "$tmp/$mode.plain" 2> "$tmp/$mode.plain.err" ||
    { cat "$tmp/$mode.plain.err" >&2; fail "$mode: plain run failed"; }
  tail -n 1 "$tmp/$mode.plain" | grep -qx ok || fail "$mode: plain run did not end with ok"
  grep -Eq '^checksum [0-9a-f]{16}$' "$tmp/$mode.plain" || fail "$mode: no checksum line"
  (( $(grep -c '^step ' "$tmp/$mode.plain") == steps )) || fail "$mode: expected $steps step lines"
done
result "$tmp/caching-eager.plain" > "$tmp/want"
for mode in $modes; do
  cmp -s <(result "$tmp/$mode.plain") "$tmp/want" ||
    { diff "$tmp/want" <(result "$tmp/$mode.plain") >&2; fail "$mode: differs from caching-eager without stensor"; }
done
"$train" --steps $steps --step-times > "$tmp/again.plain"
cmp -s <(result "$tmp/again.plain") "$tmp/want" || fail "two plain runs differ"
(( $(grep -Ec '^step_time [0-9]+ [0-9]+\.[0-9]+$' "$tmp/again.plain") == steps )) ||
  fail "--step-times: expected $steps step_time lines"
cmp -s <(grep -v '^step_time ' "$tmp/again.plain" | grep -v '^train_seconds ') \
  <(grep -v '^train_seconds ' "$tmp/caching-eager.plain") || fail "--step-times changed the other output"
ws_default=$(field "$tmp/caching-eager.plain" working_set)
(( ws_default >= 150 * 1024 * 1024 && ws_default <= 250 * 1024 * 1024 )) ||
  fail "default working set $ws_default is not within 150-250 MiB"
first=$(grep '^step 0 ' "$tmp/want" | awk '{print $4}')
last_eval=$(grep '^eval ' "$tmp/want" | tail -n 1 | awk '{print $4}')
echo "PASS: every mode without stensor: $(tail -n 1 "$tmp/want"), step 0 loss $first, last eval $last_eval"
for mode in $modes; do
  echo "  $mode: working_set $(field "$tmp/$mode.plain" working_set), train_seconds $(field "$tmp/$mode.plain" train_seconds)"
done

# 2. Under stensor, no cap.
for mode in caching-eager pertensor-eager; do
  LD_PRELOAD="$preload" "$train" --steps $steps ${mode_flags[$mode]} > "$tmp/$mode.uncapped" 2> "$tmp/$mode.uncapped.err" ||
    { cat "$tmp/$mode.uncapped.err" >&2; fail "$mode: run under stensor without a cap failed"; }
  cmp -s <(result "$tmp/$mode.uncapped") "$tmp/want" || fail "$mode: under stensor without a cap the output differs"
done
echo "PASS: under stensor without a cap, caching and per-tensor (stensor_torch_malloc)"
# The whole-step graph's launches in the access log name what their nodes
# reach, also those through the router's table, which a node of the same
# launch writes (unknown_tables: then they count as writing everything).
STENSOR_ACCESS_LOG="$tmp/step.jsonl" LD_PRELOAD="$preload" "$train" --steps $steps \
  ${mode_flags[caching-step]} > "$tmp/step.logged" 2> "$tmp/step.logged.err" ||
  { cat "$tmp/step.logged.err" >&2; fail "caching-step: run with an access log failed"; }
cmp -s <(result "$tmp/step.logged") "$tmp/want" || fail "caching-step: with an access log the output differs"
graphs=$(grep -c '"type":"graph_launch"' "$tmp/step.jsonl" || true)
named=$(grep -c '"type":"graph_launch".*"inferred":true.*"reads":\[[0-9]' "$tmp/step.jsonl" || true)
through=$(grep -c '"type":"graph_launch".*"reads":\[[0-9].*"unknown_tables":true' "$tmp/step.jsonl" || true)
(( graphs == steps - 1 && named == graphs && through == graphs )) ||
  fail "caching-step log: $graphs graph launches, $named naming their buffers, $through through a table written in the launch; want $((steps - 1)) of each"
echo "PASS: the whole-step graph's launches name their buffers in the access log ($graphs)"

# 3. Caps.
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$1"; }
passed=0 refused=0
table=""
run_case() {  # MODE PCT VMM
  local mode=$1 pct=$2 vmm=$3
  local name=$mode-$pct-v$vmm
  local ws cap status=0
  ws=$(field "$tmp/$mode.plain" working_set)
  cap=$((ws * pct / 100))
  local start end
  start=$(date +%s.%N)
  env ${mode_env[$mode]:-} FAKECUDA_HOST_VMM=$vmm FAKECUDA_REPORT_PEAK=1 \
    FAKECUDA_REPORT_CALLS=cuCtxSynchronize STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=$cap \
    LD_PRELOAD="$preload" "$train" --steps $steps ${mode_flags[$mode]} \
    > "$tmp/$name.out" 2> "$tmp/$name.err" || status=$?
  end=$(date +%s.%N)
  local wall
  wall=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }')
  local problem=""
  if (( status != 0 )); then
    if (( status == 1 )) && grep -q 'CUDA_ERROR_OUT_OF_MEMORY' "$tmp/$name.err"; then
      if (( vmm == 0 )); then
        # A refused launch is named by stensor, once, with its footprint.
        local said
        said=$(grep -c 'stensor: a launch of .* was refused (CUDA_ERROR_OUT_OF_MEMORY): its [0-9]* buffers take [0-9.]* MiB on device 0 together, the cap is [0-9.]* MiB' "$tmp/$name.err" || true)
        if grep -q 'cuLaunchKernel failed' "$tmp/$name.err" && [[ $said != 1 ]]; then
          fail "$name: a refused launch named $said times by stensor, want once: $(grep '^stensor: a launch' "$tmp/$name.err")"
        fi
        refused=$((refused + 1))
        table+=$(printf '%-24s %4s%% vmm=%s  refused  (%s)' "$mode" "$pct" "$vmm" \
          "$(grep -v '^stensor:' "$tmp/$name.err" | grep -m1 -B1 'CUDA_ERROR_OUT_OF_MEMORY' | tr '\n' ' ' | sed 's/torchlike_train: //g')")$'\n'
        return
      fi
      problem="refused with host VMM on: $(grep -m1 CUDA_ERROR_OUT_OF_MEMORY "$tmp/$name.err")"
    else
      problem="exit status $status: $(grep -v '^stensor: ' "$tmp/$name.err" | tail -n 3 | tr '\n' ' ')"
    fi
  elif ! cmp -s <(result "$tmp/$name.out") "$tmp/want"; then
    problem="output differs from the baseline: $(diff "$tmp/want" <(result "$tmp/$name.out") | grep '^>' | head -n 3 | tr '\n' ' ')"
  else
    local peak evicted
    peak=$(sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/$name.err")
    evicted=$(( $(stat "$tmp/$name.err" "swap-outs copied") + $(stat "$tmp/$name.err" "clean drops") ))
    if (( peak > cap )); then
      problem="device high-water mark $peak above the cap $cap"
    elif (( pct < 100 && evicted == 0 )); then
      problem="nothing evicted under a cap of $cap"
    elif [[ $mode == *-slabs ]] && (( vmm == 1 )) && (( $(stat "$tmp/$name.err" "slab allocations") == 0 )); then
      problem="no small allocation placed in a slab"
    elif [[ $mode == caching-* ]]; then
      local syncs
      syncs=$(sed -n 's/^fakecuda: calls cuCtxSynchronize \([0-9]*\)$/\1/p' "$tmp/$name.err")
      if [[ ! $syncs =~ ^[0-9]+$ ]]; then
        problem="no cuCtxSynchronize count in the fake's report"
      elif (( syncs > 1 )); then
        problem="$syncs cuCtxSynchronize, want at most 1 (the context's end)"
      fi
    fi
  fi
  if [[ -n $problem ]]; then
    echo "--- $name stderr:" >&2
    grep -v '^stensor: ' "$tmp/$name.err" | tail -n 20 >&2
    fail "$name (STENSOR_MEMORY_LIMIT=$cap FAKECUDA_HOST_VMM=$vmm $train --steps $steps ${mode_flags[$mode]}): $problem"
  fi
  passed=$((passed + 1))
  local secs
  secs=$(field "$tmp/$name.out" train_seconds)
  table+=$(printf '%-24s %4s%% vmm=%s  pass     %5.2f steps/s (wall %ss)' "$mode" "$pct" "$vmm" \
    "$(awk -v n=$steps -v s="$secs" 'BEGIN { print n / s }')" "$wall")$'\n'
}

declare -A caps=(
  [caching-eager]="100 75 50 25"
  [pertensor-eager]="100 75 50 25"
  [caching-eager-perparam]="50 25"
  [caching-step]="100 50"
  [caching-layer]="100 50"
  [pertensor-eager-slabs]="100 50 25"
)
for mode in $modes; do
  pcts=${caps[$mode]:-100 75 50 25}
  [[ $full == 1 ]] && pcts="100 75 50 25"
  for pct in $pcts; do
    for vmm in 1 0; do
      # Slabs need host-located VMM: without, the same as per-tensor.
      [[ $mode == *-slabs && $vmm == 0 ]] && continue
      run_case "$mode" "$pct" "$vmm"
    done
  done
done
echo "uncapped, without stensor:"
for mode in $modes; do
  printf '%-24s  plain               %5.2f steps/s\n' "$mode" \
    "$(awk -v n=$steps -v s="$(field "$tmp/$mode.plain" train_seconds)" 'BEGIN { print n / s }')"
done
printf '%s' "$table"
echo "PASS: $passed cases bit-identical, each within its cap, $refused refused with host VMM off"

# 4. Bad flags are rejected with a usage message, not ignored.
for bad in "--steps nope" "--alloc bogus" "--graphs x" "--optimizer y" "--layers 1" \
           "--dim 130 --heads 4" "--alloc per-tensor --graphs step" "--bogus 1" "extra"; do
  if "$train" $bad > /dev/null 2> "$tmp/err.txt"; then fail "$bad was accepted"; fi
  grep -qi usage "$tmp/err.txt" || fail "no usage message for $bad"
done
echo "PASS: bad flags rejected"
