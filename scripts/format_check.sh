#!/usr/bin/env bash
# Every C++ and CUDA source git tracks (third_party/ aside) is as
# clang-format leaves it under .clang-format (Google style, 100 columns).
# Prints PASS, or the files that differ and how to fix them; exits 1 then.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || {
  echo "format_check.sh: clang-format is missing (scripts/setup.sh installs it)" >&2
  exit 1
}
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' | grep -v '^third_party/')
# One call for all: each difference is reported as FILE:LINE:COL: error.
mapfile -t bad < <(clang-format --dry-run --Werror "${files[@]}" 2>&1 >/dev/null |
                   sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error.*/\1/p' | sort -u)
if ((${#bad[@]})); then
  echo "FAIL: not formatted (clang-format -i ${bad[*]}):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "PASS: ${#files[@]} files as clang-format leaves them"
