"""Does a large GEMM's time depend on where its output lies? cuBLAS
(torch._scaled_mm, per-tensor, bf16 out) timed as several copies of one call,
each copy's CUDA graph writing either its own output buffer or one buffer
shared by all copies, all graphs in alternating bursts. If the copies with
their own buffers spread wider than the shared ones, output placement (DRAM
channels, L2 slices) is part of the noise between graphs of one kernel
(bench/NOTES.md, session 26: 149 against 160 us for one kernel and setting).
Needs no fp8ext build.

    python scripts/device/output_placement.py [--mnk 8192 8192 1024 4096 4096 1024] [--copies 6] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import capture_graph, gemm_scales, time_interleaved_ms, write_record  # noqa: E402

F8 = torch.float8_e4m3fn
CALLS = 20  # per graph


def spread(values: list) -> float:
    return max(values) / min(values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mnk", type=int, nargs="+", default=[8192, 8192, 1024, 4096, 4096, 1024])
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--fast-accum", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    results = []
    for m, n, k in zip(args.mnk[::3], args.mnk[1::3], args.mnk[2::3]):
        sa, sb = gemm_scales(m, n, row_wise=False)
        a = (torch.randn(m, k, device="cuda") * 2).to(F8)
        b = (torch.randn(n, k, device="cuda") * 2).to(F8)
        own = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(args.copies)]
        shared = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def call(out):
            return lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                            use_fast_accum=args.fast_accum, out=out)
        graphs = [capture_graph(call(o), CALLS) for o in own] + [capture_graph(call(shared), CALLS)
                                                                 for _ in range(args.copies)]
        medians, _ = time_interleaved_ms(graphs, rounds=args.rounds)
        us = [ms * 1e3 / CALLS for ms in medians]
        own_us, shared_us = us[:args.copies], us[args.copies:]
        row = {"m": m, "n": n, "k": k, "fast_accum": args.fast_accum,
               "own_output_us": [round(x, 2) for x in own_us],
               "own_output_addresses_mod_2MiB": [o.data_ptr() % (2 << 20) for o in own],
               "shared_output_us": [round(x, 2) for x in shared_us],
               "own_spread": round(spread(own_us), 4), "shared_spread": round(spread(shared_us), 4)}
        results.append(row)
        print(f"{m}x{n}x{k}  own outputs {' '.join(f'{x:7.2f}' for x in own_us)}  (max/min {row['own_spread']:.3f})")
        print(f"{'':>{len(f'{m}x{n}x{k}')}}  one output  {' '.join(f'{x:7.2f}' for x in shared_us)}"
              f"  (max/min {row['shared_spread']:.3f})", flush=True)
        del a, b, own, shared, graphs
    if args.out:
        write_record(args.out, "gemm_output_placement", {
            "rows": results, "note": "cuBLAS per-tensor bf16; graph of 20 calls per copy; alternating bursts"})


if __name__ == "__main__":
    main()
