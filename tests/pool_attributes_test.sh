#!/usr/bin/env bash
# The default stream-ordered pool's answers through libstensor.so
# (tests/pool_attributes.cc): on the fake alone, preloaded without a cap (the
# same answers as the fake's own), and under a cap of 5 granules (10 MiB on
# the fake) with host-located VMM on and off, where the program's 9.x
# granules of stensor-served buffers swap. Checked: the program's checks
# (every byte, the pool's USED/RESERVED and _HIGH answers; it prints ok),
# the same answers uncapped with and without stensor, swap-outs under the
# cap (stensor's buffers, not the driver's), and no failed driver call counted by stensor.
set -euo pipefail
program=$1 fake=$2 stensor=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICE_MEMORY=256MiB
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }
run() {  # run NAME PRELOAD [VAR=value...]
  local name=$1 lib=$2
  shift 2
  env "$@" LD_PRELOAD="$lib" "$program" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.out"; tail -n 30 "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
}
run fake ""
run uncapped "$preload"
diff <(grep -v '^trim' "$tmp/fake.out") <(grep -v '^trim' "$tmp/uncapped.out") ||
  fail "uncapped answers differ from the fake's own"
cat "$tmp/uncapped.out"
for vmm in 1 0; do
  name="cap-$vmm"
  run "$name" "$preload" FAKECUDA_HOST_VMM=$vmm STENSOR_MEMORY_LIMIT=10MiB STENSOR_STATS=1
  outs=$(stat "$name" "swap-outs copied")
  (( ${outs:-0} > 0 )) || fail "$name: nothing swapped out"
  errors=$(stat "$name" "driver errors")
  [[ -z $errors || $errors == 0 ]] || fail "$name: $errors failed driver calls"
  cat "$tmp/$name.out"
  echo "$name: swap-outs copied $outs"
done
echo PASS
