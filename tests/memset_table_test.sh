#!/usr/bin/env bash
# A host-built pointer table of 64 entries cleared by a memset, then reached
# through a pointer-to-pointer parameter (tests/memset_table.cc), under a
# cap that never binds, with an access log:
# - cuMemsetD2D8 whose rows leave no gaps is a cuMemsetD8 of the same bytes:
#   the same table read-back and the same launch (every byte of its extent
#   is set, so the table is cleared exactly);
# - one whose rows leave gaps leaves the last entry of each of its 4 rows:
#   the read-back finds those 4 and the launch reaches the buffer they point
#   into (nothing is taken as cleared that was not).
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
tmp=${TEST_TMPDIR:-$(mktemp -d)}

run() {  # MODE: prints the run's table read-backs and launches, addresses out
  rm -f "$tmp/$1.jsonl"
  STENSOR_BANDWIDTH=16 STENSOR_MEMORY_LIMIT=64MiB STENSOR_ACCESS_LOG=$tmp/$1.jsonl \
    LD_PRELOAD=$preload "$program" "$kernels" --memset "$1" > "$tmp/$1.out" 2> "$tmp/$1.err" ||
    { cat "$tmp/$1.err" >&2; fail "$1: the program failed"; }
  [[ $(cat "$tmp/$1.out") == ok ]] || fail "$1: no ok line"
  grep -E '"type":"(table_read_back|launch)"' "$tmp/$1.jsonl" | sed -E 's/0x[0-9a-f]+/ADDR/g'
}

d8=$(run d8)
rows=$(run rows)
gapped=$(run gapped)
printf 'd8:\n%s\nrows:\n%s\ngapped:\n%s\n' "$d8" "$rows" "$gapped"
[[ -n $d8 ]] || fail "d8: no launch logged"
[[ $rows == "$d8" ]] || fail "a 2D memset without gaps was not taken as clearing the table as cuMemsetD8 does"
grep -q '"type":"table_read_back".*"entries":4' <<< "$gapped" ||
  fail "a 2D memset with gaps: the 4 entries it left were not read back"
grep -q '"type":"launch".*"reads":\[3,2,1\]' <<< "$gapped" ||
  fail "a 2D memset with gaps: the launch does not reach the buffer the entries left point into"
echo "PASS"
