"""Which kernels cuBLASLt (through torch._scaled_mm) and fp8ext run for each
FP8 GEMM shape, with their device times from torch.profiler.

cuBLASLt's kernel names carry its tile shape, cluster, schedule and split-K
choice, so this shows which configuration beats ours on a row (issues 4, 5, 7).
Weights rotate among copies larger than L2, as in bench_gemm.py; the times are
the profiler's per-kernel durations (no launch gaps), a median over the calls.

    python scripts/device/gemm_kernel_names.py --out DIR [--ms 16 128 ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import fp8ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import copies_past_l2, write_results  # noqa: E402

F8 = torch.float8_e4m3fn
NK = {"8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (28672, 4096), "8b_down": (4096, 14336),
      "70b_o": (8192, 8192), "70b_gate_up": (57344, 8192), "70b_down": (8192, 28672), "cube": (8192, 8192)}
CALLS = 12


def kernel_times(fn, ws):
    """{kernel name: median device us} over CALLS calls, rotating the weights."""
    for w in ws:  # warm-up (and any autotuning) outside the profile
        fn(w)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            fn(ws[i % len(ws)])
        torch.cuda.synchronize()
    times = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            times[e.name].append(e.device_time)
    return {name: round(statistics.median(t), 2) for name, t in times.items()}


def blockwise_scales(m, n, k):
    sa = (torch.rand(m, -(-k // 128), device="cuda") * 0.1 + 0.01).t().contiguous().t()
    sb = torch.rand(-(-n // 128), -(-k // 128), device="cuda") * 0.1 + 0.01
    return sa, sb


def variants(a, m, n, k):
    one = torch.tensor(0.05, device="cuda")
    sa_row, sb_row = torch.rand(m, 1, device="cuda") * 0.1 + 0.01, torch.rand(1, n, device="cuda") * 0.1 + 0.01
    sa_blk, sb_blk = blockwise_scales(m, n, k)
    bf = torch.bfloat16
    out = {}
    for fast in (False, True):
        tag = ", fast" if fast else ""
        out[f"cublas per-tensor{tag}"] = lambda w, f=fast: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one,
                                                                            out_dtype=bf, use_fast_accum=f)
        out[f"ours per-tensor{tag}"] = lambda w, f=fast: fp8ext.scaled_mm(a, w, one, one, use_fast_accum=f)
    out["cublas row-wise"] = lambda w: torch._scaled_mm(a, w.t(), scale_a=sa_row, scale_b=sb_row, out_dtype=bf)
    out["ours row-wise"] = lambda w: fp8ext.scaled_mm(a, w, sa_row.view(-1), sb_row.view(-1))
    out["cublas block-wise"] = lambda w: torch._scaled_mm(a, w.t(), scale_a=sa_blk, scale_b=sb_blk.t(), out_dtype=bf)
    out["ours block-wise"] = lambda w: fp8ext.scaled_mm(a, w, sa_blk, sb_blk)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[16, 64, 128, 1024, 4096])
    ap.add_argument("--layers", nargs="+", default=list(NK))
    args = ap.parse_args()
    rows = []
    for layer in args.layers:
        n, k = NK[layer]
        copies = copies_past_l2(n * k)
        ws = [(torch.randn(n, k, device="cuda") * 2).to(F8) for _ in range(copies)]
        for m in args.ms:
            a = (torch.randn(m, k, device="cuda") * 2).to(F8)
            for name, fn in variants(a, m, n, k).items():
                try:
                    kernels = kernel_times(fn, ws)
                except RuntimeError as e:
                    kernels = {"error": str(e).splitlines()[0][:120]}
                total = sum(v for v in kernels.values() if isinstance(v, float))
                rows.append({"op": "gemm_kernel_names", "layer": layer, "shape": [m, n, k], "variant": name,
                             "kernels_us": kernels, "total_us": round(total, 2)})
                print(f"{layer:12s} M={m:5d} {name:24s} {total:9.2f} us  " +
                      "; ".join(f"{kn[:110]} {t}" for kn, t in kernels.items()), flush=True)
    write_results(args.out, "gemm_kernel_names", rows)


if __name__ == "__main__":
    main()
