#!/usr/bin/env bash
# Extracts the mangled C++ names from the CUDA toolkit's own libraries, the
# corpus of core/kernel_signature_differential_test.cc.
#
#   scripts/kernel_corpus.sh [OUT] [CUDA_LIB_DIR]
#       OUT: default core/inference/testdata/kernel_names.txt.gz (the committed corpus)
#       CUDA_LIB_DIR: default /usr/local/cuda/lib64
#   By hand over another toolkit (or lib directory):
#       scripts/kernel_corpus.sh /tmp/names.txt.gz /opt/cuda-12/lib64
#       bazel run //core/inference:kernel_signature_differential_test -- /tmp/names.txt.gz
#
# How: cuobjdump is not part of every toolkit install (it is not in this
# one), and the device code inside the fat binaries is compressed, so the
# names are read where the host side keeps them in clear: the strings that
# register each kernel with the runtime (__cudaRegisterFunction), plus the
# libraries' own C++ symbols. Every printable run that starts "_Z" is kept
# when c++filt demangles it as a function (a "(" in its output); names are
# deduplicated and sorted, so the same toolkit gives the same file. All of
# them are kept: CUDA 13's libraries give ~47,000 names, ~290 KB compressed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-core/inference/testdata/kernel_names.txt.gz}
libdir=${2:-/usr/local/cuda/lib64}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shopt -s nullglob
libs=("$libdir"/lib*.so)
((${#libs[@]} > 0)) || { echo "kernel_corpus.sh: no lib*.so in $libdir" >&2; exit 1; }
for lib in "${libs[@]}"; do
  # -a: the libraries are binary; names end at the NUL that ends the string.
  LC_ALL=C grep -aoE '_Z[A-Za-z0-9_]{4,}' "$lib" | LC_ALL=C sort -u \
    > "$tmp/$(basename "$lib").names" || true
  echo "$(basename "$lib"): $(wc -l < "$tmp/$(basename "$lib").names") names" >&2
done
LC_ALL=C sort -u "$tmp"/*.names > "$tmp/all"
# Keep the names c++filt reads as functions (it prints them unchanged when
# it cannot demangle them).
paste -d '\t' "$tmp/all" <(c++filt < "$tmp/all") |
  awk -F '\t' '$1 != $2 && index($2, "(") > 0 { print $1 }' > "$tmp/functions"
gzip -9n < "$tmp/functions" > "$out"
echo "kernel_corpus.sh: $(wc -l < "$tmp/all") distinct _Z strings," \
  "$(wc -l < "$tmp/functions") functions written to $out" \
  "($(stat -c %s "$out") bytes)" >&2
