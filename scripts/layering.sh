#!/usr/bin/env bash
# The packages' direction (docs/design.md, "Packages and their
# dependencies"), checked on the build graph: no target of a package, tests
# included, depends on a package above it or beside it. Bazel's visibility
# already refuses such a dependency at build time; this names the offending
# edge, and catches one a widened visibility list would let through.
#   base -> driver -> {inference, swap (with policy)} -> tracker -> interpose
# Prints PASS or each violation (from -> to); exits 1 on any.
set -euo pipefail
cd "$(dirname "$0")/.."

# package: the packages it must not reach
declare -A forbidden=(
  [//core/base]="//core/driver //core/inference //core/swap //core/tracker //interpose //policy"
  [//core/driver]="//core/inference //core/swap //core/tracker //interpose //policy"
  [//core/inference]="//core/swap //core/tracker //interpose //policy"
  [//core/swap]="//core/inference //core/tracker //interpose"
  [//core/tracker]="//interpose"
  [//policy]="//core //interpose //tools"
)
status=0
for from in "${!forbidden[@]}"; do
  targets=""
  for to in ${forbidden[$from]}; do
    targets+="${targets:+ + }$to/..."
  done
  # Any path, through test helpers or other packages too.
  reached=$(bazel query --noshow_progress --output=label \
    "deps($from/...) intersect ($targets)" 2>/dev/null) || {
    echo "layering.sh: bazel query failed for $from" >&2
    exit 1
  }
  if [[ -n $reached ]]; then
    # Name the targets of the package through which each is reached.
    via=$(bazel query --noshow_progress --output=label \
      "rdeps($from/..., $(echo $reached | sed 's/ / + /g'), 1) intersect $from/..." 2>/dev/null || true)
    echo "FAIL: ${from#//} reaches $(echo $reached) (through $(echo $via))" >&2
    status=1
  fi
done
((status == 0)) && echo "PASS: core/base -> core/driver -> core/{inference, swap} -> core/tracker -> interpose"
exit $status
