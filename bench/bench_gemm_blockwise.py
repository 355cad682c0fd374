"""Block-wise FP8 GEMM suite (../shared/BENCHMARKING.md, issue 5): fp8ext.scaled_mm
with 1x128 activation groups and 128x128 weight blocks against cuBLASLt's
block-wise mode (torch._scaled_mm with the same scales) and against our own
per-tensor kernel, on the same operands in one run. Each row reports ours vs
cuBLAS block-wise (the target) and block-wise / per-tensor time (what the finer
scales cost). Rows under ~50 us (bench_gemm.graph_timed) are graph-timed with
the weight rotated among copies that exceed L2. Unaligned shapes report our time and the slowdown
against the nearest aligned one (cuBLAS refuses them, and M = 1). The three
kernels of a row are timed in alternating bursts, as in bench_gemm.py.

    python bench/bench_gemm_blockwise.py --out DIR [--full]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

import fp8ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import NK, UNALIGNED, graph_timed, timed  # noqa: E402
from benchlib import check_output, copies_past_l2, print_table, ratio_fields, round_ratio, write_results  # noqa: E402

F8 = torch.float8_e4m3fn
BLOCK = 128
M_QUICK = [1, 16, 64, 128, 1024, 4096]
M_FULL = [1, 16, 64, 128, 256, 1024, 4096, 16384]


def group_scales(m, k):
    """[M, K/128] in fp8ext's layout (M-major, column stride a multiple of 4)."""
    g = -(-k // BLOCK)
    storage = torch.rand(g, -(-m // 4) * 4, device="cuda") * 0.1 + 0.01
    return storage.t()[:m]


def dequantized_product(a, w, sa, sb):
    """(A with its 1x128 group scales) @ (W with its 128x128 block scales)^T in fp32."""
    k, n = a.shape[1], w.shape[0]
    return (a.float() * sa.repeat_interleave(BLOCK, 1)[:, :k]) @ \
        (w.float() * sb.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]).t()


def cublas_layouts(sa, sb):
    """(name, scale_a, scale_b) for torch._scaled_mm's block-wise mode: the shapes are
    [M, K/128] and [K/128, N/128]; which strides a torch build takes varies, so the
    benchmark tries these in turn and records the one that ran."""
    sa_m_major = sa.t().contiguous().t()  # column stride exactly M
    return [("a M-major, b K/128-major view", sa_m_major, sb.t()),
            ("a M-major, b contiguous", sa_m_major, sb.t().contiguous()),
            ("a row-major, b contiguous", sa.contiguous(), sb.t().contiguous()),
            ("a row-major, b K/128-major view", sa.contiguous(), sb.t())]


def cublas_blockwise(a, w, sa, sb):
    """(call, layout name) of torch._scaled_mm in cuBLASLt's 1x128 x 128x128 mode,
    or (None, why) where every layout is refused (M = 1 among others)."""
    errors = []
    for name, scale_a, scale_b in cublas_layouts(sa, sb):
        def call(weight, scale_a=scale_a, scale_b=scale_b):
            return torch._scaled_mm(a, weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        try:
            call(w)
            return call, name
        except RuntimeError as e:
            errors.append(str(e).splitlines()[0][:60])
    return None, "; ".join(errors)


def bench_row(m, n, k, anchor=True):
    graph = graph_timed(m, n, k)
    copies = copies_past_l2(n * k) if graph else 1
    ws = [(torch.randn(n, k, device="cuda") * 2).to(F8) for _ in range(copies)]
    a = (torch.randn(m, k, device="cuda") * 2).to(F8)
    sa = group_scales(m, k)
    sb = torch.rand(-(-n // BLOCK), -(-k // BLOCK), device="cuda") * 0.1 + 0.01
    one = torch.tensor(0.05, device="cuda")
    ours = lambda w: fp8ext.scaled_mm(a, w, sa, sb)  # noqa: E731
    per_tensor = lambda w: fp8ext.scaled_mm(a, w, one, one)  # noqa: E731
    # Every timed call checked once, against the dequantized product in fp32.
    got = ours(ws[0]).float()
    want = dequantized_product(a, ws[0], sa, sb)
    err = check_output(got, want, f"{m}x{n}x{k} block-wise")
    check_output(per_tensor(ws[0]), (a.float() @ ws[0].float().t()) * one * one, f"{m}x{n}x{k} per-tensor")
    flops = 2.0 * m * n * k
    fns = [ours, per_tensor]
    cublas, layout = cublas_blockwise(a, ws[0], sa, sb) if anchor else (None, None)
    if cublas is not None:
        check_output(got, cublas(ws[0]), f"{m}x{n}x{k} against cuBLAS block-wise")
        fns.append(cublas)
    (t_ours, t_tensor, *t_anchor), rounds = timed(fns, ws, graph)  # alternating bursts (bench_gemm.timed)
    row = {"op": "scaled_mm_blockwise", "shape": f"{m}x{n}x{k}", "ours_ms": round(t_ours, 5),
           "ours_TFLOPs": round(flops / t_ours / 1e9, 1), "ours_weight_TBps": round(n * k / t_ours / 1e9, 3),
           "ours_worst_slice_rel_error": round(err, 6), "per_tensor_ms": round(t_tensor, 5),
           "block_vs_per_tensor_time": round(round_ratio(rounds[0], rounds[1]), 3),
           "timing": ("cuda-graph, weights rotated past L2" if graph else "cuda events") + ", interleaved bursts"}
    if anchor:
        if cublas is None:  # cuBLAS refuses M = 1 (CUBLAS_STATUS_NOT_SUPPORTED)
            row["anchor"] = f"torch._scaled_mm block-wise: fails ({layout})"
            return row
        row["anchor_scale_layout"] = layout
        row.update({"anchor": "torch._scaled_mm block-wise (cuBLASLt)", "anchor_ms": round(t_anchor[0], 5),
                    "anchor_TFLOPs": round(flops / t_anchor[0] / 1e9, 1), **ratio_fields(rounds[2], rounds[0])})
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--full", action="store_true", help="the whole suite (default: 8B layers and the cube)")
    ap.add_argument("--large-m", action="store_true", help="only M >= 1024 (scheduler tuning)")
    args = ap.parse_args()
    layers = list(NK) if args.full else [k for k in NK if k.startswith("8b") or k == "cube"]
    ms = [m for m in (M_FULL if args.full else M_QUICK) if m >= 1024 or not args.large_m]
    rows = []
    for layer in layers:
        n, k = NK[layer]
        for m in ms:
            torch.manual_seed(0)
            rows.append({"layer": layer, **bench_row(m, n, k)})
            torch.cuda.empty_cache()
        write_results(args.out, "gemm_blockwise" + os.environ.get("FP8EXT_BENCH_TAG", ""), rows)  # partial results
    rows.append({"layer": "cube", **bench_row(8192, 8192, 8192)})
    for (m, n, k), (am, an, ak) in ([] if args.large_m else UNALIGNED):
        unaligned, aligned = bench_row(m, n, k, anchor=False), bench_row(am, an, ak, anchor=False)
        rows.append({"layer": "unaligned", **unaligned, "aligned_shape": aligned["shape"],
                     "slowdown_vs_aligned": round(unaligned["ours_ms"] / aligned["ours_ms"], 3)})
    big = [r["ratio"] for r in rows if "ratio" in r and int(r["shape"].split("x")[0]) >= 1024]
    small = [r["ours_weight_TBps"] for r in rows if r.get("layer") != "unaligned"
             and int(r["shape"].split("x")[0]) <= 64]
    cube = [r for r in rows if r["shape"] == "8192x8192x8192"]
    summary = {"op": "summary",
               "geomean_ratio_vs_cublas_m_ge_1024": round(math.exp(sum(map(math.log, big)) / len(big)), 3)
               if big else None,
               "min_ratio_vs_cublas_m_ge_1024": min(big) if big else None,
               "min_weight_TBps_m_le_64": min(small) if small else None,
               "TFLOPs_8192_cube": cube[0]["ours_TFLOPs"] if cube else None}
    rows.append(summary)
    name = "gemm_blockwise" + os.environ.get("FP8EXT_BENCH_TAG", "")
    path = write_results(args.out, name, rows)
    print(f"wrote {path}")
    print_table([r for r in rows if r.get("op") == "scaled_mm_blockwise"],
                ["layer", "shape", "ours_ms", "anchor_ms", "ratio", "ours_TFLOPs", "anchor_TFLOPs",
                 "ours_weight_TBps", "block_vs_per_tensor_time", "slowdown_vs_aligned"])
    print(summary)


if __name__ == "__main__":
    main()
