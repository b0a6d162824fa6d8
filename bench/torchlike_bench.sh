#!/usr/bin/env bash
# The benchmark of issue 23: examples/torchlike/torchlike_train (a
# PyTorch-shaped training program) under stensor on the fake device, for
# each allocator and graph mode (caching eager, per-tensor eager, caching
# with whole-step graphs, caching with per-layer graphs; fused AdamW), capped
# at 100 / 75 / 50 / 25 % of the working set each mode prints, against the
# same mode uncapped without stensor. Measured in one run, over
# interleaved runs; every run has FAKECUDA_VMM_LATENCY_US=h200 (VMM calls
# cost what they cost on an H200):
#   - steady-state step time: from the 2N-step runs' step times
#     (--step-times: each step's host wall time, its loss read back and its
#     share of the evaluation pass), each run's median of the program's
#     2-step iterations among steps N..2N-1, halved, and of those the
#     fastest run's, which leaves out the first N steps (graph
#     capture, warm-up, and finding and profiling the iteration: the program
#     repeats every 2 steps, as the evaluation pass and empty_cache follow
#     every 2nd step, but the data loader runs ahead of the first steps and
#     its copies land at other places among the kernels, so the 2-step
#     iteration is found after 5 steps, and profiled in the next 2; N = 8
#     measured those steps too and overstated the per-tensor cost at 50 %
#     from about 1.15 x to 1.69 x); a step includes its share of the
#     evaluation pass and empty_cache. Iterations of one run, not a
#     difference of two runs' totals, so that a pause of the machine moves
#     one iteration, not the step; the fastest run, since on a shared VM
#     whole stretches of seconds run 30-40 % slower (uncapped runs too), and
#     that only ever adds time;
#   - with FAKECUDA_LINK (both directions) at working set / (0.5 x uncapped
#     step time without the link), so that moving the whole working set
#     once takes half the uncapped step: step time against uncapped (also
#     run with that link); goals (from the issue) <= 1.1 x at 100 %,
#     <= 1.5 x at 50 %, <= 2 x at 25 % for the caching and per-tensor
#     allocators (eager), and whole-step graphs run at 50 % (finish with the
#     uncapped checksum); no goal at 75 % nor for per-layer graphs;
#   - the same table without the link (copies at host memcpy speed, kernels
#     reaching host memory uncharged);
#   - served share: bytes operations reached in host memory through host
#     mappings ("served from host", STENSOR_STATS=1) / (those + bytes
#     swapped in by copies), per step;
#   - moved: swap-outs copied (device->host) + swap-ins copied
#     (host->device), MiB per step (STENSOR_STATS=1, differenced);
#   - optimum: `stensor sim LOG --limit CAP --exact-seconds S` on access logs
#     (STENSOR_ACCESS_LOG, under a cap of 4 x the working set, which never
#     binds, so that pointer tables are read and launches through them
#     known) of M and 2M steps (--optimum-steps; fewer than N, since GLPK's
#     0-1 program grows with the log and the per-step optimum of a
#     repeating program does not depend on which steps), differenced: the
#     least that any
#     schedule can move (device->host plus host->device plus bytes served
#     over the link, a served use costing its buffer's bytes as the
#     library counts it) when each use of a buffer is either resident or
#     served from its host copy (the sim's optimum with serving, GLPK's 0-1
#     program; docs/sim.md). Where GLPK does not prove it within S seconds
#     the per-step figure is a range: the 2N-step log's lower bound less the
#     N-step one's schedule, up to the other way round;
#   - x optimum: moved + served per step against that optimum;
#   - context synchronisations (cuCtxSynchronize, _v2) and read-backs
#     (cuMemcpyDtoH_v2, _ptds, cuMemcpyDtoHAsync_v2, _ptsz) per step that
#     stensor adds: the capped run's calls less the same mode's calls without
#     stensor (its own loss read-backs), from the fake's
#     FAKECUDA_REPORT_CALLS report, differenced. The issue's goal of 0 holds
#     when no pointer-to-pointer table is written on the device; torchlike's
#     mixture-of-experts router writes one, so those are shown, not judged.
# Also checked: each capped run's checksum equals the uncapped one, and its
# device high-water mark (FAKECUDA_REPORT_PEAK) stays within the cap.
# Prints the markdown tables and the commands used. A measurement, not a
# test: exits 0 when goals are missed, and a failed run is reported and
# left out, not fatal.
#
# usage: bench/torchlike_bench.sh [--quick] [--runs R] [--steps N]
#                                 [--optimum-steps M] [--exact-seconds S]
#                                 [--modes LIST] [--model "ARGS"]
#   --quick            one run of each, N = M = 2 (a smoke test of the script)
#   --runs R           runs per configuration (default 5)
#   --steps N          the shorter run's steps (default 16); the longer runs 2N
#   --optimum-steps M  the shorter access log's steps (default 4); the
#                      longer one 2M
#   --exact-seconds S  time limit of each exact optimum (default 60)
#   --modes LIST       comma-separated modes to run (default all:
#                      caching-eager,per-tensor-eager,per-tensor-eager-slabs,
#                      per-tensor-eager-noslabs,caching-step,caching-layer;
#                      -slabs: STENSOR_SLABS=on, -noslabs: off, else the
#                      default, auto)
#   --model "ARGS"     more torchlike_train flags for every run, e.g.
#                      "--dim 512 --buckets 8192 --experts 8": a wider model
#                      whose 2-4 MiB weights share PyTorch's 20 MiB segments
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5 steps=16 optimum_steps=4 exact_seconds=60 modes=all model=
while (($#)); do
  case $1 in
    --quick) runs=1 steps=2 optimum_steps=2 ;;
    --runs) runs=${2:?--runs needs a value}; shift ;;
    --steps) steps=${2:?--steps needs a value}; shift ;;
    --optimum-steps) optimum_steps=${2:?--optimum-steps needs a value}; shift ;;
    --exact-seconds) exact_seconds=${2:?--exact-seconds needs a value}; shift ;;
    --modes) modes=${2:?--modes needs a value}; shift ;;
    --model) model=${2?--model needs a value}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "torchlike_bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "torchlike_bench.sh: --runs '$runs': expected a positive integer" >&2; exit 2; }
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "torchlike_bench.sh: --steps '$steps': expected a positive integer" >&2; exit 2; }
(( steps >= 2 )) || { echo "torchlike_bench.sh: --steps $steps: at least 2, so the first 2 steps stay out" >&2; exit 2; }
[[ $optimum_steps =~ ^[1-9][0-9]*$ ]] || { echo "torchlike_bench.sh: --optimum-steps '$optimum_steps': expected a positive integer" >&2; exit 2; }
[[ $exact_seconds =~ ^[1-9][0-9]*$ ]] || { echo "torchlike_bench.sh: --exact-seconds '$exact_seconds': expected a positive integer" >&2; exit 2; }

