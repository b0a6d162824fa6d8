#!/usr/bin/env bash
# Checks stensor on this machine's GPU, from the bundle scripts/gpu_bundle.sh
# built (run it from the bundle: ./gpu_check.sh), and writes one JSON file
# and a one-screen summary. Each section runs on its own, under its own time
# limit: one that fails reports its error and the others still run.
#   device      name, compute capability, memory, copy engines, the VMM,
#               host-VMM and host-NUMA-VMM attributes, granularities
#   vmm         p50/p99 microseconds of cuMemCreate, cuMemMap,
#               cuMemSetAccess, cuMemUnmap, cuMemRelease, device- and
#               host-located
#   bandwidth   pinned copies each way, and both ways at once
#   mapped      a kernel's read and write bandwidth through a host-located
#               mapping, against device memory
#   launch      host time per launch: plain, preloaded, and under a cap
#   mlp         mlp_train plain, preloaded, under caps of 100/75/50/25 % of
#               its working set (checksums, steps per second, bytes moved,
#               reads served from host), and on unified memory
#   transformer transformer_train likewise (no unified-memory run)
#   torchlike   examples/torchlike likewise (PyTorch-shaped: its caching
#               allocator, fused AdamW, pointer tables), eager and with the
#               whole step as one CUDA graph (torchlike_graph)
#   runtime_program  a static-cudart program intercepted through cuGetProcAddress
#   hooks       tests/hooks_all on the real driver: every refused argument's
#               CUresult against the fake driver's answers (recorded in the
#               bundle), and unchanged by stensor, uncapped and capped
#   nvml        what NVML (nvidia-ml-py, where python3 has it) reports for
#               device 0's memory without stensor and under a cap: the cap
#   torch       whether python3 imports torch and sees the GPU; if so a
#               small training loop through stensor's pluggable allocator,
#               plain, uncapped and under caps, checksums compared
# A driver older than the bundle's toolkit, or none, gives a clear message
# and a JSON file saying so (exit 1), never a crash. Exit 1 also when a
# checksum under stensor differs from the plain run's.
#
# usage: gpu_check.sh [--out FILE] [--quick] [--dry-run] [--only SECTION[,...]] [--keep FILE]
#   --out FILE   where the JSON goes (default gpu_check.json in the bundle)
#   --quick      fewer steps, caps 50 and 25 % only, one capped torch run:
#                under 3 minutes
#   --only S,..  run only these sections
#   --keep FILE  also write a tar.gz of every run's output there (the
#                programs' stdout and stderr, hooks_all's answers)
#   --dry-run    on the bundle's fake driver (fake/libcuda.so.1), no GPU:
#                host-kernel modules instead of fatbins; the sections that
#                need a GPU's kernels report {"skipped": ...}
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
out=$dir/gpu_check.json dry=0 quick=0 only= keep=
sections=(device vmm bandwidth mapped launch mlp transformer torchlike torchlike_graph
  runtime_program hooks nvml torch)
while (($#)); do
  case $1 in
    --out) out=${2:?--out needs a file}; shift ;;
    --quick) quick=1 ;;
    --keep) keep=${2:?--keep needs a file}; shift ;;
    --dry-run) dry=1 ;;
    --only)
      only=${2:?--only needs a list of sections}; shift
      for s in ${only//,/ }; do
        [[ " ${sections[*]} " == *" $s "* ]] ||
          { echo "gpu_check.sh: --only '$s': expected one of: ${sections[*]}" >&2; exit 2; }
      done ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
toolkit=$(sed -n 's/^toolkit //p' "$dir/MANIFEST" 2>/dev/null || true)
commit=$(sed -n 's/^commit //p' "$dir/MANIFEST" 2>/dev/null || true)
preload=$dir/libstensor.so
started=$(date +%s)

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/ }; printf '"%s"' "${s//$'\n'/ }"; }
json_num() { [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?$ ]] && printf '%s' "$1" || printf null; }
json_bool() { [[ $1 == 1 || $1 == true ]] && printf true || printf false; }
# A fragment is kept only if it parses (when python3 is here to say).
valid_json() {
  command -v python3 > /dev/null || return 0
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1" 2> /dev/null
}
err_json() { printf '{"error": %s}' "$(json_str "$1")"; }
fail_json() {  # the whole check cannot run: the JSON says why, and so does stderr
  echo "gpu_check.sh: $1" >&2
  printf '{"ok": false, "error": %s, "toolkit": %s, "commit": %s}\n' "$(json_str "$1")" \
    "$(json_str "$toolkit")" "$(json_str "$commit")" > "$out"
  exit 1
}
mismatch=0  # a checksum under stensor that is not the plain run's

