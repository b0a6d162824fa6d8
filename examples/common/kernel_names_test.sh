#!/usr/bin/env bash
# The host kernels of an example's fake-device module must carry exactly the
# names nvcc gives the CUDA kernels of its .cu file, or the same program could
# not find its kernels on both. Skipped (passes, saying so) where nvcc is
# absent.
#
#   kernel_names_test.sh KERNELS.cu HOST_MODULE.so LIST_KERNELS
set -euo pipefail
cu=$1 module=$2 list_kernels=$3
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
if [[ ! -x $nvcc ]]; then
  echo "SKIPPED: no nvcc at $nvcc"
  exit 0
fi
tmp=${TEST_TMPDIR:-$(mktemp -d)}
"$nvcc" -cubin -arch=sm_90 -O3 -o "$tmp/k.cubin" "$cu"
# Kernels are the global functions of the cubin's symbol table.
readelf -sW "$tmp/k.cubin" | awk '$4 == "FUNC" && $5 == "GLOBAL" {print $NF}' | sort > "$tmp/nvcc.txt"
"$list_kernels" "$module" | sort > "$tmp/host.txt"
if [[ ! -s $tmp/nvcc.txt ]]; then
  echo "FAIL: no kernel symbols found in the cubin" >&2
  exit 1
fi
if ! diff -u "$tmp/nvcc.txt" "$tmp/host.txt"; then
  echo "FAIL: kernel names differ between nvcc (-) and the host module (+)" >&2
  exit 1
fi
echo "PASS: $(wc -l < "$tmp/nvcc.txt") kernels with identical names:"
cat "$tmp/nvcc.txt"
