"""Perplexity of SmolLM2-135M-Instruct (float32, CPU) on lee_background.cor with
every linear but the LM head in FP8, per recipe and format (protocol in
fp8ext/evaluation.py; the issue's plain-PyTorch emulation measured float32
29.07, E4M3 per-tensor +2.6%, row-wise +3.0%, block-wise +2.7%, E5M2 +14.3%).

With --gptq, the E4M3 recipes also run with GPTQ-rounded weights
(convert(weight_rounding="gptq"), calibrated on the 8192 tokens after the
evaluated ones).

    python bench/eval_perplexity.py --out DIR [--tokens 8192] [--gptq]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

import fp8ext
from fp8ext import evaluation
from fp8ext.nn.convert import replace_linear, select_linears
from fp8ext.nn.gptq import input_hessians

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import print_table, write_results  # noqa: E402

RECIPES = {
    "e4m3 per-tensor (current)": fp8ext.CurrentScaling(),
    "e4m3 row-wise": fp8ext.RowWise(),
    "e4m3 block-wise": fp8ext.BlockWise(),
    "e5m2 per-tensor (current)": fp8ext.CurrentScaling(weight_format="e5m2", activation_format="e5m2"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--gptq", action="store_true", help="also the E4M3 recipes with GPTQ-rounded weights")
    args = ap.parse_args()
    model, tokenizer = evaluation.load_smollm2()
    windows = evaluation.token_windows(tokenizer, evaluation.lee_background_text(), max_tokens=args.tokens)
    t0 = time.time()
    base = evaluation.perplexity(model, windows)
    rows = [{"op": "perplexity", "model": "SmolLM2-135M-Instruct", "recipe": "float32", "tokens": windows.numel(),
             "perplexity": round(base, 4), "delta_pct": 0.0, "seconds": round(time.time() - t0, 1)}]
    runs = [(name, recipe, "nearest") for name, recipe in RECIPES.items()]
    if args.gptq:
        runs += [(name + " gptq", recipe, "gptq") for name, recipe in RECIPES.items() if name.startswith("e4m3")]
        ids = evaluation.token_windows(tokenizer, evaluation.lee_background_text(), max_tokens=args.tokens + 8192)
        calibration = [ids[i:i + 2] for i in range(windows.shape[0], ids.shape[0], 2)]
        hessians = input_hessians(model, select_linears(model)[0], calibration)  # the same for every recipe
    for name, recipe, rounding in runs:
        m = copy.deepcopy(model)
        for layer in select_linears(m)[0]:
            replace_linear(m, layer, recipe, hessians[layer] if rounding == "gptq" else None)
        t0 = time.time()
        p = evaluation.perplexity(m, windows)
        rows.append({"op": "perplexity", "model": "SmolLM2-135M-Instruct", "recipe": name, "tokens": windows.numel(),
                     "perplexity": round(p, 4), "delta_pct": round(100 * (p / base - 1), 2),
                     "seconds": round(time.time() - t0, 1), "path": "CPU reference", "weight_rounding": rounding})
        print(rows[-1], flush=True)
    path = write_results(args.out, "perplexity_smollm2", rows)
    print(f"wrote {path}")
    print_table(rows, ["recipe", "tokens", "perplexity", "delta_pct", "seconds"])


if __name__ == "__main__":
    main()
