"""One process, bench_linear's FP8Linear stack (one Llama-3.1-8B layer's four
linears, activation quantization included, graph-timed, 3 layers' weights
rotated): fp8ext's recipes timed under each setting of environment variables
the library reads at launch (a CUDA graph keeps what was set while it was
captured), interleaved over rounds, outputs checked equal across settings; with
--torchao, torchao's compiled per-tensor and per-row stacks timed each round as
the anchor.

    python3 scripts/device/ab_linear_env.py --settings - FP8EXT_GEMM_PREFETCH_MB=4 [--m 16 128] \
        [--rounds 3] [--torchao] [--out DIR]

A setting is "VAR=VALUE,VAR=VALUE" or "-" for none; every variable any setting
names is unset before each setting.
"""
import argparse
import copy
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_linear import COPIES, LAYER, ROW_ERROR_BOUND, Stack, variants  # noqa: E402
from benchlib import apply_env, check_output, env_setting, graph_time_rotating_ms, same_output, write_record  # noqa: E402

import fp8ext  # noqa: E402

RECIPES = {"per-tensor": fp8ext.CurrentScaling, "row-wise": fp8ext.RowWise}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", nargs="+", required=True)
    ap.add_argument("--m", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torchao", action="store_true")
    ap.add_argument("--close", action="store_true",
                    help="settings may change a sum's order (split-K): outputs agree within 1e-2, not bit for bit")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    base = [Stack().to("cuda", torch.bfloat16) for _ in range(COPIES)]

    def converted(s, recipe):
        fp8ext.convert(s, recipe)  # in place
        return s

    stacks = {name: [converted(copy.deepcopy(s), recipe()) for s in base] for name, recipe in RECIPES.items()}
    anchors = {}
    if args.torchao:
        for name, make in variants().items():
            if name.startswith("torchao") and not isinstance(make, str):
                anchors[name] = [make(copy.deepcopy(s)) for s in base]
    inputs = {m: [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k, _ in LAYER] for m in args.m}
    named = {v for st in args.settings for v in env_setting(st)}
    ref, times, anchor_times = {}, {}, {}
    with torch.no_grad():
        for rnd in range(args.rounds):
            for st in args.settings:
                apply_env(env_setting(st), named)
                for name, ss in stacks.items():
                    for m, xs in inputs.items():
                        if rnd == 0:
                            outs = ss[0](xs)
                            for y, x, lin in zip(outs, xs, base[0].linears):  # against bf16 (bench_linear's bound)
                                check_output(y, torch.nn.functional.linear(x, lin.weight), f"{name} M={m} {st}",
                                             ROW_ERROR_BOUND, columns=False)
                            got = torch.cat([y.flatten() for y in outs])
                            assert same_output(got, ref.setdefault((name, m), got), not args.close), (name, m, st)
                        times.setdefault((st, name, m), []).append(graph_time_rotating_ms(lambda s: s(xs), ss) * 1e3)
            apply_env({}, named)
            for name, ss in anchors.items():
                for m, xs in inputs.items():
                    anchor_times.setdefault((name, m), []).append(graph_time_rotating_ms(lambda s: s(xs), ss) * 1e3)
    rows = []
    for (st, name, m), t in times.items():
        us = statistics.median(t)
        best = min((statistics.median(v) for (a, am), v in anchor_times.items() if am == m), default=None)
        rows.append({"setting": st, "recipe": name, "M": m, "us": round(us, 2), "us_rounds": [round(v, 2) for v in t],
                     "torchao_best_us": round(best, 2) if best else None,
                     "ratio_vs_torchao": round(best / us, 3) if best else None})
        print(f"{st:40s} {name:10s} M={m:5d} {us:8.2f} us" + (f"  {best / us:.3f}x torchao" if best else ""))
    for (name, m), t in anchor_times.items():
        print(f"{name:40s} M={m:5d} {statistics.median(t):8.2f} us")
    if args.out:
        write_record(args.out, "ab_linear_env", {
            "settings": args.settings, "rows": rows,
            "torchao": {f"{n} M={m}": round(statistics.median(t), 2) for (n, m), t in anchor_times.items()}})


if __name__ == "__main__":
    main()
