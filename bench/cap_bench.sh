#!/usr/bin/env bash
# The benchmark "Fast under a cap": how fast mlp_train
# (--hidden 2048) and transformer_train train under stensor on the fake
# device, capped at 50 % and 75 % of the working set each prints, against the
# same programs uncapped. Measured in one run, medians over interleaved runs:
#   - steady-state step time uncapped and capped: runs of N and 2N steps,
#     (time(2N) - time(N)) / N, which leaves out the first steps (the
#     profiled iteration, warm-up and start-up);
#   - bytes moved per step (swap-outs device->host plus on-demand swap-ins
#     host->device, from STENSOR_STATS=1), differenced the same way, and
#     beside them the bytes served (buffers kernels reached in host memory at
#     their addresses: they cross the link too, but are not in "moved");
#   - with FAKECUDA_LINK set so that those bytes take about half the uncapped
#     step time: capped step time, with STENSOR_PREFETCH=on and off, against
#     1.15 x the time no schedule beats (`stensor sim`'s time bound on an
#     uncapped access log at the same cap and link, a launch's compute its
#     kernel's share of the uncapped step by the fake's timeline of that
#     run, differenced the same way: the uncapped step, the fewest bytes any
#     schedule moves each way a step over the link, or the precedence the
#     cap forces); the library's own transfer-bound time (its bytes moved
#     per step over the link) beside it;
#   - host wait (stensor's "host waited") as a share of the step time;
#   - cuMemCreate + cuMemRelease calls per steady-state step, from the fake's
#     FAKECUDA_REPORT_CALLS report ("n/a" where the fake does not print it);
#   - without FAKECUDA_LINK: the capped run's extra time per MiB moved
#     against twice this machine's warm memcpy cost per MiB (a 64 MiB copy,
#     timed in the same run).
#   - the launch path first (scripts/bench.sh): instructions and wall time
#     added per cuLaunchKernel uncapped, under a cap that does not bind and
#     one that does;
#   - the library's bytes per step against the fewest any schedule of whole
#     buffers moves (`stensor sim`'s LP bound on the uncapped logs).
# Prints one markdown table and the commands used. A measurement, not a
# test: exits 0 when targets are missed, and a failed run is reported and
# skipped, not fatal.
#
# usage: bench/cap_bench.sh [--quick] [--runs R] [--steps N]
#   --quick    one run of each, N = 3 (a smoke test of the script)
#   --runs R   runs per configuration (default 5)
#   --steps N  the shorter run's steps (default 6); the longer runs 2N
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5 steps=6
while (($#)); do
  case $1 in
    --quick) runs=1 steps=3 ;;
    --runs) runs=${2:?--runs needs a value}; shift ;;
    --steps) steps=${2:?--steps needs a value}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cap_bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "cap_bench.sh: --runs '$runs': expected a positive integer" >&2; exit 2; }
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "cap_bench.sh: --steps '$steps': expected a positive integer" >&2; exit 2; }
(( steps >= 2 )) || { echo "cap_bench.sh: --steps $steps: at least 2, so the first 2 steps stay out" >&2; exit 2; }

scripts/setup.sh
bazel build -c opt //...
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
work=$(mktemp -d)
echo "cap_bench: logs in $work"

python3 - "$bin" "$work" "$runs" "$steps" <<'PY'
import json, os, re, statistics, subprocess, sys, time

bin_dir, work, runs, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fake_dir = os.path.join(bin_dir, "tests/fakecuda")
stensor = os.path.join(bin_dir, "interpose/libstensor.so")
programs = [
    ("mlp_train --hidden 2048", [os.path.join(bin_dir, "examples/mlp/mlp_train"), "--hidden", "2048"]),
    ("transformer_train", [os.path.join(bin_dir, "examples/transformer/transformer_train"), "--step-times"]),
]
caps = [50, 75]
lengths = [steps, 2 * steps]
timeout_s = 900
MIB = float(1 << 20)

