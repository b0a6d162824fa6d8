#!/usr/bin/env python3
"""Checks a `stensor trace` output against the access log it was made from.

usage: check_chrome_trace.py TRACE.json LOG.jsonl capped|uncapped

The trace must parse as JSON with traceEvents and displayTimeUnit, name its
process and tracks, have a track per stream of the log with one kernel
slice per launch named by the launch's demangled name (its kernel name when
there is none), in log order; every complete event must have ts and dur >= 0;
the resident-bytes counter must exist. A capped log must give a cap counter
that the resident counter never exceeds and a swap track with swap-in and
swap-out slices, one per record; an uncapped log neither.
"""
import json
import sys


def fail(message):
    sys.exit(f"FAIL: {sys.argv[1]}: {message}")


def main():
    trace_path, log_path, mode = sys.argv[1:4]
    with open(trace_path) as f:
        trace = json.load(f)
    if not isinstance(trace, dict) or "displayTimeUnit" not in trace:
        fail("not a JSON object with displayTimeUnit")
    events = trace.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail("no traceEvents")
    if "logical" not in trace.get("otherData", {}).get("clock", ""):
        fail("otherData does not say the clock is logical")

    with open(log_path) as f:
        records = [json.loads(line) for line in f]
    launches = [r for r in records if r["type"] == "launch" and not r.get("captured")]
    streams = {r["stream"] for r in records if "stream" in r}
    swaps = {t: sum(r["type"] == t for r in records) for t in ("swap_in", "swap_out")}

    meta = [e for e in events if e["ph"] == "M"]
    if not any(e["name"] == "process_name" for e in meta):
        fail("no process_name")
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    stream_tids = {tid: name for tid, name in threads.items() if name.startswith("stream ")}
    if len(stream_tids) != len(streams):
        fail(f"{len(stream_tids)} stream tracks for {len(streams)} streams: {threads}")

    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:
        if not (e["ts"] >= 0 and e["dur"] >= 0):
            fail(f"ts/dur below 0: {e}")
    kernels = [e for e in slices if e["cat"] == "kernel"]
    if len(kernels) != len(launches):
        fail(f"{len(kernels)} kernel slices for {len(launches)} launches")
    for e, r in zip(kernels, launches):
        want = r.get("demangled") or r["kernel"]
        if e["name"] != want or e["tid"] not in stream_tids:
            fail(f"kernel slice {e['name']!r} on track {e['tid']}, want {want!r} on a stream")
    if not any("(" in e["name"] and not e["name"].startswith("_Z") for e in kernels):
        fail("no kernel slice has a demangled name")
    ts = [e["ts"] for e in slices]
    if ts != sorted(ts):
        fail("slices not in clock order")

    counters = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append((e["ts"], e["args"]["bytes"]))
    resident = counters.get("device 0 resident")
    if not resident:
        fail(f"no resident counter: {sorted(counters)}")
    # With no live buffer left, nothing is resident but the slabs the library
    # keeps for small allocations (STENSOR_SLABS), empty and never freed.
    slabs = {}
    for r in records:
        if r["type"] == "slab":
            slabs[r["slab"]] = r["bytes"]
        elif r["type"] == "slab_free":
            slabs.pop(r["slab"], None)
    if (resident[-1][1] > sum(slabs.values()) and records[-1]["type"] == "end"
            and records[-1]["live_buffers"] == 0):
        fail(f"resident bytes end at {resident[-1][1]} with no live buffers")

    swap_tids = [tid for tid, name in threads.items() if name.startswith("swap")]
    by_cat = {}
    for e in slices:
        if e["tid"] in swap_tids:
            by_cat[e["cat"]] = by_cat.get(e["cat"], 0) + 1
    if mode == "capped":
        cap = counters.get("device 0 cap")
        if not cap:
            fail(f"no cap counter: {sorted(counters)}")
        limit = cap[0][1]
        peak = max(v for _, v in resident)
        if peak > limit:
            fail(f"resident {peak} bytes over the cap {limit}")
        if peak < limit // 2:
            fail(f"resident peaks at {peak} bytes, under half the cap {limit}: the check is empty")
        for t, n in swaps.items():
            if n == 0 or by_cat.get(t, 0) != n:
                fail(f"{by_cat.get(t, 0)} {t} slices on the swap track for {n} records")
        print(f"capped: peak resident {peak} <= cap {limit}; swap track {by_cat}")
    else:
        if "device 0 cap" in counters:
            fail("a cap counter in an uncapped run")
        if by_cat:
            fail(f"swap slices in an uncapped run: {by_cat}")
    print(f"{trace_path}: {len(events)} events, {len(kernels)} kernels on "
          f"{len(stream_tids)} streams: OK")


if __name__ == "__main__":
    main()
