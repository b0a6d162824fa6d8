#!/usr/bin/env bash
# The profiled iteration, belady and prefetch, on the fake driver: mlp_train
# and transformer_train print their uncapped checksums under caps with
# STENSOR_PREFETCH on and off, under every policy, with host-located VMM on
# and off, with the fake's time model on and at the smallest cap; the
# iteration is found and profiled; on mlp_train prefetch leaves at least
# 80 % fewer on-demand swap-ins once profiled than swapping on demand, and
# never moves more bytes than it (but for a fetch or so at the end); on
# transformer_train buffers are fetched ahead of their use and used, with
# fewer on-demand swap-ins than without, and at 75 % on a slow link too,
# where the room the planner counts is freed buffers' memory.
set -euo pipefail
train=$1 fake=$2 stensor=$3 transformer=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
export LD_LIBRARY_PATH=$(cd "$(dirname "$fake")" && pwd)
stensor=$(cd "$(dirname "$stensor")" && pwd)/$(basename "$stensor")
source "$(dirname "$0")/preload.bash"
preload=$(preload_of "$stensor")
steps=16

"$train" --steps $steps > "$tmp/plain.txt"
want=$(tail -n 1 "$tmp/plain.txt")
ws=$(head -n 1 "$tmp/plain.txt" | cut -d' ' -f2)

run() {  # run NAME PROGRAM WANT CAP PREFETCH POLICY [VAR=value...]: stats in NAME.err
  local name=$1 program=$2 expect=$3 cap=$4 prefetch=$5 policy=$6
  shift 6
  env "$@" FAKECUDA_REPORT_PEAK=1 STENSOR_POLICY=$policy STENSOR_PREFETCH=$prefetch STENSOR_STATS=1 \
    STENSOR_MEMORY_LIMIT=$cap LD_PRELOAD="$preload" $program > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.err" >&2; fail "$name: $program failed"; }
  [[ $(tail -n 1 "$tmp/$name.out") == "$expect" ]] ||
    fail "$name: $(tail -n 1 "$tmp/$name.out"), want $expect"
  local peak
  peak=$(sed -n 's/^fakecuda: device 0 peak \([0-9]*\) bytes$/\1/p' "$tmp/$name.err")
  (( peak <= cap )) || fail "$name: device high-water mark $peak above the cap $cap"
}
stat() { sed -n "s/^stensor: $2 *\([0-9]*\).*/\1/p" "$tmp/$1.err"; }

for policy in version belady lru; do
  for prefetch in on off; do
    run "$policy-$prefetch" "$train --steps $steps" "$want" $((ws * 40 / 100)) $prefetch $policy
  done
done
run belady-on-novmm "$train --steps $steps" "$want" $((ws * 40 / 100)) on belady FAKECUDA_HOST_VMM=0
run belady-on-link "$train --steps $steps" "$want" $((ws * 50 / 100)) on belady FAKECUDA_LINK=20
run belady-on-smallest "$train --steps $steps" "$want" 14000000 on belady

period=$(stat belady-on "profiled iteration")
[[ -n $period ]] && (( period > 0 )) || fail "no iteration profiled: $(grep 'stensor: profiled' "$tmp/belady-on.err")"
# Bytes brought to the device's operations: swap-ins copied plus bytes served
# from host (under belady a buffer needed after the one its room would
# displace is served rather than fetched: either way it crosses the link).
mib_in() { awk -v c="$(sed -n 's/^stensor: swap-ins copied *[0-9]* (\([0-9.]*\) MiB.*/\1/p' "$tmp/$1.err")" \
  -v s="$(sed -n 's/^stensor: served from host *[0-9]* (\([0-9.]*\) MiB.*/\1/p' "$tmp/$1.err")" \
  'BEGIN { print c + s }'; }
# Prefetch pays off: once the iteration is profiled (from the third
# iteration or so on), at least 80 % fewer swap-ins wait on demand than
# without prefetch (belady keeps the planner, and so the count, either way).
on=$(stat belady-on "on-demand after profile") off=$(stat belady-off "on-demand after profile")
echo "mlp_train at 40 %: on-demand swap-ins once profiled: $off with prefetch off, $on with it on"
[[ -n $on && -n $off ]] && (( off > 0 )) || fail "no on-demand counts: on '$on', off '$off'"
(( on * 5 <= off )) || fail "prefetch on left $on on-demand swap-ins, off $off: not 80 % fewer"
# The planner's evictions are issued now, and counted.
planned=$(stat belady-on "planned evictions")
[[ -n $planned ]] && (( planned > 0 )) || fail "no planned eviction issued: $(grep 'planned evictions' "$tmp/belady-on.err")"
grep -q '^stensor: planner cost' "$tmp/belady-on.err" || fail "no planner cost line"
for policy in version belady; do
  on=$(mib_in "$policy-on") off=$(mib_in "$policy-off")
  echo "$policy at 40 %: $off MiB in with prefetch off, $on MiB with it on"
  awk -v on="$on" -v off="$off" 'BEGIN { exit !(on <= off * 1.05 + 4) }' ||
    fail "$policy: prefetch on moved $on MiB in, off $off MiB"