# Tolerant of spacing and of extra words after the numbers.
number = r"([0-9]+(?:\.[0-9]*)?)"
stat_patterns = {
    "out_mib": re.compile(r"^stensor: swap-outs copied\s+[0-9]+\s*\(\s*" + number + r"\s*MiB", re.M),
    "in_mib": re.compile(r"^stensor: swap-ins copied\s+[0-9]+\s*\(\s*" + number + r"\s*MiB", re.M),
    "served_mib": re.compile(r"^stensor: served from host\s+[0-9]+\s*\(\s*" + number + r"\s*MiB", re.M),
    "wait_s": re.compile(r"^stensor: host waited\s+" + number + r"\s*s", re.M),
    "creates": re.compile(r"^fakecuda: calls cuMemCreate\s+([0-9]+)", re.M),
    "releases": re.compile(r"^fakecuda: calls cuMemRelease\s+([0-9]+)", re.M),
}
commands = {}   # a description of each configuration -> its command line
failures = []   # "what failed" lines


def shell_words(env, argv):
    setting = " ".join("%s=%s" % kv for kv in sorted(env.items()))
    return (setting + " " if setting else "") + " ".join(argv)


def run_once(name, argv, extra_env, length, tag):
    """One run; returns a dict of what it printed, or None if it failed."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = fake_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.update(extra_env)
    full = argv + ["--steps", str(length)]
    shown = {k: v.replace(bin_dir, "bazel-bin") for k, v in extra_env.items()}
    shown["LD_LIBRARY_PATH"] = "bazel-bin/tests/fakecuda"
    commands.setdefault((name, tag), shell_words(shown, [a.replace(bin_dir, "bazel-bin") for a in argv] + ["--steps", "N|2N"]))
    log = os.path.join(work, "%s-%s-%d-%d" % (re.sub(r"[^a-z0-9]+", "_", name), tag, length, len(os.listdir(work))))
    start = time.monotonic()
    try:
        p = subprocess.run(full, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        failures.append("%s, %s, %d steps: timed out after %d s" % (name, tag, length, timeout_s))
        return None
    seconds = time.monotonic() - start
    with open(log + ".out", "w") as f:
        f.write(p.stdout)
    with open(log + ".err", "w") as f:
        f.write(p.stderr)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        failures.append("%s, %s, %d steps: exit %d: %s (log %s.err)" % (name, tag, length, p.returncode, last, log))
        return None
    r = {"seconds": seconds}
    m = re.search(r"^working_set ([0-9]+)$", p.stdout, re.M)
    r["ws"] = int(m.group(1)) if m else None
    m = re.search(r"^checksum ([0-9a-f]+)$", p.stdout, re.M)
    r["checksum"] = m.group(1) if m else None
    r["step_times"] = [float(t) for t in re.findall(r"^step_time [0-9]+ ([0-9.]+)$", p.stdout, re.M)]
    for key, pattern in stat_patterns.items():
        m = pattern.search(p.stderr)
        r[key] = float(m.group(1)) if m else None
    return r


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def steady(results, key, what):
    """per_step, but a time difference below 0 (or a step time of 0: noise on
    a loaded machine swamping too few steps) is reported and counts as no
    figure. A host wait may be 0."""
    value = per_step(results, key)
    if value is not None and (value < 0 or (value == 0 and key == "seconds")):
        failures.append("%s: %s per step came out %.4g (noise: 2N-step runs were not slower "
                        "than N-step runs); more --runs or --steps" % (what, key, value))
        return None
    return value


def per_step(results, key):
    """Median over runs of (value at 2N - value at N) / N; runs pair by index."""
    short, long_ = results.get(steps, []), results.get(2 * steps, [])
    diffs = []
    for a, b in zip(short, long_):
        if a is None or b is None or a.get(key) is None or b.get(key) is None:
            continue
        diffs.append((b[key] - a[key]) / steps)
    return median(diffs)


def measure(configs):
    """configs: [(program name, argv, tag, env)]; interleaved runs."""
    results = {}
    for rep in range(runs):
        for name, argv, tag, env in configs:
            for length in lengths:
                r = run_once(name, argv, env, length, tag)
                results.setdefault((name, tag), {}).setdefault(length, []).append(r)
                print("cap_bench: run %d/%d %-24s %-18s %3d steps: %s" % (
                    rep + 1, runs, name, tag, length,
                    "failed" if r is None else "%.2f s" % r["seconds"]), file=sys.stderr, flush=True)
    return results


# This machine's warm memcpy cost per MiB: a 64 MiB copy between two buffers
# already written, repeated; the median.
src = bytearray(os.urandom(1 << 20)) * 64
dst = bytearray(len(src))
dst[:] = src
copies = []
for _ in range(15):
    start = time.perf_counter()
    dst[:] = src
    copies.append(time.perf_counter() - start)
memcpy_ms_per_mib = statistics.median(copies) * 1e3 / 64
del src, dst

# Phase 0: the launch path (scripts/bench.sh): instructions per launch under
# callgrind, uncapped and under a cap that does not bind (8 GiB: small,
# new-words and swappable buffers) or binds (1 GiB, its fourth count); wall
# per launch, medians of the benchmark's repetitions, uncapped and capped.
launch = {}  # (cap label, what) -> value
def bench_sh(args, env_extra):
    """scripts/bench.sh's output, or None (the reason in `failures`)."""
    env = dict(os.environ)
    env.update(env_extra)
    what = " ".join("%s=%s" % kv for kv in env_extra.items()) + " scripts/bench.sh " + " ".join(args)
    try:
        p = subprocess.run(["scripts/bench.sh"] + args, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        failures.append("%s: timed out after %d s" % (what.strip(), timeout_s))
        return None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        failures.append("%s: exit %d: %s" % (what.strip(), p.returncode, last))
        return None
    return p.stdout
added_re = re.compile(r"^\s*added by the launch hook\s+" + number + r"( ns)?", re.M)
for cap_label, env_extra in (("none", {}), ("8 GiB", {"STENSOR_MEMORY_LIMIT": "8GiB"})):
    shown = "STENSOR_MEMORY_LIMIT=8GiB " if env_extra else ""
    out = bench_sh(["--instructions"], env_extra)
    counts = [float(m.group(1)) for m in added_re.finditer(out)] if out else []
    if len(counts) >= 3:
        for what, value in zip(("small", "new words", "swappable", "binding", "rotating",
                                "changing buffers"), counts):
            launch[(cap_label if what not in ("binding", "rotating") else "1 GiB",
                    "instructions, " + what)] = value
        # Rotating: each launch moves buffers in and out; the cost of a move.
        per_move = re.search(r"^\s*added per move\s+" + number, out or "", re.M)
        if per_move:
            launch[("1 GiB", "instructions, per move")] = float(per_move.group(1))
        commands.setdefault(("launch", "instructions " + cap_label),
                            shown + "scripts/bench.sh --instructions")
    else:
        failures.append("launch path, cap %s: no instruction counts (valgrind missing?)" % cap_label)
    out = bench_sh(["--benchmark_repetitions=5"], env_extra)
    walls = [float(m.group(1)) for m in added_re.finditer(out)] if out else []
    if len(walls) >= 2:
        launch[(cap_label, "wall, same words")] = walls[0]
        launch[(cap_label, "wall, new words")] = walls[1]
        commands.setdefault(("launch", "wall " + cap_label),
                            shown + "scripts/bench.sh --benchmark_repetitions=5")
    else:
        failures.append("launch path, cap %s: no wall times" % cap_label)
# Wall with the swappable buffers: under 8 GiB (the cap does not bind) and
# under 1 GiB (it binds: half of them out, the launches' own resident).
for cap_label, limit, what in (("8 GiB", "8GiB", "wall, swappable"), ("1 GiB", "1GiB", "wall, binding")):
    out = bench_sh(["--benchmark_repetitions=5", "--swappable"], {"STENSOR_MEMORY_LIMIT": limit})
    walls = [float(m.group(1)) for m in added_re.finditer(out)] if out else []
    if walls:
        launch[(cap_label, what)] = walls[0]
        commands.setdefault(("launch", what), "STENSOR_MEMORY_LIMIT=%s scripts/bench.sh "
                            "--benchmark_repetitions=5 --swappable" % limit)
    else:
        failures.append("launch path, cap %s: no wall times with swappable buffers" % cap_label)

# Phase 1: the working sets, then uncapped and capped without a link model.
working_set = {}
for name, argv in programs:
    r = run_once(name, argv, {}, 1, "probe")
    if r is None or r["ws"] is None:
        failures.append("%s: no working_set line; program left out" % name)
        continue
    working_set[name] = r["ws"]
active = [(name, argv) for name, argv in programs if name in working_set]

capped_env = {"LD_PRELOAD": stensor, "STENSOR_STATS": "1",
              "FAKECUDA_REPORT_CALLS": "cuMemCreate,cuMemRelease"}
phase1 = []
for name, argv in active:
    phase1.append((name, argv, "uncapped", {}))
    for cap in caps:
        env = dict(capped_env, STENSOR_MEMORY_LIMIT=str(working_set[name] * cap // 100))
        phase1.append((name, argv, "cap%d" % cap, env))
res1 = measure(phase1)

summary = {}
for name, argv in active:
    u = res1[(name, "uncapped")]
    summary[(name, "uncapped")] = {"step": steady(u, "seconds", name + " uncapped"),
                                   "checksum": [r["checksum"] for r in u.get(2 * steps, []) if r]}
    for cap in caps:
        c = res1[(name, "cap%d" % cap)]
        out, in_ = per_step(c, "out_mib"), per_step(c, "in_mib")
        summary[(name, "cap%d" % cap)] = {
            "step": steady(c, "seconds", "%s at %d %%" % (name, cap)),
            "moved_mib": None if out is None or in_ is None else out + in_,
            "served_mib": per_step(c, "served_mib"),
            "wait": steady(c, "wait_s", "%s at %d %%" % (name, cap)),
            "creates": per_step(c, "creates"),
            "releases": per_step(c, "releases"),
            "checksum": [r["checksum"] for r in c.get(2 * steps, []) if r],
        }

def fmt(value, unit="", digits=1):
    return "n/a" if value is None else ("%.*f%s" % (digits, value, unit))


def verdict(ok):
    return "n/a" if ok is None else ("pass" if ok else "FAIL")


# Phase 2: with the link model at a bandwidth that makes the bytes moved per
# step take half the uncapped step time, prefetch on and off.
phase2, bandwidth = [], {}
for name, argv in active:
    uncapped = summary[(name, "uncapped")]["step"]
    for cap in caps:
        s = summary[(name, "cap%d" % cap)]
        if uncapped is None or uncapped <= 0:
            failures.append("%s at %d %%: uncapped step time %s (failed runs or noise); link runs skipped"
                            % (name, cap, fmt(uncapped and uncapped * 1e3, " ms")))
            continue
        if not s["moved_mib"] or s["moved_mib"] <= 0:
            failures.append("%s at %d %%: no bytes moved per step; link runs skipped" % (name, cap))
            continue
        gbps = s["moved_mib"] * MIB / (0.5 * uncapped) / 1e9
        bandwidth[(name, cap)] = gbps
        for prefetch in ("on", "off"):
            env = dict(capped_env, STENSOR_MEMORY_LIMIT=str(working_set[name] * cap // 100),
                       FAKECUDA_LINK="%.3f" % gbps, STENSOR_PREFETCH=prefetch)
            phase2.append((name, argv, "link%d-prefetch-%s" % (cap, prefetch), env))
res2 = measure(phase2)

def timed_log(log_path, trace_path, total_us):
    """The access log with a compute_us on each launch: its kernel's time in
    the fake's timeline (FAKECUDA_TRACE) of the same run, scaled so that the
    launches sum to total_us. None unless the timeline's kernels, in time
    order, are the log's launches in order (one stream)."""
    try:
        with open(trace_path) as f:
            trace = json.load(f)
    except (OSError, ValueError):
        return None
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    kernels = sorted((e["ts"], e["dur"], e["args"]["symbol"]) for e in events
                     if e.get("ph") == "X" and "symbol" in e.get("args", {}))
    with open(log_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    launched = [r for r in records if r.get("type") == "launch"]
    total = sum(k[1] for k in kernels)
    if (len(kernels) != len(launched) or total <= 0
            or any(k[2] != r.get("kernel") for k, r in zip(kernels, launched))):
        return None
    for k, r in zip(kernels, launched):
        r["compute_us"] = k[1] * total_us / total
    out = log_path[:-len(".jsonl")] + "-timed.jsonl"
    with open(out, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return out


# The time bound per step: `stensor sim` on uncapped access logs of N and
# 2N steps, each term differenced, a launch's compute its kernel's share of
# the uncapped step (uniform when the timeline does not tell).
sim = os.path.join(bin_dir, "tools/stensor")
bound_re = re.compile(r"^time bound\s+[0-9.]+ ms at least.*compute " + number + r" ms, at least "
                      + number + r" MiB in \(" + number + r" ms\), " + number + r" MiB out \("
                      + number + r" ms\), " + number + r" MiB both ways \(" + number + r" ms\), precedence "
                      + number + r" ms", re.M)
time_bound = {}  # (name, cap) -> (bound, compute, in, out, both ways, precedence) per step, seconds
# The fewest bytes any schedule of whole buffers moves (the sim's LP bound).
optimum_re = re.compile(r"^optimum\s+([0-9]+) bytes", re.M)
optimum_bytes = {}  # (name, cap) -> {length: bytes}
for name, argv in active:
    caps_here = [cap for cap in caps if (name, cap) in bandwidth]
    uncapped = summary[(name, "uncapped")]["step"]
    if not caps_here:
        continue
    logs, launches, traces = {}, {}, {}
    for length in lengths:
        base = os.path.join(work, "%s-uncapped-%d" % (re.sub(r"[^a-z0-9]+", "_", name), length))
        path, trace = base + ".jsonl", base + "-trace.json"
        if run_once(name, argv, {"LD_PRELOAD": stensor, "STENSOR_ACCESS_LOG": path,
                                 "FAKECUDA_TRACE": trace}, length, "uncapped-log") is None:
            break
        logs[length], traces[length] = path, trace
        with open(path) as f:
            launches[length] = sum('"type":"launch"' in line for line in f)
    if len(logs) < 2 or launches[2 * steps] <= launches[steps]:
        failures.append("%s: no uncapped access logs to bound the step time with" % name)
        continue
    kernel_us = uncapped * 1e6 * steps / (launches[2 * steps] - launches[steps])
    # Each launch's compute: its kernel's share of the device's time in the
    # same uncapped run, so that the bound's windows see where the compute
    # is (the precedence term depends on it; the totals do not).
    timed = {length: timed_log(logs[length], traces[length], launches[length] * kernel_us)
             for length in lengths}
    if all(timed.values()):
        logs = timed
    else:
        failures.append("%s: the uncapped timeline's kernels do not match the log's launches one "
                        "to one; every launch taken to compute %.1f us" % (name, kernel_us))
    commands.setdefault((name, "time bound"), "bazel-bin/tools/stensor sim LOG --limit CAP_BYTES "
                        "--link GBPS --kernel-us %.1f (LOG: STENSOR_ACCESS_LOG of the uncapped "
                        "N and 2N runs, each launch's compute_us its kernel's share of "
                        "FAKECUDA_TRACE's device time, scaled to the uncapped step)" % kernel_us)
    for cap in caps_here:
        terms = {}
        for length in lengths:
            p = subprocess.run([sim, "sim", logs[length], "--limit", str(working_set[name] * cap // 100),
                                "--link", "%.3f" % bandwidth[(name, cap)], "--kernel-us", "%.3f" % kernel_us],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                               timeout=timeout_s)
            m = bound_re.search(p.stdout)
            if p.returncode != 0 or m is None:
                failures.append("%s at %d %%, %d steps: stensor sim gave no time bound (%s)" % (
                    name, cap, length, (p.stderr.strip().splitlines() or ["no output"])[-1]))
                break
            # compute, in, out, both ways, precedence (ms)
            terms[length] = [float(m.group(i)) for i in (1, 3, 5, 7, 8)]
            o = optimum_re.search(p.stdout)
            if o is not None:
                optimum_bytes.setdefault((name, cap), {})[length] = float(o.group(1))
        if len(terms) < 2:
            continue
        step = [(b - a) / steps / 1e3 for a, b in zip(terms[steps], terms[2 * steps])]
        time_bound[(name, cap)] = (max(step), step[0], step[1], step[2], step[3], step[4])

# The table.
rows = []


def row(program, cap, figure, value, target="", ok=None):
    rows.append((program, cap, figure, value, target, verdict(ok) if target else ""))


for (cap_label, what), value in sorted(launch.items(), key=lambda kv: ("none 8 GiB 1 GiB".index(kv[0][0]), kv[0][1])):
    if what.startswith("instructions"):
        target = "" if cap_label == "1 GiB" else ("<= 700" if cap_label == "none" else "<= 1,400")
        limit = 700 if cap_label == "none" else 1400
        per = " added" if what.endswith("per move") else " added per launch"
        row("launch path", cap_label, what + per, "%.0f" % value, target,
            None if not target else value <= limit)
    else:
        target = "<= 60 ns" if cap_label == "none" else ""
        row("launch path", cap_label, what + " added per launch", "%.1f ns" % value, target,
            None if not target else value <= 60)

for name, argv in active:
    u = summary[(name, "uncapped")]
    us = u["step"]
    row(name, "none", "working set", "%.1f MiB" % (working_set[name] / MIB))
    row(name, "none", "step time", fmt(us and us * 1e3, " ms"))
    # Programs that print step_time lines: the median of steps 2.. of each
    # longer run, a check on the differencing.
    step_lines = [median(r["step_times"][2:]) for r in res1[(name, "uncapped")].get(2 * steps, [])
                  if r and len(r["step_times"]) > 2]
    if step_lines:
        row(name, "none", "step time, step_time lines", fmt(median(step_lines) * 1e3, " ms"))
    want = u["checksum"][0] if u["checksum"] else None
    for cap in caps:
        label = "%d %%" % cap
        s = summary[(name, "cap%d" % cap)]
        row(name, label, "checksum = uncapped", "%d/%d runs" % (sum(c == want for c in s["checksum"]), len(s["checksum"])),
            "all", None if not s["checksum"] or want is None else all(c == want for c in s["checksum"]))
        cs = s["step"]
        row(name, label, "step time, no link", fmt(cs and cs * 1e3, " ms") +
            ("" if not (cs and us) else " (x%.1f)" % (cs / us)))
        row(name, label, "moved per step", fmt(s["moved_mib"], " MiB"))
        # Read by kernels over the link where they are mapped at their
        # addresses, not in "moved" (nor in the link's setting below).
        row(name, label, "served per step (kernels' reads of host copies, not in moved)",
            fmt(s["served_mib"], " MiB"))
        ob = optimum_bytes.get((name, cap), {})
        if steps in ob and 2 * steps in ob:
            opt_mib = (ob[2 * steps] - ob[steps]) / steps / MIB
            ratio = "" if not (s["moved_mib"] and opt_mib > 0) else " (moved x%.2f)" % (s["moved_mib"] / opt_mib)
            row(name, label, "fewest bytes any schedule moves per step (whole buffers; served bytes not in moved)",
                "%.1f MiB%s" % (opt_mib, ratio))
        wait_pct = None if s["wait"] is None or not cs else 100 * s["wait"] / cs
        row(name, label, "host wait, no link", fmt(wait_pct, " %"), "<= 5 %", None if wait_pct is None else wait_pct <= 5)
        calls = None if s["creates"] is None or s["releases"] is None else s["creates"] + s["releases"]
        row(name, label, "cuMemCreate+cuMemRelease per step", fmt(calls, "", 1), "0",
            None if calls is None else calls == 0)
        extra = None
        if cs is not None and us is not None and s["moved_mib"]:
            extra = (cs - us) * 1e3 / s["moved_mib"]
        row(name, label, "extra time per MiB moved, no link", fmt(extra, " ms", 3),
            "<= 2 x %.3f ms (memcpy)" % memcpy_ms_per_mib, None if extra is None else extra <= 2 * memcpy_ms_per_mib)
        if (name, cap) not in bandwidth:
            continue
        gbps = bandwidth[(name, cap)]
        bound = s["moved_mib"] * MIB / (gbps * 1e9)
        row(name, label, "FAKECUDA_LINK, transfer-bound time", "%.1f ms at %.3f GB/s" % (bound * 1e3, gbps))
        tb = time_bound.get((name, cap))
        if tb is not None:
            row(name, label, "time bound (sim), per step",
                "%.1f ms (compute %.1f, in %.1f, out %.1f, both ways %.1f, precedence %.1f)" % tuple(t * 1e3 for t in tb))
        # Without a bound, the older target: the uncapped step or the
        # library's own bytes over the link.
        target = 1.15 * (tb[0] if tb is not None else max(us, bound))
        for prefetch in ("on", "off"):
            r = res2.get((name, "link%d-prefetch-%s" % (cap, prefetch)), {})
            what = "%s at %d %%, link, prefetch %s" % (name, cap, prefetch)
            ls, lw = steady(r, "seconds", what), steady(r, "wait_s", what)
            # Also against the compute alone: the model charges a served
            # read whole where the fake (as a GPU's link) carries the pages
            # the kernel touches, so with serving only the compute bounds
            # every schedule whatever a kernel touches.
            ratio = "" if not (ls and tb) else " (x%.2f the bound, x%.2f the compute)" % (
                ls / tb[0], ls / tb[1])
            if ls and tb and ls < tb[0]:
                # No schedule of the model beats it, so the model charged this
                # run more than the fake did (served bytes it counts whole).
                ratio += " [below the bound: the model overcharges this run]"
            row(name, label, "step time, link, prefetch %s" % prefetch, fmt(ls and ls * 1e3, " ms") + ratio,
                "<= %.1f ms" % (target * 1e3), None if ls is None else ls <= target)
            wait_pct = None if lw is None or not ls else 100 * lw / ls
            row(name, label, "host wait, link, prefetch %s" % prefetch, fmt(wait_pct, " %"), "<= 5 %",
                None if wait_pct is None else wait_pct <= 5)

print()
print("Medians of %d interleaved run(s) of N = %d and 2N = %d steps; per step = (2N - N) / N." % (runs, steps, 2 * steps))
print("Moved = swap-outs copied (device->host) + on-demand swap-ins (host->device), MiB = 2^20 bytes.")
print("Warm memcpy on this machine: %.3f ms per MiB (%.1f GB/s, 64 MiB copies)." % (
    memcpy_ms_per_mib, MIB / (memcpy_ms_per_mib * 1e-3) / 1e9))
print()
print("| program | cap | figure | value | target | pass/fail |")
print("|---|---|---|---|---|---|")
for r in rows:
    print("| %s |" % " | ".join(r))
print()
print("Commands (N|2N: run with --steps N and --steps 2N; caps in bytes of the working set printed by a 1-step probe):")
for (name, tag), command in commands.items():
    print("  %-24s %-20s %s" % (name, tag, command))
if failures:
    print()
    print("Failed runs and figures left out:")
    for f in failures:
        print("  " + f)
PY
