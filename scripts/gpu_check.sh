#!/usr/bin/env bash
# Checks stensor on this machine's GPU, from the bundle scripts/gpu_bundle.sh
# built (run it from the bundle: ./gpu_check.sh), in a few minutes, and
# writes one JSON file with:
#   driver and toolkit versions;
#   mlp_train's checksum and steps per second without stensor, preloaded
#     without a cap, and under caps of 60 % and 40 % of its working set;
#   the swap traffic under each cap and the bandwidth it achieved (bytes
#     moved / the time the capped run took beyond the uncapped one) against
#     the pinned-copy probe;
#   the unified-memory baseline: mlp_train --memory managed, steps per second;
#   whether a CUDA-runtime program's calls (static cudart, which reaches the
#     driver through cuGetProcAddress) were intercepted.
# A driver older than the bundle's toolkit, or none, gives a clear message
# and a JSON file saying so (exit 1), never a crash.
#
# usage: gpu_check.sh [--out FILE] [--steps N] [--hidden N] [--layers N] [--dry-run]
#   --out FILE   where the JSON goes (default gpu_check.json in the bundle)
#   --steps N    training steps per run (default 40; 6 with --dry-run)
#   --hidden N   mlp_train --hidden (default 4096; 512 with --dry-run)
#   --layers N   mlp_train --layers (default 8; 2 with --dry-run)
#   --dry-run    on the bundle's fake driver (fake/libcuda.so.1), no GPU:
#                the host-kernel module instead of the fatbin; the runtime
#                program, the probe and the unified-memory run are skipped
#                (reported as null)
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
out=$dir/gpu_check.json steps= hidden= layers= dry=0
while (($#)); do
  case $1 in
    --out) out=${2:?--out needs a file}; shift ;;
    --steps) steps=${2:?--steps needs a value}; shift ;;
    --hidden) hidden=${2:?--hidden needs a value}; shift ;;
    --layers) layers=${2:?--layers needs a value}; shift ;;
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if ((dry)); then
  steps=${steps:-6} hidden=${hidden:-512} layers=${layers:-2}
  export LD_LIBRARY_PATH=$dir/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  module=$dir/mlp_kernels_host.so
else
  steps=${steps:-40} hidden=${hidden:-4096} layers=${layers:-8}
  module=$dir/mlp_kernels.fatbin
fi
for v in steps hidden layers; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: --$v '${!v}': expected a positive integer" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
toolkit=$(sed -n 's/^toolkit //p' "$dir/MANIFEST" 2>/dev/null || true)
commit=$(sed -n 's/^commit //p' "$dir/MANIFEST" 2>/dev/null || true)

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "${s//$'\n'/ }"; }
json_num() { [[ -n $1 ]] && printf '%s' "$1" || printf null; }
fail_json() {  # fail_json MESSAGE: the JSON says why, and so does stderr
  echo "gpu_check.sh: $1" >&2
  printf '{"ok": false, "error": %s, "toolkit": %s, "commit": %s}\n' "$(json_str "$1")" \
    "$(json_str "$toolkit")" "$(json_str "$commit")" > "$out"
  exit 1
}

driver=fake runtime= h2d= d2h=
if ((!dry)); then
  if ! "$dir/runtime_probe" version > "$work/version.txt" 2> "$work/version.err"; then
    fail_json "$(cat "$work/version.err" "$work/version.txt" | head -n 2 | tr '\n' ' ')"
  fi
  read -r _ driver _ runtime < "$work/version.txt"
  if "$dir/runtime_probe" bandwidth > "$work/bw.txt" 2> "$work/bw.err"; then
    read -r _ h2d _ d2h < "$work/bw.txt"
  else
    echo "gpu_check.sh: the bandwidth probe failed: $(cat "$work/bw.err")" >&2
  fi
fi

