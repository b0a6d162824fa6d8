#!/usr/bin/env bash
# NVML under a cap (interpose/nvml_hooks.cc), on the fake driver and the fake
# NVML (tests/fakenvml), three devices of 1 GiB: tests/nvml_probe asks NVML
# for every device's memory between CUDA steps. Checked:
#   - under a cap, nvmlDeviceGetMemoryInfo and _v2 report the device's cap as
#     total, what the program allocated as used, the rest free, nothing
#     reserved, and agree with cuMemGetInfo; a device without a cap (a
#     per-device limit that names other devices, or no limit at all) gets
#     NVML's own answer; so with NVML found by dlsym on its handle, by
#     dlsym(RTLD_DEFAULT) and by linking;
#   - CUDA_VISIBLE_DEVICES reorders and hides devices: caps follow CUDA's
#     numbering, a device CUDA does not see keeps NVML's answer;
#   - a wrong version to _v2 is NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
#   - before the program initialises CUDA (not loaded, or loaded only) NVML's
#     own answer, and a program that never uses CUDA starts nothing of
#     stensor's (no access log).
set -euo pipefail
probe=$1 linked=$2 nvml=$3 fake=$4 stensor=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
nvml=$(abs "$nvml")
export LD_LIBRARY_PATH=$(dirname "$(abs "$fake")"):$(dirname "$nvml")
export FAKECUDA_DEVICES=3 FAKECUDA_DEVICE_MEMORY=1GiB
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$(abs "$stensor")")
MiB=$((1 << 20))
GiB=$((1 << 30))

run() {  # run NAME PROGRAM LOAD [VAR=value...] -- STEP...
  local name=$1 program=$2 load=$3
  shift 3
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  env "${vars[@]}" "$program" "$load" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
}

# The fields of NVML device I in the Nth query of NAME's output:
# v1 total, used, free, v2 total, reserved, used, free.
nvml_of() {
  awk -v n="$2" -v i="$3" '$1 == "query" { q++ } q == n && $1 == "nvml" && $2 == i {
    print $5, $6, $7, $9, $10, $11, $12 }' "$tmp/$1.out"
}

# NVML's own answer (the fake's: 1 MiB reserved).
expect_own() {  # expect_own NAME QUERY DEVICE
  local got want="$GiB $MiB $((GiB - MiB)) $GiB $MiB 0 $((GiB - MiB))"
  got=$(nvml_of "$1" "$2" "$3")
  [[ $got == "$want" ]] || fail "$1: query $2, NVML device $3: '$got', want NVML's own '$want'"
}

expect_capped() {  # expect_capped NAME QUERY DEVICE CAP USED
  local got want="$4 $5 $(($4 - $5)) $4 0 $5 $(($4 - $5))"
  got=$(nvml_of "$1" "$2" "$3")
  [[ $got == "$want" ]] || fail "$1: query $2, NVML device $3: '$got', want '$want' under the cap"
}

# In query QUERY, NVML's total and free for each capped device (nothing
# reserved) equal cuMemGetInfo's for the CUDA device with its UUID.
agree() {  # agree NAME QUERY
  awk -v n="$2" '$1 == "query" { q++ } q == n && $1 == "nvml" && $10 == 0 { nv[$3] = $5 " " $7 }
    q == n && $1 == "cuda" { cu[$3] = $4 " " $5 }
    END { for (u in nv) if (cu[u] != nv[u]) { print u, "cuda", cu[u], "nvml", nv[u]; bad = 1 }
          exit bad }' "$tmp/$1.out" || fail "$1: cuMemGetInfo and NVML disagree"
}

caps="STENSOR_MEMORY_LIMIT=0=256MiB,1=128MiB"
steps=(query cuda alloc 0 $((64 * MiB)) alloc 1 $((32 * MiB)) query badversion)

# Without stensor: NVML's own answers throughout.
run plain "$probe" "handle:$nvml" -- "${steps[@]}"
for d in 0 1 2; do expect_own plain 2 $d; done

# Under per-device caps, NVML found three ways.
for load in handle default linked; do
  program=$probe
  [[ $load == linked ]] && program=$linked
  [[ $load == linked ]] || load="$load:$nvml"
  name=cap-${load%%:*}
  run "$name" "$program" "$load" LD_PRELOAD="$preload" "$caps" -- "${steps[@]}"
  for d in 0 1 2; do expect_own "$name" 1 $d; done  # before cuInit
  expect_capped "$name" 2 0 $((256 * MiB)) $((64 * MiB))
  expect_capped "$name" 2 1 $((128 * MiB)) $((32 * MiB))
  expect_own "$name" 2 2  # no cap named
  agree "$name" 2
  grep -qx "badversion 25 25" "$tmp/$name.out" ||
    fail "$name: a wrong version: $(grep badversion "$tmp/$name.out")"
  echo "$name: ok"
done

# A cap as a share of every device.
run share "$probe" "handle:$nvml" LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=50% -- \
  cuda alloc 2 $((64 * MiB)) query
expect_capped share 1 0 $((512 * MiB)) 0
expect_capped share 1 1 $((512 * MiB)) 0
expect_capped share 1 2 $((512 * MiB)) $((64 * MiB))
agree share 1

# Preloaded without a cap: NVML's own answers.
run uncapped "$probe" "handle:$nvml" LD_PRELOAD="$preload" -- "${steps[@]}"
for d in 0 1 2; do expect_own uncapped 2 $d; done
grep -qx "badversion 25 25" "$tmp/uncapped.out" || fail "uncapped: a wrong version"

# CUDA sees physical devices 2 and 0, as its devices 0 and 1.
run visible "$linked" linked LD_PRELOAD="$preload" "$caps" CUDA_VISIBLE_DEVICES=2,0 -- \
  cuda alloc 0 $((64 * MiB)) query
expect_capped visible 1 2 $((256 * MiB)) $((64 * MiB))
expect_capped visible 1 0 $((128 * MiB)) 0
expect_own visible 1 1  # hidden from CUDA
agree visible 1
echo "CUDA_VISIBLE_DEVICES: ok"

# NVML alone: CUDA never loaded, then loaded but never initialised. stensor
# builds nothing: no access log appears.
for steps in "query badversion" "loadcuda query"; do
  rm -f "$tmp/never.jsonl"
  run never "$probe" "handle:$nvml" LD_PRELOAD="$preload" "$caps" \
    STENSOR_ACCESS_LOG="$tmp/never.jsonl" -- $steps
  for d in 0 1 2; do expect_own never 1 $d; done
  [[ ! -e $tmp/never.jsonl ]] || fail "never ($steps): stensor started (an access log)"
done
echo "NVML without CUDA: ok"
echo PASS
