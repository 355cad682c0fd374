"""The GPU sections of `fp8ext report` (run only where CUDA is present):
GEMM economics against cuBLAS (per-tensor, row-wise and block-wise) and the
serving engine's decode curves."""
from __future__ import annotations

import statistics

import torch

import fp8ext
from fp8ext.cuda_graphs import capture, replay_times_ms

SHAPES = [(16, 4096, 4096), (128, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096), (4096, 14336, 4096)]
UNALIGNED = [((1024, 4096, 4096), (1000, 4095, 4100))]


def _time_ms(fn, repeats: int = 20, calls: int = 10) -> float:
    """Median time of one fn() call, `calls` of them captured back to back in a graph."""
    graph, _ = capture(lambda: [fn() for _ in range(calls)])
    return statistics.median(replay_times_ms(graph.replay, repeats)) / calls


def _operands(m, n, k, recipe=fp8ext.CurrentScaling()):
    """bf16 a [M, K], b [N, K] and their FP8 codes and scales under `recipe`."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return a, b, fp8ext.quantize(a, recipe) + fp8ext.quantize(b, recipe, "weight")


def gemm_economics() -> list:
    rows = []
    for m, n, k in SHAPES:
        a, b, (qa, sa, qb, sb) = _operands(m, n, k)
        _, _, (ra, rsa, rb, rsb) = _operands(m, n, k, fp8ext.RowWise())
        _, _, (ba, bsa, bb, bsb) = _operands(m, n, k, fp8ext.BlockWise())
        flops = 2 * m * n * k
        times = {
            "bf16 (cuBLAS)": _time_ms(lambda: a @ b.t()),
            "fp8 per-tensor (cuBLAS)": _time_ms(lambda: torch._scaled_mm(qa, qb.t(), sa, sb, out_dtype=torch.bfloat16)),
            "fp8 per-tensor (fp8ext)": _time_ms(lambda: fp8ext.scaled_mm(qa, qb, sa, sb)),
            "fp8 row-wise (cuBLAS)": _time_ms(lambda: torch._scaled_mm(
                ra, rb.t(), rsa.reshape(-1, 1), rsb.reshape(1, -1), out_dtype=torch.bfloat16)),
            "fp8 row-wise (fp8ext)": _time_ms(lambda: fp8ext.scaled_mm(ra, rb, rsa, rsb)),
            # cuBLAS takes the group scales with column stride M and the block scales as [K/128, N/128] (a view)
            "fp8 block-wise (cuBLAS)": _time_ms(lambda: torch._scaled_mm(
                ba, bb.t(), bsa.t().contiguous().t(), bsb.t(), out_dtype=torch.bfloat16)),
            "fp8 block-wise (fp8ext)": _time_ms(lambda: fp8ext.scaled_mm(ba, bb, bsa, bsb)),
        }
        for name, ms in times.items():
            rows.append({"M": m, "N": n, "K": k, "kernel": name, "ms": round(ms, 4),
                         "TFLOP/s": round(flops / ms / 1e9, 1)})
    return rows


def unaligned_cost() -> list:
    rows = []
    for aligned, odd in UNALIGNED:
        t = {}
        for shape in (aligned, odd):
            _, _, (qa, sa, qb, sb) = _operands(*shape)
            t[shape] = _time_ms(lambda: fp8ext.scaled_mm(qa, qb, sa, sb))
        rows.append({"aligned": "x".join(map(str, aligned)), "aligned ms": round(t[aligned], 4),
                     "unaligned": "x".join(map(str, odd)), "unaligned ms": round(t[odd], 4),
                     "cost": f"{t[odd] / t[aligned]:.2f}x"})
    return rows


def plot_roofline(rows: list, path: str) -> None:
    from fp8ext.report.render import _plt
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        in_bytes = 2 if kernel.startswith("bf16") else 1  # FP8 operands are one byte; the output is bf16
        pts = [(2 * r["M"] * r["N"] * r["K"] / (in_bytes * (r["M"] * r["K"] + r["N"] * r["K"]) + 2 * r["M"] * r["N"]),
                r["TFLOP/s"]) for r in rows if r["kernel"] == kernel and r["N"] == 4096]
        ax.plot(*zip(*pts), "o-", label=kernel)
    ax.axhline(1979, ls=":", c="gray", label="FP8 dense peak (datasheet)")
    ax.axhline(790, ls="--", c="gray", label="bf16 measured ceiling")
    ax.set_xscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved, N = K = 4096)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_serving(rows: list, path: str) -> None:
    """Decode throughput and step time against batch, one line per mode."""
    from fp8ext.report.render import _plt
    plt = _plt()
    decode = [r for r in rows if r["op"] == "serve_decode" and "step_ms" in r]
    fig, (tput, step) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(r["mode"] for r in decode):
        pts = sorted((r["batch"], r["tokens_per_s"], r["step_ms"]) for r in decode if r["mode"] == mode)
        batches, tok_s, ms = zip(*pts)
        tput.plot(batches, tok_s, "o-", label=mode)
        step.plot(batches, ms, "o-", label=mode)
    for ax, label in ((tput, "output tokens/s"), (step, "decode step (ms): inter-token latency")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (context 4096)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    tput.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
