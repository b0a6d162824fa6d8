#!/usr/bin/env bash
# `stensor report` on real logs: the recorded uncapped mlp_train --steps 20
# (tools/testdata/mlp20.jsonl.gz) and a capped run recorded here
# (mlp_train --steps 6 under libstensor.so on the fake at a cap of
# 30687232 bytes, where it swaps). For each: the HTML page parses
# (html.parser) and holds an inline <svg> with the resident-bytes polyline
# (and the cap line when capped); the SVG alone parses as XML; the summary's
# figures equal those computed here from the same log by an independent
# reader (swap_out, swap_in with and without copy, drop_clean,
# drop_unwritten: records and bytes; the clean-drop share; swap_wait
# seconds; peak resident bytes from alloc/free/swap records, charged as the
# manager does); the top buffer and top kernel agree; the plot's peak stays
# under the cap line. Kernel names and a log path holding <, > and & are
# escaped; a log of 30000 operations is plotted in at most 2000 buckets;
# truncated, foreign and empty logs fail with one line naming the file and
# the line; bad flags print the usage (exit 2); --help documents every flag.
set -euo pipefail
report() { "$stensor" report "$@"; }
stensor=$1 mlp20=$2 train=$3 fake=$4 lib=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

# The capped log, recorded live under the preload on the fake driver.
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
source "$(dirname "$0")/../tests/preload.bash"
preload=$(preload_of "$lib")
STENSOR_MEMORY_LIMIT=30687232 STENSOR_ACCESS_LOG="$tmp/capped.jsonl" LD_PRELOAD="$preload" \
  "$train" --steps 6 > "$tmp/train.out" 2> "$tmp/train.err" || fail "mlp_train exit $?: $(cat "$tmp/train.err")"
# And with small allocations in slabs (STENSOR_SLABS=on): swap records name
# slabs, and small allocations are charged as their slab.
STENSOR_SLABS=on STENSOR_MEMORY_LIMIT=30687232 STENSOR_ACCESS_LOG="$tmp/slabs.jsonl" \
  LD_PRELOAD="$preload" "$train" --steps 6 > "$tmp/slabs.out" 2> "$tmp/slabs.err" ||
  fail "mlp_train with slabs exit $?: $(cat "$tmp/slabs.err")"
unset LD_LIBRARY_PATH
gzip -dc "$mlp20" > "$tmp/mlp20.jsonl" || fail "$mlp20: cannot decompress"

