#!/usr/bin/env bash
# dlsym(RTLD_NEXT, ...) from another preloaded library still means "after
# that library" with libstensor.so (which hooks dlsym) preloaded before or
# after it: the wrapper gets the C library's getpid, not its own.
set -euo pipefail
main=$1 wrap=$2 stensor=$3
wrap=$(cd "$(dirname "$wrap")" && pwd)/$(basename "$wrap")
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
for preload in "$(preload_of "$stensor" "$wrap")" "$(preload_of "$wrap" "$stensor")" "$(preload_of "$wrap")"; do
  out=$(LD_PRELOAD=$preload "$main") || { echo "FAIL: LD_PRELOAD=$preload: exit $?" >&2; exit 1; }
  [[ $out =~ ^pid\ [0-9]+$ ]] || { echo "FAIL: LD_PRELOAD=$preload printed '$out'" >&2; exit 1; }
done
echo "rtld_next_test: ok"
