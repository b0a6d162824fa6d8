#!/usr/bin/env bash
# Two fake devices, four threads (tests/multi_device.cc): kernels on each
# device, cross-device copies of buffers that are often swapped out, under
# per-device caps (STENSOR_MEMORY_LIMIT=0=...,1=...), with host-located VMM on
# and off. Every capped run prints the uncapped checksum, neither device's
# high-water mark exceeds its own cap, both devices swap, and stensor counts
# no failed driver call (a stream or event of the wrong context would).
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
rounds=${MULTI_DEVICE_ROUNDS:-24}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICES=2
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")

"$program" "$kernels" "$rounds" > "$tmp/plain.out"
want=$(cat "$tmp/plain.out")
[[ $want == checksum* ]] || fail "uncapped run printed '$want'"

peak() { sed -n "s/^fakecuda: device $2 peak \([0-9]*\) bytes$/\1/p" "$tmp/$1.err"; }
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }

# Each device has 16 buffers of 2 MiB (32 MiB); at most 8 are in use at once
# (four threads, each on two of one device's buffers).
run() {  # run NAME CAP0 CAP1 HOST_VMM
  local name=$1 cap0=$2 cap1=$3 vmm=$4
  FAKECUDA_HOST_VMM=$vmm FAKECUDA_REPORT_PEAK=1 STENSOR_STATS=1 \
    STENSOR_MEMORY_LIMIT="0=$cap0,1=$cap1" LD_PRELOAD="$stensor" \
    "$program" "$kernels" "$rounds" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.err" >&2; fail "$name: multi_device failed"; }
  [[ $(cat "$tmp/$name.out") == "$want" ]] || fail "$name: $(cat "$tmp/$name.out"), want $want"
  local p0 p1
  p0=$(peak "$name" 0) p1=$(peak "$name" 1)
  (( p0 <= cap0 )) || fail "$name: device 0 high-water mark $p0 above its cap $cap0"
  (( p1 <= cap1 )) || fail "$name: device 1 high-water mark $p1 above its cap $cap1"
  (( $(stat "$name" "swap-ins copied") > 0 )) || fail "$name: nothing swapped in"
  local errors
  errors=$(stat "$name" "driver errors")
  [[ -z $errors || $errors == 0 ]] || fail "$name: $errors failed driver calls"
  echo "$name: $(cat "$tmp/$name.out"), peaks $p0 / $p1"
}
mib=$((1 << 20))
for vmm in 1 0; do
  run "tight-$vmm" $((20 * mib)) $((18 * mib)) $vmm  # 10 and 9 of 16 buffers
  run "half-$vmm" $((16 * mib)) $((24 * mib)) $vmm
done
echo PASS
