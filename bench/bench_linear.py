"""FP8Linear layer stack (../shared/BENCHMARKING.md): one Llama-3.1-8B layer's four
linears (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336), bf16 in
and out, activation quantization included, graph-timed with the weights of
several layers rotated past L2, against bf16 nn.Linear and torchao's FP8
inference (Float8DynamicActivationFloat8WeightConfig, per-tensor and per-row,
under torch.compile) in the same run: at each M every variant's graph is timed
in alternating bursts and a ratio is the median of the per-round ratios (timed
one after the other, torchao's M = 16 stack read 90.7-105.6 us between runs
while ours stayed at ~77.5-80). torchao's config uses FP8 fast
accumulation by default; fp8ext rows run with and without it
(``Recipe(fast_accum=...)``), and each fp8ext row's ratio is against the faster
torchao variant.

    python bench/bench_linear.py --out DIR [--ms 1024 4096] [--no-breakdown]

torchao is optional: bring its wheel like the CUTLASS one (.whl/, carried) and
`pip install --no-deps`; its rows are skipped (with the reason) when it is missing.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
from torch import nn

import fp8ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (capture_graph, check_output, copies_past_l2, graph_time_ms, graph_time_rotating_ms,  # noqa: E402
                      print_table, rotating, round_ratio, time_interleaved_ms, write_results)

LAYER = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)]
M_ALL = [16, 128, 1024, 4096]
COPIES = 3  # weights of 3 layers (3 x 218 MB in FP8, 3 x 436 MB in bf16) rotate past the 60 MB L2
# Against bf16 F.linear, each output row of an FP8 layer (random nn.Linear
# weights and inputs) is off by 0.037-0.039 (CPU emulation, per-tensor and
# row-wise, M = 16 and 128); a zeroed 128-column tile adds sqrt(128 / N) to its
# rows: >= 0.077 at the widest N (28672).
ROW_ERROR_BOUND = 0.05


class Stack(nn.Module):
    """The four linears, fed with inputs of the right widths (no attention or activation between)."""

    def __init__(self):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(k, n, bias=False) for _, k, n in LAYER)

    def forward(self, xs):
        return [lin(x) for lin, x in zip(self.linears, xs)]


def without_pdl(stack):
    """The stack with programmatic dependent launch off (FP8EXT_PDL=0 is read at
    each launch, and a CUDA graph keeps what was set while it was captured)."""
    def run(xs):
        os.environ["FP8EXT_PDL"] = "0"
        try:
            return stack(xs)
        finally:
            del os.environ["FP8EXT_PDL"]
    return run


def variants():
    """name -> function(stack in bf16) -> callable stack, or a string saying why it is skipped."""
    out = {"bf16 nn.Linear": lambda s: s}
    # torchao's Float8DynamicActivationFloat8WeightConfig defaults to FP8 fast
    # accumulation (Float8MMConfig(use_fast_accum=True), torchao 0.18): the
    # ", fast accum" rows are the like-for-like comparison with it.
    for label, recipe in (("fp8ext per-tensor", fp8ext.CurrentScaling()), ("fp8ext row-wise", fp8ext.RowWise()),
                          ("fp8ext per-tensor, fast accum", fp8ext.CurrentScaling(fast_accum=True)),
                          ("fp8ext row-wise, fast accum", fp8ext.RowWise(fast_accum=True))):
        out[label] = (lambda r: lambda s: (fp8ext.convert(s, r), s)[1])(recipe)
    out["fp8ext row-wise, PDL off"] = lambda s: without_pdl((fp8ext.convert(s, fp8ext.RowWise()), s)[1])
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

        for label, gran in (("torchao per-tensor (compiled)", PerTensor()), ("torchao per-row (compiled)", PerRow())):
            def make(s, gran=gran):
                quantize_(s, Float8DynamicActivationFloat8WeightConfig(granularity=gran))
                return torch.compile(s)
            out[label] = make
    except ImportError as e:
        out["torchao"] = f"skipped: torchao is not installed ({e})"
    return out


def breakdown(ms: list):
    """Where an fp8ext layer's time goes at each M in ms: its activation quantization
    and its GEMM timed apart (graph-timed, weights rotated), with cuBLAS's scaled_mm
    on the same operands as the GEMM's anchor."""
    rows = []
    for label, recipe in (("per-tensor", fp8ext.CurrentScaling()), ("row-wise", fp8ext.RowWise())):
        # Per layer, enough copies of its FP8 weight to exceed L2 twice (o: 8 x 16.8 MB).
        lins = [[fp8ext.nn.FP8Linear.from_linear(nn.Linear(k, n, bias=False).to("cuda", torch.bfloat16), recipe)
                 for _ in range(max(COPIES, copies_past_l2(n * k)))] for _, k, n in LAYER]
        for m in ms:
            for (name, k, n), copies in zip(LAYER, lins):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                q, s = fp8ext.quantize(x, recipe, "activation", pad_k_to=16)
                t_q = graph_time_ms(lambda: fp8ext.quantize(x, recipe, "activation", pad_k_to=16))
                t_mm = graph_time_rotating_ms(lambda w: fp8ext.scaled_mm(q, w.weight, s, w.weight_scale), copies)
                row = {"op": "linear_breakdown", "variant": f"fp8ext {label}", "layer": name, "M": m,
                       "quantize_ms": round(t_q, 5), "gemm_ms": round(t_mm, 5)}
                try:
                    sb = lambda w: w.weight_scale.reshape(1, -1) if w.weight_scale.dim() else w.weight_scale
                    sa = s.reshape(-1, 1) if s.dim() else s
                    cublas = lambda w: torch._scaled_mm(q, w.weight.t(), sa, sb(w), out_dtype=torch.bfloat16)  # noqa: E731
                    check_output(fp8ext.scaled_mm(q, copies[0].weight, s, copies[0].weight_scale), cublas(copies[0]),
                                 f"{label} {name} M={m}")
                    t_cb = graph_time_rotating_ms(cublas, copies)
                    row["cublas_gemm_ms"] = round(t_cb, 5)
                except RuntimeError as e:
                    row["cublas_note"] = str(e)[:120]
                rows.append(row)
    print_table(rows, ["variant", "layer", "M", "quantize_ms", "gemm_ms", "cublas_gemm_ms"])
    return rows


