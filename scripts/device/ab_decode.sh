#!/usr/bin/env bash
# A/B of decode kernel builds: runs decode_timeline binaries
# (scripts/device/decode_timeline.cu built without stamps, one per kernel
# version via -DDECODE_SOURCE) over the suite's five decode rows and page sizes
# 16 and 64, 2 rounds, in shuffled order, so machine drift hits every version.
#   usage: scripts/device/ab_decode.sh OUT BINARY...   (writes OUT/ab_decode.txt)
# Each line: round, binary, batch, context, splits, page, then the binary's
# report (us a call, TB/s, output hash: equal hashes mean equal outputs).
set -euo pipefail
OUT="${1:?usage: ab_decode.sh OUT BINARY...}"; shift
[ $# -ge 1 ] || { echo "give at least one binary" >&2; exit 2; }
ROWS="1:32768:33 1:131072:33 8:32768:6 64:4096:3 256:1024:1"  # batch:context:splits (plan_splits's choice)
for round in 1 2; do
  for page in 16 64; do
    for row in $ROWS; do
      IFS=: read -r b c s <<< "$row"
      for bin in $(shuf -e "$@"); do
        echo "$round $(basename "$bin") $b $c $s $page $("$bin" "$b" "$c" "$s" "$page")"
      done
    done
  done
done > "$OUT/ab_decode.txt" 2>&1
