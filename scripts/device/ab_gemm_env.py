"""One process, decode-sized GEMMs (bench_gemm's and bench_gemm_blockwise's
operands, graph-timed, weights rotated past L2): fp8ext.scaled_mm timed under
each setting of environment variables the library reads at launch,
interleaved over rounds, with cuBLAS (torch._scaled_mm) timed in every round as
the anchor, the outputs checked equal across settings and against cuBLAS.

    python3 scripts/device/ab_gemm_env.py --settings - FP8EXT_GEMV=0 [--m 1 16 64] [--rounds 2]
        [--kinds block-wise] [--close] [--fast-accum] [--out DIR]

A setting is "VAR=VALUE,VAR=VALUE" or "-" for none; every variable any setting
names is unset before each setting. (Session 16 timed 472599c's weight
prefetch before the PDL wait with it, since reverted: bench/NOTES.md.)
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_gemm import NK, weights  # noqa: E402
from bench_gemm_blockwise import BLOCK, cublas_blockwise, dequantized_product, group_scales  # noqa: E402
from benchlib import (apply_env, check_output, copies_past_l2, env_setting, gemm_scales, graph_time_rotating_ms,  # noqa: E402
                      same_output, write_record)

import fp8ext  # noqa: E402

F8 = torch.float8_e4m3fn
LAYERS = ["8b_qkv", "8b_o", "8b_gate_up", "8b_down", "cube"]


KINDS = ("per-tensor", "row-wise", "block-wise")


def cases(ms, layers, kinds=KINDS, fast=False):
    """(name, weight bytes, ours(w), anchor(w) or None, the weight copies to rotate,
    want(w): what ours is checked against, the anchor or, where cuBLAS refuses, the product in fp32);
    fast: FP8 fast accumulation for ours and cuBLAS (per-tensor and row-wise rows)."""
    out = []
    for layer in layers:
        n, k = NK[layer]
        ws = weights(n, k, copies_past_l2(n * k))
        for m in ms:
            a = (torch.randn(m, k, device="cuda") * 2).to(F8)
            for kind in ("per-tensor", "row-wise"):
                if kind not in kinds:
                    continue
                sa, sb = gemm_scales(m, n, kind == "row-wise")
                ours = lambda w, a=a, sa=sa, sb=sb: fp8ext.scaled_mm(a, w, sa.reshape(-1), sb.reshape(-1),  # noqa: E731
                                                                         use_fast_accum=fast)
                anchor = lambda w, a=a, sa=sa, sb=sb: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb,  # noqa: E731
                                                                       out_dtype=torch.bfloat16, use_fast_accum=fast)
                out.append((f"{m}x{n}x{k} {kind}{' fast' if fast else ''}", n * k, ours, anchor, ws, anchor))
            if "block-wise" not in kinds:
                continue
            ga, gb = group_scales(m, k), torch.rand(-(-n // BLOCK), -(-k // BLOCK), device="cuda") * 0.1 + 0.01
            ours = lambda w, a=a, ga=ga, gb=gb: fp8ext.scaled_mm(a, w, ga, gb)  # noqa: E731
            anchor, _ = cublas_blockwise(a, ws[0], ga, gb)
            product = lambda w, a=a, ga=ga, gb=gb: dequantized_product(a, w, ga, gb)  # noqa: E731
            out.append((f"{m}x{n}x{k} block-wise", n * k, ours, anchor, ws, anchor or product))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", nargs="+", required=True)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layers", nargs="+", default=LAYERS, choices=sorted(NK), help="bench_gemm's layer names")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="which scalings' rows")
    ap.add_argument("--close", action="store_true",
                    help="settings may change a sum's order (split-K): outputs agree within 1e-2, not bit for bit")
    ap.add_argument("--fast-accum", action="store_true", help="use_fast_accum=True (not for block-wise rows)")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    named = {v for st in args.settings for v in env_setting(st)}
    rows = cases(args.m, args.layers, args.kinds, args.fast_accum)
    ref, times, anchor_times = {}, {}, {}
    # Each row's settings are timed back to back (then cuBLAS), starting one
    # setting later every round. Session 24 timed a whole setting at a time,
    # always in the same order, and a 10% trend across the settings followed
    # that order (bench/NOTES.md): this keeps the drift between them short
    # and moves each setting through every position.
    for rnd in range(args.rounds):
        first = rnd % len(args.settings)
        order = args.settings[first:] + args.settings[:first]
        for name, _, ours, anchor, ws, want in rows:  # want: a fast wrong kernel must not win
            for st in order:
                apply_env(env_setting(st), named)
                if rnd == 0:
                    got = ours(ws[0])
                    assert same_output(got, ref.setdefault(name, got), not args.close), (name, st)
                    check_output(got, want(ws[0]), f"{name} {st}")
                times.setdefault((st, name), []).append(graph_time_rotating_ms(ours, ws) * 1e3)
            apply_env({}, named)
            if anchor is not None:
                anchor_times.setdefault(name, []).append(graph_time_rotating_ms(anchor, ws) * 1e3)
            # As it goes, so that a call cut short by its time limit still shows what ran.
            print(f"round {rnd} {name}: " + "  ".join(f"{st} {times[(st, name)][-1]:.2f}" for st in order)
                  + (f"  cuBLAS {anchor_times[name][-1]:.2f}" if anchor is not None else "") + " us", flush=True)
    out = []
    for name, nbytes, *_ in rows:
        cublas = statistics.median(anchor_times[name]) if name in anchor_times else None
        line = f"{name:32s}"
        for st in args.settings:
            us = statistics.median(times[(st, name)])
            out.append({"case": name, "setting": st, "us": round(us, 2), "us_rounds": [round(v, 2) for v in times[(st, name)]],
                        "weight_TBps": round(nbytes / us / 1e6, 3), "cublas_us": round(cublas, 2) if cublas else None,
                        "ratio_vs_cublas": round(cublas / us, 3) if cublas else None})
            line += f"  {us:7.2f} us {out[-1]['weight_TBps']:.2f} TB/s"
        print(line + (f"  | cuBLAS {cublas:7.2f} us" if cublas else "  | cuBLAS refuses"))
    print("settings:", "  |  ".join(args.settings))
    if args.out:
        write_record(args.out, "ab_gemm_env", {"settings": args.settings, "rows": out})


if __name__ == "__main__":
    main()
