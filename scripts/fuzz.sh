#!/usr/bin/env bash
# Fuzzes the STENSOR_* option parser (core/config_fuzz.cc) with libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh [SECONDS] [LIBFUZZER_FLAG...]     (SECONDS: default 60)
#
# Needs clang and its runtime (Debian: clang, libclang-rt-dev); CXX picks
# another clang++. The corpus grows in $FUZZ_DIR/corpus (default
# /tmp/stensor-fuzz), starting from the seeds of core/fuzz_main.cc, and a
# crashing input is saved under $FUZZ_DIR/artifacts/. Replay one without
# libFuzzer: bazel run //core:config_fuzz -- "$FUZZ_DIR"/artifacts/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
[[ $# -gt 0 ]] && shift
cxx=${CXX:-clang++}
dir=${FUZZ_DIR:-${TMPDIR:-/tmp}/stensor-fuzz}
mkdir -p "$dir/corpus" "$dir/artifacts"

# The abseil libraries exactly as third_party/BUILD links them.
mapfile -t absl < <(grep -o -- '-labsl_[a-z0-9_]*' third_party/BUILD)
srcs=(core/config_fuzz.cc core/config.cc)
flags=(-std=c++17 -g -O1 -I.)

# The standalone driver writes its seeds as the starting corpus.
"$cxx" "${flags[@]}" "${srcs[@]}" core/fuzz_main.cc -o "$dir/seed_writer" \
  "${absl[@]}"
"$dir/seed_writer" --write-seeds "$dir/corpus"

"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined "${srcs[@]}" -o "$dir/config_fuzz" \
  "${absl[@]}"
exec "$dir/config_fuzz" -max_total_time="$seconds" -max_len=4096 \
  -artifact_prefix="$dir/artifacts/" "$@" "$dir/corpus"