scripts/setup.sh
targets=(//examples/torchlike:torchlike_train //interpose:libstensor.so //tools:stensor //tests/fakecuda:libcuda.so.1)
bazel build -c opt "${targets[@]}"
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
work=$(mktemp -d)
echo "torchlike_bench: logs in $work"

python3 - "$bin" "$work" "$runs" "$steps" "$optimum_steps" "$exact_seconds" "$modes" "$model" <<'PY'
import os, re, shlex, statistics, subprocess, sys, time

bin_dir, work = sys.argv[1], sys.argv[2]
runs, steps, optimum_steps, exact_seconds = (int(a) for a in sys.argv[3:7])
chosen, model_args = sys.argv[7], shlex.split(sys.argv[8])
fake_dir = os.path.join(bin_dir, "tests/fakecuda")
stensor = os.path.join(bin_dir, "interpose/libstensor.so")
train = os.path.join(bin_dir, "examples/torchlike/torchlike_train")
sim = os.path.join(bin_dir, "tools/stensor")
modes = [  # (allocator, graphs[, "slabs" | "noslabs": STENSOR_SLABS=on | off])
    ("caching", "eager"),
    ("per-tensor", "eager"),
    ("per-tensor", "eager", "slabs"),
    ("per-tensor", "eager", "noslabs"),
    ("caching", "step"),
    ("caching", "layer"),
]
if chosen != "all":
    names = chosen.split(",")
    unknown = [n for n in names if n not in ["-".join(m) for m in modes]]
    if unknown:
        sys.exit("torchlike_bench.sh: --modes: unknown mode %s (expected a list of %s)" % (
            unknown[0], ", ".join("-".join(m) for m in modes)))
    modes = [m for m in modes if "-".join(m) in names]
caps = [100, 75, 50, 25]
lengths = [steps, 2 * steps]
log_lengths = [optimum_steps, 2 * optimum_steps]
timeout_s = 600
MIB = float(1 << 20)
SYNCS = ["cuCtxSynchronize", "cuCtxSynchronize_v2"]
READS = ["cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"]
base_env = {"FAKECUDA_VMM_LATENCY_US": "h200", "FAKECUDA_REPORT_CALLS": ",".join(SYNCS + READS)}

number = r"([0-9]+(?:\.[0-9]*)?)"
stat_patterns = {
    "out_mib": re.compile(r"^stensor: swap-outs copied\s+[0-9]+\s*\(\s*" + number + r"\s*MiB", re.M),
    "in_mib": re.compile(r"^stensor: swap-ins copied\s+[0-9]+\s*\(\s*" + number + r"\s*MiB", re.M),
    "served_mib": re.compile(r"^stensor: served from host\s+[0-9]+\s*\(\s*" + number + r"\s*MiB", re.M),
}
commands = {}  # configuration -> command line
failures = []  # what failed


def mode_name(mode):
    return "-".join(mode)


def slabs(mode):
    """STENSOR_SLABS for the mode: on, off, or the default (auto)."""
    return {"slabs": "on", "noslabs": "off"}.get(mode[2] if len(mode) > 2 else "", "auto")


def alloc_column(mode):
    return mode[0] + {"on": " + slabs", "off": " without slabs", "auto": ""}[slabs(mode)]


def mode_argv(mode):
    return [train, "--alloc", mode[0], "--graphs", mode[1], "--step-times"] + model_args


def shell_words(env, argv):
    setting = " ".join("%s=%s" % kv for kv in sorted(env.items()) if kv[0] not in base_env)
    return (setting + " " if setting else "") + " ".join(argv)


def run_once(mode, tag, extra_env, length):
    """One run of torchlike_train; a dict of what it printed, or None."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = fake_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.update(base_env)
    env.update(extra_env)
    argv = mode_argv(mode)
    shown = {k: v.replace(bin_dir, "bazel-bin") for k, v in dict(base_env, **extra_env).items()}
    commands.setdefault((mode_name(mode), tag), shell_words(
        shown, [a.replace(bin_dir, "bazel-bin") for a in argv] + ["--steps", "M|2M" if tag == "access-log" else "N|2N"]))
    what = "%s, %s, %d steps" % (mode_name(mode), tag, length)
    log = os.path.join(work, "%s-%s-%d-%d" % (mode_name(mode), tag, length, len(os.listdir(work))))
    start = time.monotonic()
    try:
        p = subprocess.run(argv + ["--steps", str(length)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        failures.append("%s: timed out after %d s" % (what, timeout_s))
        return None
    seconds = time.monotonic() - start
    with open(log + ".out", "w") as f:
        f.write(p.stdout)
    with open(log + ".err", "w") as f:
        f.write(p.stderr)
    if p.returncode != 0:
        last = [l for l in p.stderr.strip().splitlines() if not l.startswith(("stensor: ", "fakecuda: "))]
        failures.append("%s: exit %d: %s (log %s.err)" % (what, p.returncode, (last or ["(no message)"])[-1], log))
        return None
    r = {"wall": seconds}
    m = re.search(r"^train_seconds ([0-9.]+)$", p.stdout, re.M)
    r["seconds"] = float(m.group(1)) if m else None
    r["step_times"] = dict((int(n), float(t)) for n, t in re.findall(r"^step_time ([0-9]+) ([0-9.]+)$", p.stdout, re.M))
    m = re.search(r"^working_set ([0-9]+)$", p.stdout, re.M)
    r["ws"] = int(m.group(1)) if m else None
    m = re.search(r"^checksum ([0-9a-f]+)$", p.stdout, re.M)
    r["checksum"] = m.group(1) if m else None
    for key, pattern in stat_patterns.items():
        m = pattern.search(p.stderr)
        r[key] = float(m.group(1)) if m else None
    calls = dict((name, int(n)) for name, n in re.findall(r"^fakecuda: calls (\S+) ([0-9]+)$", p.stderr, re.M))
    r["syncs"] = sum(calls[s] for s in SYNCS) if all(s in calls for s in SYNCS) else None
    r["reads"] = sum(calls[s] for s in READS) if all(s in calls for s in READS) else None
    m = re.search(r"^fakecuda: device 0 peak ([0-9]+) bytes$", p.stderr, re.M)
    r["peak"] = int(m.group(1)) if m else None
    r["log"] = log
    return r


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def per_step(results, key):
    """Median over runs of (value at 2N - value at N) / N; runs pair by index."""
    diffs = []
    for a, b in zip(results.get(steps, []), results.get(2 * steps, [])):
        if a is None or b is None or a.get(key) is None or b.get(key) is None:
            continue
        diffs.append((b[key] - a[key]) / steps)
    return median(diffs)


def step_time(results, what):
    """Seconds a steady-state step: per 2N-step run, the median of its 2-step
    iterations that start at an even step from N on (each holds one
    evaluation pass and one empty_cache), halved; the least over runs."""
    first = steps + steps % 2
    medians = []
    for r in results.get(2 * steps, []):
        if r is None:
            continue
        times = r["step_times"]
        if any(n not in times for n in range(first, 2 * steps)):
            failures.append("%s: step_time lines missing in %s.out" % (what, r["log"]))
            continue
        medians.append(statistics.median(
            [times[n] + times[n + 1] for n in range(first, 2 * steps - 1, 2)]) / 2)
    return min(medians) if medians else None


def measure(configs, phase):
    """configs: [(mode, tag, env)]; runs interleaved over configurations."""
    results = {}
    for rep in range(runs):
        for mode, tag, env in configs:
            for length in lengths:
                r = run_once(mode, tag, env, length)
                results.setdefault((mode, tag), {}).setdefault(length, []).append(r)
                print("torchlike_bench: %s run %d/%d %-18s %-14s %3d steps: %s" % (
                    phase, rep + 1, runs, mode_name(mode), tag, length,
                    "failed" if r is None else "%.2f s" % r["wall"]), file=sys.stderr, flush=True)
    return results


def capped_env(ws, cap, mode):
    env = {"LD_PRELOAD": stensor, "STENSOR_STATS": "1", "FAKECUDA_REPORT_PEAK": "1",
           "STENSOR_MEMORY_LIMIT": str(ws * cap // 100)}
    if slabs(mode) != "auto":
        env["STENSOR_SLABS"] = slabs(mode)
    return env


# Phase 0: each mode's working set (a probe of N steps: the whole-step graph
# is captured in step 1, in a private pool), and access logs of M
# and 2M steps under stensor with a cap that never binds (a cap changes
# nothing the program does) for the optimum.
working_set, logs = {}, {}
for mode in modes:
    r = run_once(mode, "probe", {}, steps)
    if r is None or r["ws"] is None:
        failures.append("%s: no working_set line; mode left out" % mode_name(mode))
        continue
    working_set[mode] = r["ws"]
    for length in log_lengths:
        path = os.path.join(work, "%s-%d.jsonl" % (mode_name(mode), length))
        # Under a cap that never binds: without one the library reads no
        # pointer table back, and logs the launches that reach them as of
        # unknown accesses (every buffer written), which the sim replays so.
        log_env = {"LD_PRELOAD": stensor, "STENSOR_ACCESS_LOG": path,
                   "STENSOR_MEMORY_LIMIT": str(4 * working_set[mode])}
        if run_once(mode, "access-log", log_env, length) is not None:
            logs[(mode, length)] = path
active = [m for m in modes if m in working_set]


def optimum(mode, cap):
    """((low, high) MiB per step or None, note): the optimum with serving of
    the 2M-step log less the M-step one's. Proven, low == high; else each
    log's optimum lies between its lower bound and the schedule found, so
    the difference lies between (low 2N - found N) and (found 2N - low N)."""
    cap_bytes = working_set[mode] * cap // 100
    found, low, notes = [], [], []
    for length in log_lengths:
        path = logs.get((mode, length))
        if path is None:
            return None, "no access log"
        argv = [sim, "sim", path, "--limit", str(cap_bytes), "--exact-seconds", str(exact_seconds)]
        if slabs(mode) != "auto":
            argv += ["--slabs", slabs(mode)]
        commands.setdefault((mode_name(mode), "optimum"), shell_words({}, [a.replace(bin_dir, "bazel-bin").replace(work, "LOGDIR") for a in argv]))
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, timeout=exact_seconds * 6 + 120)
        except subprocess.TimeoutExpired:
            return None, "sim timed out"
        out = p.stdout
        # A launch that names none of its buffers (a graph whose nodes the
        # log does not list): the optimum would not count them. One through
        # a table written in the same launch names what it was seen to
        # reach, and counts as writing all of it.
        u = re.search(r"launches \([0-9]+ of unknown accesses, ([0-9]+) naming none", out)
        if u and int(u.group(1)) > 0:
            return None, "%s launches naming none of their buffers in the log" % u.group(1)
        m = re.search(r"^serving: (the optimum with serving moves|not proven[^;]*; a schedule with serving moving) ([0-9]+) bytes.*?(?:no schedule below ([0-9.]+) MiB)?;", out, re.M)
        if m:
            best = int(m.group(2)) / MIB
            found.append(best)
            if m.group(1).startswith("the optimum"):
                low.append(best)
            else:
                low.append(float(m.group(3) or 0))
                notes.append("not proven in %d s" % exact_seconds)
            continue
        m = re.search(r"^serving: not computed: (.*)$", out, re.M)
        if m:
            return None, m.group(1)
        last = (out.strip().splitlines() or ["no output"])[-1]
        failures.append("%s at %d %%: optimum: %s" % (mode_name(mode), cap, last))
        return None, "sim: " + re.sub(r"^stensor sim: ", "", last).split(":")[0]
    return ((max(0.0, low[1] - found[0]) / optimum_steps, (found[1] - low[0]) / optimum_steps),
            "; ".join(sorted(set(notes))))


# Phase 1: without the link, uncapped (no stensor) and capped.
def configs_for(link):
    """Every mode's runs; with `link`, those of the modes it has a rate for."""
    out = []
    for mode in active:
        if link is not None and mode not in link:
            continue
        extra = {} if link is None else {"FAKECUDA_LINK": "%.3f" % link[mode]}
        out.append((mode, "uncapped" + ("" if link is None else "-link"), dict(extra)))
        for cap in caps:
            env = dict(capped_env(working_set[mode], cap, mode), **extra)
            out.append((mode, "cap%d%s" % (cap, "" if link is None else "-link"), env))
    return out


res = {}
res.update(measure(configs_for(None), "no link"))

# The link: the working set once in half the uncapped step time.
bandwidth = {}
for mode in active:
    us = step_time(res[(mode, "uncapped")], "%s uncapped" % mode_name(mode))
    if us is None:
        failures.append("%s: no uncapped step time; link runs left out" % mode_name(mode))
        continue
    bandwidth[mode] = working_set[mode] / (0.5 * us) / 1e9
res.update(measure(configs_for(bandwidth), "link"))

opt = {(mode, cap): optimum(mode, cap) for mode in active for cap in caps}


def fmt(value, digits=1, unit=""):
    return "n/a" if value is None else "%.*f%s" % (digits, value, unit)


def goal(mode, cap, ratio, ran):
    """(goal text, met/missed/'')."""
    if mode[1] == "eager":
        limit = {100: 1.1, 50: 1.5, 25: 2.0}.get(cap)
        if limit is None:
            return "", ""
        return "<= %.1f x" % limit, ("n/a" if ratio is None else "met" if ratio <= limit else "MISSED")
    if mode[1] == "step" and cap == 50:
        return "runs", "met" if ran else "MISSED"
    return "", ""


def table(suffix, title):
    print("### " + title)
    print()
    print("| alloc | graphs | cap | step ms | x uncapped | goal | met | served share | moved MiB/step "
          "| optimum MiB/step | x optimum | ctx syncs/step | read-backs/step | checksum, peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in active:
        u = res.get((mode, "uncapped" + suffix))
        if u is None:
            continue
        us = step_time(u, "%s uncapped%s" % (mode_name(mode), suffix))
        want = {}  # the uncapped checksum after N and after 2N steps
        for length in lengths:
            sums = [r["checksum"] for r in u.get(length, []) if r]
            if sums:
                want[length] = sums[0]
        base_syncs, base_reads = per_step(u, "syncs"), per_step(u, "reads")
        print("| %s | %s | none | %s | 1.00 | | | | | | | | | |" % (alloc_column(mode), mode[1], fmt(us and us * 1e3)))
        for cap in caps:
            c = res.get((mode, "cap%d%s" % (cap, suffix)), {})
            done = [(length, r) for length in lengths for r in c.get(length, []) if r]
            cs = step_time(c, "%s at %d %%%s" % (mode_name(mode), cap, suffix))
            ratio = cs / us if cs is not None and us else None
            out, in_, served = per_step(c, "out_mib"), per_step(c, "in_mib"), per_step(c, "served_mib")
            moved = None if out is None or in_ is None else out + in_
            share = None
            if served is not None and in_ is not None:
                share = "0 %" if served + in_ <= 0 else "%.0f %%" % (100 * served / (served + in_))
            o, note = opt[(mode, cap)]
            # Against the optimum with serving: bytes copied and served.
            total = None if moved is None or served is None else moved + served
            if o is None:
                o_text, x_text = "n/a (%s)" % note, "n/a"
            else:
                lo, hi = o
                o_text = (fmt(lo) if abs(hi - lo) < 0.05 else "%s-%s" % (fmt(lo), fmt(hi))) + (
                    " (%s)" % note if note else "")
                if total is None:
                    x_text = "n/a"
                elif hi <= 0:
                    x_text = "n/a (0 / 0)" if total <= 0 else "n/a (optimum 0)"
                elif abs(hi - lo) < 0.05:
                    x_text = "%.2f" % (total / hi)
                else:
                    x_text = "%.2f-%s" % (total / hi, "%.2f" % (total / lo) if lo > 0 else "inf")
            syncs, reads = per_step(c, "syncs"), per_step(c, "reads")
            syncs = None if syncs is None or base_syncs is None else syncs - base_syncs
            reads = None if reads is None or base_reads is None else reads - base_reads
            bad_sum = sum(1 for length, r in done if r["checksum"] != want.get(length))
            cap_bytes = working_set[mode] * cap // 100
            over = sum(1 for length, r in done if r["peak"] is not None and r["peak"] > cap_bytes)
            bigger = [r["ws"] for length, r in done if r["ws"] is not None and r["ws"] != working_set[mode]]
            if bigger:
                failures.append("%s at %d %%%s: working_set %d, the probe's %d" % (
                    mode_name(mode), cap, suffix, bigger[0], working_set[mode]))
            check = "%d/%d ok" % (len(done) - bad_sum, len(done)) if want else "n/a"
            if over:
                check += ", %d over cap" % over
            ran = bool(done) and bad_sum == 0 and len(done) == 2 * runs
            g, met = goal(mode, cap, ratio, ran)
            print("| %s | %s | %d %% | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                alloc_column(mode), mode[1], cap, fmt(cs and cs * 1e3), fmt(ratio, 2), g, met,
                share or "n/a", fmt(moved), o_text, x_text, fmt(syncs), fmt(reads), check))
    print()


print()
print("%d interleaved run(s) of N = %d and 2N = %d steps; step time: the fastest 2N-step run's median "
      "2-step iteration among steps N..2N-1, halved; other figures medians over runs of (2N - N) / N; "
      "the optimum on access logs of M = %d and 2M = %d steps. "
      "MiB = 2^20 bytes. FAKECUDA_VMM_LATENCY_US=h200 in every run." %
      (runs, steps, 2 * steps, optimum_steps, 2 * optimum_steps))
print()
for mode in active:
    # The link is set from the uncapped step without it; against the uncapped
    # step measured with it (noise, load), moving the working set takes:
    ul = step_time(res.get((mode, "uncapped-link"), {}), "%s uncapped-link" % mode_name(mode))
    took = "" if mode not in bandwidth or not ul else (
        " (the working set once: %.2f x the uncapped step measured with the link)" %
        (working_set[mode] / (bandwidth[mode] * 1e9) / ul))
    print("- %s: working set %.1f MiB; FAKECUDA_LINK %s%s" % (
        mode_name(mode), working_set[mode] / MIB,
        "%.3f GB/s" % bandwidth[mode] if mode in bandwidth else "n/a", took))
print()
table("-link", "With FAKECUDA_LINK (the working set once in half the uncapped step)")
table("", "Without the link")
print("Columns: step ms: steady-state step time; x uncapped: against the same mode without stensor "
      "under the same link setting; goal/met: the issue's goal; served share: bytes served through "
      "host mappings / (those + bytes swapped in); moved: swap-outs + swap-ins copied; optimum: the "
      "sim's exact optimum with serving on access logs, copies and served bytes per step (a range where "
      "GLPK did not prove it in time: between its lower bounds and the schedules found); x optimum: moved + "
      "served against it; ctx syncs and read-backs: calls stensor adds per step; "
      "checksum, peak: runs with the uncapped checksum, and runs whose device high-water mark passed the cap.")
print()
print("Commands, each also with %s LD_LIBRARY_PATH=bazel-bin/tests/fakecuda" %
      " ".join("%s=%s" % kv for kv in sorted(base_env.items())))
print("(N|2N: run with --steps N and --steps 2N; caps in bytes of the working set printed by an N-step probe):")
for (name, tag), command in commands.items():
    print("  %-18s %-14s %s" % (name, tag, command))
if failures:
    print()
    print("Failed runs and figures left out:")
    for f in dict.fromkeys(failures):
        print("  " + f)
PY
