#!/usr/bin/env bash
# gpu_check.sh --dry-run on the fake driver, from a bundle laid out as
# scripts/gpu_bundle.sh lays it out: it writes one JSON file with every
# figure of the check (the GPU-only ones null), mlp_train gives the same
# checksum without stensor, preloaded and under caps of 60 % and 40 %, and
# the capped runs swapped; bad arguments exit 2 without running anything.
set -euo pipefail
check=$1 lib=$2 train=$3 kernels=$4 fake=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
bundle=$tmp/bundle
mkdir -p "$bundle/fake"
cp "$(abs "$check")" "$(abs "$lib")" "$(abs "$train")" "$(abs "$kernels")" "$bundle/"
cp "$(abs "$fake")" "$bundle/fake/"
printf 'commit test\ntoolkit 13.0\n' > "$bundle/MANIFEST"

"$bundle/gpu_check.sh" --dry-run --out "$tmp/check.json" > "$tmp/out.txt" 2> "$tmp/err.txt" ||
  fail "gpu_check.sh --dry-run: exit $?: $(cat "$tmp/err.txt")"
python3 - "$tmp/check.json" <<'PY' || fail "the JSON: $(cat "$tmp/check.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is True and r["dry_run"] is True, r
assert r["driver"] == "fake" and r["toolkit"] == "13.0", r
assert r["model"]["working_set_bytes"] > 0, r["model"]
plain = r["plain"]["checksum"]
assert len(plain) == 16, plain
for run in ("preloaded", "cap60", "cap40"):
    assert r[run]["checksum"] == plain and r[run]["matches_plain"] is True, (run, r[run])
    assert r[run]["steps_per_s"] > 0, (run, r[run])
for run in ("cap60", "cap40"):
    assert r[run]["mib_out"] + r[run]["mib_in"] > 0, ("nothing swapped", run, r[run])
assert r["cap40"]["mib_out"] >= r["cap60"]["mib_out"], (r["cap40"], r["cap60"])
assert r["unified_memory"] is None and r["probe"]["h2d_gbps"] is None
assert r["runtime_program"]["intercepted"] is None
PY

for bad in "--steps 0" "--hidden x" "--frobnicate"; do
  # shellcheck disable=SC2086
  if "$bundle/gpu_check.sh" --dry-run $bad --out "$tmp/bad.json" 2> "$tmp/err.txt"; then
    fail "gpu_check.sh $bad was accepted"
  else
    rc=$?
  fi
  (( rc == 2 )) || fail "gpu_check.sh $bad: exit $rc, want 2"
  [[ ! -e $tmp/bad.json ]] || fail "gpu_check.sh $bad ran"
done
echo PASS