done

"$transformer" --steps 6 > "$tmp/tplain.txt"
twant=$(tail -n 1 "$tmp/tplain.txt")
tws=$(head -n 1 "$tmp/tplain.txt" | cut -d' ' -f2)
for prefetch in on off; do
  run "transformer-$prefetch" "$transformer --steps 6" "$twant" $((tws * 50 / 100)) $prefetch belady
done
used=$(sed -n 's/^stensor: prefetches *[0-9]* issued (\([0-9]*\) used.*/\1/p' "$tmp/transformer-on.err")
(( used > 0 )) || fail "transformer: no prefetched buffer was used: $(grep prefetches "$tmp/transformer-on.err")"
on=$(stat transformer-on "on-demand after profile") off=$(stat transformer-off "on-demand after profile")
echo "transformer at 50 %: $used prefetches used; on-demand swap-ins once profiled: $off off, $on on"
(( on < off )) || fail "transformer: prefetch on left $on on-demand swap-ins, off $off"
# What the planner fetches follows the compute times it profiled, which a
# loaded machine stretches: with two runs of this test at a time, 1 in 6
# moved 1.23x or 1.31x (210.9 MiB against 171.9, 173.9 against 132.8),
# alone never over 1.02x; so the bound is 1.35x, and a miss is run once
# more.
on=$(mib_in transformer-on) off=$(mib_in transformer-off)
if ! awk -v on="$on" -v off="$off" 'BEGIN { exit !(on <= off * 1.35 + 4) }'; then
  run transformer-on "$transformer --steps 6" "$twant" $((tws * 50 / 100)) on belady
  on=$(mib_in transformer-on)
  awk -v on="$on" -v off="$off" 'BEGIN { exit !(on <= off * 1.35 + 4) }' ||
    fail "transformer: prefetch on moved $on MiB in, off $off MiB (twice)"
fi

# Bytes moved both ways, prefetch on against off, where the planner used to
# evict for fetches that on demand placed into pooled or freed memory:
# mlp_train --hidden 2048 at 50 % under belady (1272-1384 MiB on, 888 off;
# its largest buffer is 16 MiB) and transformer_train at 75 % under version
# (222.6 MiB on, 206.2 off; 4 MiB). With allocations in pieces the wide
# case spreads from run to run, timing-dependent: 500-592 MiB on against
# 504-524 off in 8 sequential runs (up to 1.15x), so its bound is 1.2x, far
# below the 1.45x of that bug, and a miss is run once more.
moved() { awk -v o="$(sed -n 's/^stensor: swap-outs copied *[0-9]* (\([0-9.]*\) MiB.*/\1/p' "$tmp/$1.err")" \
  -v i="$(mib_in "$1")" 'BEGIN { print o + i }'; }
"$train" --hidden 2048 --steps 12 > "$tmp/wplain.txt"
wwant=$(tail -n 1 "$tmp/wplain.txt")
wws=$(head -n 1 "$tmp/wplain.txt" | cut -d' ' -f2)
"$transformer" --steps 8 > "$tmp/t8plain.txt"
t8want=$(tail -n 1 "$tmp/t8plain.txt")
for prefetch in on off; do
  run "wide-$prefetch" "$train --hidden 2048 --steps 12" "$wwant" $((wws * 50 / 100)) $prefetch belady
  run "t8-$prefetch" "$transformer --steps 8" "$t8want" $((tws * 75 / 100)) $prefetch version
done
within() { awk -v on="$1" -v off="$2" -v f="$3" -v b="$4" 'BEGIN { exit !(off > 0 && on <= off * f + b) }'; }
for pair in wide:16:1.2 t8:4:1.05; do
  IFS=: read -r name largest factor <<< "$pair"
  on=$(moved "$name-on") off=$(moved "$name-off")
  echo "$name: $off MiB moved with prefetch off, $on MiB with it on"
  if ! within "$on" "$off" "$factor" "$largest"; then
    if [[ $name == wide ]]; then
      run wide-on "$train --hidden 2048 --steps 12" "$wwant" $((wws * 50 / 100)) on belady
    else
      run t8-on "$transformer --steps 8" "$t8want" $((tws * 75 / 100)) on version
    fi
    on=$(moved "$name-on")
    within "$on" "$off" "$factor" "$largest" ||
      fail "$name: prefetch on moved $on MiB, off $off MiB (twice)"
  fi
done

# Fetches go into the memory of freed buffers whose work is still queued
# (handed on in stream order, as an on-demand swap-in takes it): at 75 % on
# a slow link the transformer's frees keep the room the planner counts in
# that state, and before, every fetch it proposed was refused (0 issued, 50-61
# not now, in 4 runs of 4; now 2 issued and used in each).
run t75-link "$transformer --steps 6" "$twant" $((tws * 75 / 100)) on belady FAKECUDA_LINK=0.5
used=$(sed -n 's/^stensor: prefetches *[0-9]* issued (\([0-9]*\) used.*/\1/p' "$tmp/t75-link.err")
(( used > 0 )) || fail "transformer at 75 % on a slow link: no fetch used: $(grep prefetches "$tmp/t75-link.err")"
echo PASS
