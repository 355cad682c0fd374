#!/usr/bin/env bash
# A/B of fused row-quantize kernel builds (build_variants.sh rms or silu): runs
# the binaries over a serving engine's row shapes, 2 rounds, in shuffled order,
# so machine drift hits every version.
#   usage: scripts/device/ab_rows.sh OUT rms|silu BINARY...   (writes OUT/ab_TOOL.txt)
# Each line: round, binary, then the binary's report (us a call, TB/s, output
# hash: equal hashes mean equal outputs); a binary that fails leaves a FAILED
# line and the script exits 1 after the loop. Then:
#   python3 scripts/device/ab_summary.py OUT/ab_TOOL.txt --baseline NAME
set -euo pipefail
OUT="${1:?usage: ab_rows.sh OUT rms|silu BINARY...}" TOOL="${2:?give rms or silu}"; shift 2
[ $# -ge 1 ] || { echo "give at least one binary" >&2; exit 2; }
case "$TOOL" in
  # ROWS:HIDDEN[:add] (the residual kernel with add)
  rms) ROWS="1:4096 2048:4096 8192:4096 8192:8192 1:4096:add 2048:4096:add 8192:4096:add 8192:8192:add" ;;
  # ROWS:INTERMEDIATE:dtype (Llama-3.1-8B's 14336; 28672 for 70B)
  silu) ROWS="1:14336:bf16 256:14336:bf16 2048:14336:bf16 4096:14336:bf16 2048:28672:bf16 2048:14336:fp32" ;;
  *) echo "TOOL must be rms or silu, got '$TOOL'" >&2; exit 2 ;;
esac
for round in 1 2; do
  for row in $ROWS; do
    IFS=: read -r -a args <<< "$row"
    for bin in $(shuf -e "$@"); do
      if report=$("$bin" "${args[@]}" 2>&1); then echo "$round $(basename "$bin") $report"
      else echo "FAILED: $round $(basename "$bin") $row (exit $?): $report"; fi
    done
  done
done > "$OUT/ab_$TOOL.txt"
if grep -q '^FAILED' "$OUT/ab_$TOOL.txt"; then grep '^FAILED' "$OUT/ab_$TOOL.txt" >&2; exit 1; fi