# check LOG HTML SVG: the outputs against an independent reading of LOG.
check() {
  python3 - "$@" << 'EOF'
import json, re, sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
log, html_path, svg_path, want_cap = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"

def fail(msg):
    sys.exit(f"FAIL: {log}: {msg}")

# The independent reading.
counts = {k: [0, 0] for k in ("swap_out", "swap_in_copy", "swap_in_no_copy", "drop_clean", "drop_unwritten")}
wait = 0.0
waits_by_kernel = {}
pending = 0.0
moved = {}
sizes = {}
charge = {}
resident = {}
cur = peak = 0
G = 2 << 20
in_slabs = set()  # addresses placed in slabs, their `alloc` to come
for line in open(log):
    r = json.loads(line)
    t = r["type"]
    if t == "slab":  # small allocations' slab: one buffer, charged a granule
        charge[r["slab"]] = sizes[r["slab"]] = r["bytes"]
        resident[r["slab"]] = set() if r.get("resident", True) else {0}
        cur += r["bytes"] if r.get("resident", True) else 0
    elif t == "slab_alloc":
        in_slabs.add(r["addr"])
    elif t == "slab_free":
        out = resident.pop(r["slab"])
        cur -= charge[r["slab"]] - sum(min(G, charge[r["slab"]] - p) for p in out)
    elif t == "alloc":
        b = r["bytes"]
        big = r.get("kind", "device") == "device" and "Pitch" not in r.get("api", "") and b >= G
        c = -(-b // G) * G if big else (b if r.get("kind") == "app_vmm" else -(-b // 4096) * 4096)
        if r.get("addr") in in_slabs:
            in_slabs.discard(r["addr"])
            c = 0
        charge[r["id"]] = c
        sizes[r["id"]] = b
        resident[r["id"]] = set()  # of its pieces (a `piece` field), those out
        cur += c
    elif t == "free":
        out = resident.pop(r["id"])
        cur -= charge[r["id"]] - sum(min(G, charge[r["id"]] - p) for p in out)
    elif t in ("swap_out", "drop_clean", "drop_unwritten"):
        counts[t][0] += 1
        counts[t][1] += r["bytes"]
        p = r.get("piece", 0)
        resident[r["id"]].add(p)
        cur -= min(G, charge[r["id"]] - p) if "piece" in r else charge[r["id"]]
        if t == "swap_out":
            moved[r["id"]] = moved.get(r["id"], 0) + r["bytes"]
    elif t == "swap_in":
        k = "swap_in_copy" if r["copy"] else "swap_in_no_copy"
        counts[k][0] += 1
        counts[k][1] += r["bytes"]
        p = r.get("piece", 0)
        resident[r["id"]].discard(p)
        cur += min(G, charge[r["id"]] - p) if "piece" in r else charge[r["id"]]
        if r["copy"]:
            moved[r["id"]] = moved.get(r["id"], 0) + r["bytes"]
    elif t == "swap_wait":
        wait += r["seconds"]
        pending += r["seconds"]
    elif t == "launch":
        if pending:
            waits_by_kernel[r["demangled"]] = waits_by_kernel.get(r["demangled"], 0) + pending
        pending = 0.0
    peak = max(peak, cur)

def mib(b):
    return f"{b / 2**20:.1f} MiB" if b >= 1024 else f"{b} B"

def count_text(c):
    return f"{c[0]} ({mib(c[1]) if c[1] >= 1024 else str(c[1]) + ' B'}, {c[1]} bytes)"

# The page: html.parser collects the summary rows, the tables' cells and
# checks the inline SVG.
class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.row, self.cell, self.tables, self.stack = [], None, None, [], []
        self.svg = self.polyline = self.cap = 0
        self.table = None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg": self.svg += 1
        if tag == "polyline" and a.get("class") == "resident" and len(a.get("points", "").split()) >= 2:
            self.polyline += 1
        if tag == "line" and a.get("class") == "cap": self.cap += 1
        if tag == "table": self.table = a.get("class"); self.tables.append((self.table, []))
        if tag == "tr": self.row = []
        if tag in ("td", "th") and self.row is not None: self.cell = ""
    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(self.cell.strip()); self.cell = None
        if tag == "tr" and self.row is not None:
            self.tables[-1][1].append(self.row); self.row = None
    def handle_data(self, data):
        if self.cell is not None: self.cell += data

text = open(html_path, encoding="utf-8").read()
page = Page()
page.feed(text)
page.close()
if page.svg != 1: fail(f"{page.svg} inline <svg> in the page, expected 1")
if page.polyline < 1: fail("no resident-bytes polyline in the page's svg")
if want_cap and page.cap != 1: fail("no cap line in the page's svg")
if not want_cap and page.cap: fail("a cap line on an uncapped run")
for forbidden in ("<script", "http://", "https://", "@import", "url("):
    if forbidden in text.replace('xmlns="http://www.w3.org/2000/svg"', ""):
        fail(f"the page is not self-contained: it has {forbidden!r}")
tables = dict((k, v) for k, v in page.tables)
summary = {row[0]: row[1:] for row in tables["summary"]}
def expect(label, value):
    got = summary.get(label, ["(missing)"])[0]
    if got != value: fail(f"summary {label!r}: {got!r}, computed {value!r}")
expect("swap_out", count_text(counts["swap_out"]))
expect("swap_in with copy", count_text(counts["swap_in_copy"]))
expect("swap_in without copy", count_text(counts["swap_in_no_copy"]))
expect("drop_clean", count_text(counts["drop_clean"]))
expect("drop_unwritten", count_text(counts["drop_unwritten"]))
ev = counts["swap_out"][0] + counts["drop_clean"][0] + counts["drop_unwritten"][0]
expect("clean-drop share of evictions", f"{100 * counts['drop_clean'][0] / ev:.1f}%" if ev else "-")
# Seconds summed in another order may differ in the last printed digit.
waited = summary["time waited for swaps"][0]
if abs(float(waited.split()[0]) - wait) > 0.0011: fail(f"waited {waited!r}, computed {wait:.3f} s")
got_peak = summary["device 0 peak resident"][0]
if f"({peak} bytes)" not in got_peak: fail(f"peak {got_peak!r}, computed {peak} bytes")
buffers = tables.get("buffers", [])
if moved:
    top = max(moved.items(), key=lambda kv: (kv[1], -kv[0]))
    if buffers[1][0] != str(top[0]) or buffers[1][2] != mib(top[1]):
        fail(f"top buffer {buffers[1][:3]}, computed id {top[0]} moving {mib(top[1])}")
    if buffers[1][1] != mib(sizes[top[0]]): fail(f"top buffer size {buffers[1][1]}")
    if len(buffers) - 1 != min(10, len(moved)): fail(f"{len(buffers) - 1} buffer rows, {len(moved)} moved")
elif buffers:
    fail("buffers listed though nothing moved")
kernels = tables.get("kernels", [])
if waits_by_kernel:
    name, secs = max(waits_by_kernel.items(), key=lambda kv: kv[1])
    if kernels[1][0] != name or abs(float(kernels[1][1].split()[0]) - secs) > 0.0011:
        fail(f"top kernel {kernels[1][:2]}, computed {name!r} {secs:.3f} s")
elif kernels:
    fail("kernels listed though no swap_wait")

# The SVG alone: XML, the same polyline; the plot's highest point is the
# peak and stays on or under the cap line.
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(svg_path).getroot()
lines = root.findall(".//s:polyline[@class='resident']", ns)
if len(lines) != 1: fail(f"{len(lines)} resident polylines in the svg")
ys = [float(p.split(",")[1]) for p in lines[0].get("points").split()]
if len(ys) > 2 * 2000: fail(f"{len(ys)} points: more than 2000 buckets")
caps = root.findall(".//s:line[@class='cap']", ns)
if want_cap:
    if len(caps) != 1: fail("no cap line in the svg")
    if min(ys) < float(caps[0].get("y1")): fail("the resident line goes above the cap")
print(f"ok {log}: peak {peak}, swap_out {counts['swap_out']}, waited {wait:.3f} s, {len(ys) // 2} buckets")
EOF
}

for name in mlp20 capped slabs; do
  report "$tmp/$name.jsonl" -o "$tmp/$name.html" || fail "$name: report exit $?"
  report "$tmp/$name.jsonl" -o "$tmp/$name.svg" || fail "$name: report -o svg exit $?"
  check "$tmp/$name.jsonl" "$tmp/$name.html" "$tmp/$name.svg" $([[ $name == mlp20 ]] && echo 0 || echo 1)
done
grep -q '"type":"swap_out"' "$tmp/capped.jsonl" || fail "the capped run swapped nothing (the check would be empty)"
grep -q '"type":"slab_alloc"' "$tmp/slabs.jsonl" || fail "the run with slabs placed nothing in one"

# Escaping: kernel names with <, > and & (as C++ templates have), and a log
# named with them; a swap_wait before each so they reach the kernel table.
esc="$tmp/a&b <c>.jsonl"
python3 - "$tmp/capped.jsonl" "$esc" << 'EOF'
import json, sys
out = []
n = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "launch" and n < 3:
        out.append(json.dumps({"type": "swap_wait", "what": "stream", "seconds": 5.0 - n}))
        r["demangled"] = ["ns::k<float&, (1<2)>(T<int> const&)", "a&&b", "x</td></tr><script>"][n]
        n += 1
    out.append(json.dumps(r))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
EOF
report "$esc" -o "$tmp/esc.html" || fail "escaping: report exit $?"
report "$esc" -o "$tmp/esc.svg" || fail "escaping: report -o svg exit $?"
python3 - "$tmp/esc.html" "$tmp/esc.svg" << 'EOF'
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
raw = open(sys.argv[1], encoding="utf-8").read()
for bad in ("k<float&", "a&&b", "x</td>", "<script", "a&b <c>"):
    if bad in raw: sys.exit(f"FAIL: {bad!r} is in the page unescaped")
class Cells(HTMLParser):
    cells, cell = [], None
    def handle_starttag(self, tag, attrs):
        if tag == "td": self.cell = ""
    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None: self.cells.append(self.cell); self.cell = None
    def handle_data(self, d):
        if self.cell is not None: self.cell += d
p = Cells()
p.feed(raw)
for name in ("ns::k<float&, (1<2)>(T<int> const&)", "a&&b", "x</td></tr><script>"):
    if name not in p.cells: sys.exit(f"FAIL: kernel {name!r} not in the kernel table as text")
title = ET.parse(sys.argv[2]).getroot().find("{http://www.w3.org/2000/svg}title").text
if "a&b <c>.jsonl" not in title: sys.exit(f"FAIL: the svg's title {title!r} lost the log's name")
print("ok escaping")
EOF

# Downsampling: 30000 operations in at most 2000 buckets (width 16).
python3 - "$tmp/long.jsonl" << 'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"type": "header", "format": 1, "pid": 1, "devices": [{"ordinal": 0, "name": "d", "total_bytes": 1 << 30}], "config": {"STENSOR_MEMORY_LIMIT": "50%"}}) + "\n")
    for i in range(1, 10001):
        f.write(json.dumps({"type": "alloc", "id": i, "addr": hex(i << 24), "bytes": 4 << 20, "device": 0, "kind": "device", "api": "cuMemAlloc_v2"}) + "\n")
        f.write(json.dumps({"type": "swap_out", "id": i, "bytes": 4 << 20, "device": 0}) + "\n")
        f.write(json.dumps({"type": "launch", "kernel": "k", "demangled": "k()", "reads": [], "writes": []}) + "\n")
        f.write(json.dumps({"type": "free", "id": i, "addr": hex(i << 24)}) + "\n")
    f.write(json.dumps({"type": "end", "counts": {}, "live_buffers": 0, "dropped": 0}) + "\n")
EOF
report "$tmp/long.jsonl" -o "$tmp/long.svg" || fail "long log: report exit $?"
python3 - "$tmp/long.svg" << 'EOF'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
pts = root.find(".//{http://www.w3.org/2000/svg}polyline[@class='resident']").get("points").split()
if not 2 * 1000 <= len(pts) <= 2 * 2000: sys.exit(f"FAIL: {len(pts) // 2} buckets for 30000 operations")
cap = root.find(".//{http://www.w3.org/2000/svg}line[@class='cap']")
if cap is None: sys.exit("FAIL: no cap line for STENSOR_MEMORY_LIMIT=50%")
text = "".join(root.itertext())
if "16 operation(s) per bucket" not in text: sys.exit("FAIL: bucket width not 16")
print(f"ok downsampled: {len(pts) // 2} buckets")
EOF

# expect_error STATUS PATTERN ARGS...: the report fails with STATUS and one
# line on stderr matching PATTERN.
expect_error() {
  local want=$1 pattern=$2 rc=0
  shift 2
  report "$@" > "$tmp/err.out" 2> "$tmp/err.txt" || rc=$?
  [[ $rc == "$want" ]] || fail "report $*: exit $rc, expected $want: $(cat "$tmp/err.txt")"
  head -n 1 "$tmp/err.txt" | grep -Eq -- "$pattern" || fail "report $*: said '$(cat "$tmp/err.txt")', expected /$pattern/"
  echo "ok: $(head -n 1 "$tmp/err.txt" | sed "s|$tmp/||g")"
}
lines=$(wc -l < "$tmp/capped.jsonl")
# Cut in the middle of line 100; and cut after whole lines (no `end`).
head -n 99 "$tmp/capped.jsonl" > "$tmp/cut.jsonl"
sed -n 100p "$tmp/capped.jsonl" | head -c 40 >> "$tmp/cut.jsonl"
expect_error 1 "cut\.jsonl: line 100: not a JSON record.*at column 41" "$tmp/cut.jsonl" -o "$tmp/x.html"
head -n $((lines - 1)) "$tmp/capped.jsonl" > "$tmp/noend.jsonl"
expect_error 1 "noend\.jsonl: line $((lines - 1)): .*without its .end. record" "$tmp/noend.jsonl" -o "$tmp/x.html"
report "$tmp/noend.jsonl" -o "$tmp/partial.html" --partial || fail "--partial: exit $?"
grep -q "no <code>end</code> record" "$tmp/partial.html" || fail "--partial: no warning in the page"
echo '{"hello": "world"}' > "$tmp/foreign.jsonl"
expect_error 1 "foreign\.jsonl: line 1: not a stensor access log" "$tmp/foreign.jsonl" -o "$tmp/x.html"
printf 'a,b,c\n1,2,3\n' > "$tmp/foreign.csv"
expect_error 1 "foreign\.csv: line 1: not a stensor access log" "$tmp/foreign.csv" -o "$tmp/x.html"
: > "$tmp/empty.jsonl"
expect_error 1 "empty\.jsonl: line 1: " "$tmp/empty.jsonl" -o "$tmp/x.html"
expect_error 1 "cannot open access log .*missing\.jsonl" "$tmp/missing.jsonl" -o "$tmp/x.html"
expect_error 1 "cannot write .*nodir/x\.html" "$tmp/capped.jsonl" -o "$tmp/nodir/x.html"
[[ ! -e $tmp/x.html ]] || fail "a failed report left $tmp/x.html"

expect_error 2 "no access log given" -o "$tmp/x.html"
grep -q "^usage: stensor report" "$tmp/err.txt" || fail "no usage after a bad flag"
expect_error 2 "-o OUT.html or -o OUT.svg is required" "$tmp/capped.jsonl"
expect_error 2 "unknown flag --bogus" "$tmp/capped.jsonl" -o "$tmp/x.html" --bogus
expect_error 2 "cannot tell the output's kind" "$tmp/capped.jsonl" -o "$tmp/x.txt"
expect_error 2 "--format 'png' is not valid" "$tmp/capped.jsonl" -o "$tmp/x.html" --format png
expect_error 2 "--top '0' is not valid" "$tmp/capped.jsonl" -o "$tmp/x.html" --top 0
expect_error 2 "--granularity '1000' is not valid" "$tmp/capped.jsonl" -o "$tmp/x.html" --granularity 1000
expect_error 2 "-o needs a value" "$tmp/capped.jsonl" -o
cp "$tmp/capped.jsonl" "$tmp/keep.jsonl"
expect_error 2 "-o '.*keep.jsonl' is the log itself" "$tmp/keep.jsonl" -o "$tmp/keep.jsonl" --format html
ln -s keep.jsonl "$tmp/link.html"
expect_error 2 "-o '.*link.html' is the log itself" "$tmp/keep.jsonl" -o "$tmp/link.html"
cmp -s "$tmp/capped.jsonl" "$tmp/keep.jsonl" || fail "a refused -o changed the log"
# Standard input: the same page as from the file, but for its name.
report - -o "$tmp/stdin.html" < "$tmp/mlp20.jsonl" || fail "report - exit $?"
diff <(sed "s|$tmp/mlp20.jsonl|(standard input)|g" "$tmp/mlp20.html") "$tmp/stdin.html" > /dev/null ||
  fail "the page from standard input differs from the page from the file"
report "$tmp/capped.jsonl" -o "$tmp/x.out" --format svg || fail "--format svg: exit $?"
head -c 200 "$tmp/x.out" | grep -q "<svg" || fail "--format svg wrote no svg"
report --help > "$tmp/help.txt" || fail "--help: exit $?"
for word in -o --output --format --top --granularity --partial --help "Exit status"; do
  grep -q -- "$word" "$tmp/help.txt" || fail "--help does not document $word"
done
echo "PASS"
