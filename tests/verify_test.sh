#!/usr/bin/env bash
# STENSOR_VERIFY on the fake driver. verify_clean_drop runs a kernel that
# writes a buffer it declares const, so version control would drop the
# buffer as clean: with verification off under a cap the write is lost (the
# checksum differs, which shows the check matters); under copy and hash the
# mismatch is caught, logged with the kernel's name, counted, and the result
# is bit-identical to the run without stensor; host-located VMM on and off.
# Then mlp_train under 40 % of its working set prints its usual checksum in
# every mode, with no mismatch.
set -euo pipefail
fake=$1 stensor=$2 program=$3 module=$4 train=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }

"$program" "$module" > "$tmp/plain.out"
want=$(cat "$tmp/plain.out")
cap=$(( (4 << 20) + (64 << 10) ))

run() {  # run NAME VERIFY HOST_VMM
  FAKECUDA_HOST_VMM=$3 STENSOR_VERIFY=$2 STENSOR_POLICY=version STENSOR_STATS=1 \
    STENSOR_MEMORY_LIMIT=$cap STENSOR_ACCESS_LOG="$tmp/$1.jsonl" LD_PRELOAD="$preload" \
    "$program" "$module" > "$tmp/$1.out" 2> "$tmp/$1.err" ||
    { cat "$tmp/$1.err" >&2; fail "$1: exit $?"; }
}

for vmm in 1 0; do
  run "off-$vmm" off $vmm
  [[ $(cat "$tmp/off-$vmm.out") != "$want" ]] ||
    fail "off-$vmm: the hidden write survived without verification; the test proves nothing"
  (( $(stat "off-$vmm" "clean drops") >= 1 )) || fail "off-$vmm: no clean drop"
  for mode in copy hash; do
    name=$mode-$vmm
    run "$name" $mode $vmm
    [[ $(cat "$tmp/$name.out") == "$want" ]] ||
      fail "$name: $(cat "$tmp/$name.out"), want $want (the write was lost)"
    (( $(stat "$name" "verify mismatches") == 1 )) || fail "$name: mismatches not counted"
    (( $(stat "$name" "verified drops") >= 1 )) || fail "$name: no check counted"
    (( $(stat "$name" "verify errors") == 0 )) || fail "$name: checks failed"
    grep -q "STENSOR_VERIFY=$mode: buffer [0-9]* .*lying::scale_in_place(float const\*, float, int)" \
      "$tmp/$name.err" || { cat "$tmp/$name.err" >&2; fail "$name: no warning naming the kernel"; }
    grep -q "\"type\":\"verify_mismatch\".*\"mode\":\"$mode\".*\"last_kernel\":\"lying::scale_in_place" \
      "$tmp/$name.jsonl" || fail "$name: no verify_mismatch record"
    if grep -q "comparing bytes instead" "$tmp/$name.err"; then
      cat "$tmp/$name.err" >&2
      fail "$name: the hash kernel did not run"
    fi
  done
done

# An honest program: every mode gives the uncapped checksum, no mismatch.
"$train" --steps 10 > "$tmp/train.txt"
ws=$(head -n 1 "$tmp/train.txt" | cut -d' ' -f2)
for mode in off copy hash; do
  STENSOR_VERIFY=$mode STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=$((ws * 40 / 100)) \
    LD_PRELOAD="$preload" "$train" --steps 10 > "$tmp/train-$mode.txt" 2> "$tmp/train-$mode.err" ||
    { cat "$tmp/train-$mode.err" >&2; fail "mlp_train under verify=$mode failed"; }
  cmp -s "$tmp/train.txt" "$tmp/train-$mode.txt" || fail "mlp_train: output differs under verify=$mode"
  if [[ $mode != off ]]; then
    (( $(stat "train-$mode" "verified drops") > 0 )) || fail "mlp_train $mode: nothing verified"
    (( $(stat "train-$mode" "verify mismatches") == 0 )) || fail "mlp_train $mode: false mismatch"
  fi
done
echo "PASS (lost without verification: $(cat "$tmp/off-1.out") vs $want)"
