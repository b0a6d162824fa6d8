#!/usr/bin/env bash
# `stensor run` as a user runs it: the flags reach the command as the
# library's variables, its arguments unchanged, LD_PRELOAD with libstensor.so
# added after (and never twice) what was there; the command's exit status
# comes back, 128+N for signal N; SIGTERM sent to stensor run reaches the
# command; a bad value or an unknown flag is one line and exit 2 with nothing
# run; a stensor with no library beside it says where it looked. Then the
# help of every command and the version.
set -euo pipefail
stensor=$1 lib=$2 other=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
# As stensor finds it: the file itself, not the runfiles link to it.
lib=$(readlink -f "$lib")
other=$(readlink -f "$other")
unset LD_PRELOAD STENSOR_CONFIG
# An ASan-built library (--config=asan) needs the ASan runtime preloaded
# before it: that is the LD_PRELOAD every command here starts with, and
# stensor run keeps it.
source "$(dirname "$0")/../tests/preload.bash"
base=$(preload_of "$lib")
base=${base%"$lib"}
base=${base%:}
[[ -z $base ]] || export LD_PRELOAD=$base

# run EXPECTED_RC ARGS...: runs stensor, output in $tmp/out and $tmp/err.
run() {
  local expected=$1 rc=0
  shift
  "$stensor" "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  ((rc == expected)) || fail "stensor $*: exit $rc, expected $expected; stderr: $(cat "$tmp/err")"
}

# Settings and arguments. The library is found beside stensor (bazel-bin).
run 0 run --limit 1GiB --host-limit 50% --policy lru --prefetch off \
  --log "$tmp/never.%p.jsonl" --stats --verify=hash -- \
  sh -c 'for a in "$@"; do echo "arg [$a]"; done; env' sh 'two words' --limit ''
for want in STENSOR_MEMORY_LIMIT=1GiB STENSOR_HOST_LIMIT=50% STENSOR_POLICY=lru \
  STENSOR_PREFETCH=off "STENSOR_ACCESS_LOG=$tmp/never.%p.jsonl" STENSOR_STATS=1 \
  STENSOR_VERIFY=hash "LD_PRELOAD=${base:+$base:}$lib" 'arg [two words]' 'arg [--limit]' 'arg []'; do
  grep -qxF -- "$want" "$tmp/out" || fail "no line '$want' in: $(cat "$tmp/out")"
done
(($(grep -c '^arg ' "$tmp/out") == 3)) || fail "expected 3 arguments: $(cat "$tmp/out")"
echo "PASS: settings, arguments and LD_PRELOAD=$lib reach the command"

# A preload already there is kept, ours after it; ours is not added twice.
given=${base:+$base:}$other
LD_PRELOAD=$given run 0 run -- sh -c 'echo "$LD_PRELOAD"'
[[ $(cat "$tmp/out") == "$given:$lib" ]] || fail "LD_PRELOAD=$given became $(cat "$tmp/out")"
given="${base:+$base }$lib $other"
LD_PRELOAD=$given run 0 run --library "$lib" -- sh -c 'echo "$LD_PRELOAD"'
[[ $(cat "$tmp/out") == "$given" ]] || fail "LD_PRELOAD='$given' became $(cat "$tmp/out")"
echo "PASS: an existing LD_PRELOAD is kept"

# Exit statuses: the command's, 128+N for signal N, 127 when not found.
run 3 run -- sh -c 'exit 3'
run 137 run -- sh -c 'kill -KILL $$'
run 143 run -- sh -c 'kill -TERM $$'
run 127 run -- "$tmp/no-such-program"
grep -q "cannot run '$tmp/no-such-program': No such file or directory" "$tmp/err" ||
  fail "not-found message: $(cat "$tmp/err")"
echo "PASS: exit 3, 128+9, 128+15, 127"

# SIGTERM to stensor run reaches the command, which traps it and exits 7.
wait_for() {
  for _ in $(seq 200); do [[ -s $1 ]] && return 0; sleep 0.05; done
  fail "$1 never appeared"
}
"$stensor" run -- sh -c "trap 'echo trapped > $tmp/marker; exit 7' TERM; echo ready > $tmp/ready
  while :; do sleep 0.05; done" &
