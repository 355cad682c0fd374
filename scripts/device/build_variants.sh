#!/usr/bin/env bash
# Builds one of the standalone timing tools here (nvcc only: no GPU, no torch)
# once per version of the kernel file it includes, for a same-process A/B on
# the device: carry OUTDIR with the call and run the binaries there in
# shuffled order (ab_decode.sh, or a loop like it), then ab_summary.py.
#
#   usage: scripts/device/build_variants.sh TOOL OUTDIR NAME=VERSION ...
#   TOOL     rms | silu | decode | amax | chain (quant_state/chain_ab.cu: the per-tensor
#            chain through its public entry points, linked with the version's sources)
#   VERSION  tree (the working tree as it is), a git revision, or REV+PATCH
#            (PATCH applied to REV, e.g. HEAD+bench/wip/packed-amax.patch)
#
# Each version other than the tree is checked out into a temporary git
# worktree, so its kernel file includes its own headers (quant_common.cuh,
# row_quantize.cuh, ...) rather than the tree's. The tool's own source
# (its argument parsing, timing and output hash) is always the tree's, so a
# version must still provide what the tool calls. No copies are left in
# csrc/ (the extension's CMake build globs csrc/quant/*.cu).
set -euo pipefail
TOOL="${1:?usage: build_variants.sh TOOL OUTDIR NAME=VERSION ...}"
OUT="${2:?usage: build_variants.sh TOOL OUTDIR NAME=VERSION ...}"
shift 2
[ $# -ge 1 ] || { echo "give at least one NAME=VERSION" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
EXTRA=()
case "$TOOL" in
  rms) SRC=scripts/device/rms_timeline.cu MACRO=RMS_SOURCE KERNEL=csrc/quant/rms_norm_quantize.cu ;;
  silu) SRC=scripts/device/silu_timeline.cu MACRO=SILU_SOURCE KERNEL=csrc/quant/silu_mul_quantize.cu ;;
  decode) SRC=scripts/device/decode_timeline.cu MACRO=DECODE_SOURCE KERNEL=csrc/attention/paged_decode.cu ;;
  amax) SRC=scripts/device/quant_state/amax_ceiling.cu MACRO=QPT_SOURCE KERNEL=csrc/quant/quantize_per_tensor.cu
        EXTRA=(csrc/quant/quantize_per_tensor_kept.cu csrc/quant/quantize_per_tensor_small.cu) ;;
  chain) SRC=scripts/device/quant_state/chain_ab.cu MACRO="" KERNEL=""
         EXTRA=(csrc/quant/quantize_per_tensor.cu csrc/quant/quantize_per_tensor_kept.cu
                csrc/quant/quantize_per_tensor_small.cu) ;;
  *) echo "TOOL must be rms, silu, decode, amax or chain, got '$TOOL'" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
WORK="$(mktemp -d)"
cleanup() {
  for wt in "$WORK"/*/; do
    if [ -d "$wt" ]; then git -C "$ROOT" worktree remove --force "$wt" >/dev/null 2>&1 || true; fi
  done
  rm -rf "$WORK"
  git -C "$ROOT" worktree prune || true
}
trap cleanup EXIT

for spec in "$@"; do
  name="${spec%%=*}" version="${spec#*=}"
  [ -n "$name" ] && [ "$name" != "$spec" ] || { echo "expected NAME=VERSION, got '$spec'" >&2; exit 2; }
  if [ "$version" = tree ]; then
    base="$ROOT"
  else
    base="$WORK/$name"
    git -C "$ROOT" worktree add --detach --quiet "$base" "${version%%+*}"
    if [[ "$version" == *+* ]]; then git -C "$base" apply "$ROOT/${version#*+}"; fi
  fi
  extra=()
  for f in "${EXTRA[@]}"; do extra+=("$base/$f"); done
  [ -z "$MACRO" ] || extra+=(-D"$MACRO=\"$base/$KERNEL\"")
  echo "== $name ($version)"
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DFP8EXT_WITH_SM90=1 \
    -I"$base/csrc/include" -I"$base/csrc" "$ROOT/$SRC" "${extra[@]}" \
    -o "$OUT/$name"
done
