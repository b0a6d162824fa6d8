#!/usr/bin/env bash
# Pointer tables under a memory cap, on the fake driver: table_train, whose
# kernels reach their buffers through tables in device memory (built on the
# host and copied in every form, rewritten between steps, inside a swappable
# buffer, copied on the device, written by a kernel, in pinned host memory),
# prints the checksum of the run without stensor under caps of 100, 60 and
# 40 % of its working set and the smallest cap, every policy, host-located
# VMM on and off; short runs repeat 20 times to catch races; the device's
# high-water mark stays under the cap; the access log records the tables.
set -euo pipefail
train=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

"$train" "$kernels" > "$tmp/plain.txt"
want=$(tail -n 1 "$tmp/plain.txt")
ws=$(head -n 1 "$tmp/plain.txt" | cut -d' ' -f2)
"$train" "$kernels" --steps 2 > "$tmp/short.txt"
want_short=$(tail -n 1 "$tmp/short.txt")
# The largest set one launch needs at once (axpy: three buffers read and
# three written through tables, 2 MiB each) plus six small tables charged
# in 4 KiB pages: 12,607,488 bytes.
smallest=12610000

run() {  # run NAME CAP HOST_VMM POLICY WANT [ARGS...]
  local name=$1 cap=$2 vmm=$3 policy=$4 expect=$5
  shift 5
  FAKECUDA_HOST_VMM=$vmm FAKECUDA_REPORT_PEAK=1 STENSOR_POLICY=$policy STENSOR_STATS=1 \
    STENSOR_MEMORY_LIMIT=$cap LD_PRELOAD="$preload" "$train" "$kernels" "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name: table_train failed"; }
  [[ $(tail -n 1 "$tmp/$name.out") == "$expect" ]] ||
    fail "$name: $(tail -n 1 "$tmp/$name.out"), want $expect"
  local peak
  peak=$(sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/$name.err")
  (( peak <= cap )) || fail "$name: device high-water mark $peak above the cap $cap"
}
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }

for vmm in 1 0; do
  for policy in version belady lru; do
    for cap in $((ws)) $((ws * 60 / 100)) $((ws * 40 / 100)) $smallest; do
      run "$policy-$cap-$vmm" $cap $vmm $policy "$want"
    done
    (( $(stat "$policy-$smallest-$vmm" "swap-outs copied") > 0 )) ||
      fail "$policy, host VMM $vmm: nothing was swapped out at the smallest cap"
  done
done

# Races: a buffer reached through a table must never be evicted or
# unmapped under a kernel still using it. 20 short runs per host VMM
# setting, two at a time.
for vmm in 1 0; do
  for i in $(seq 1 10); do
    run "race-version-$vmm-$i" $smallest $vmm version "$want_short" --steps 2 &
    run "race-lru-$vmm-$i" $((ws * 40 / 100)) $vmm lru "$want_short" --steps 2 &
    wait -n && wait -n || fail "race run failed (see above)"
  done
done

# A table in memory nobody tracks (pageable host memory): with host-located
# VMM the launch runs with every host copy distrusted and nothing evicted
# under it; without, everything it might reach is brought in first, which
# works where it all fits and is a clean out-of-memory error where not.
for cap in $((ws)) $((ws * 40 / 100)) $smallest; do
  run "pageable-$cap" $cap 1 version "$want" --last-table pageable
done
run "pageable-novmm" $((ws + (1 << 20))) 0 version "$want" --last-table pageable
if FAKECUDA_HOST_VMM=0 STENSOR_MEMORY_LIMIT=$((ws * 40 / 100)) LD_PRELOAD="$preload" \
    "$train" "$kernels" --last-table pageable > /dev/null 2> "$tmp/pageable-oom.err"; then
  fail "an unknown table without host VMM cannot fit 40 %"
fi
grep -q "host_table_add.*CUDA_ERROR_OUT_OF_MEMORY\|cuLaunchKernel.*CUDA_ERROR_OUT_OF_MEMORY" "$tmp/pageable-oom.err" ||
  { cat "$tmp/pageable-oom.err" >&2; fail "expected a launch to fail with out of memory"; }