pid=$!
wait_for "$tmp/ready"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
((rc == 7)) || fail "stensor run after SIGTERM: exit $rc, expected 7"
[[ $(cat "$tmp/marker") == trapped ]] || fail "the command did not trap SIGTERM"
# An untrapped SIGUSR1 ends the command: 128+10.
rm -f "$tmp/ready"
"$stensor" run -- sh -c "echo ready > $tmp/ready; while :; do sleep 0.05; done" &
pid=$!
wait_for "$tmp/ready"
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
((rc == 128 + 10)) || fail "stensor run after SIGUSR1: exit $rc, expected 138"
echo "PASS: SIGTERM and SIGUSR1 forwarded"

# Bad values and flags: one line, exit 2, nothing run.
one_line() {
  (($(wc -l < "$tmp/err") == 1)) || fail "expected one line, got: $(cat "$tmp/err")"
  grep -qF -- "$1" "$tmp/err" || fail "'$1' not in: $(cat "$tmp/err")"
  [[ ! -e $tmp/ran ]] || fail "the command ran"
}
run 2 run --limit 12XB -- touch "$tmp/ran"
one_line 'stensor run: --limit: invalid STENSOR_MEMORY_LIMIT="12XB": expected a size'
run 2 run --policy fifo -- touch "$tmp/ran"
one_line 'stensor run: --policy: invalid STENSOR_POLICY="fifo": expected lru, version or belady'
run 2 run --frobnicate -- touch "$tmp/ran"
one_line 'stensor run: unknown flag --frobnicate'
run 2 run --limit
one_line 'stensor run: --limit needs a value'
run 2 run --stats
one_line 'stensor run: no command given'
STENSOR_PREFETCH=sometimes run 2 run -- touch "$tmp/ran"
one_line 'stensor run: from the environment: invalid STENSOR_PREFETCH="sometimes"'
STENSOR_MEMRY_LIMIT=1GiB run 2 run -- touch "$tmp/ran"
one_line 'unknown variable STENSOR_MEMRY_LIMIT="1GiB" in the environment: did you mean STENSOR_MEMORY_LIMIT?'
run 2 frobnicate
one_line "stensor: unknown command 'frobnicate'"
echo "PASS: bad values, flags and commands refused"

# No library beside a copy of stensor: the error says where it looked.
mkdir -p "$tmp/alone"
cp "$stensor" "$tmp/alone/stensor"
rc=0
"$tmp/alone/stensor" run -- touch "$tmp/ran" 2> "$tmp/err" || rc=$?
((rc == 2)) || fail "without a library: exit $rc"
one_line "libstensor.so not found beside stensor (looked for $tmp/alone/../interpose/libstensor.so and $tmp/alone/libstensor.so)"
run 2 run --library "$tmp/alone/libstensor.so" -- touch "$tmp/ran"
one_line "--library $tmp/alone/libstensor.so: No such file or directory"
echo "PASS: a missing library is named"

# Help and version.
for help in --help -h help; do
  run 0 $help
  for word in "stensor run" "stensor sim" version help; do
    grep -qF -- "$word" "$tmp/out" || fail "stensor $help: no '$word'"
  done
done
run 2
for help in "run --help" "help run"; do
  run 0 $help
  for flag in "--limit SIZE" "--host-limit SIZE" "--policy P" "--prefetch on|off" "--log PATH" \
    --stats "--verify MODE" "--library PATH" --help STENSOR_MEMORY_LIMIT STENSOR_HOST_LIMIT \
    STENSOR_POLICY STENSOR_PREFETCH STENSOR_ACCESS_LOG STENSOR_STATS STENSOR_VERIFY "exit status"; do
    grep -qF -- "$flag" "$tmp/out" || fail "stensor $help: no '$flag'"
  done
done
for help in "sim --help" "help sim"; do
  run 0 $help
  for flag in LOG "--limit BYTES|N%" "--policy P" "--prefetch on|off" "--planned-evictions on|off" \
    "--bandwidth GB/s" "--kernel-us US" --compare "--exact-seconds S" "--granularity BYTES" \
    "--rounds N" --help; do
    grep -qF -- "$flag" "$tmp/out" || fail "stensor $help: no '$flag'"
  done
done
run 0 version
grep -Eqx 'stensor 0\.10\.0 \(CUDA toolkit [0-9]+\.[0-9]+, CUDA_VERSION [0-9]+\)' "$tmp/out" ||
  fail "version: $(cat "$tmp/out")"
echo "PASS: help and version: $(cat "$tmp/out")"
