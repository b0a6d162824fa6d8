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

# One plain closing line for CI: counted from Bazel's per-target summary.
passed=$(grep -Ec '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -Ec '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS|FAILED TO BUILD)' "$log")
echo "${passed} passed, ${failed} failed"
if ((rc == 0 && passed == 0)); then
  echo "test.sh: no test ran" >&2
  exit 1
fi
exit "$rc"