# Failures of the calls a table read-back makes (the launch stream's
# synchronisation, the device-to-host copy), at each of their first
# occurrences: the program either sees its own call fail, or stensor falls
# back (unknown accesses) and the result is the same. Never a crash or a
# wrong result.
for fn in cuStreamSynchronize cuMemcpyDtoH_v2; do
  for n in 1 2 3 4 5 6; do
    if FAKECUDA_FAIL=$fn:$n STENSOR_MEMORY_LIMIT=$((ws * 40 / 100)) LD_PRELOAD="$preload" \
        "$train" "$kernels" > "$tmp/fail.out" 2> "$tmp/fail.err"; then
      [[ $(tail -n 1 "$tmp/fail.out") == "$want" ]] || fail "$fn:$n: wrong result $(tail -n 1 "$tmp/fail.out")"
    else
      grep -q "table_train.cc:[0-9]*: ${fn%_v2}(.*failed: CUDA_ERROR_UNKNOWN" "$tmp/fail.err" ||
        { cat "$tmp/fail.err" >&2; fail "$fn:$n: the program saw an error that was not its own call's"; }
    fi
  done
done

# A table in registered host memory, which stensor does not track but the
# driver describes: read where it is, so even without host VMM at the
# smallest cap nothing faults.
for vmm in 1 0; do
  run "registered-$vmm" $smallest $vmm version "$want" --last-table registered
done

# Below the smallest cap: with host-located VMM what does not fit is served
# from host memory, same checksum; without, a clean out-of-memory error, no
# crash.
run below-1 12500000 1 version "$want"
grep -Eq '^stensor: served from host +[1-9]' "$tmp/below-1.err" || fail "below-1: nothing served from host"
if FAKECUDA_HOST_VMM=0 STENSOR_MEMORY_LIMIT=12500000 LD_PRELOAD="$preload" "$train" "$kernels" \
    > /dev/null 2> "$tmp/oom.err"; then
  fail "12,500,000 bytes should not be enough without host-located VMM"
fi
grep -q "CUDA_ERROR_OUT_OF_MEMORY" "$tmp/oom.err" || { cat "$tmp/oom.err" >&2; fail "expected an out-of-memory error"; }

# The access log: tables found in copies, table references on launches,
# device-written tables read back, and the one table in memory nobody
# tracks marked unknown.
STENSOR_ACCESS_LOG="$tmp/log.jsonl" STENSOR_MEMORY_LIMIT=$smallest LD_PRELOAD="$preload" \
  "$train" "$kernels" --steps 2 --last-table pageable > /dev/null
python3 - "$tmp/log.jsonl" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
def fail(m):
    print("FAIL: " + m, file=sys.stderr); sys.exit(1)
copies = [r for r in records if r["type"] == "memcpy" and r.get("table_entries")]
if len(copies) < 4 or any(r["table_entries"] not in (2, 3) for r in copies):
    fail("expected host-to-device copies of 2- and 3-entry tables, got %r" % copies[:3])
launches = [r for r in records if r["type"] == "launch"]
unknown = [r for r in launches if r["unknown_tables"]]
# Only the table in pageable host memory, which nobody tracks.
if len(unknown) != 1 or "host_table_add" not in unknown[0]["kernel"] or unknown[0]["tables"]:
    fail("expected one launch with a table of unknown contents: %r" % unknown)
for r in launches:
    for t in r["tables"]:
        if not set(t["refs"]) <= set(r["reads"]):
            fail("table references not among the reads: %r" % r)
        if t["writes"] and not set(t["refs"]) <= set(r["writes"]):
            fail("written table references not among the writes: %r" % r)
axpy = [r for r in launches if "axpy" in r["kernel"]]
if not axpy or any(len(r["tables"]) != 2 or len(r["writes"]) != 3 for r in axpy):
    fail("axpy should reach six buffers through two tables, writing three: %r" % axpy[:1])
for r in axpy:
    reads_only = [t for t in r["tables"] if not t["writes"]]
    if len(reads_only) != 1 or set(reads_only[0]["refs"]) & set(r["writes"]):
        fail("axpy's const table should only be read: %r" % r)
scale = [r for r in launches if "scale" in r["kernel"]]
if not scale or any(len(r["tables"]) != 1 or len(r["tables"][0]["refs"]) != 1 for r in scale):
    fail("scale should reach the 4 MiB buffer through the kernel-built table: %r" % scale[:1])
if not any(r["type"] == "table_read_back" for r in records):
    fail("no table was read back")
EOF
echo "PASS: table_train bit-identical under every cap, policy and host VMM setting"
