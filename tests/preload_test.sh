#!/usr/bin/env bash
# libstensor.so preloaded under programs on the fake driver: mlp_train prints
# exactly what it prints without it and its access log carries the kernels'
# read and write sets; a program that reaches the driver as the CUDA runtime
# does gets stensor's hooks for the exact ABIs it asks for; the library
# exports only C symbols and links no spdlog or fmt; a bad setting stops the
# program at start with one line, a STENSOR_REAL_LIBCUDA that is no CUDA
# driver at its first CUDA call.
set -euo pipefail
train=$1 fake=$2 stensor=$3 runtime_path=$4 checker=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

"$train" --steps 5 > "$tmp/plain.txt"
STENSOR_ACCESS_LOG="$tmp/log-%p.jsonl" LD_PRELOAD="$preload" "$train" --steps 5 > "$tmp/preloaded.txt"
cmp "$tmp/plain.txt" "$tmp/preloaded.txt" || { diff "$tmp/plain.txt" "$tmp/preloaded.txt" >&2; fail "output differs under the preload"; }
logs=("$tmp"/log-*.jsonl)
(( ${#logs[@]} == 1 )) || fail "expected one access log, found ${#logs[@]}"
python3 "$checker" "${logs[0]}" 5

# Preloaded into the shell that starts the job (as with scripts/with-fake-gpu,
# which sets the loader path only after it started): the shell, which never
# uses CUDA, runs unaffected and writes no log of its own.
fakedir=$LD_LIBRARY_PATH
mkdir -p "$tmp/shell"
env -u LD_LIBRARY_PATH STENSOR_ACCESS_LOG="$tmp/shell/log-%p.jsonl" LD_PRELOAD="$preload" \
  bash -c 'export LD_LIBRARY_PATH="$1"; exec "$2" --steps 5' _ "$fakedir" "$train" > "$tmp/shell.txt"
cmp -s "$tmp/plain.txt" "$tmp/shell.txt" || fail "output differs when the preload starts in a shell"
shell_logs=("$tmp"/shell/log-*.jsonl)
(( ${#shell_logs[@]} == 1 )) || fail "expected one access log (the trainer's), found ${#shell_logs[@]}"

# Conservative inference: every pointer parameter is written.
STENSOR_WRITE_INFERENCE=conservative STENSOR_ACCESS_LOG="$tmp/cons.jsonl" LD_PRELOAD="$preload" "$train" --steps 1 > /dev/null
python3 - "$tmp/cons.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "launch" and set(r["reads"]) != set(r["writes"]):
        sys.exit("conservative inference left a read-only buffer: %r" % r)
PY

"$runtime_path"
LD_PRELOAD="$preload" "$runtime_path" --expect-hooks libstensor.so

# The C hooks, NVML's two, the pair PyTorch's pluggable allocator loads and
# the statistics.
bad=$(nm -D --defined-only "$stensor" | awk '{print $NF}' |
  grep -v -E '^(cu[A-Za-z0-9_]+|dlsym|nvmlDeviceGetMemoryInfo(_v2)?|stensor_torch_malloc|stensor_torch_free|stensor_stats_json)$' || true)
[[ -z $bad ]] || fail "libstensor.so exports more than C hooks: $(echo $bad | head -c 300)"
if ldd "$stensor" | grep -E 'spdlog|fmt'; then fail "libstensor.so links spdlog or fmt dynamically"; fi

if STENSOR_POLICY=sometimes LD_PRELOAD="$preload" "$train" --steps 1 > "$tmp/out.txt" 2> "$tmp/err.txt"; then
  fail "an invalid STENSOR_POLICY was accepted"
fi
[[ ! -s $tmp/out.txt ]] || fail "the program ran despite an invalid setting"
(( $(wc -l < "$tmp/err.txt") == 1 )) || { cat "$tmp/err.txt" >&2; fail "expected one line on stderr"; }
grep -q 'STENSOR_POLICY="sometimes"' "$tmp/err.txt" || fail "the error does not name the variable and value: $(cat "$tmp/err.txt")"
grep -q '^stensor: invalid' "$tmp/err.txt" && ! grep -q 'stensor: stensor:' "$tmp/err.txt" ||
  fail "the error does not carry exactly one prefix: $(cat "$tmp/err.txt")"

# A misspelled option would leave the run uncapped without a word: it stops
# the program with one line naming the variable, its value and the option
# meant. Other variables are no business of stensor's.
if STENSOR_MEMRY_LIMIT=8MiB LD_PRELOAD="$preload" "$train" --steps 1 > "$tmp/out.txt" 2> "$tmp/err.txt"; then
  fail "a misspelled STENSOR_MEMRY_LIMIT was accepted"
fi
[[ ! -s $tmp/out.txt ]] || fail "the program ran despite a misspelled variable"
(( $(wc -l < "$tmp/err.txt") == 1 )) || { cat "$tmp/err.txt" >&2; fail "misspelled: expected one line on stderr"; }
grep -q '^stensor: unknown variable STENSOR_MEMRY_LIMIT="8MiB" .*did you mean STENSOR_MEMORY_LIMIT?' "$tmp/err.txt" ||
  fail "the error does not name the variable, its value and the option: $(cat "$tmp/err.txt")"
NOT_STENSOR_X=1 STENSORX=1 LD_PRELOAD="$preload" "$train" --steps 5 > "$tmp/other.txt"
cmp -s "$tmp/plain.txt" "$tmp/other.txt" || fail "a variable that is not STENSOR_* changed the run"

# A log that cannot be created (no such directory; an existing read-only
# file) stops the program at start with one line.
touch "$tmp/readonly.jsonl" && chmod a-w "$tmp/readonly.jsonl"
for log in "$tmp/no-such-dir/log.jsonl" "$tmp/readonly.jsonl"; do
  if [[ $log == *readonly* && -w $log ]]; then continue; fi  # root writes anyway
  if STENSOR_ACCESS_LOG=$log LD_PRELOAD="$preload" "$train" --steps 1 > "$tmp/out.txt" 2> "$tmp/err.txt"; then
    fail "an access log at $log was accepted"
  fi
  [[ ! -s $tmp/out.txt ]] || fail "$log: the program ran without its log"
  (( $(wc -l < "$tmp/err.txt") == 1 )) || { cat "$tmp/err.txt" >&2; fail "$log: expected one line on stderr"; }
  grep -q "^stensor: cannot write the access log \"$log\" (STENSOR_ACCESS_LOG): " "$tmp/err.txt" ||
    fail "$log: $(cat "$tmp/err.txt")"
done

# A log on a full disk: the run is unchanged and one line says how many
# records were lost (it used to lose them all with nothing said).
STENSOR_ACCESS_LOG=/dev/full LD_PRELOAD="$preload" "$train" --steps 5 > "$tmp/full.txt" 2> "$tmp/err.txt" ||
  fail "full disk: exit $?: $(cat "$tmp/err.txt")"
cmp -s "$tmp/plain.txt" "$tmp/full.txt" || fail "output differs with the log on a full disk"
(( $(wc -l < "$tmp/err.txt") == 1 )) || { cat "$tmp/err.txt" >&2; fail "full disk: expected one line on stderr"; }
grep -qE '^stensor: the access log "/dev/full" \(STENSOR_ACCESS_LOG\) lost [0-9]+ of [0-9]+ records: No space left on device$' \
  "$tmp/err.txt" || fail "full disk: $(cat "$tmp/err.txt")"

# STENSOR_REAL_LIBCUDA naming something that is not a CUDA driver (a library
# without cuInit and cuDriverGetVersion, stensor itself, the toolkit's stub
# libcuda.so, whose cuDriverGetVersion answers CUDA_ERROR_STUB_LIBRARY = 34:
# the fake made to answer so), or nothing: one line at the first CUDA call,
# never a run on which every call fails unexplained. Naming the driver
# itself runs as without it.
fake_abs=$LD_LIBRARY_PATH/$(basename "$fake")
STENSOR_REAL_LIBCUDA=$fake_abs LD_PRELOAD="$preload" "$train" --steps 5 > "$tmp/named.txt"
cmp -s "$tmp/plain.txt" "$tmp/named.txt" || fail "output differs with STENSOR_REAL_LIBCUDA naming the driver"
for lib in libm.so.6 "$stensor" "$tmp/no-such-libcuda.so" "stub:$fake_abs"; do
  inject=()
  if [[ $lib == stub:* ]]; then lib=${lib#stub:}; inject=(FAKECUDA_FAIL=cuDriverGetVersion:1:34); fi
  if env "${inject[@]}" STENSOR_REAL_LIBCUDA="$lib" LD_PRELOAD="$preload" "$train" --steps 1 > "$tmp/out.txt" 2> "$tmp/err.txt"; then
    fail "STENSOR_REAL_LIBCUDA=$lib ${inject[*]} was accepted"
  fi
  (( $(wc -l < "$tmp/err.txt") == 1 )) || { cat "$tmp/err.txt" >&2; fail "$lib: expected one line on stderr"; }
  grep -q "STENSOR_REAL_LIBCUDA=\"$lib\"" "$tmp/err.txt" || fail "$lib: the error does not name it: $(cat "$tmp/err.txt")"
  if (( ${#inject[@]} )); then
    grep -q "stub library" "$tmp/err.txt" || fail "the stub is not called one: $(cat "$tmp/err.txt")"
  fi
done
echo "PASS"
