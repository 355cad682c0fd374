"""scaled_mm's padded path (shapes the kernels cannot take as they are) timed
three ways in one process, graph-timed with the weights rotated past L2:
the op as built (operands through cuda::copy_zero_padded, one pass each), the
path it replaced emulated with the same torch calls the op made before (zeros,
then a copy into a strided view: 1-byte elements a thread at a time; D's
columns dropped by a strided copy), and the nearest aligned shape. Checks that
the two padded paths give the same bits. JSON lines to --out.

    python3 scripts/device/time_padded_path.py --out DIR [--rounds 6]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import fp8ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import (capture_graph, check_output, copies_past_l2, gemm_scales, rotating, run_info,  # noqa: E402
                      time_interleaved_ms)

F8 = torch.float8_e4m3fn
# (unaligned M, N, K), nearest aligned shape: bench_gemm's three, a decode row and a larger one.
ROWS = [((1000, 4095, 4100), (1024, 4096, 4096)), ((7, 1000, 1710), (8, 1024, 1712)),
        ((33, 1280, 1710), (32, 1280, 1712)), ((16, 4095, 4100), (16, 4096, 4096)),
        ((4096, 14335, 4100), (4096, 14336, 4096))]


def round_up(x, m):
    return (x + m - 1) // m * m


def replaced_path(a, w, sa, sb):
    """What the op did before (gemm_operands.h and scaled_mm_cuda.cpp at 19153cd), in the same torch calls."""
    (m, k), n = a.shape, w.shape[0]
    k16, n16 = round_up(k, 16), round_up(n, 8)
    ka = torch.zeros(m, k16, dtype=F8, device="cuda")
    ka.narrow(1, 0, k).copy_(a)
    kb = torch.zeros(n16, k16, dtype=F8, device="cuda")
    kb.narrow(0, 0, n).narrow(1, 0, k).copy_(w)
    ksb = torch.zeros(n16, device="cuda")
    ksb.narrow(0, 0, n).copy_(sb)
    d = fp8ext.scaled_mm(ka, kb, sa, ksb, out_dtype=torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    out.copy_(d.narrow(1, 0, n))
    return out


def timed_row(shape, aligned, rounds):
    (m, n, k), (am, an, ak) = shape, aligned
    copies = copies_past_l2(n * k)
    ws = [(torch.randn(n, k, device="cuda") * 2).to(F8) for _ in range(copies)]
    ws_aligned = [(torch.randn(an, ak, device="cuda") * 2).to(F8) for _ in range(copies)]
    a = (torch.randn(m, k, device="cuda") * 2).to(F8)
    a_aligned = (torch.randn(am, ak, device="cuda") * 2).to(F8)
    sa, sb = (s.reshape(-1) for s in gemm_scales(m, n, True))
    sa2, sb2 = (s.reshape(-1) for s in gemm_scales(am, an, True))
    new = lambda w: fp8ext.scaled_mm(a, w, sa, sb, out_dtype=torch.bfloat16)  # noqa: E731
    old = lambda w: replaced_path(a, w, sa, sb)  # noqa: E731
    ali = lambda w: fp8ext.scaled_mm(a_aligned, w, sa2, sb2, out_dtype=torch.bfloat16)  # noqa: E731
    # Every timed call checked once: the padded path against the dequantized product
    # in fp32 and bit for bit against the path it replaced; the aligned one likewise.
    want = lambda x, w, s_a, s_b: ((x.float() @ w.float().t()) * s_a[:, None] * s_b).to(torch.bfloat16)  # noqa: E731
    check_output(new(ws[0]), want(a, ws[0], sa, sb), f"{m}x{n}x{k} padded path")
    check_output(ali(ws_aligned[0]), want(a_aligned, ws_aligned[0], sa2, sb2), f"{am}x{an}x{ak} aligned")
    same = torch.equal(new(ws[0]), old(ws[0]))
    if not same:
        raise AssertionError(f"{m}x{n}x{k}: the padded path's bits differ from the replaced path's")
    calls = []
    for f, items in ((new, ws), (old, ws), (ali, ws_aligned)):
        call, count = rotating(f, items)
        calls.append((capture_graph(call, count), count))
    times, _ = time_interleaved_ms([c for c, _ in calls], rounds=rounds)
    us = [t / count * 1e3 for t, (_, count) in zip(times, calls)]
    return {"op": "scaled_mm padded path", "shape": f"{m}x{n}x{k}", "aligned_shape": f"{am}x{an}x{ak}",
            "scales": "row-wise", "out_dtype": "bfloat16", "new_us": round(us[0], 2), "replaced_us": round(us[1], 2),
            "aligned_us": round(us[2], 2), "replaced_over_new": round(us[1] / us[0], 3),
            "new_slowdown_vs_aligned": round(us[0] / us[2], 3),
            "replaced_slowdown_vs_aligned": round(us[1] / us[2], 3), "same_bits": same,
            "timing": "cuda-graph, weights rotated past L2, interleaved bursts", **run_info()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "padded_path.jsonl")
    for shape, aligned in ROWS:
        torch.manual_seed(0)
        row = timed_row(shape, aligned, args.rounds)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['shape']:>18s} new {row['new_us']:8.2f} us  replaced {row['replaced_us']:8.2f}  aligned "
              f"{row['aligned_us']:8.2f}  replaced/new {row['replaced_over_new']:.2f}  new/aligned "
              f"{row['new_slowdown_vs_aligned']:.2f}  same bits {row['same_bits']}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