def time_stacks(built: dict, xs: list) -> tuple:
    """Every variant's stack on inputs xs, each captured in a CUDA graph that goes
    round its copies (weights past L2), the graphs timed in alternating bursts
    (benchlib.time_interleaved_ms) so that all variants meet the same clock
    drift. Returns name -> ms per stack call, and name -> per-round ms."""
    graphs = {}
    with torch.no_grad():
        for name, stacks in built.items():
            call, calls = rotating(lambda s: s(xs), stacks)
            graphs[name] = (capture_graph(call, calls), calls)
    times, rounds = time_interleaved_ms([g for g, _ in graphs.values()])
    per_call = {name: t / n for (name, (_, n)), t in zip(graphs.items(), times)}
    per_round = {name: [t / n for t in r] for (name, (_, n)), r in zip(graphs.items(), rounds)}
    return per_call, per_round


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--ms", type=int, nargs="+", default=M_ALL, help="only these M (default: the suite's)")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-layer quantize/GEMM breakdown")
    args = ap.parse_args()
    torch.manual_seed(0)
    base = [Stack().to("cuda", torch.bfloat16) for _ in range(COPIES)]
    rows, built = [], {}
    for name, make in variants().items():
        if isinstance(make, str):
            rows.append({"op": "linear_stack", "variant": name, "note": make})
            print(name, make)
        else:
            built[name] = [make(copy.deepcopy(s)) for s in base]
    for m in args.ms:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k, _ in LAYER]
        ref = [torch.nn.functional.linear(x, lin.weight) for x, lin in zip(xs, base[0].linears)]
        errors = {}
        for name, stacks in built.items():
            with torch.no_grad():
                got = stacks[0](xs)
            errors[name] = max(check_output(g, r, f"{name} M={m}", ROW_ERROR_BOUND, columns=False)
                               for g, r in zip(got, ref))
        times, rounds = time_stacks(built, xs)
        torchao = [name for name in times if name.startswith("torchao")]
        # The faster torchao variant in each round is the anchor of that round.
        anchor_rounds = [min(r) for r in zip(*(rounds[n] for n in torchao))] if torchao else None
        for name, t in times.items():
            print(f"{name} M={m}: {t:.5f} ms", flush=True)
            row = {"op": "linear_stack", "variant": name, "M": m, "ms": round(t, 5),
                   "worst_row_rel_error": round(errors[name], 4),
                   "timing": "cuda-graph, 3 layers' weights rotated, all variants in alternating bursts",
                   "rounds_ms": [round(x, 5) for x in rounds[name]]}
            if name.startswith("fp8ext"):
                if anchor_rounds:
                    row["anchor"] = "torchao, faster variant (per round)"
                    row["ratio_vs_torchao"] = round(round_ratio(anchor_rounds, rounds[name]), 3)
                row["ratio_vs_bf16"] = round(round_ratio(rounds["bf16 nn.Linear"], rounds[name]), 3)
            rows.append(row)
        torch.cuda.empty_cache()
    del built
    torch.cuda.empty_cache()
    if not args.no_breakdown:
        rows += breakdown(args.ms)
    path = write_results(args.out, "linear_stack", rows)
    print(f"wrote {path}")
    print_table([r for r in rows if "M" in r and r["op"] == "linear_stack"],
                ["variant", "M", "ms", "ratio_vs_torchao", "ratio_vs_bf16", "worst_row_rel_error"])


if __name__ == "__main__":
    main()
