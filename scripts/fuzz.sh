#!/usr/bin/env bash
# Runs one fuzz target under libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh [TARGET] [SECONDS] [LIBFUZZER_FLAG...]
#     TARGET: config (core/base/config_fuzz.cc, the default), log
#             (tools/log_fuzz.cc), kernel_signature
#             (core/inference/kernel_signature_fuzz.cc), chrome_trace
#             (tools/chrome_trace_fuzz.cc) or report (tools/report_fuzz.cc);
#             log_scale, chrome_trace_scale, report_scale: the same three
#             built with STENSOR_FUZZ_SCALE, whose inputs describe logs of
#             scale (tools/log_generator.h: thousands of records, a
#             thousand buffers live, a launch of a quarter of a million
#             reads, a line of the input spliced in);
#             SECONDS: default 60
#
# Needs clang and its runtime (Debian: clang, libclang-rt-dev); CXX picks
# another clang++. The corpus grows in $FUZZ_DIR/TARGET/corpus (default
# FUZZ_DIR=/tmp/stensor-fuzz), starting from the target's seeds (written by
# the standalone driver tests/support/fuzz_main.cc), and a crashing input is saved
# under $FUZZ_DIR/TARGET/artifacts/. Replay one without libFuzzer:
#   bazel run //core/base:config_fuzz -- "$FUZZ_DIR"/config/artifacts/crash-...
# (//tools:log_fuzz, //core/inference:kernel_signature_fuzz, //tools:chrome_trace_fuzz,
# //tools:report_fuzz for the others; //tools:log_fuzz_scale and the like
# for the scale targets).
set -euo pipefail
cd "$(dirname "$0")/.."

target=config
if [[ $# -gt 0 && ! $1 =~ ^[0-9]+$ && $1 != -* ]]; then
  target=$1
  shift
fi
seconds=${1:-60}
[[ $# -gt 0 ]] && shift
# What `stensor sim` replays and bounds, for the log targets.
sim_srcs=(tools/workload.cc tools/log_json.cc tools/optimum.cc tools/keep_problem.cc
  tools/min_cost_flow.cc tools/replay.cc policy/eviction_policy.cc policy/iteration_planner.cc
  policy/iteration_detector.cc policy/next_use.cc policy/prefetch_planner.cc
  policy/access_profile.cc)
defines=()
case "$target" in
  *_scale)
    defines=(-DSTENSOR_FUZZ_SCALE)
    max_len=512 ;;
  *) max_len=8192 ;;
esac
case "$target" in
  config) srcs=(core/base/config_fuzz.cc core/base/config.cc); max_len=4096 ;;
  log | log_scale)
    srcs=(tools/log_fuzz.cc "${sim_srcs[@]}" tools/log_generator.cc core/base/json.cc) ;;
  report | report_scale)
    srcs=(tools/report_fuzz.cc tools/report.cc tools/run_summary.cc tools/log_json.cc
      tools/log_generator.cc core/base/config.cc core/base/json.cc) ;;
  kernel_signature)
    srcs=(core/inference/kernel_signature_fuzz.cc core/inference/kernel_signature.cc) ;;
  chrome_trace | chrome_trace_scale)
    srcs=(tools/chrome_trace_fuzz.cc tools/chrome_trace.cc tools/log_json.cc
      tools/log_generator.cc core/base/config.cc core/base/json.cc) ;;
  *)
    echo "fuzz.sh: unknown target '$target' (config, log, kernel_signature, chrome_trace," \
      "report, log_scale, chrome_trace_scale, report_scale)" >&2
    exit 2 ;;
esac
cxx=${CXX:-clang++}
dir=${FUZZ_DIR:-${TMPDIR:-/tmp}/stensor-fuzz}/$target
mkdir -p "$dir/corpus" "$dir/artifacts"

# The abseil libraries exactly as third_party/BUILD links them.
mapfile -t absl < <(grep -o -- '-labsl_[a-z0-9_]*' third_party/BUILD)
flags=(-std=c++17 -g -O1 -I. "${defines[@]}")

# The standalone driver writes the target's seeds as the starting corpus.
"$cxx" "${flags[@]}" "${srcs[@]}" tests/support/fuzz_main.cc -o "$dir/seed_writer" \
  "${absl[@]}" -pthread
"$dir/seed_writer" --write-seeds "$dir/corpus"

"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined "${srcs[@]}" -o "$dir/fuzz" "${absl[@]}"
exec "$dir/fuzz" -max_total_time="$seconds" -max_len="$max_len" \
  -artifact_prefix="$dir/artifacts/" "$@" "$dir/corpus"
