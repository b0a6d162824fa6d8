#!/usr/bin/env bash
# Several processes and GPUs, as torchrun starts them: four mlp_train
# processes at once on a machine of four fake devices, each with RANK,
# LOCAL_RANK and WORLD_SIZE, ranks 0 and 1 restricted to their GPU by
# CUDA_VISIBLE_DEVICES=$LOCAL_RANK, ranks 2 and 3 seeing all four and
# choosing theirs with --device $LOCAL_RANK; each preloaded with
# libstensor.so under a cap of its own (100 % of its working set in bytes,
# 60 % in the per-device form for ordinal 0 behind CUDA_VISIBLE_DEVICES,
# 30 % of the device in percent, 40 % in the per-device form for ordinal 3) and writing its own access log through %r. Checks: every rank
# prints the checksum of its uncapped run without stensor, bit for bit; each
# rank wrote exactly one log, named with its rank, whole (header with its
# pid, end record, nothing dropped), whose header names the physical device
# it used (UUID, PCI bus id); every rank below its working set swapped; each
# device's high-water mark stayed within its cap; every exit status is 0.
# Then %r from LOCAL_RANK alone, a malformed RANK, and two processes given
# one log path (one writes it, the other says so and writes none).
set -euo pipefail
train=$1 fake=$2 stensor=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
export FAKECUDA_DEVICES=4 FAKECUDA_DEVICE_MEMORY=128MiB
unset CUDA_VISIBLE_DEVICES RANK LOCAL_RANK WORLD_SIZE
world=4 steps=${MULTI_PROCESS_STEPS:-12}

# Rank r trains with seed r + 1, so a log or output mixed up between ranks
# shows. The uncapped runs, without stensor, give each rank's checksum.
for r in 0 1 2 3; do
  "$train" --steps "$steps" --seed $((r + 1)) --device "$r" > "$tmp/plain.$r.out" &
done
wait
ws=$(sed -n 's/^working_set //p' "$tmp/plain.0.out")
(( ws > 0 )) || fail "no working set in $(cat "$tmp/plain.0.out")"
device=$((128 << 20))
# The cap each rank is given, and the same in bytes.
# Rank 1's per-device entry is for device 0: the ordinal as the process
# sees it, physical device 1 behind CUDA_VISIBLE_DEVICES=1.
limit=("$ws" "0=$((ws * 60 / 100))" "30%" "3=$((ws * 40 / 100))")
cap_bytes=("$ws" $((ws * 60 / 100)) $((device * 30 / 100)) $((ws * 40 / 100)))

logs=$tmp/logs
mkdir -p "$logs"
declare -a pids
for r in 0 1 2 3; do
  if (( r < 2 )); then visible=(CUDA_VISIBLE_DEVICES=$r) ordinal=0
  else visible=() ordinal=$r
  fi
  env "${visible[@]}" RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world \
    STENSOR_MEMORY_LIMIT="${limit[$r]}" STENSOR_STATS=1 FAKECUDA_REPORT_PEAK=1 \
    STENSOR_ACCESS_LOG="$logs/log.%r.jsonl" LD_PRELOAD="$preload" \
    "$train" --steps "$steps" --seed $((r + 1)) --device "$ordinal" \
    > "$tmp/rank.$r.out" 2> "$tmp/rank.$r.err" &
  pids[r]=$!
done
for r in 0 1 2 3; do
  status=0
  wait "${pids[r]}" || status=$?
  (( status == 0 )) || { cat "$tmp/rank.$r.err" >&2; fail "rank $r exited with status $status"; }
done

found=$(cd "$logs" && ls | sort | tr '\n' ' ')
[[ $found == "log.0.jsonl log.1.jsonl log.2.jsonl log.3.jsonl " ]] ||
  fail "expected one log per rank, found: $found"
for r in 0 1 2 3; do
  cmp -s "$tmp/plain.$r.out" "$tmp/rank.$r.out" ||
    fail "rank $r: $(tail -1 "$tmp/rank.$r.out"), uncapped $(tail -1 "$tmp/plain.$r.out")"
  # The device the rank used, as the process numbers it.
  ordinal=$(( r < 2 ? 0 : r ))
  peak=$(sed -n "s/^fakecuda: device $ordinal peak \([0-9]*\) bytes$/\1/p" "$tmp/rank.$r.err")
  (( peak <= cap_bytes[r] )) || fail "rank $r: high-water mark $peak above its cap ${cap_bytes[r]}"
  # Nothing on the devices it sees but does not use.
  others=$(sed -n "s/^fakecuda: device [0-9]* peak \([0-9]*\) bytes$/\1/p" "$tmp/rank.$r.err" |
    awk '{ s += $1 } END { print s }')
  (( others == peak )) || fail "rank $r: $((others - peak)) bytes used on devices other than $ordinal"
  python3 - "$logs/log.$r.jsonl" "${pids[r]}" "$ordinal" "$r" "${limit[$r]}" \
    "$(( cap_bytes[r] < ws ))" <<'PY' || fail "rank $r: its access log (above)"
import json, sys
path, pid, ordinal, physical, limit, capped = sys.argv[1:]
records = []
for number, line in enumerate(open(path), 1):
    try:
        records.append(json.loads(line))
    except ValueError:
        sys.exit("%s: line %d is not whole JSON: %r" % (path, number, line[:120]))
