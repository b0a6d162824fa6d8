#!/usr/bin/env bash
# gpu_check.sh --dry-run on the fake driver, from a bundle laid out as
# scripts/gpu_bundle.sh lays it out (without the nvcc-built probes, whose
# sections say so): one JSON file; mlp_train, transformer_train and
# torchlike_train (eager, and its whole step as one graph) give the
# plain run's checksum preloaded and under every cap they finish at, and
# swap under the caps; hooks_all's answers are the fake's own, unchanged by
# stensor; a section that cannot run reports why and the rest still run;
# nothing is written into the bundle;
# bad arguments exit 2 without running anything.
set -euo pipefail
check=$1 lib=$2 fake=$3
shift 3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
bundle=$tmp/bundle
mkdir -p "$bundle/fake"
cp "$(abs "$check")" "$(abs "$lib")" "$bundle/"
for f in "$@"; do cp "$(abs "$f")" "$bundle/"; done
cp "$(abs "$fake")" "$bundle/fake/"
printf 'commit test\ntoolkit 13.0\n' > "$bundle/MANIFEST"
nm -D --defined-only "$bundle/libstensor.so" | awk '$2 == "T" || $2 == "W" { print $3 }' |
  grep '^cu' | sort > "$bundle/hooks.list"
LD_LIBRARY_PATH="$bundle/fake" "$bundle/hooks_all" "$bundle/test_kernels.so" "$bundle/hooks.list" |
  grep -E '^(rc|val) ' > "$bundle/hooks.fake"

(cd "$bundle" && find . | sort) > "$tmp/bundle.before"
"$bundle/gpu_check.sh" --dry-run --out "$tmp/check.json" > "$tmp/out.txt" 2> "$tmp/err.txt" ||
  fail "gpu_check.sh --dry-run: exit $?: $(cat "$tmp/err.txt") $(cat "$tmp/check.json")"
# Nothing is written into the bundle (on a GPU machine it may be read-only).
(cd "$bundle" && find . | sort) | diff "$tmp/bundle.before" - ||
  fail "gpu_check.sh wrote into the bundle"
grep -q '^gpu_check: ok ' "$tmp/out.txt" || fail "no summary: $(cat "$tmp/out.txt")"
python3 - "$tmp/check.json" <<'PY' || fail "the JSON: $(cat "$tmp/check.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is True and r["dry_run"] is True, r
assert r["driver"] == "fake" and r["toolkit"] == "13.0", r
for s in ("device", "vmm", "bandwidth"):
    assert "no device_probe" in r[s]["skipped"], (s, r[s])
for s in ("mapped", "launch", "runtime_program"):
    assert r[s] == {"skipped": "needs a GPU"}, (s, r[s])
for model, must_finish in (("mlp", ("cap100", "cap75", "cap50", "cap25")),
                           ("transformer", ("cap100", "cap75", "cap50")),
                           ("torchlike", ("cap100", "cap75", "cap50", "cap25")),
                           ("torchlike_graph", ("cap100", "cap75", "cap50"))):
    m = r[model]
    assert m["working_set_bytes"] > 0, m
    plain = m["plain"]["checksum"]
    assert len(plain) == 16, (model, plain)
    assert m["mismatches"] == [], (model, m["mismatches"])
    for run in ("preloaded",) + must_finish:
        assert m[run]["checksum"] == plain, (model, run, m[run])
        assert m[run]["steps_per_s"] > 0, (model, run, m[run])
    for run in must_finish[2:]:
        assert m[run]["mib_out"] + m[run]["mib_in"] > 0, ("nothing swapped", model, run, m[run])
h = r["hooks"]
assert h["results"] > 1000, h
for run in ("plain", "nocap", "cap"):
    assert h[run + "_exit"] == 0 and h[run + "_ok"] is True, (run, h)
for cmp in ("driver_vs_fake", "nocap_vs_driver", "cap_vs_driver"):
    assert h[cmp]["count"] == 0, (cmp, h[cmp])
assert "import" in r["torch"], r["torch"]
PY

# One section alone; a section that fails still leaves the others' answers.
"$bundle/gpu_check.sh" --dry-run --only hooks,mlp --out "$tmp/only.json" > /dev/null 2>&1 ||
  fail "--only hooks,mlp: exit $?"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert "hooks" in r and "mlp" in r and "transformer" not in r, list(r)' \
  "$tmp/only.json" || fail "--only: $(cat "$tmp/only.json")"
rm "$bundle/transformer_kernels_host.so"
"$bundle/gpu_check.sh" --dry-run --only transformer,mlp --out "$tmp/missing.json" > /dev/null 2>&1 ||
  fail "without the transformer's kernels: exit $?"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert "skipped" in r["transformer"] and r["mlp"]["mismatches"] == [], r' \
  "$tmp/missing.json" || fail "a missing file: $(cat "$tmp/missing.json")"

for bad in "--only nothing" "--frobnicate" "--out"; do
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
