#!/usr/bin/env bash
# core/swap/swap_entry_points.inc against the code: every driver entry point that
# the memory manager and the parts it drives unchecked name (driver_->cuX,
# driver().cuX, d.cuX) is listed, and every listed one is named somewhere
# there. A call added without listing it would crash a program on a driver
# that lacks it instead of running it uncapped with one line saying why.
#   swap_entry_points_test.sh LIST SOURCE...
set -euo pipefail
list=$1
shift
listed=$(sed -n 's/^STENSOR_SWAP_ENTRY(\(cu[A-Za-z0-9_]*\))$/\1/p' "$list" | sort -u)
[[ -n $listed ]] || { echo "FAIL: no entries in $list" >&2; exit 1; }
# Comments are dropped first: they may name entry points they do not call.
called=$(sed -e 's://.*$::' "$@" | grep -oE '(->|\.)cu[A-Z][A-Za-z0-9_]*' | sed -E 's/^(->|\.)//' | sort -u)
missing=$(comm -13 <(echo "$listed") <(echo "$called"))
unused=$(comm -23 <(echo "$listed") <(echo "$called"))
status=0
if [[ -n $missing ]]; then
  echo "FAIL: called but not in $(basename "$list"): $(echo $missing)" >&2
  status=1
fi
if [[ -n $unused ]]; then
  echo "FAIL: in $(basename "$list") but called nowhere: $(echo $unused)" >&2
  status=1
fi
(( status == 0 )) && echo "PASS: $(echo "$listed" | wc -l) entry points, each called and listed"
exit $status
