#!/usr/bin/env bash
# The page renders: Debian's chromium, headless, screenshots the report of a
# capped mlp_train run (tools/testdata/mlp6_cap30.jsonl.gz, recorded on the
# fake at a cap of 30687232 bytes) at 1200x900, and the PNG (decoded here
# with zlib) shows the plot: enough pixels of the resident line's color, of
# the cap line's and of the swap-out bars', and the plot region is not blank.
# Without chromium the test fails (scripts/setup.sh installs it): a picture
# nobody looked at is not a pass.
set -euo pipefail
report() { "$stensor" report "$@"; }
stensor=$1 log=$2
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

chromium=$(command -v chromium || command -v chromium-browser || true)
[[ -n $chromium ]] ||
  fail "chromium is not installed (PATH=$PATH): run scripts/setup.sh, or apt-get install --no-install-recommends chromium"

gzip -dc "$log" > "$tmp/run.jsonl" || fail "$log: cannot decompress"
report "$tmp/run.jsonl" -o "$tmp/report.html" || fail "report exit $?"

# chromium wants a writable home and profile; its own sandbox needs user
# namespaces the test sandbox may not grant (--no-sandbox: the page is ours
# and has no script).
export HOME=$tmp/home
mkdir -p "$HOME"
start=$SECONDS
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
  --user-data-dir="$tmp/profile" --hide-scrollbars --window-size=1200,900 \
  --screenshot="$tmp/shot.png" "file://$tmp/report.html" > "$tmp/chromium.log" 2>&1 ||
  fail "chromium exit $?: $(tail -n 5 "$tmp/chromium.log")"
[[ -s $tmp/shot.png ]] || fail "chromium wrote no screenshot: $(tail -n 5 "$tmp/chromium.log")"
echo "chromium took $((SECONDS - start)) s"

python3 - "$tmp/shot.png" << 'EOF'
import struct, sys, zlib

def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("FAIL: the screenshot is not a PNG")
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    w, h, depth, ctype, _, _, interlace = head
    if depth != 8 or ctype not in (2, 6) or interlace:
        sys.exit(f"FAIL: unexpected PNG layout: depth {depth}, color type {ctype}, interlace {interlace}")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows

w, h, bpp, rows = decode(sys.argv[1])
if (w, h) != (1200, 900):
    sys.exit(f"FAIL: screenshot is {w}x{h}, asked 1200x900")

def near(px, color, tol=24):
    return all(abs(px[i] - color[i]) <= tol for i in range(3))

colors = {"resident line": (0x1f, 0x77, 0xb4), "cap line": (0xd6, 0x27, 0x28),
          "swap-out bars": (0xff, 0x7f, 0x0e)}
found = dict.fromkeys(colors, 0)
nonwhite_plot = 0
for y in range(h):
    line = rows[y]
    for x in range(w):
        px = line[x * bpp:x * bpp + 3]
        for name, color in colors.items():
            if near(px, color):
                found[name] += 1
        # The plot sits in the lower half of the first screen (under the
        # headline): count what is drawn there.
        if y >= 300 and min(px) < 235:
            nonwhite_plot += 1
print(f"pixels: {found}, non-white in the lower part: {nonwhite_plot}")
need = {"resident line": 500, "cap line": 300, "swap-out bars": 100}
for name, n in need.items():
    if found[name] < n:
        sys.exit(f"FAIL: {found[name]} pixels of the {name}'s color, expected at least {n}")
if nonwhite_plot < 50000:
    sys.exit(f"FAIL: the plot region is nearly blank ({nonwhite_plot} non-white pixels)")
print("ok: the plot is drawn")
EOF
echo "PASS"
