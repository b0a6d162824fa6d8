#!/usr/bin/env bash
# A program that frees its buffers while their work is still queued and
# never synchronises (tests/free_backlog.cc), 10,000 iterations of each loop
# under libstensor.so: memsets freed with cuMemFree, kernel fills copied out
# asynchronously and freed with cuMemFreeAsync; "uncapped" (a cap of the
# whole device) with one 2 MiB buffer alive, and under a 1 GiB cap with four
# (an 8 MiB working set). The fake's streams run behind the program, so
# pending frees pile up unless their memory is reused in stream order. The
# fake device has 2 GiB, so that a library that keeps creating memory stops
# there (the runs need 8 MiB). Each run must
#   - read back every iteration's own value (no memory reused under work);
#   - create at most twice the working set's chunks (cuMemCreate);
#   - keep the process's mappings and resident memory flat;
#   - cost as many event queries per iteration in its last 1,000 iterations
#     as in its first (no scan of the backlog), and take no more than a
#     generous multiple of their time.
#
#   free_backlog_test.sh FREE_BACKLOG FAKE_LIBCUDA LIBSTENSOR KERNELS
set -euo pipefail
prog=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

iterations=10000
# run NAME MODE LIVE CAP: the program under stensor, its block lines checked.
run() {
  local name=$1 mode=$2 live=$3 cap=$4
  timeout 300 env LD_PRELOAD="$preload" STENSOR_MEMORY_LIMIT="$cap" STENSOR_STATS=1 \
    FAKECUDA_DEVICE_MEMORY=2GiB "$prog" "$mode" $iterations "$live" "$kernels" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.out" "$tmp/$name.err" >&2; fail "$name: exit status"; }
  grep -qx ok "$tmp/$name.out" || fail "$name: $(grep bad "$tmp/$name.out")"
  # block B seconds S maps M rss R creates C queries Q
  awk -v name="$name" -v live="$live" '
    $1 == "block" {
      n++; secs[n] = $4; maps[n] = $6; rss[n] = $8; creates += $10; queries[n] = $12
      if ($6 > max_maps) max_maps = $6
      if ($8 > max_rss) max_rss = $8
    }
    END {
      printf "%s: %d blocks, chunks created %d, mappings %d -> %d (max %d), rss %.1f -> %.1f MiB, " \
             "event queries per iteration %.1f -> %.1f, seconds per 1,000 %.4f -> %.4f\n",
             name, n, creates, maps[1], maps[n], max_maps, rss[1] / 1048576, rss[n] / 1048576,
             queries[1] / 1000, queries[n] / 1000, secs[1], secs[n]
      bad = 0
      if (n != 10) { print name ": want 10 blocks"; bad = 1 }
      if (creates > 2 * live) { print name ": more chunks created than twice the working set"; bad = 1 }
      if (max_maps > maps[1] + 32) { print name ": the mappings grew"; bad = 1 }
      if (max_rss > rss[1] + 64 * 1048576) { print name ": resident memory grew by more than 64 MiB"; bad = 1 }
      if (queries[n] > 2 * queries[1] + 1000) { print name ": event queries per iteration grew"; bad = 1 }
      if (secs[n] > 4 * secs[1] + 0.25) { print name ": the last 1,000 iterations took over 4x the first"; bad = 1 }
      exit bad
    }' "$tmp/$name.out" || fail "$name (output in $tmp/$name.out)"
}

run memset-uncapped memset 1 100%
run kernel-uncapped kernel 1 100%
run memset-1GiB memset 4 1GiB
run kernel-1GiB kernel 4 1GiB
echo PASS
