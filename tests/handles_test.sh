#!/usr/bin/env bash
# Handles stensor must not take at face value (tests/handle_adversary.cc),
# without stensor, preloaded uncapped, and under a cap of eight of the
# program's 2 MiB buffers with host-located VMM on and off: every run
# prints the plain run's driver results and checksum, and the capped runs
# swap, with no failed driver call of stensor's own.
#   free-async     cuMemFreeAsync/cuMemAllocAsync on a destroyed and a bogus
#                  stream: CUDA_ERROR_INVALID_HANDLE, the buffers intact.
#   refused-work   then a copy, a memset and a launch on such streams: the
#                  driver's error, the buffers intact (stensor's calls made
#                  with the program's bad stream, its waits on it, fail and
#                  are worked around: not counted against it here).
#   graph-update   a node set through the original graph's handle after
#                  cuGraphExecUpdate: the exec's launches stay inferred.
#   ctx-destroy, ctx-reset, ctx-release
#                  the context stensor's streams were made in ends; twelve
#                  allocations after it, each past the eighth evicting,
#                  all succeed with their data (three runs per setting).
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
cap=$((16 << 20))
stat() { sed -n "s/^stensor: $2 *\([0-9]*\) .*/\1/p" "$tmp/$1.err"; }

run() {  # NAME MODE [VAR=value...]: output in NAME.out/.err, compared with MODE.want
  local name=$1 mode=$2
  shift 2
  env "$@" "$program" "$kernels" "$mode" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.out" "$tmp/$name.err" >&2; fail "$name: the program failed"; }
  cmp -s "$tmp/$name.out" "$tmp/$mode.want" ||
    { diff "$tmp/$mode.want" "$tmp/$name.out" >&2 || true; fail "$name: other results than without stensor"; }
}

for mode in free-async refused-work graph-update ctx-destroy ctx-reset ctx-release; do
  "$program" "$kernels" "$mode" > "$tmp/$mode.want" || fail "$mode: plain run failed"
  run "$mode-nocap" "$mode" LD_PRELOAD="$preload"
  tries=1
  [[ $mode != ctx-* ]] || tries=3
  for vmm in 1 0; do
    for i in $(seq "$tries"); do
      name=$mode-$vmm-$i
      run "$name" "$mode" LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap STENSOR_STATS=1 \
        FAKECUDA_HOST_VMM=$vmm STENSOR_ACCESS_LOG="$tmp/$name.jsonl"
      (( $(stat "$name" "swap-outs copied") > 0 )) || fail "$name: nothing was swapped out"
      errors=$(stat "$name" "driver errors")
      [[ $mode == refused-work || -z $errors || $errors == 0 ]] ||
        fail "$name: $errors failed driver calls of stensor's"
      ! grep -q '"type":"oom"' "$tmp/$name.jsonl" || fail "$name: out of memory"
      if [[ $mode == graph-update ]]; then
        # The exec's plan is followed through the update and the setter.
        launches=$(grep -c '"type":"graph_launch".*"inferred":true' "$tmp/$name.jsonl" || true)
        (( launches == 5 )) || fail "$name: $launches inferred graph launches, want 5"
      fi
    done
  done
  echo "$mode: $(tail -1 "$tmp/$mode.want")"
done
echo PASS
