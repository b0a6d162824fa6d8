#!/usr/bin/env python3
"""Compares the fake driver's answers to tests/hooks_all's calls (its `rc
LABEL N` lines, run without stensor) with a real driver's, recorded on a GPU
(tests/gpu/driver_*.answers: the `rc` lines of scripts/gpu_check.sh's plain
hooks run).

usage: driver_answers.py DRIVER_ANSWERS FAKE_OUTPUT

Labels are compared, not lines: hooks_all prints lines on the fake that it
does not on a GPU (and the other way round), and a label that repeats
(`verifyA`) is compared by the set of results it had. Every label of either
side must have the same results on both, except those matching ALLOWED
below, each with its reason; an ALLOWED pattern that matches no difference
fails too, so the list cannot outlive its reasons. Exits 1 with every
difference listed.
"""
import re
import sys
from collections import defaultdict

# (pattern over the label, reason). Keep it short: a difference that is the
# fake's fault is fixed in the fake, not listed here.
ALLOWED = [
    (r"(cuGetProcAddress(_v2)?/)?(cuMemcpy3DPeer(Async)?(_ptds|_ptsz)?|cuMemcpyAtoD(_v2)?(_ptds)?"
     r"|cuMemcpyDtoA(_v2)?(_ptds)?|cuMemcpy(3D)?BatchAsync(_v2)?(_ptsz)?|cuLibraryUnload"
     r"|cuGraphExec(ChildGraph|Memcpy|Memset|)NodeSetParams)(/.*)?",
     "entry points the fake does not implement (README, Entry points): not found there, "
     "'missing' in hooks_all, where the driver has them"),
    (r"cuGetProcAddress(_v2)?/null-(symbol|pfn)",
     "asked of the fake only: a null symbol crashes the driver"),
    (r"cuMem(Alloc_v2|Create)/above-device",
     "the GPU run asked for 64 GiB, which fitted the H200; hooks_all now asks for the "
     "device's size and 2 GiB, not yet run on a GPU"),
    (r"cuLaunchKernel/extra-exact",
     "added after the GPU run (a packed buffer of the parameters' exact size)"),
    (r"(cuGetProcAddress(_v2)?/)?(cuLaunchHostFunc|cuStreamAddCallback)(_ptsz)?/.*"
     r"|(cuGetProcAddress(_v2)?/)?(cuMemHostRegister(_v2)?|cuMemHostUnregister)/.*",
     "hooked (and so called here) after the GPU run"),
]


def load(path):
    results = defaultdict(set)
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "rc":
                results[parts[1]].add(parts[2])
    return results


def main():
    driver, fake = load(sys.argv[1]), load(sys.argv[2])
    if len(driver) < 1000 or len(fake) < 1000:
        print("FAIL: too few answers (%d from the driver, %d from the fake)"
              % (len(driver), len(fake)), file=sys.stderr)
        sys.exit(1)
    allowed = [(re.compile(p), why) for p, why in ALLOWED]
    used = set()
    bad = []
    for label in sorted(set(driver) | set(fake)):
        d, f = driver.get(label), fake.get(label)
        if d == f:
            continue
        hit = [i for i, (p, _) in enumerate(allowed) if p.fullmatch(label)]
        if hit:
            used.update(hit)
            continue
        bad.append("%s: driver %s, fake %s" % (label, "/".join(sorted(d)) if d else "absent",
                                                "/".join(sorted(f)) if f else "absent"))
    for i, (p, why) in enumerate(allowed):
        if i not in used:
            bad.append("allowed difference no longer seen: %s (%s)" % (p.pattern, why))
    if bad:
        print("FAIL: the fake answers differently from the driver (%s):" % sys.argv[1],
              file=sys.stderr)
        for line in bad:
            print("  " + line, file=sys.stderr)
        sys.exit(1)
    print("driver answers OK: %d labels answered as by the driver, %d allowed differences seen"
          % (len(set(driver) & set(fake)), len(used)))


if __name__ == "__main__":
    main()
