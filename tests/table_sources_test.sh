#!/usr/bin/env bash
# Pointer tables whose host source is written in stream order after the
# upload was submitted (tests/table_sources.cc): by a host function, by a
# kernel through device-mapped pinned memory (its address a parameter, or
# read from a device table), by an asynchronous
# device-to-host copy, and by a graph's host node; and a graph launched on a
# busy stream whose source the host wrote before (it must not count as
# unknown: every cap works without host-located VMM). Each form on a
# non-blocking, a blocking and the legacy stream, at 100, 60 and 40 % of the
# working set and the smallest cap, every policy, host-located VMM on and
# off, and from registered memory or by cuMemcpyAsync, prints the checksum
# of the run without stensor; a source the host wrote before the upload is
# learnt without a wait for the busy stream; short runs repeat 20
# times at the smallest cap to catch races. A graph whose host node writes a
# table's source cannot be read before it runs: without host-located VMM
# every buffer it could reach must then be resident, so below that it is a
# clean out-of-memory error, never a wrong result.
set -euo pipefail
program=$1 fake=$2 stensor=$3 kernels=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")

# Eight targets of one granule each, and four buffers charged a 4 KiB page
# each: the whole set resident, and the most one launch needs.
all=$((8 * 2 * 1048576 + 4 * 4096))
smallest=$((2 * 1048576 + 4 * 4096))

"$program" "$kernels" --source hostfunc > "$tmp/plain.txt"
want=$(tail -n 1 "$tmp/plain.txt")
"$program" "$kernels" --source hostfunc --steps 6 > "$tmp/short.txt"
want_short=$(tail -n 1 "$tmp/short.txt")
for source in kernel escaped dtoh graph hostgraph; do
  [[ $("$program" "$kernels" --source $source | tail -n 1) == "$want" ]] ||
    fail "$source: the run without stensor differs from hostfunc's"
done

