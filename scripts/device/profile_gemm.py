"""Runs fp8ext.scaled_mm and cuBLAS (torch._scaled_mm) on large shapes (per-tensor
scales, or row-wise with --row-wise), for `ncu` to profile side by side
(bench_gemm's operands; the kernels under ncu are ours, cutlass::device_kernel,
and cuBLASLt's nvjet):

    ncu -k regex:"device_kernel|nvjet" --launch-skip 2 ... python3 scripts/device/profile_gemm.py --shapes 16384x4096x4096

Each shape runs three calls of ours, then three of cuBLAS: with one shape per
run, --launch-skip 2 --launch-count 4 profiles our third call and cuBLAS's
three (session 24: bench/results/gemm_ncu_vs_cublas_2026-12-04_h200_27987d3.json).
--config forces our tile configuration, --fast-accum sets use_fast_accum on
both, and --only-cublas runs cuBLAS's calls alone, without the extension (so
without a build: session 25 read cuBLAS's SASS with ncu's source counters that
way, bench/NOTES.md), with either kind of scales (cuBLAS's row-wise fast kernel
is the one faster than its per-tensor at 16384x28672x4096: session 27)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import gemm_scales  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", nargs="+", default=["16384x4096x4096"], help="MxNxK")
ap.add_argument("--row-wise", action="store_true")
ap.add_argument("--config", default="auto", help="our tile configuration (scaled_mm's config)")
ap.add_argument("--fast-accum", action="store_true", help="use_fast_accum=True on both sides")
ap.add_argument("--only-cublas", action="store_true", help="cuBLAS's calls only (no fp8ext build needed)")
args = ap.parse_args()
if not args.only_cublas:
    import fp8ext  # noqa: E402
for shape in args.shapes:
    m, n, k = map(int, shape.split("x"))
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    sa, sb = gemm_scales(m, n, args.row_wise)
    for _ in range(0 if args.only_cublas else 3):
        fp8ext.scaled_mm(a, w, sa.reshape(-1), sb.reshape(-1), config=args.config, use_fast_accum=args.fast_accum)
    for _ in range(3):
        torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=args.fast_accum)
torch.cuda.synchronize()