header, end = records[0], records[-1]
if header["type"] != "header" or header["pid"] != int(pid):
    sys.exit("%s: first record is not this process's header: %r" % (path, header))
if end["type"] != "end" or end["dropped"] != 0:
    sys.exit("%s: last record is not an end record with nothing dropped" % path)
if sum(r["type"] in ("header", "end") for r in records) != 2:
    sys.exit("%s: more than one header or end record" % path)
if header["config"]["STENSOR_MEMORY_LIMIT"] != limit:
    sys.exit("%s: cap %r, given %r" % (path, header["config"]["STENSOR_MEMORY_LIMIT"], limit))
# Every buffer on one device, and the header says which physical one.
used = {r["device"] for r in records if r["type"] == "alloc"}
if used != {int(ordinal)}:
    sys.exit("%s: buffers on devices %r, expected %s" % (path, used, ordinal))
device = header["devices"][int(ordinal)]
want_uuid = "GPU-facecd1%x-0000-0000-6661-6b6563756461" % int(physical)
want_bus = "0000:%02x:00.0" % (int(physical) + 1)
if device["uuid"] != want_uuid or device["pci_bus_id"] != want_bus:
    sys.exit("%s: device %r, expected %s at %s" % (path, device, want_uuid, want_bus))
evictions = sum(r["type"] in ("swap_out", "drop_clean", "drop_unwritten") for r in records)
if capped == "1" and evictions == 0:
    sys.exit("%s: capped below the working set, yet nothing was evicted" % path)
print("rank %s: %d records, device %s (%s), %d evictions" %
      (physical, len(records), device["uuid"][:12], device["pci_bus_id"], evictions))
PY
  if (( cap_bytes[r] < ws )); then
    copied=$(sed -n 's/^stensor: swap-outs copied *\([0-9]*\) .*/\1/p' "$tmp/rank.$r.err")
    (( copied > 0 )) || fail "rank $r: capped below its working set, no swap-out copied"
  fi
  echo "rank $r: cap ${limit[$r]}, peak $peak of ${cap_bytes[r]}, $(tail -1 "$tmp/rank.$r.out")"
done

# %r without RANK: LOCAL_RANK.
LOCAL_RANK=5 STENSOR_ACCESS_LOG="$tmp/local.%r.jsonl" LD_PRELOAD="$preload" \
  "$train" --steps 1 > /dev/null
[[ -s $tmp/local.5.jsonl ]] || fail "%r with only LOCAL_RANK=5 set did not write local.5.jsonl"

# A malformed RANK stops the program at start, naming it.
if RANK=one LOCAL_RANK=1 STENSOR_ACCESS_LOG="$tmp/bad.%r.jsonl" LD_PRELOAD="$preload" \
  "$train" --steps 1 > "$tmp/bad.out" 2> "$tmp/bad.err"; then
  fail "RANK=one was accepted for %r"
fi
grep -q 'stensor: invalid RANK="one" (used for %r in STENSOR_ACCESS_LOG)' "$tmp/bad.err" ||
  fail "malformed RANK: $(cat "$tmp/bad.err")"
[[ ! -s $tmp/bad.out ]] || fail "the program ran despite RANK=one"
# Two processes given one log path (no %r or %p): the first to open it
# writes it; the other says so on stderr and writes none, rather than both
# truncating and overwriting each other's lines. Deterministic first: the
# lock held by flock(1) while a process starts.
echo "held" > "$tmp/shared.jsonl"
flock "$tmp/shared.jsonl" env STENSOR_ACCESS_LOG="$tmp/shared.jsonl" LD_PRELOAD="$preload" \
  "$train" --steps 1 > /dev/null 2> "$tmp/held.err"
[[ $(cat "$tmp/shared.jsonl") == held ]] || fail "a log another process holds was written to"
grep -q 'is being written by another process: this process writes no access log' "$tmp/held.err" ||
  fail "no word that the log is held: $(cat "$tmp/held.err")"
# Then two ranks at once: one whole log, whichever opened it first (both, one
# after the other, if they did not overlap), and both trained as without it.
rm "$tmp/shared.jsonl"
for r in 0 1; do
  RANK=$r STENSOR_ACCESS_LOG="$tmp/shared.jsonl" LD_PRELOAD="$preload" \
    "$train" --steps "$steps" --seed $((r + 1)) --device "$r" > "$tmp/shared.$r.out" 2> "$tmp/shared.$r.err" &
  pids[r]=$!
done
for r in 0 1; do
  wait "${pids[r]}" || fail "rank $r exited with status $? sharing a log path"
  cmp -s "$tmp/plain.$r.out" "$tmp/shared.$r.out" || fail "rank $r: other output sharing a log path"
done
python3 - "$tmp/shared.jsonl" "${pids[0]}" "${pids[1]}" <<'PY' || fail "shared log path (above)"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
headers = [r for r in records if r["type"] == "header"]
if len(headers) != 1 or records[0] is not headers[0] or records[-1]["type"] != "end" \
        or sum(r["type"] == "end" for r in records) != 1:
    sys.exit("not one whole log: %d headers" % len(headers))
if str(headers[0]["pid"]) not in sys.argv[2:]:
    sys.exit("header of pid %r" % headers[0]["pid"])
PY
warned=$(cat "$tmp"/shared.[01].err | grep -c 'is being written by another process' || true)
echo "shared log path: one whole log, $warned process(es) said the log was taken"
echo PASS
