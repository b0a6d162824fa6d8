#!/usr/bin/env bash
# Clang's thread-safety analysis over stensor's sources, as errors: the
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations are checked,
# not only documentation. `bazel build --config=clang` over the annotated
# packages; scripts/test.sh runs it. It first shows the analysis is on: a snippet that touches a
# guarded field without its lock must fail.
set -euo pipefail
cd "$(dirname "$0")/.."
clang=${CLANG:-clang++}
cuda=${CUDA_PATH:-/usr/local/cuda}
command -v "$clang" > /dev/null || { echo "thread_safety.sh: no $clang (scripts/setup.sh installs clang)" >&2; exit 1; }
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety -Wno-unknown-attributes
       -Wno-macro-redefined -I. -I"$cuda/include")

probe=$(mktemp --suffix=.cc)
trap 'rm -f "$probe"' EXIT
cat > "$probe" <<'CC'
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
struct S {
  absl::Mutex mu;
  int x ABSL_GUARDED_BY(mu) = 0;
  int Read() { return x; }  // no lock: the analysis must refuse this
};
CC
if "$clang" "${flags[@]}" "$probe" 2> /dev/null; then
  echo "thread_safety.sh: $clang accepted an unlocked read of a guarded field: the analysis is off" >&2
  exit 1
fi

# Every package whose sources carry lock annotations (its libraries, tests
# and what they depend on), compiled by clang with the analysis as errors
# (--config=clang, .bazelrc), in its own output directory; bazel-bin stays
# on the normal build. Code elsewhere cannot reach a guarded member (the
# mutexes are private), so building the rest twice would check nothing.
packages=$(git grep -l -E 'ABSL_[A-Z_]*(GUARDED_BY|LOCKS_REQUIRED|LOCKS_EXCLUDED|LOCKABLE|ACQUIRE|RELEASE)' \
             -- '*.h' '*.cc' | xargs -n1 dirname | sort -u | sed 's|^|//|; s|$|:all|')
[[ -n $packages ]] || { echo "thread_safety.sh: no annotated sources found" >&2; exit 1; }
# shellcheck disable=SC2086  # one target pattern per word
if ! bazel build --config=clang --symlink_prefix=/ $packages "$@"; then
  echo "thread_safety.sh: lock annotations violated or a target did not build with clang (above)" >&2
  exit 1
fi
echo "thread_safety.sh:" $packages "built with clang -Werror=thread-safety, no violation"
