#!/usr/bin/env python3
"""Checks the access log of a tests/hooks_all run against the records the
program said each of its calls must write (its `expect` lines), in order.

usage: hooks_check.py LOG PROGRAM_OUTPUT CAPPED(0|1)

Every operation record of the log (alloc, free, memcpy, memset, launch, sync,
graph_launch, host_alloc, host_free, pin) must be the next expected one: a
missing record, an extra one (a refused call that was logged) or a wrong
field fails. An expected field is compared as given, except buffers, which
the program names by base address: `reads`/`writes` (sets of buffers) and
`id_of` (the record's `id`) are compared through the log's alloc records.
Under a cap, a `swapped ADDR` line before an expected record requires that
buffer to have been swapped out (its last swap_out, drop_clean or
drop_unwritten after its last swap_in) when the call began, i.e. at the
previous operation record; the call then swaps it in, or serves it from its
host copy (a device-to-host copy).
Exits 1 with a message on the first violation.
"""
import json
import sys

OPERATIONS = {"alloc", "free", "memcpy", "memset", "launch", "sync",
              "graph_launch", "host_alloc", "host_free", "pin"}


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    log_path, out_path, capped = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    records = []
    with open(log_path) as f:
        for number, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except ValueError as e:
                fail("log line %d is not JSON (%s): %r" % (number, e, line[:200]))
    if not records or records[0].get("type") != "header":
        fail("the log has no header")
    if records[-1].get("type") != "end" or records[-1].get("dropped") != 0:
        fail("the log does not end with an end record with nothing dropped: %r"
             % records[-1])

    # The program's expectations, each with the buffers it said were swapped
    # out before it.
    expected, pending = [], []
    with open(out_path) as f:
        for line in f:
            if line.startswith("expect "):
                expected.append((json.loads(line[len("expect "):]), pending))
                pending = []
            elif line.startswith("swapped "):
                pending.append(int(line.split()[1], 16))

    base_of = {}  # buffer id -> base address
    out = set()  # ids swapped out now
    out_at_start = set()  # ... when the current call began
    swapped_in = set()  # ids swapped in since the previous operation record
    index = 0
    swap_checks = served = 0
    for number, r in enumerate(records[1:-1], 2):
        kind = r.get("type")
        # A piece of an allocation (a `piece` field) moves on its own: the
        # allocation counts as out while any piece of it is.
        if kind == "swap_in":
            swapped_in.add(r["id"])
            out.discard((r["id"], r.get("piece")))
            continue
        if kind in ("swap_out", "drop_clean", "drop_unwritten"):
            out.add((r["id"], r.get("piece")))
            continue
        if kind not in OPERATIONS:
            continue
        if kind == "alloc" and r["id"] != 0:
            base_of[r["id"]] = int(r["addr"], 16)
        if index == len(expected):
            fail("log line %d: a record no call should have written: %r" % (number, r))
        want, swapped = expected[index]
        index += 1

        def bases(ids):
            return sorted(base_of.get(i, -1) for i in ids)

        for key, value in want.items():
            if key in ("reads", "writes"):
                got = bases(r.get(key, []))
                if got != sorted(int(v, 16) for v in value):
                    fail("log line %d: %s %s, want %s: %r"
                         % (number, key, [hex(b) for b in got], value, r))
            elif key == "id_of":
                if base_of.get(r.get("id"), -1) != int(value, 16):
                    fail("log line %d: id %r is not the buffer at %s: %r"
                         % (number, r.get("id"), value, r))
            elif r.get(key) != value:
                fail("log line %d: %s is %r, want %r: %r (expected %r)"
                     % (number, key, r.get(key), value, r, want))
        if capped:
            for base in swapped:
                ids = [i for i, b in base_of.items() if b == base]
                if not any(i in out_at_start for i in ids):  # ids with a piece out
                    fail("log line %d: the buffer at %s was resident when this call began: %r"
                         % (number, hex(base), r))
                if not any(i in swapped_in for i in ids):
                    served += 1
                swap_checks += 1
        swapped_in = set()
        out_at_start = {i for i, _ in out}
    if index != len(expected):
        fail("the log has %d of the %d expected records; the first missing: %r"
             % (index, len(expected), expected[index][0]))
    print("access log OK: %d records as expected; %d buffers swapped out when their "
          "call began (%d of them served from the host copy)" % (index, swap_checks, served))


if __name__ == "__main__":
    main()
