#!/usr/bin/env bash
# Builds here, into build/gpu/ (ignored by git), everything a machine with
# only an NVIDIA driver needs to check stensor on its GPU
# (scripts/gpu_check.sh, copied in):
#   libstensor.so and the stensor tool, with the shared libraries they link
#     beside them (RUNPATH $ORIGIN: abseil, libstdc++; not glibc or the
#     driver), debug sections stripped;
#   mlp_train, transformer_train and torchlike_train with their kernels as fatbins for sm_80
#     and sm_90 (for --module), and their host-kernel modules for a dry run
#     on the fake driver;
#   runtime_probe, built by nvcc with the static CUDA runtime (it reaches
#     the driver through cudart's cuGetProcAddress, as most programs do),
#     with the driver/toolkit version check;
#   device_probe (nvcc): attributes, VMM call latencies, pinned and mapped
#     bandwidth, launch cost;
#   hooks_all (tests/hooks_all.cc) with its kernel as a fatbin
#     (tests/gpu/hooks_kernels.cu) and as the fake's module, the list of the
#     library's exported hooks (hooks.list), and the fake driver's answers to
#     its calls (hooks.fake), to compare with the real driver's;
#   torch_check.py (examples/gpu), run where python3 has PyTorch, with the
#     stensor package (python/stensor) it uses;
#   the fake driver (fake/libcuda.so.1), for gpu_check.sh --dry-run here;
#   MANIFEST: the commit and the toolkit it was built with.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu
while (($#)); do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
[[ -x $nvcc ]] || { echo "gpu_bundle.sh: no nvcc at $nvcc (set NVCC)" >&2; exit 1; }

scripts/setup.sh
bazel build //interpose:libstensor.so //examples/mlp:mlp_train //examples/mlp:mlp_kernels_host.so \
  //examples/transformer:transformer_train //examples/transformer:transformer_kernels_host.so \
  //examples/torchlike:torchlike_train //examples/torchlike:torchlike_kernels_host.so \
  //tests:hooks_all //tests/fakecuda:test_kernels.so //tools:stensor //tests/fakecuda:libcuda.so.1
bin=$(bazel info bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/fake"
install -m 755 "$bin/interpose/libstensor.so" "$bin/tools/stensor" "$bin/examples/mlp/mlp_train" \
  "$bin/examples/mlp/mlp_kernels_host.so" "$bin/examples/transformer/transformer_train" \
  "$bin/examples/transformer/transformer_kernels_host.so" "$bin/examples/torchlike/torchlike_train" \
  "$bin/examples/torchlike/torchlike_kernels_host.so" "$bin/tests/hooks_all" \
  "$bin/tests/fakecuda/test_kernels.so" scripts/gpu_check.sh examples/gpu/torch_check.py "$out/"
strip --strip-debug "$out/libstensor.so" "$out/stensor"
mkdir -p "$out/python/stensor"
cp python/stensor/*.py "$out/python/stensor/"
install -m 755 "$bin/tests/fakecuda/libcuda.so.1" "$out/fake/"

# The shared libraries the bundle's programs link, beside them: what a
# machine with only a driver may lack (glibc and the driver it has).
elves=("$out/libstensor.so" "$out/stensor" "$out/mlp_train" "$out/mlp_kernels_host.so"
  "$out/transformer_train" "$out/transformer_kernels_host.so" "$out/torchlike_train"
  "$out/torchlike_kernels_host.so" "$out/hooks_all" "$out/test_kernels.so")
for elf in "${elves[@]}"; do
  LD_LIBRARY_PATH="$bin/tests/fakecuda" ldd "$elf" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda)\.so' || true
done | sort -u | while read -r lib; do
  install -m 644 "$(readlink -f "$lib")" "$out/$(basename "$lib")"
done
for elf in "$out"/*.so* "$out/stensor" "$out/mlp_train" "$out/transformer_train" \
    "$out/torchlike_train" "$out/hooks_all"; do
  patchelf --set-rpath '$ORIGIN' "$elf"
done

# Kernels for Ampere and Hopper in one fatbin; cuModuleLoad picks the one
# for the device.
"$nvcc" -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -o "$out/mlp_kernels.fatbin" examples/mlp/mlp_kernels.cu
"$nvcc" -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -o "$out/transformer_kernels.fatbin" examples/transformer/transformer_kernels.cu
"$nvcc" -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -o "$out/torchlike_kernels.fatbin" examples/torchlike/torchlike_kernels.cu
"$nvcc" -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -o "$out/hooks_kernels.fatbin" tests/gpu/hooks_kernels.cu
for probe in runtime_probe device_probe; do
  "$nvcc" -O2 -cudart static -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -o "$out/$probe" "examples/gpu/$probe.cu" -L"$(dirname "$nvcc")/../lib64/stubs" -lcuda
  patchelf --set-rpath '$ORIGIN' "$out/$probe"
done

# hooks_all's calls: the hooks the library exports (as tests/hooks_test.sh
# lists them), and the fake driver's answers, for gpu_check.sh to compare
# with the real driver's.
nm -D --defined-only "$out/libstensor.so" | awk '$2 == "T" || $2 == "W" { print $3 }' |
  grep '^cu' | sort > "$out/hooks.list"
LD_LIBRARY_PATH="$out/fake" "$out/hooks_all" "$out/test_kernels.so" "$out/hooks.list" \
  > "$out/hooks.all" 2> /dev/null || { echo "gpu_bundle.sh: hooks_all failed on the fake" >&2; exit 1; }
grep -E '^(rc|val) ' "$out/hooks.all" > "$out/hooks.fake"
rm "$out/hooks.all"

toolkit=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "toolkit $toolkit"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$out/MANIFEST"
# Every library the programs need is in the bundle or the base system.
for elf in "$out/libstensor.so" "$out/stensor" "$out/mlp_train" "$out/transformer_train" \
    "$out/torchlike_train" "$out/hooks_all" "$out/runtime_probe" "$out/device_probe"; do
  if LD_LIBRARY_PATH= ldd "$elf" | grep 'not found' | grep -v libcuda; then
    echo "gpu_bundle.sh: $elf misses a library" >&2
    exit 1
  fi
done
echo "gpu_bundle: $(du -sh "$out" | cut -f1) in $out; on the GPU machine: ./gpu_check.sh [--out result.json]"