run() {  # NAME CAP HOST_VMM POLICY WANT ARGS...
  local name=$1 cap=$2 vmm=$3 policy=$4 expect=$5
  shift 5
  FAKECUDA_HOST_VMM=$vmm FAKECUDA_REPORT_PEAK=1 STENSOR_POLICY=$policy STENSOR_STATS=1 \
    STENSOR_MEMORY_LIMIT=$cap LD_PRELOAD="$preload" "$program" "$kernels" "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { tail -n 20 "$tmp/$name.err" >&2; fail "$name: table_sources failed"; }
  [[ $(tail -n 1 "$tmp/$name.out") == "$expect" ]] ||
    fail "$name: $(tail -n 1 "$tmp/$name.out"), want $expect"
  local peak
  peak=$(sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/$name.err")
  (( peak <= cap )) || fail "$name: device high-water mark $peak above the cap $cap"
}

# The policy decides what goes, not what a table reaches: each case takes
# the next of the three in turn, so every policy meets every source, stream
# and cap across the matrix without running it three times over.
policies=(version belady lru)
turn=0
for vmm in 1 0; do
  for source in hostfunc kernel dtoh graph hostgraph; do
    for stream in nonblocking blocking legacy; do
      [[ $source == *graph && $stream == legacy ]] && continue  # no capture there
      for cap in $all $((all * 60 / 100)) $((all * 40 / 100)) $smallest; do
        policy=${policies[turn++ % 3]}
        name="$source-$stream-$policy-$cap-$vmm"
        if [[ $source == graph && $vmm == 0 ]] && (( cap < all )); then
          if FAKECUDA_HOST_VMM=0 STENSOR_POLICY=$policy STENSOR_MEMORY_LIMIT=$cap \
              LD_PRELOAD="$preload" "$program" "$kernels" --source graph --stream $stream \
              > "$tmp/$name.out" 2> "$tmp/$name.err"; then
            [[ $(tail -n 1 "$tmp/$name.out") == "$want" ]] || fail "$name: wrong result"
          else
            grep -q "cuGraphLaunch(exec, s) failed: CUDA_ERROR_OUT_OF_MEMORY" "$tmp/$name.err" ||
              { cat "$tmp/$name.err" >&2; fail "$name: expected a clean out-of-memory error"; }
          fi
          continue
        fi
        run "$name" $cap $vmm $policy "$want" --source $source --stream $stream
      done
    done
  done
done

# A source nothing queued writes (the host stored it before the upload), on
# a busy stream: learnt at once, with no wait for the stream. stensor's own
# calls (the link probe) are a few, whatever the steps; a wait per upload
# would be 64 more.
want_long=$("$program" "$kernels" --source hostfunc --steps 64 | tail -n 1)
for vmm in 1 0; do
  for stream in nonblocking blocking legacy; do
    for form in "--memory pinned --copy htod" "--memory registered --copy unified"; do
      cap=$((all * 40 / 100))
      [[ $form == *registered* ]] && cap=$all
      name="host-$stream-$cap-$vmm-${form//[ -]/}"
      FAKECUDA_REPORT_CALLS=cuStreamSynchronize run "$name" $cap $vmm belady "$want_long" \
        --source host --steps 64 --stream $stream $form
      syncs=$(sed -n 's/^fakecuda: calls cuStreamSynchronize //p' "$tmp/$name.err")
      [[ -n $syncs ]] || fail "$name: no call count"
      (( syncs < 32 )) || fail "$name: $syncs stream synchronisations for 64 uploads"
    done
  done
done

# A kernel that writes the source through an address it reads from a device
# table: the address reached the device in an upload, so every kernel may
# write pinned memory from then on.
for vmm in 1 0; do
  for stream in nonblocking blocking legacy; do
    run "escaped-$stream-$vmm" $smallest $vmm belady "$want" --source escaped --stream $stream
  done
done

# The source in registered memory, and the upload by cuMemcpyAsync.
for vmm in 1 0; do
  for source in hostfunc kernel dtoh; do
    for cap in $((all * 40 / 100)) $smallest; do
      run "registered-$source-$cap-$vmm" $cap $vmm belady "$want" --source $source --memory registered
      run "unified-$source-$cap-$vmm" $cap $vmm version "$want" --source $source --copy unified
    done
  done
done

# The calls stensor makes to tell whether a source is settled and to wait
# for it (stream queries and flags, the stream wait, the pointer query),
# failed at their early occurrences: the table is then read back or counted
# unknown, never guessed; the program never calls them itself here.
for fn in cuStreamQuery cuStreamGetFlags cuStreamSynchronize cuPointerGetAttribute; do
  for n in 1 2 3 5; do
    for vmm in 1 0; do
      FAKECUDA_FAIL=$fn:$n run "fail-$fn-$n-$vmm" $smallest $vmm belady "$want_short" \
        --source hostfunc --steps 6 --stream blocking
    done
  done
done
# The events that mark a pending write into the source (after the
# device-to-host copy) failed: that write counts as pending for good, and
# the uploads over it wait as before.
want_dtoh=$("$program" "$kernels" --source dtoh --steps 6 | tail -n 1)
for fn in cuEventCreate cuEventRecord; do
  for n in 1 2 5; do
    FAKECUDA_FAIL=$fn:$n run "fail-$fn-$n" $smallest 1 belady "$want_dtoh" --source dtoh --steps 6
  done
done

# Races: 20 short runs per form at the smallest cap, two at a time.
for source in hostfunc kernel escaped dtoh graph; do
  vmm=0
  [[ $source == graph ]] && vmm=1
  for i in $(seq 1 10); do
    run "race-$source-$i-a" $smallest $vmm belady "$want_short" --source $source --steps 6 &
    run "race-$source-$i-b" $smallest 1 version "$want_short" --source $source --steps 6 \
      --stream blocking &
    wait -n && wait -n || fail "race run failed (see above)"
  done
done
echo "PASS: tables learnt from what their uploads copied, under every cap, policy and stream"
