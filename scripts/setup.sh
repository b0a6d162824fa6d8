#!/usr/bin/env bash
# Installs everything the build and the tests need from Debian's archive.
# Idempotent: packages already present are left alone, and nothing is
# downloaded when nothing is missing.
set -euo pipefail

packages=(
  bazel-bootstrap      # Bazel 4.2.3
  g++
  python3
  libabsl-dev          # abseil, shared libraries
  libspdlog-dev        # spdlog, used header-only
  libfmt-dev           # fmt, used header-only
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libglpk-dev          # exact offline optimum in `stensor sim`
  nlohmann-json3-dev   # JSON reader of `stensor trace` and `stensor report`, header-only
  clang                # thread-safety analysis only (scripts/thread_safety.sh)
  clang-format         # the sources' format (scripts/format_check.sh)
  patchelf             # RUNPATH $ORIGIN in the GPU bundle (scripts/gpu_bundle.sh)
  chromium             # renders `stensor report`'s page headless (tools:report_screenshot_test)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian's /usr/bin/bazel picks the binary named after .bazelversion.
version=$(cat "$(dirname "$0")/../.bazelversion")
if [[ ! -x /usr/bin/bazel-$version ]]; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo ln -sf bazel-4 "/usr/bin/bazel-$version"
fi

cuda=${CUDA_PATH:-/usr/local/cuda}
if [[ ! -f $cuda/include/cuda.h ]]; then
  echo "setup: no CUDA toolkit headers at $cuda/include/cuda.h; install the CUDA toolkit or set CUDA_PATH" >&2
  exit 1
fi
