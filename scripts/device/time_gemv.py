"""The CUDA-core GEMV (config "gemv", each rows-per-warp variant through
FP8EXT_GEMV_ROWS) against the swap-AB CUTLASS kernel (what auto picks at M = 2
to 16, and at M = 1 with FP8EXT_GEMV=0) and against cuBLAS (torch._scaled_mm),
row-wise scales, bf16 out, graph-timed with the weights rotated past L2
(bench/bench_gemm.py's bench_row), on Llama-3.1-8B's decode layers at M = 1, 2
and 4.

    python3 scripts/device/time_gemv.py [--out DIR]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_gemm import bench_row  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", default=None)
args = ap.parse_args()
rows = []
for m in (1, 2, 4):
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        for config, rows_per_warp in (("gemv", "1"), ("gemv", "2"), ("gemv", "4"), ("swap_small", "")):
            os.environ["FP8EXT_GEMV_ROWS"] = rows_per_warp
            r = bench_row(m, n, k, True, config=config, anchor=rows_per_warp == "1")
            r["gemv_rows_per_warp"] = rows_per_warp
            rows.append(r)
            print(f"{r['shape']:>16s} {config:>11s} {rows_per_warp:>2s} {r['ours_ms'] * 1e3:8.1f} us "
                  f"{r['ours_weight_TBps']:6.2f} TB/s"
                  + (f"  cuBLAS {r['anchor_ms'] * 1e3:8.1f} us" if "anchor_ms" in r else ""), flush=True)
os.environ.pop("FP8EXT_GEMV_ROWS")
if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemv_timing.json"), "w") as f:
        json.dump(dict(commit=os.environ.get("FP8EXT_COMMIT", "unknown"), gpu=torch.cuda.get_device_name(0),
                       torch=torch.__version__, rows=rows), f, indent=1)
