#!/usr/bin/env bash
# Builds everything and trains the example MLP on the fake device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
bazel build //...
exec scripts/with-fake-gpu bazel-bin/examples/mlp/mlp_train "$@"
