"""Where a large GEMM's time goes, per tile: ours and cuBLAS (torch._scaled_mm)
at fixed M and N over several K, each variant's CUDA graph (20 calls) timed in
alternating bursts. A line time = fixed + K * slope through each variant's
points splits the per-tile cost that does not grow with K (the epilogue, the
tile's prologue and pipeline fill, the scheduler) from the mainloop's cost per
K. Per-tensor scales, bf16 out, promoted and fast accumulation.

    python scripts/device/k_sweep_gemm.py --out DIR [--mn 4096 4096 8192 8192] [--ks 1024 2048 4096 8192 16384]
        [--configs large large_n192]   (ours forced to these configurations too)
        [--settings FP8EXT_GEMM_SWIZZLE=2 FP8EXT_GEMM_RASTER=1]   (ours under these environment
                                                   settings too; read at launch, so at capture)
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

import fp8ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import (apply_env, capture_graph, env_setting, gemm_scales, relative_error,  # noqa: E402
                      time_interleaved_ms, write_record)

F8 = torch.float8_e4m3fn
CALLS = 20  # per graph


def line_fit(xs: list, ys: list) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def under_env(fn, setting: str, named):
    """fn run with `setting` applied (and every variable in `named` unset otherwise)."""
    def run():
        apply_env(env_setting(setting), named)
        try:
            return fn()
        finally:
            apply_env({}, named)
    return run


def variants(a, b, sa, sb, fast: bool, configs=(), settings=()) -> dict:
    tag = " fast" if fast else ""
    forced = {f"ours {c}{tag}": (lambda c=c: fp8ext.scaled_mm(a, b, sa, sb, config=c, use_fast_accum=fast))
              for c in configs}
    named = {var for text in settings for var in env_setting(text)}
    ours = lambda: fp8ext.scaled_mm(a, b, sa, sb, use_fast_accum=fast)  # noqa: E731
    with_env = {f"ours [{t}]{tag}": under_env(ours, t, named) for t in settings}
    return {
        **forced,
        **with_env,
        f"ours{tag}": ours,
        f"cublas{tag}": lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                                  use_fast_accum=fast),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mn", type=int, nargs="+", default=[4096, 4096, 8192, 8192], help="M N pairs")
    ap.add_argument("--ks", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--configs", nargs="*", default=[], help="also time ours forced to these tile configurations")
    ap.add_argument("--settings", nargs="*", default=[], help='also time ours under these "VAR=VALUE,..."')
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, fits = [], []
    for m, n in zip(args.mn[::2], args.mn[1::2]):
        sa, sb = gemm_scales(m, n, row_wise=False)
        per_variant = {}
        for k in args.ks:
            a = (torch.randn(m, k, device="cuda") * 2).to(F8)
            b = (torch.randn(n, k, device="cuda") * 2).to(F8)
            fns = {**variants(a, b, sa, sb, False, args.configs, args.settings),
                   **variants(a, b, sa, sb, True, args.configs, args.settings)}
            ref = fns["cublas"]().float()
            for name, fn in fns.items():  # a fast wrong kernel must not win
                err = relative_error(fn(), ref)
                assert err < 1e-2, (m, n, k, name, err)
            graphs = [capture_graph(fn, CALLS) for fn in fns.values()]
            medians, _ = time_interleaved_ms(graphs, rounds=args.rounds)
            line = f"{m}x{n}x{k:<6d}"
            for name, ms in zip(fns, medians):
                us = ms * 1e3 / CALLS
                per_variant.setdefault(name, []).append((k, us))
                rows.append({"m": m, "n": n, "k": k, "variant": name, "us": round(us, 2),
                             "TFLOPs": round(2 * m * n * k / us / 1e6, 1)})
                line += f"  {name} {us:8.2f}"
            print(line, flush=True)
            del a, b, graphs
        tiles = math.ceil(m / 128) * math.ceil(n / 128)
        for name, pts in per_variant.items():
            fixed, slope = line_fit([k for k, _ in pts], [us for _, us in pts])
            fits.append({"m": m, "n": n, "variant": name, "fixed_us": round(fixed, 2),
                         "us_per_1024_k": round(slope * 1024, 3), "tiles_128x128": tiles})
            print(f"  {m}x{n} {name:12s} fixed {fixed:7.2f} us  per 1024 of K {slope * 1024:7.3f} us")
    if args.out:
        write_record(args.out, "gemm_k_sweep", {"rows": rows, "fits": fits,
                                                "note": "per-tensor scales, bf16 out; graph of 20 calls, "
                                                        "alternating bursts; line fit us = fixed + slope*K"})


if __name__ == "__main__":
    main()
