"""The tile configurations once every kernel that fits promotes to fp32 one K
tile behind (sm90_deferred_promotion.cuh), in one process: at decode sizes
(row-wise scales, FP8Linear's recipe) auto against each kernel that can take
M (swap_medium, and at M = 65-128 medium and large_cluster_n); at
M >= 1024 (issue 4's suite rows, per-tensor and row-wise) auto against large
and large_n192 (CUTLASS's own mainloop, promoting every 256 of K). Beside them
auto with use_fast_accum and cuBLASLt promoted. Every variant's CUDA graph (20
calls, weights rotated past L2 at decode sizes) is timed in alternating
bursts; each output's error against float64 is recorded. (Session 22's first
run compared the deferred kernels, then separate configs, with the promoting
ones: bench/NOTES.md.)

    python scripts/device/ab_deferred.py --out DIR [--large-only | --decode-only]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

import fp8ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import (capture_graph, check_output, copies_past_l2, relative_error, rotating, round_ratio,  # noqa: E402
                      time_interleaved_ms, write_results)  # noqa: E402

F8 = torch.float8_e4m3fn
NK_8B = {"8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (28672, 4096), "8b_down": (4096, 14336)}
DECODE = [(m, layer) for m in (32, 64, 128) for layer in NK_8B]
LARGE = [(m, layer) for m in (1024, 4096) for layer in NK_8B] + [(8192, "cube")]
NK = {**NK_8B, "cube": (8192, 8192)}


def variants(m: int) -> list[tuple[str, dict]]:
    """(name, scaled_mm keyword arguments) of ours at this M."""
    if m <= 128:
        out = [("auto", {}), ("swap_medium", {"config": "swap_medium"})]
        if m > 64:
            out += [(c, {"config": c}) for c in ("medium", "large_cluster_n")]
    else:
        out = [("auto", {}), ("large", {"config": "large"}), ("large_n192", {"config": "large_n192"})]
    return out + [("auto fast", {"use_fast_accum": True})]


def one_row(m: int, layer: str, per_row: bool) -> dict:
    n, k = NK[layer]
    copies = copies_past_l2(n * k) if m <= 128 else 1
    ws = [(torch.randn(n, k, device="cuda") * 2).to(F8) for _ in range(copies)]
    a = (torch.randn(m, k, device="cuda") * 2).to(F8)
    if per_row:
        sa, sb = torch.rand(m, device="cuda") * 0.1 + 0.01, torch.rand(n, device="cuda") * 0.1 + 0.01
        csa, csb = sa[:, None], sb[None, :]
    else:
        sa, sb = torch.tensor(0.05, device="cuda"), torch.tensor(0.03, device="cuda")
        csa, csb = sa, sb
    exact = (a.double() * (sa.double()[:, None] if per_row else sa.double())) @ \
            (ws[0].double() * (sb.double()[:, None] if per_row else sb.double())).t()
    names, calls, errors = [], [], {}
    for name, kw in variants(m):
        fn = lambda w, kw=kw: fp8ext.scaled_mm(a, w, sa, sb, **kw)  # noqa: E731
        errors[name] = relative_error(fn(ws[0]), exact, torch.float64)
        check_output(fn(ws[0]), exact, f"{layer} {m}x{n}x{k} {name}")  # each timed variant checked once
        names.append(name)
        calls.append(fn)
    cublas = lambda w: torch._scaled_mm(a, w.t(), scale_a=csa, scale_b=csb, out_dtype=torch.bfloat16)  # noqa: E731
    errors["cublas"] = relative_error(cublas(ws[0]), exact, torch.float64)
    names.append("cublas")
    calls.append(cublas)
    graphs = []
    for fn in calls:
        call, reps = rotating(fn, ws)
        graphs.append(capture_graph(call, reps))
    times, rounds = time_interleaved_ms(graphs)
    us = {name: round(1000 * t / reps, 2) for name, t in zip(names, times)}
    cublas_rounds = rounds[-1]
    return {"op": "deferred_promotion_configs", "layer": layer, "shape": [m, n, k],
            "scales": "row-wise" if per_row else "per-tensor", "us": us,
            "cublas_over_ours_median_ratio": {name: round(round_ratio(cublas_rounds, r), 3)
                                              for name, r in zip(names, rounds)},
            "tflops": {name: round(2 * m * n * k / (t * 1e-6) / 1e12, 1) for name, t in us.items()},
            "error_vs_float64": {name: float(f"{e:.3e}") for name, e in errors.items()},
            "timing": "cuda-graph of 20 calls (decode: weights rotated past L2), interleaved bursts"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--large-only", action="store_true")
    group.add_argument("--decode-only", action="store_true")
    args = ap.parse_args()
    cases = [] if args.large_only else [(m, layer, True) for m, layer in DECODE]
    if not args.decode_only:
        cases += [(m, layer, per_row) for per_row in (False, True) for m, layer in LARGE]
    rows = []
    for m, layer, per_row in cases:
        row = one_row(m, layer, per_row)
        rows.append(row)
        r = row["cublas_over_ours_median_ratio"]
        print(f"{layer:11s} M={m:5d} {row['scales']:10s} " + "  ".join(f"{k}={v}" for k, v in row["us"].items())
              + "  | cublas/ours " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
        print("    error: " + "  ".join(f"{k}={v}" for k, v in row["error_vs_float64"].items()), flush=True)
        write_results(args.out, "deferred_promotion_configs", rows)
    for scales in ("row-wise", "per-tensor"):
        large = [r for r in rows if r["shape"][0] >= 1024 and r["scales"] == scales]
        for name in ("auto", "large", "large_n192", "auto fast"):
            if large:
                g = math.exp(sum(math.log(r["cublas_over_ours_median_ratio"][name]) for r in large) / len(large))
                print(f"M >= 1024 {scales}: {name} geomean cublas/ours {g:.3f}, lowest "
                      f"{min(r['cublas_over_ours_median_ratio'][name] for r in large):.3f}")


if __name__ == "__main__":
    main()
