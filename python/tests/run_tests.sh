#!/usr/bin/env bash
# The Python package's tests (python/tests), with the library and the fake
# driver the preloaded ones need; a skipped test, or none run, is a failure
# here.
#   run_tests.sh LIBSTENSOR FAKE_LIBCUDA PYPROJECT
set -euo pipefail
stensor=$1 fake=$2 pyproject=$3
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
export TEST_LIBSTENSOR=$(abs "$stensor") TEST_FAKECUDA=$(abs "$fake")
cd "$(dirname "$pyproject")"
out=$(python3 -m unittest discover -s tests -v 2>&1) || { echo "$out"; exit 1; }
echo "$out"
if grep -Eq "skipped=|\.\.\. skipped" <<< "$out" || ! grep -Eq "^Ran [1-9][0-9]* tests" <<< "$out"; then
  echo "FAIL: tests were skipped, or none ran" >&2
  exit 1
fi
