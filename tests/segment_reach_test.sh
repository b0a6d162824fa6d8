#!/usr/bin/env bash
# Tensors of one segment under a cap (tests/segment_reach.cc): with
# host-located VMM, of a swapped-out segment only what a kernel's pointers
# likely reach is fetched and the rest served, and kernels that reach past
# that guess still read and write every word right: the same checksum as
# without stensor under each policy, with the pieces left on host counted.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICE_MEMORY=1GiB
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
rounds=4

"$program" "$kernels" $rounds > "$tmp/plain.out" 2> "$tmp/plain.err" ||
  { cat "$tmp/plain.err" >&2; fail "uncapped without stensor"; }
want=$(grep '^checksum' "$tmp/plain.out")
for policy in belady lru; do
  name=$policy
  env FAKECUDA_HOST_VMM=1 LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=24MiB STENSOR_STATS=1 \
    STENSOR_POLICY=$policy "$program" "$kernels" $rounds > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  [[ $(grep '^checksum' "$tmp/$name.out") == "$want" ]] || fail "$name: checksum differs"
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
  far=$(sed -n 's/.* \([0-9][0-9]*\) pieces a kernel held but likely did not touch.*/\1/p' "$tmp/$name.err")
  (( ${far:-0} > 0 )) || fail "$name: no piece left on host for a kernel that did not name it"
  grep -q '^stensor: out of memory  *0$' "$tmp/$name.err" || fail "$name: out-of-memory errors counted"
  echo "$name: $far pieces served rather than fetched, same checksum"
done
echo PASS
