"""Decode-sized FP8 GEMMs (M = 16, 64, 128): what "auto" runs, the tuning
configurations around it (swap_medium and medium at M = 128;
session 21 also timed swap-AB kernels in thread-block clusters, cuBLASLt's
shapes, since removed) and cuBLASLt per-tensor, in one process: every variant's graph (20
calls, weights rotated past L2) timed in alternating bursts, row-wise scales
for ours (FP8Linear's recipe). Each output is checked against cuBLAS, and its
error against float64 is recorded beside cuBLAS's (promoted and fast): run it
under FP8EXT_GEMM_PROMOTION=N to sweep the fp32
promotion interval, as session 21 did (since session 22 only CUTLASS's own
mainloop, in large_n192, reads it).

    python scripts/device/ab_swap_clusters.py --out DIR
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import fp8ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import (capture_graph, copies_past_l2, relative_error, rotating, round_ratio, time_interleaved_ms,  # noqa: E402
                      write_results)  # noqa: E402

F8 = torch.float8_e4m3fn
NK = {"8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (28672, 4096), "8b_down": (4096, 14336),
      "70b_o": (8192, 8192)}
CONFIGS = {16: ["auto"], 64: ["auto"], 128: ["auto", "swap_medium", "medium"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=list(CONFIGS))
    args = ap.parse_args()
    promotion = os.environ.get("FP8EXT_GEMM_PROMOTION", "built-in")
    rows = []
    for layer, (n, k) in NK.items():
        copies = copies_past_l2(n * k)
        ws = [(torch.randn(n, k, device="cuda") * 2).to(F8) for _ in range(copies)]
        for m in args.ms:
            a = (torch.randn(m, k, device="cuda") * 2).to(F8)
            sa, sb = torch.rand(m, device="cuda") * 0.1 + 0.01, torch.rand(n, device="cuda") * 0.1 + 0.01
            one = torch.tensor(0.05, device="cuda")
            ref = torch._scaled_mm(a, ws[0].t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16)
            exact = (a.double() * sa.double()[:, None]) @ (ws[0].double() * sb.double()[:, None]).t()
            errors = {f"cublas row-wise, fast={f}": relative_error(
                torch._scaled_mm(a, ws[0].t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16,
                                 use_fast_accum=f), exact, torch.float64) for f in (False, True)}
            names, calls = [], []
            for config in CONFIGS[m]:
                fn = lambda w, c=config: fp8ext.scaled_mm(a, w, sa, sb, config=c)  # noqa: E731
                got = fn(ws[0])
                err = relative_error(got, ref)
                if not err < 1e-2:
                    raise AssertionError(f"{layer} M={m} {config}: differs from cuBLAS by {err:.2e}")
                errors[config] = relative_error(got, exact, torch.float64)
                names.append(config)
                calls.append(fn)
            names.append("cublas per-tensor")
            calls.append(lambda w: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            graphs = []
            for fn in calls:
                call, reps = rotating(fn, ws)
                graphs.append(capture_graph(call, reps))
            times, rounds = time_interleaved_ms(graphs)
            us = {name: round(1000 * t / reps, 2) for name, t in zip(names, times)}
            auto_rounds = rounds[0]
            row = {"op": "swap_cluster_ab", "layer": layer, "shape": [m, n, k], "promotion": promotion, "us": us,
                   "error_vs_float64": {name: float(f"{e:.3e}") for name, e in errors.items()},
                   "vs_auto_median_ratio": {name: round(round_ratio(auto_rounds, r), 3)
                                            for name, r in zip(names, rounds)},
                   "weight_TBps": {name: round(n * k / (t * 1e-6) / 1e12, 3) for name, t in us.items()},
                   "timing": "cuda-graph of 20 calls, weights rotated past L2, interleaved bursts"}
            rows.append(row)
            print(f"{layer:11s} M={m:4d} " + "  ".join(f"{k_}={v}" for k_, v in us.items()), flush=True)
            print("    error vs float64: " + "  ".join(f"{k_}={v}" for k_, v in row["error_vs_float64"].items()))
        write_results(args.out, f"swap_cluster_ab_promotion_{promotion}", rows)


if __name__ == "__main__":
    main()
