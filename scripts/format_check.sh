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
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "FAIL: not formatted (clang-format -i ${bad[*]}):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "PASS: ${#files[@]} files as clang-format leaves them"
