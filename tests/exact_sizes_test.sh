#!/usr/bin/env bash
# What a program sees of its buffers under stensor is what the driver shows
# for cuMemAlloc memory (tests/exact_sizes.cc), without stensor, with it and
# no cap, and under caps with host-located VMM on and off:
#   bounds: overruns refused, exact ranges and pointer attributes resident and
#           swapped out, SIZE_MAX out of memory, cuMemFreeAsync in stream order;
#   vmm:    32 MiB of the program's own VMM memory under a 16 MiB cap: 8 of
#           the 2 MiB handles fit once all four 2 MiB buffers were swapped out,
#           then CUDA_ERROR_OUT_OF_MEMORY; the fake's peak never above the cap;
#   pin:    buffers handed out through cuIpcGetMemHandle and
#           cuMemRetainAllocationHandle are swapped in, pinned, logged once,
#           never evicted afterwards, and keep their data.
set -euo pipefail
prog=$1 fake=$2 stensor=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

granule=$((2 << 20))
run() {  # run NAME MODE [VAR=value...]: output in NAME.out/.err
  local name=$1 mode=$2
  shift 2
  env FAKECUDA_REPORT_PEAK=1 STENSOR_STATS=1 "$@" "$prog" "$mode" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.out" "$tmp/$name.err" >&2; fail "$name"; }
  grep -qx ok "$tmp/$name.out" || fail "$name: no ok"
}
peak() { sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/$1.err"; }
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }

# bounds: three granules and a little; the 2 MiB + 1000 byte buffer reserves two.
cap=$((3 * granule + (64 << 10)))
run bounds-plain bounds
run bounds-nocap bounds LD_PRELOAD="$preload"
for vmm in 1 0; do
  run "bounds-$vmm" bounds LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap FAKECUDA_HOST_VMM=$vmm
  (( $(stat "bounds-$vmm" "swap-outs copied") >= 1 )) || fail "bounds-$vmm: nothing was swapped out"
  (( $(peak "bounds-$vmm") <= cap )) || fail "bounds-$vmm: peak $(peak "bounds-$vmm") above the cap $cap"
  # Without host-located VMM a hidden pointer to a swapped-out buffer
  # faults: said once on stderr, not only in the access log.
  warned=$(grep -c "^stensor: this driver has no host-located VMM" "$tmp/bounds-$vmm.err" || true)
  (( warned == 1 - vmm )) || fail "bounds-$vmm: the no-host-VMM warning appeared $warned times"
done
run bounds-quiet bounds LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap FAKECUDA_HOST_VMM=0 \
  STENSOR_LOG_LEVEL=error
! grep -q "host-located VMM" "$tmp/bounds-quiet.err" || fail "STENSOR_LOG_LEVEL=error did not silence a warning"

# vmm: 16 MiB cap, four 2 MiB buffers, up to sixteen 2 MiB handles.
cap=$((8 * granule))
run vmm-plain vmm
grep -qx "created 16" "$tmp/vmm-plain.out" || fail "vmm without stensor: $(head -1 "$tmp/vmm-plain.out")"
for vmm in 1 0; do
  run "vmm-$vmm" vmm LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap FAKECUDA_HOST_VMM=$vmm
  grep -qx "created 8" "$tmp/vmm-$vmm.out" || fail "vmm-$vmm: $(head -1 "$tmp/vmm-$vmm.out"), want created 8"
  (( $(peak "vmm-$vmm") <= cap )) || fail "vmm-$vmm: peak $(peak "vmm-$vmm") above the cap $cap"
  (( $(stat "vmm-$vmm" "swap-outs copied") >= 4 )) || fail "vmm-$vmm: the buffers were not swapped out to make room"
done

# pin: three granules and a little.
cap=$((3 * granule + (64 << 10)))
run pin-plain pin
for vmm in 1 0; do
  log=$tmp/pin-$vmm.jsonl
  run "pin-$vmm" pin LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap FAKECUDA_HOST_VMM=$vmm \
    STENSOR_ACCESS_LOG="$log"
  (( $(grep -c "stays on the device for good" "$tmp/pin-$vmm.err") == 2 )) ||
    fail "pin-$vmm: want two warnings on stderr"
  read -r _ _ ipc _ retain < <(grep '^pinned' "$tmp/pin-$vmm.out")
  python3 - "$log" "$ipc" "$retain" <<'PY' || fail "pin-$vmm: access log"
import json, sys
log, ipc, retain = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
records = [json.loads(l) for l in open(log)]
ids = {int(r["addr"], 16): r["id"] for r in records if r["type"] == "alloc"}
for addr, api in ((ipc, "cuIpcGetMemHandle"), (retain, "cuMemRetainAllocationHandle")):
    bid = ids[addr]
    pins = [i for i, r in enumerate(records) if r["type"] == "pin" and r["id"] == bid]
    assert len(pins) == 1, f"buffer {bid}: {len(pins)} pin records"
    assert records[pins[0]]["api"] == api, records[pins[0]]
    before = [r["type"] for r in records[:pins[0]] if r.get("id") == bid]
    assert "swap_in" in before, f"buffer {bid} was not brought back before its pin: {before}"
    after = [r["type"] for r in records[pins[0]:] if r.get("id") == bid]
    assert not {"swap_out", "drop_clean"} & set(after), f"buffer {bid} evicted after its pin: {after}"
evictions = sum(r["type"] in ("swap_out", "drop_clean") for r in records)
assert evictions >= 6, f"only {evictions} evictions: the churn did not run through the cap"
PY
  (( $(peak "pin-$vmm") <= cap )) || fail "pin-$vmm: peak above the cap"
done
echo PASS
