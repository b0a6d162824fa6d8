#!/usr/bin/env python3
"""Checks an access log written under mlp_train against docs/access-log.md
and against the kernels' signatures.

usage: check_access_log.py LOG STEPS
Exits 1 with a message on the first violation.
"""
import json
import sys


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    path, steps = sys.argv[1], int(sys.argv[2])
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except ValueError as e:
                fail("line %d is not JSON (%s): %r" % (number, e, line[:200]))
    if not records:
        fail("empty log")
    header, end = records[0], records[-1]
    if header.get("type") != "header" or header.get("format") != 1:
        fail("first record is not a format-1 header: %r" % header)
    for key in ("pid", "devices", "config"):
        if key not in header:
            fail("header lacks %r" % key)
    if header["config"].get("STENSOR_ACCESS_LOG") in (None, ""):
        fail("header config does not show STENSOR_ACCESS_LOG")
    if end.get("type") != "end" or end.get("dropped") != 0:
        fail("last record is not an end record with nothing dropped: %r" % end)

    body = records[1:-1]
    counts = {}
    for r in body:
        counts[r["type"]] = counts.get(r["type"], 0) + 1
    for kind, n in end["counts"].items():
        if counts.get(kind, 0) != n:
            fail("end record counts %d %s records, the log has %d"
                 % (n, kind, counts.get(kind, 0)))

    sizes = {}
    for r in body:
        if r["type"] == "alloc":
            if r["id"] == 0 or r["bytes"] <= 0:
                fail("alloc without id or size: %r" % r)
            sizes[r["id"]] = r["bytes"]

    launches = [r for r in body if r["type"] == "launch"]
    if not launches:
        fail("no launch records")
    by_kernel = {}
    for r in launches:
        for key in ("kernel", "demangled", "stream", "grid", "block", "reads", "writes"):
            if key not in r:
                fail("launch record lacks %r: %r" % (key, r))
        if not set(r["writes"]) <= set(r["reads"]):
            fail("a written buffer is not also read (read-write): %r" % r)
        for i in r["reads"]:
            if i not in sizes:
                fail("launch names buffer %d that was never allocated" % i)
        by_kernel.setdefault(r["kernel"], []).append(r)

    def each(kernel, n_reads, n_writes):
        runs = by_kernel.get(kernel)
        if not runs:
            fail("no launch of %s" % kernel)
        for r in runs:
            if len(r["reads"]) != n_reads or len(r["writes"]) != n_writes:
                fail("%s: %d reads / %d writes, want %d / %d: %r"
                     % (kernel, len(r["reads"]), len(r["writes"]), n_reads, n_writes, r))
        return runs

    # sgd_momentum(float* w, float* v, const float* g, float, float, int):
    # writes the weights and the momentum, only reads the gradients.
    for r in each("_ZN3mlp12sgd_momentumEPfS0_PKfffi", 3, 2):
        read_only = set(r["reads"]) - set(r["writes"])
        if len(read_only) != 1:
            fail("sgd_momentum must read exactly one buffer only: %r" % r)
        (g,) = read_only
        if any(sizes[w] != sizes[g] for w in r["writes"]):
            fail("sgd_momentum's weights, momentum and gradient differ in size: %r" % r)
    if r["demangled"] != "mlp::sgd_momentum(float*, float*, float const*, float, float, int)":
        fail("demangled name: %r" % r["demangled"])
    # linear_forward(const float* x, const float* w, const float* b, float* y, ...)
    each("_ZN3mlp14linear_forwardEPKfS1_S1_Pfiii", 4, 1)
    # linear_backward_params(const float* x, const float* dy, float* dw, float* db, ...)
    each("_ZN3mlp22linear_backward_paramsEPKfS1_PfS2_iii", 4, 2)
    # relu_backward(const float* pre, float* grad, int): grad in place.
    each("_ZN3mlp13relu_backwardEPKfPfi", 2, 1)
    # mean_loss(const float* sample_loss, float* loss, int)
    runs = each("_ZN3mlp9mean_lossEPKfPfi", 2, 1)
    if len(runs) != steps:
        fail("%d mean_loss launches for %d steps" % (len(runs), steps))

    copies = [r for r in body if r["type"] == "memcpy"]
    dtoh = [r for r in copies if r["kind"] == "DtoH"]
    if len(dtoh) < steps:
        fail("expected at least one DtoH copy per step, got %d" % len(dtoh))
    for r in dtoh:
        if len(r["reads"]) != 1 or r["writes"]:
            fail("a DtoH copy reads one device buffer and writes none: %r" % r)
    print("access log OK: %d records, %d launches of %d kernels, %d copies"
          % (len(records), len(launches), len(by_kernel), len(copies)))


if __name__ == "__main__":
    main()