if ((dry)); then
  export LD_LIBRARY_PATH=$dir/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [[ -e $dir/fake/libcuda.so.1 ]] || fail_json "--dry-run: no fake/libcuda.so.1 in the bundle"
  driver=fake runtime=
else
  [[ -x $dir/runtime_probe ]] || fail_json "no runtime_probe in the bundle: build it with scripts/gpu_bundle.sh"
  if ! "$dir/runtime_probe" version > "$work/version.txt" 2> "$work/version.err"; then
    fail_json "$(cat "$work/version.err" "$work/version.txt" | head -n 2 | tr '\n' ' ')"
  fi
  read -r _ driver _ runtime < "$work/version.txt"
fi
if ((quick)); then
  caps=(50 25) steps_mlp=10 steps_tf=6 steps_tl=4
else
  caps=(100 75 50 25) steps_mlp=20 steps_tf=10 steps_tl=6
fi
if ((dry)); then
  mlp_flags=(--hidden 512 --layers 2) tf_flags=(--layers 2 --dim 128 --seq 64 --batch 4)
  tl_flags=(--buckets 8192 --experts 4 --ffn 256)
  steps_mlp=6 steps_tf=4 steps_tl=3
  mlp_module=$dir/mlp_kernels_host.so tf_module=$dir/transformer_kernels_host.so
  tl_module=$dir/torchlike_kernels_host.so
  hooks_module=$dir/test_kernels.so
else
  mlp_flags=(--hidden 4096 --layers 8) tf_flags=(--layers 4 --dim 512 --seq 256 --batch 8)
  tl_flags=()
  mlp_module=$dir/mlp_kernels.fatbin tf_module=$dir/transformer_kernels.fatbin
  tl_module=$dir/torchlike_kernels.fatbin
  hooks_module=$dir/hooks_kernels.fatbin
fi

gpu_only() { ((dry)) && { printf '{"skipped": "needs a GPU"}'; return 0; }; return 1; }
need() {  # need FILE...: every file is in the bundle, else a skip fragment
  local f
  for f; do
    [[ -e $dir/$f ]] || { printf '{"skipped": "no %s in the bundle"}' "$f"; return 1; }
  done
}
probe() {  # probe MODE [VAR=value...]: device_probe's JSON, or its error
  local mode=$1
  shift
  need device_probe || return 0
  if env "$@" "$dir/device_probe" "$mode" > "$work/probe.out" 2> "$work/probe.err" &&
     valid_json "$work/probe.out"; then
    cat "$work/probe.out"
  else
    err_json "device_probe $mode: $(tail -n 2 "$work/probe.err")"
  fi
}

sec_device() { probe attributes; }
sec_vmm() { probe vmm; }
sec_bandwidth() { probe bandwidth; }
sec_mapped() { gpu_only || probe mapped; }
sec_launch() {
  gpu_only && return
  printf '{"plain": %s, "preloaded": %s, "capped": %s}' "$(probe launch)" \
    "$(probe launch LD_PRELOAD="$preload")" \
    "$(probe launch LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=1GiB)"
}