# train NAME [VAR=value...] [-- FLAG...]: runs mlp_train; sets
# checksum_NAME, wall_NAME, out_NAME and in_NAME (MiB swapped, from
# STENSOR_STATS), link_NAME (the library's own probe, GB/s).
train() {
  local name=$1
  shift
  local vars=() flags=()
  while (($#)) && [[ $1 != -- ]]; do vars+=("$1"); shift; done
  (($#)) && shift
  flags=("$@")
  local start end
  start=$(date +%s.%N)
  if ! env "${vars[@]}" "$dir/mlp_train" --module "$module" --steps "$steps" --hidden "$hidden" \
      --layers "$layers" "${flags[@]}" > "$work/$name.out" 2> "$work/$name.err"; then
    echo "gpu_check.sh: mlp_train ($name) failed: $(tail -n 3 "$work/$name.err")" >&2
    printf -v "checksum_$name" '%s' "failed"
    printf -v "wall_$name" '%s' ""
    return
  fi
  end=$(date +%s.%N)
  printf -v "checksum_$name" '%s' "$(sed -n 's/^checksum //p' "$work/$name.out")"
  printf -v "wall_$name" '%s' "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')"
  printf -v "out_$name" '%s' "$(sed -n 's/^stensor: swap-outs copied.*(\([0-9.]*\) MiB.*/\1/p' "$work/$name.err")"
  printf -v "in_$name" '%s' "$(sed -n 's/^stensor: swap-ins copied.*(\([0-9.]*\) MiB.*/\1/p' "$work/$name.err")"
  printf -v "link_$name" '%s' "$(sed -n 's/^stensor: link bandwidth *\([0-9.]*\) GB.*/\1/p' "$work/$name.err")"
}
preload=$dir/libstensor.so
train plain
[[ $checksum_plain != failed ]] || fail_json "mlp_train fails without stensor: $(tail -n 2 "$work/plain.err" | tr '\n' ' ')"
ws=$(sed -n 's/^working_set //p' "$work/plain.out")
train preloaded LD_PRELOAD="$preload"
train cap60 LD_PRELOAD="$preload" STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=$((ws * 60 / 100))
train cap40 LD_PRELOAD="$preload" STENSOR_STATS=1 STENSOR_MEMORY_LIMIT=$((ws * 40 / 100))
managed_checksum= wall_managed=
if ((!dry)); then
  train managed -- --memory managed
  managed_checksum=$checksum_managed
fi

intercepted= probe_checksum= probe_plain=
if ((!dry)); then
  probe_plain=$("$dir/runtime_probe" check 2>&1 | sed -n 's/^checksum //p' || true)
  if STENSOR_ACCESS_LOG="$work/probe.jsonl" LD_PRELOAD="$preload" "$dir/runtime_probe" check \
      > "$work/probe.out" 2> "$work/probe.err"; then
    probe_checksum=$(sed -n 's/^checksum //p' "$work/probe.out")
  fi
  # Intercepted: its allocations and launches are in stensor's log.
  if grep -q '"type":"alloc"' "$work/probe.jsonl" 2>/dev/null &&
     grep -q '"type":"launch"' "$work/probe.jsonl" 2>/dev/null; then
    intercepted=true
  else
    intercepted=false
  fi
fi

rate() {  # steps per second of run NAME
  local wall=$1
  [[ -n $wall ]] && awk -v s="$steps" -v w="$wall" 'BEGIN { printf "%.3f", s / w }' || true
}
achieved() {  # GB/s: MiB moved / seconds beyond the uncapped run
  local o=$1 i=$2 wall=$3
  [[ -n $o && -n $i && -n $wall && -n $wall_preloaded ]] || return 0
  awk -v o="$o" -v i="$i" -v w="$wall" -v u="$wall_preloaded" \
    'BEGIN { d = w - u; if (d > 0) printf "%.2f", (o + i) * 1048576 / d / 1e9 }'
}
run_json() {  # run_json NAME
  local c="checksum_$1" w="wall_$1" o="out_$1" i="in_$1" l="link_$1"
  printf '{"checksum": %s, "matches_plain": %s, "wall_s": %s, "steps_per_s": %s' \
    "$(json_str "${!c}")" "$([[ ${!c} == "$checksum_plain" ]] && echo true || echo false)" \
    "$(json_num "${!w}")" "$(json_num "$(rate "${!w}")")"
  if [[ -n ${!o:-} ]]; then
    printf ', "mib_out": %s, "mib_in": %s, "achieved_gbps": %s, "library_probe_gbps": %s' \
      "${!o}" "${!i}" "$(json_num "$(achieved "${!o}" "${!i}" "${!w}")")" "$(json_num "${!l:-}")"
  fi
  printf '}'
}

{
  printf '{"ok": true, "dry_run": %s, "driver": %s, "runtime": %s, "toolkit": %s, "commit": %s,\n' \
    "$([[ $dry == 1 ]] && echo true || echo false)" "$(json_str "$driver")" "$(json_num "$runtime")" \
    "$(json_str "$toolkit")" "$(json_str "$commit")"
  printf ' "model": {"steps": %s, "hidden": %s, "layers": %s, "working_set_bytes": %s},\n' \
    "$steps" "$hidden" "$layers" "$(json_num "$ws")"
  printf ' "probe": {"h2d_gbps": %s, "d2h_gbps": %s},\n' "$(json_num "$h2d")" "$(json_num "$d2h")"
  for run in plain preloaded cap60 cap40; do
    printf ' "%s": %s,\n' "$run" "$(run_json "$run")"
  done
  if ((dry)); then
    printf ' "unified_memory": null,\n'
  else
    printf ' "unified_memory": {"checksum": %s, "steps_per_s": %s},\n' \
      "$(json_str "$managed_checksum")" "$(json_num "$(rate "$wall_managed")")"
  fi
  printf ' "runtime_program": {"intercepted": %s, "checksum": %s, "checksum_without_stensor": %s}}\n' \
    "$(json_num "$intercepted")" "$(json_str "$probe_checksum")" "$(json_str "$probe_plain")"
} > "$out"
echo "gpu_check: wrote $out"
cat "$out"
bad=0
for run in preloaded cap60 cap40; do
  c="checksum_$run"
  [[ ${!c} == "$checksum_plain" ]] || { echo "gpu_check.sh: $run: checksum ${!c}, without stensor $checksum_plain" >&2; bad=1; }
done
[[ -z $intercepted || $intercepted == true ]] || { echo "gpu_check.sh: the runtime program was not intercepted" >&2; bad=1; }
exit $bad
