#!/usr/bin/env bash
# `stensor run --limit 40% --stats -- mlp_train --steps 4` on the fake
# driver, with the device at 160 MiB so that the cap (64 MiB) is below the
# program's working set (73 MiB): the capped run prints the uncapped run's
# checksum, the library's statistics come on stderr, buffers were swapped
# and the peak stayed under the cap. The library is the one stensor finds
# beside itself (bazel-bin/interpose/libstensor.so).
set -euo pipefail
stensor=$1 train=$2 fake=$3 lib=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
export FAKECUDA_DEVICE_MEMORY=160MiB
unset LD_PRELOAD STENSOR_CONFIG
# An ASan-built library needs the ASan runtime preloaded first; stensor run
# keeps it and adds the library after it.
source "$(dirname "$0")/../tests/preload.bash"
preload=$(preload_of "$lib")
[[ $preload == "$lib" ]] || export LD_PRELOAD=${preload%:*}

"$train" --steps 4 > "$tmp/uncapped.out"
"$stensor" run --limit 40% --stats -- "$train" --steps 4 > "$tmp/capped.out" 2> "$tmp/capped.err" ||
  fail "stensor run: exit $?; stderr: $(cat "$tmp/capped.err")"
uncapped=$(tail -n 1 "$tmp/uncapped.out")
capped=$(tail -n 1 "$tmp/capped.out")
[[ $uncapped =~ ^checksum\ [0-9a-f]{16}$ ]] || fail "uncapped run ends with '$uncapped'"
[[ $capped == "$uncapped" ]] || fail "capped run ends with '$capped', uncapped with '$uncapped'"

stat_of() { sed -n "s/^stensor: $1 *\([0-9.]*\) .*/\1/p" "$tmp/capped.err"; }
peak=$(stat_of "peak resident")
outs=$(stat_of "swap-outs copied")
drops=$(stat_of "never-written drops")
clean=$(stat_of "clean drops")
[[ -n $peak && -n $outs && -n $drops && -n $clean ]] ||
  fail "no statistics on stderr: $(cat "$tmp/capped.err")"
((outs + drops + clean > 0)) || fail "nothing was swapped under the cap: $(cat "$tmp/capped.err")"
awk -v p="$peak" 'BEGIN { exit !(p <= 64) }' || fail "peak resident $peak MiB above the 64 MiB cap"
echo "PASS: $capped under --limit 40% of 160 MiB: peak $peak MiB, $outs swap-outs, $drops + $clean drops"
