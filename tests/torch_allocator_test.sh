#!/usr/bin/env bash
# PyTorch's pluggable allocator on libstensor.so (tests/torch_allocator.cc):
# stensor_torch_malloc/free resolved with dlsym and called as PyTorch calls
# them, on two fake devices, without a cap and under caps of 100 %, 60 % and
# 40 % of the program's working set (what it has live at once, in the units
# a cap charges), each with host-located VMM on and off. Checked: every byte
# of every tensor against the program's host model (it prints ok), the same
# checksum in every run, device 0's high-water mark within its cap, swapping
# at 60 % and 40 % (the tensors are stensor's, not the driver's), and no
# failed driver call counted by stensor; then the 40 % caps under load (below).
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICES=2 FAKECUDA_DEVICE_MEMORY=256MiB
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

# The exports, with C linkage.
for name in stensor_torch_malloc stensor_torch_free; do
  nm -D --defined-only "$stensor" | awk '$2 == "T" { print $3 }' | grep -qx "$name" ||
    fail "libstensor.so does not export $name"
done

stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }
peak() { sed -n "s/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p" "$tmp/$1.err"; }
run() {  # run NAME [VAR=value...]
  local name=$1
  shift
  env "$@" FAKECUDA_REPORT_PEAK=1 LD_PRELOAD="$preload" "$program" "$kernels" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 30 "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
}
run plain
want=$(grep '^checksum' "$tmp/plain.out")
ws=$(sed -n 's/^working_set //p' "$tmp/plain.out")
(( ws > 0 )) || fail "no working set"
echo "uncapped: $want, working set $ws bytes"
for vmm in 1 0; do
  for pct in 100 60 40; do
    name="cap$pct-$vmm"
    cap=$(( ws * pct / 100 ))
    run "$name" FAKECUDA_HOST_VMM=$vmm STENSOR_MEMORY_LIMIT="0=$cap,1=$cap" STENSOR_STATS=1
    got=$(grep '^checksum' "$tmp/$name.out")
    [[ $got == "$want" ]] || fail "$name: $got, want $want"
    p=$(peak "$name")
    (( p <= cap )) || fail "$name: device 0 high-water mark $p above the cap $cap"
    ins=$(stat "$name" "swap-ins copied")
    if (( pct < 100 )); then
      (( ${ins:-0} > 0 )) || fail "$name: nothing swapped in"
    fi
    errors=$(stat "$name" "driver errors")
    [[ -z $errors || $errors == 0 ]] || fail "$name: $errors failed driver calls"
    echo "$name: cap $cap, peak $p, swap-ins copied ${ins:-0}"
  done
done
# Under load: the 40 % cap, host-located VMM on and off, 12 runs of each,
# six at once, so that the fake's streams run well behind the program
# (buffers freed with their swap copies still queued, their memory taken
# over by the next tensor of their size). Each run must print ok and the
# uncapped checksum.
cap=$(( ws * 40 / 100 ))
for vmm in 1 0; do
  failed=0
  for batch in 0 1; do
    pids=()
    for i in 0 1 2 3 4 5; do
      name="load-$vmm-$batch-$i"
      ( env FAKECUDA_HOST_VMM=$vmm STENSOR_MEMORY_LIMIT="0=$cap,1=$cap" LD_PRELOAD="$preload" \
          "$program" "$kernels" > "$tmp/$name.out" 2> "$tmp/$name.err" ) &
      pids+=($!)
    done
    for i in 0 1 2 3 4 5; do
      name="load-$vmm-$batch-$i"
      if ! wait "${pids[$i]}" || ! grep -qx ok "$tmp/$name.out" ||
        [[ $(grep '^checksum' "$tmp/$name.out") != "$want" ]]; then
        tail -n 5 "$tmp/$name.err" >&2
        failed=$((failed + 1))
      fi
    done
  done
  (( failed == 0 )) || fail "40 % under load, host VMM $vmm: $failed of 12 runs failed"
  echo "40 % under load, host VMM $vmm: 12 runs right"
done
echo PASS
