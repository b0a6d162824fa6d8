#!/usr/bin/env bash
# Kernel descriptions follow module lifetime: module_reload reuses a function
# handle for a kernel that writes where the old one read, then forces the
# buffer out under the version policy. The write must survive, with
# host-located VMM on and off; the access log must show the second launch
# writing the buffer. The cuLibraryUnload hook, with no real entry point in
# the fake, returns CUDA_ERROR_NOT_SUPPORTED.
set -euo pipefail
fake=$1 stensor=$2 reload=$3 module_a=$4 module_b=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

"$reload" "$module_a" "$module_b" > "$tmp/plain.out" || fail "without stensor: exit $?"

cap=$(( (4 << 20) + (64 << 10) ))
for vmm in 1 0; do
  status=0
  FAKECUDA_HOST_VMM=$vmm STENSOR_POLICY=version STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=$cap \
    STENSOR_ACCESS_LOG="$tmp/log-$vmm.jsonl" LD_PRELOAD="$preload" \
    "$reload" "$module_a" "$module_b" > "$tmp/$vmm.out" 2> "$tmp/$vmm.err" || status=$?
  (( status == 0 )) || { cat "$tmp/$vmm.err" >&2; fail "host VMM $vmm: exit $status"; }
  grep -q "cuLibraryUnload not supported" "$tmp/$vmm.out" || fail "host VMM $vmm: cuLibraryUnload hook not reached"
  nm -D "$stensor" | grep " T cuLibraryUnload$" > /dev/null || fail "libstensor.so does not export cuLibraryUnload"
  grep -q '"demangled":"reload::touch(float\*, float\*, int)".*"writes":\[[0-9]' "$tmp/log-$vmm.jsonl" ||
    fail "host VMM $vmm: the access log has no write by the reloaded kernel"
done
echo "PASS ($(cat "$tmp/1.out"))"