# train PROGRAM NAME [VAR=value...] [-- FLAG...]: one run's JSON object.
train() {
  local prog=$1 name=$2
  shift 2
  local vars=() flags=()
  while (($#)) && [[ $1 != -- ]]; do vars+=("$1"); shift; done
  (($#)) && shift
  flags=("$@")
  local o=$work/$prog.$name.out e=$work/$prog.$name.err start end
  start=$(date +%s.%N)
  if ! env "${vars[@]}" "$dir/${exe:-$prog}" "${flags[@]}" > "$o" 2> "$e"; then
    err_json "$(grep -v '^stensor: ' "$e" | tail -n 2) $(grep -E '^stensor: (out of memory|peak resident)' "$e")"
    return
  fi
  end=$(date +%s.%N)
  local wall checksum
  wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')
  checksum=$(sed -n 's/^checksum //p' "$o")
  printf '{"checksum": %s, "wall_s": %s, "steps_per_s": %s' "$(json_str "$checksum")" "$wall" \
    "$(awk -v s="$steps" -v w="$wall" 'BEGIN { printf "%.3f", s / w }')"
  local ws
  ws=$(sed -n 's/^working_set //p' "$o")
  [[ -n $ws ]] && printf ', "working_set_bytes": %s' "$(json_num "$ws")"
  if grep -q '^stensor: swap-outs copied' "$e"; then
    printf ', "mib_out": %s, "mib_in": %s, "reads_from_host": %s, "peak_resident_mib": %s, "link_gbps": %s' \
      "$(json_num "$(sed -n 's/^stensor: swap-outs copied.*(\([0-9.]*\) MiB.*/\1/p' "$e")")" \
      "$(json_num "$(sed -n 's/^stensor: swap-ins copied.*(\([0-9.]*\) MiB.*/\1/p' "$e")")" \
      "$(json_num "$(sed -n 's/^stensor: reads from host *\([0-9]*\) .*/\1/p' "$e")")" \
      "$(json_num "$(sed -n 's/^stensor: peak resident *\([0-9.]*\) MiB.*/\1/p' "$e")")" \
      "$(json_num "$(sed -n 's/^stensor: link bandwidth *\([0-9.]*\) GB.*/\1/p' "$e")")"
  fi
  printf '}'
  echo "$checksum" > "$work/$prog.$name.sum"
}
model() {  # model LABEL[=PROGRAM] MODULE STEPS MANAGED FLAGS...: files named by LABEL
  local prog=${1%%=*} module=$2 managed=$4
  local exe=${1#*=}  # the program train runs (bash: visible to it)
  steps=$3
  shift 4
  need "$exe" "$(basename "$module")" || return 0
  local flags=(--module "$module" --steps "$steps" "$@")
  local plain ws
  plain=$(train "$prog" plain -- "${flags[@]}")
  ws=$(sed -n 's/^working_set //p' "$work/$prog.plain.out" 2> /dev/null)
  [[ -n $ws ]] || { printf '{"plain": %s}' "$plain"; return 0; }
  printf '{"working_set_bytes": %s, "plain": %s' "$ws" "$plain"
  local runs=(preloaded) p
  printf ', "preloaded": %s' "$(train "$prog" preloaded LD_PRELOAD="$preload" -- "${flags[@]}")"
  for p in "${caps[@]}"; do
    runs+=("cap$p")
    printf ', "cap%s": %s' "$p" "$(train "$prog" "cap$p" LD_PRELOAD="$preload" STENSOR_STATS=1 \
      STENSOR_MEMORY_LIMIT=$((ws * p / 100)) -- "${flags[@]}")"
  done
  if ((managed)) && ! ((dry)); then
    runs+=(managed)
    printf ', "managed": %s' "$(train "$prog" managed -- "${flags[@]}" --memory managed)"
  fi
  # Every run that finished gave the plain run's checksum.
  local want r got bad=()
  want=$(cat "$work/$prog.plain.sum" 2> /dev/null)
  for r in "${runs[@]}"; do
    got=$(cat "$work/$prog.$r.sum" 2> /dev/null) || continue
    [[ $got == "$want" ]] || bad+=("$r")
  done
  printf ', "mismatches": [%s]}' "$(for r in "${bad[@]}"; do printf '"%s",' "$r"; done | sed 's/,$//')"
  ((${#bad[@]} == 0)) || echo "${bad[*]}" > "$work/$prog.mismatch"
}
sec_mlp() { model mlp_train "$mlp_module" "$steps_mlp" 1 "${mlp_flags[@]}"; }
sec_transformer() { model transformer_train "$tf_module" "$steps_tf" 0 "${tf_flags[@]}"; }
sec_torchlike() {
  model torchlike_train "$tl_module" "$steps_tl" 0 --alloc caching --graphs eager "${tl_flags[@]}"
}
# The same program under its own label, so that its runs' files are its own
# (nothing is written into the bundle, which may be read-only).
sec_torchlike_graph() {
  model torchlike_graph=torchlike_train "$tl_module" "$steps_tl" 0 --alloc caching --graphs step \
    "${tl_flags[@]}"
}

sec_runtime_program() {
  gpu_only && return
  need runtime_probe || return 0
  local plain with=
  plain=$("$dir/runtime_probe" check 2>&1 | sed -n 's/^checksum //p')
  if STENSOR_ACCESS_LOG="$work/probe.jsonl" LD_PRELOAD="$preload" "$dir/runtime_probe" check \
      > "$work/rt.out" 2> "$work/rt.err"; then
    with=$(sed -n 's/^checksum //p' "$work/rt.out")
  fi
  # Intercepted: its allocations and launches are in stensor's log.
  local seen=false
  grep -q '"type":"alloc"' "$work/probe.jsonl" 2> /dev/null &&
    grep -q '"type":"launch"' "$work/probe.jsonl" 2> /dev/null && seen=true
  [[ -n $with && $with == "$plain" ]] || echo runtime > "$work/runtime.mismatch"
  printf '{"intercepted": %s, "checksum": %s, "checksum_without_stensor": %s}' "$seen" \
    "$(json_str "$with")" "$(json_str "$plain")"
}

# hooks_all's answers ("rc LABEL N" and "val LABEL V" lines) per run.
sec_hooks() {
  need hooks_all hooks.list "$(basename "$hooks_module")" || return 0
  local name
  hooks_run() {  # hooks_run NAME [VAR=value...]
    local n=$1
    shift
    env "$@" "$dir/hooks_all" "$hooks_module" "$dir/hooks.list" > "$work/hooks.$n.out" \
      2> "$work/hooks.$n.err"
    echo $? > "$work/hooks.$n.rc"
    grep -E '^(rc|val) ' "$work/hooks.$n.out" > "$work/hooks.$n.answers" || true
  }
  # Two 2 MiB buffers and 1 MiB for the driver's small allocations, as
  # tests/hooks_test.sh.
  hooks_run plain
  hooks_run nocap LD_PRELOAD="$preload"
  hooks_run cap LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$(((2 << 20) * 2 + (1 << 20))) \
    STENSOR_POLICY=lru STENSOR_PREFETCH=off
  # Values that differ between devices by nature (sizes of the device,
  # addresses, pitches the hardware picks) are left out of the comparison
  # with the fake; the CUresults all count.
  local fake_cmp=$work/hooks.fake
  # hooks_all asks the fake alone about null symbols: they crash the driver.
  [[ -e $dir/hooks.fake ]] && grep '^rc ' "$dir/hooks.fake" | grep -Ev '/null-(symbol|pfn) |^rc cuMemExportToShareableHandle/handle ' > "$fake_cmp"
  diffs() {  # diffs A B: JSON {"count": N, "first": [...]} of A's lines not as in B
    diff "$1" "$2" | grep -E '^[<>] ' > "$work/diff.lines"
    printf '{"count": %s, "first": [' "$(wc -l < "$work/diff.lines")"
    head -n 30 "$work/diff.lines" | while read -r l; do
      [[ -n $l ]] && printf '%s, ' "$(json_str "$l")"
    done | sed 's/, $//'
    printf ']}'
  }
  local differs='^(val cuMemGetInfo_v2/total|val cuDeviceTotalMem_v2/total|rc cuIpcGetMemHandle/(valid|interior)|rc cuPointerGetAttribute/p2p-tokens|rc cuMemRetainAllocationHandle/stensor-buffer|rc cuMemRelease/stensor-buffer|rc cuMemAlloc_v2/above-device) '
  grep -Ev "$differs" "$work/hooks.plain.answers" > "$work/hooks.plain.cmp"
  grep -Ev "$differs" "$work/hooks.cap.answers" > "$work/hooks.cap.cmp"
  printf '{"results": %s' "$(grep -c '^rc ' "$work/hooks.plain.answers")"
  for name in plain nocap cap; do
    printf ', "%s_exit": %s, "%s_ok": %s' "$name" "$(cat "$work/hooks.$name.rc")" "$name" \
      "$(grep -qx ok "$work/hooks.$name.out" && echo true || echo false)"
  done
  if [[ -s $fake_cmp ]]; then
    grep '^rc ' "$work/hooks.plain.answers" | grep -Ev '/null-(symbol|pfn) |^rc cuMemExportToShareableHandle/handle ' > "$work/hooks.plain.rc"
    printf ', "driver_vs_fake": %s' "$(diffs "$work/hooks.plain.rc" "$fake_cmp")"
  fi
  printf ', "nocap_vs_driver": %s' "$(diffs "$work/hooks.plain.answers" "$work/hooks.nocap.answers")"
  printf ', "cap_vs_driver": %s' "$(diffs "$work/hooks.plain.cmp" "$work/hooks.cap.cmp")"
  printf ', "first_errors": %s}' "$(json_str "$(grep -v '^stensor' "$work/hooks.plain.err" | head -n 5)")"
}

# NVML's memory figures for device 0, CUDA initialised first (stensor answers
# NVML for a process that uses CUDA): "total used" in bytes.
sec_nvml() {
  command -v python3 > /dev/null || { printf '{"skipped": "no python3"}'; return 0; }
  local query='
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
if cuda.cuInit(0) != 0: sys.exit("cuInit failed")
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMemoryInfo(h)
print(m.total, m.used)'
  if ! python3 -c 'import pynvml' 2> /dev/null; then
    printf '{"skipped": "python3 has no pynvml (nvidia-ml-py)"}'
    return 0
  fi
  local plain capped cap=$((8 << 30))
  plain=$(python3 -c "$query" 2> "$work/nvml.err") || { err_json "$(tail -n 1 "$work/nvml.err")"; return 0; }
  capped=$(LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT=$cap python3 -c "$query" 2>> "$work/nvml.err") ||
    { err_json "$(tail -n 1 "$work/nvml.err")"; return 0; }
  printf '{"plain_total": %s, "plain_used": %s, "cap": %s, "capped_total": %s, "capped_used": %s, "reports_cap": %s}' \
    "$(json_num "${plain% *}")" "$(json_num "${plain#* }")" "$cap" "$(json_num "${capped% *}")" \
    "$(json_num "${capped#* }")" "$([[ ${capped% *} == "$cap" ]] && echo true || echo false)"
}

sec_torch() {
  need torch_check.py || return 0
  command -v python3 > /dev/null || { printf '{"import": false, "error": "no python3"}'; return 0; }
  local v
  if ! v=$(python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>&1 | tail -n 1) ||
     [[ $v != *" True" ]]; then
    printf '{"import": false, "error": %s}' "$(json_str "$v")"
    return 0
  fi
  local flags=(--steps 10)
  ((quick)) && flags=(--steps 5)
  tc() {  # tc NAME [VAR=value...] [-- FLAG...]
    local n=$1
    shift
    local vars=() extra=()
    while (($#)) && [[ $1 != -- ]]; do vars+=("$1"); shift; done
    (($#)) && shift
    extra=("$@")
    if env "${vars[@]}" python3 "$dir/torch_check.py" "${flags[@]}" "${extra[@]}" \
        > "$work/torch.$n.out" 2> "$work/torch.$n.err"; then
      sed -n 's/^checksum //p' "$work/torch.$n.out" > "$work/torch.$n.sum"
      printf '{"checksum": %s, "steps_per_s": %s, "loss": %s' \
        "$(json_str "$(cat "$work/torch.$n.sum")")" \
        "$(json_num "$(sed -n 's/^steps_per_s //p' "$work/torch.$n.out")")" \
        "$(json_num "$(sed -n 's/^loss //p' "$work/torch.$n.out")")"
      grep -q '^stensor: swap-outs copied' "$work/torch.$n.err" &&
        printf ', "mib_out": %s, "mib_in": %s' \
          "$(json_num "$(sed -n 's/^stensor: swap-outs copied.*(\([0-9.]*\) MiB.*/\1/p' "$work/torch.$n.err")")" \
          "$(json_num "$(sed -n 's/^stensor: swap-ins copied.*(\([0-9.]*\) MiB.*/\1/p' "$work/torch.$n.err")")"
      printf '}'
    else
      # Python's exception line, not the hints it prints after it.
      err_json "$(grep -E '^[A-Za-z_.]*(Error|Exception)' "$work/torch.$n.err" | tail -n 1) $(grep -E '^stensor: (out of memory|peak resident)' "$work/torch.$n.err")"
    fi
  }
  printf '{"import": true, "version": %s, "plain": %s' "$(json_str "${v% *}")" "$(tc plain)"
  local ws
  ws=$(sed -n 's/^max_reserved_bytes //p' "$work/torch.plain.out" 2> /dev/null)
  printf ', "working_set_bytes": %s' "$(json_num "$ws")"
  local runs=(stensor) p
  printf ', "stensor": %s' "$(tc stensor LD_PRELOAD="$preload" -- --stensor)"
  if [[ -n $ws ]]; then
    for p in "${caps[@]}"; do
      ((quick && p != 50)) && continue
      runs+=("cap$p")
      printf ', "cap%s": %s' "$p" "$(tc "cap$p" LD_PRELOAD="$preload" STENSOR_STATS=1 \
        STENSOR_MEMORY_LIMIT=$((ws * p / 100)) -- --stensor)"
    done
  fi
  local want r bad=()
  want=$(cat "$work/torch.plain.sum" 2> /dev/null)
  for r in "${runs[@]}"; do
    [[ -e $work/torch.$r.sum ]] || continue
    [[ $(cat "$work/torch.$r.sum") == "$want" ]] || bad+=("$r")
  done
  ((${#bad[@]} == 0)) || echo "${bad[*]}" > "$work/torch.mismatch"
  printf ', "mismatches": [%s]}' "$(for r in "${bad[@]}"; do printf '"%s",' "$r"; done | sed 's/,$//')"
}

# Each section in its own shell under its own limit; what it printed is
# kept only if it is one JSON value.
declare -A limit=([device]=60 [vmm]=60 [bandwidth]=60 [mapped]=60 [launch]=90 [mlp]=150
  [transformer]=120 [torchlike]=120 [torchlike_graph]=120 [runtime_program]=60 [hooks]=90 [nvml]=60 [torch]=240)
for s in "${sections[@]}"; do
  if [[ -n $only && ",$only," != *",$s,"* ]]; then
    continue
  fi
  t0=$(date +%s)
  timeout "${limit[$s]}" bash -c "$(declare -f); $(declare -p dir work dry quick preload caps \
    steps_mlp steps_tf steps_tl mlp_flags tf_flags tl_flags mlp_module tf_module tl_module hooks_module \
    2> /dev/null); sec_$s" \
    > "$work/sec.$s.json" 2> "$work/sec.$s.err"
  rc=$?
  if ((rc == 124)); then
    err_json "section $s: no answer within ${limit[$s]} s" > "$work/sec.$s.json"
  elif ! valid_json "$work/sec.$s.json" || [[ ! -s $work/sec.$s.json ]]; then
    err_json "section $s: exit $rc: $(tail -n 2 "$work/sec.$s.err") $(head -c 300 "$work/sec.$s.json")" \
      > "$work/sec.$s.json"
  fi
  echo "gpu_check: $s ($(($(date +%s) - t0)) s)" >&2
done
ls "$work"/*.mismatch > /dev/null 2>&1 && mismatch=1

{
  printf '{"ok": %s, "dry_run": %s, "quick": %s, "driver": %s, "runtime": %s, "toolkit": %s, "commit": %s,\n' \
    "$( ((mismatch)) && echo false || echo true)" "$(json_bool $dry)" "$(json_bool $quick)" \
    "$(json_str "$driver")" "$(json_num "${runtime:-}")" "$(json_str "$toolkit")" "$(json_str "$commit")"
  printf ' "date": %s, "seconds": %s' "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" \
    "$(($(date +%s) - started))"
  for s in "${sections[@]}"; do
    [[ -e $work/sec.$s.json ]] && printf ',\n "%s": %s' "$s" "$(cat "$work/sec.$s.json")"
  done
  printf '}\n'
} > "$out"

# One screen: a line a section.
if command -v python3 > /dev/null; then
  python3 - "$out" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
def g(d, *ks):
    for k in ks:
        if not isinstance(d, dict) or k not in d: return None
        d = d[k]
    return d
print(f"gpu_check: {'ok' if r['ok'] else 'FAILED'}  driver {r['driver']}  toolkit {r['toolkit']}  {r['seconds']} s")
d = r.get("device", {})
if "name" in d:
    print(f"  device     {d['name']} cc {d['compute_capability']}, {d['total_bytes'] / 2**30:.0f} GiB, "
          f"{d['async_engines']} copy engines, vmm {d['vmm']} host_vmm {d['host_vmm']} "
          f"host_numa_vmm {d['host_numa_vmm']}, granularity {d['granularity_device'] >> 20} MiB")
for k in ("vmm", "bandwidth", "mapped", "launch", "runtime_program", "hooks"):
    if k in r:
        s = json.dumps(r[k])
        print(f"  {k:<11} {s[:150]}{'...' if len(s) > 150 else ''}")
for k in ("mlp", "transformer", "torchlike", "torchlike_graph", "torch"):
    m = r.get(k)
    if not isinstance(m, dict): continue
    if "error" in m or "skipped" in m or m.get("import") is False:
        print(f"  {k:<10} {json.dumps(m)[:150]}"); continue
    parts = []
    for run, v in m.items():
        if not isinstance(v, dict): continue
        if "error" in v: parts.append(f"{run} ERROR"); continue
        sps = v.get("steps_per_s")
        moved = (v.get("mib_out") or 0) + (v.get("mib_in") or 0)
        parts.append(f"{run} {sps}/s" + (f" {moved / 1024:.1f}GiB" if moved else ""))
    print(f"  {k:<10} mismatches {m.get('mismatches')}: " + ", ".join(parts))
PY
fi
[[ -z $keep ]] || tar -czf "$keep" -C "$work" . || echo "gpu_check.sh: --keep: cannot write $keep" >&2
echo "gpu_check: wrote $out"
exit $mismatch
