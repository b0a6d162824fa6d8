#!/usr/bin/env bash
# Sets up a fresh machine and runs every test on the fake CUDA driver.
# Extra arguments go to `bazel test` (e.g. --config=asan).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
# Lock annotations first: a minute, and a violation is a failure of its own.
scripts/thread_safety.sh || { echo "0 passed, 1 failed (scripts/thread_safety.sh)"; exit 1; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# The packages' direction (core/base -> core/driver -> core/{inference,
# swap} -> core/tracker -> interpose) on the build graph.
if scripts/layering.sh; then
  echo "//scripts:layering                                                       PASSED" | tee -a "$log"
else
  echo "//scripts:layering                                                       FAILED" | tee -a "$log"
  rc=1
fi

# The sources as clang-format leaves them (.clang-format).
if scripts/format_check.sh; then
  echo "//scripts:format                                                         PASSED" | tee -a "$log"
else
  echo "//scripts:format                                                         FAILED" | tee -a "$log"
  rc=1
fi

# The GPU bundle builds whenever the toolkit is here (nvcc), and the check
# it carries runs on the fake driver (scripts/gpu_bundle.sh, gpu_check.sh).
if [[ -x ${NVCC:-/usr/local/cuda/bin/nvcc} ]]; then
  bundle=$(mktemp -d)
  if scripts/gpu_bundle.sh --out "$bundle/gpu" > "$bundle/log" 2>&1 &&
     "$bundle/gpu/gpu_check.sh" --dry-run --out "$bundle/check.json" >> "$bundle/log" 2>&1; then
    echo "//scripts:gpu_bundle                                                     PASSED" | tee -a "$log"
  else
    tail -n 20 "$bundle/log"
    echo "//scripts:gpu_bundle                                                     FAILED" | tee -a "$log"
    rc=1
  fi
  rm -rf "$bundle"
fi

# The README's first command: the demo finishes with matching checksums and
# leaves its access log, trace and report.
demo=$(mktemp -d)
if scripts/demo.sh --steps 6 --out "$demo/out" > "$demo/log" 2>&1 &&
   grep -q '^demo: same checksum' "$demo/log" &&
   [[ -s $demo/out/access.jsonl && -s $demo/out/trace.json && -s $demo/out/report.html ]]; then
  echo "//scripts:demo                                                           PASSED" | tee -a "$log"
else
  tail -n 20 "$demo/log"
  echo "//scripts:demo                                                           FAILED" | tee -a "$log"
  rc=1
fi
rm -rf "$demo"

# A short stress run (every byte checked, faults injected, preloaded) under
# AddressSanitizer and ThreadSanitizer. Each builds into its own output
# directory (.bazelrc) and leaves bazel-bin pointing at the normal build.
# TEST_SANITIZERS=0 skips them (e.g. when iterating).
if [[ ${TEST_SANITIZERS:-1} != 0 ]]; then
  for config in asan tsan; do
    bazel test --config=$config --symlink_prefix=/ //tests:stress_short_test "$@" 2>&1 |
      sed "s|^//tests:stress_short_test |//tests:stress_short_test[$config] |" | tee -a "$log"
    ((PIPESTATUS[0] == 0)) || rc=1
  done
fi

# One plain closing line for CI: counted from Bazel's per-target summary.
passed=$(grep -Ec '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -Ec '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS|FAILED TO BUILD)' "$log")
echo "${passed} passed, ${failed} failed"
if ((rc == 0 && passed == 0)); then
  echo "test.sh: no test ran" >&2
  exit 1
fi
exit "$rc"
