#!/usr/bin/env bash
# A device-built pointer table in a small stream-ordered allocation, read
# back before each launch through it (tests/table_writers.cc): the read-back
# waits for the launch's stream, not the context (another stream is held
# meanwhile: a wait for the context stalls the program, which then fails).
# Under a cap that holds both targets, host-located VMM on and off, and one
# that holds one (the target must be known to be made resident, the other
# served from host memory) with host-located VMM: the
# uncapped checksum, and the log's read-backs waited for the stream or the
# writers' events.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

want=$("$program" "$kernels" | tail -n 1)
[[ $want == checksum* ]] || fail "the run without stensor printed no checksum"
for vmm in 1 0; do
  for cap in $((2 * 2097152 + 4096)) $((2097152 + 4096)); do
    # The storing launch reaches the table's previous target too: without
    # host-located VMM both must fit.
    (( vmm == 0 && cap < 2 * 2097152 )) && continue
    name="cap$cap-vmm$vmm"
    FAKECUDA_HOST_VMM=$vmm STENSOR_MEMORY_LIMIT=$cap STENSOR_ACCESS_LOG="$tmp/$name.jsonl" \
      LD_PRELOAD="$preload" "$program" "$kernels" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
      { tail -n 20 "$tmp/$name.err" >&2; fail "$name: table_writers failed"; }
    [[ $(tail -n 1 "$tmp/$name.out") == "$want" ]] || fail "$name: $(tail -n 1 "$tmp/$name.out"), want $want"
    backs=$(grep -c '"type":"table_read_back"' "$tmp/$name.jsonl" || true)
    (( backs >= 6 )) || fail "$name: $backs table read-backs, want one a step"
    # The first learns the table (its writers unknown: the stream), the
    # others refresh the range the kernel rewrote (its event).
    grep '"type":"table_read_back"' "$tmp/$name.jsonl" | grep -q '"waited":"stream"' ||
      fail "$name: no read-back waited for the launch's stream"
    if grep '"type":"table_read_back"' "$tmp/$name.jsonl" | grep -Evq '"waited":"(stream|writers)"'; then
      fail "$name: a read-back waited for more than the table's writers or the stream"
    fi
  done
done
echo "PASS: a device-built table in a driver allocation read back after its stream only"
