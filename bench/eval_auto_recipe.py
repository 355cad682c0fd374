"""recipe="auto" on SmolLM2-135M-Instruct (CPU reference path): per-layer
estimates from calibration text (from token 8192 of lee_background.cor; 4096
tokens unless --calibration-tokens says otherwise, at most 8192), then
perplexity for several max_error budgets on the first 8192 tokens (the issue's
protocol) and on 16384 held-out tokens (16384..32768), with the share of the
decoder linears' FLOPs left in FP8 (issue 7's targets: within 1.5% of float32
with >= 90% of FLOPs in FP8, within 1.0% with >= 80%). Weights are
GPTQ-rounded on the calibration text (convert's default for auto) unless
--weight-rounding nearest.

    python bench/eval_auto_recipe.py --out DIR [--budgets 0.01 0.02 ...] [--weight-rounding nearest]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

import torch

from fp8ext import evaluation
from fp8ext.nn.auto import DEFAULT_CANDIDATES, choose_from_errors, measure_errors
from fp8ext.nn.convert import WEIGHT_ROUNDINGS, replace_linear, select_linears
from fp8ext.nn.gptq import input_hessians

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import print_table, write_results  # noqa: E402

BUDGETS = (0.005, 0.01, 0.015, 0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS))
    ap.add_argument("--name", default="auto_recipe_smollm2", help="results file name (without .json)")
    ap.add_argument("--calibration-tokens", type=int, default=4096, help="from token 8192 on (at most 8192)")
    ap.add_argument("--weight-rounding", choices=WEIGHT_ROUNDINGS, default="gptq")
    args = ap.parse_args()
    model, tokenizer = evaluation.load_smollm2()
    ids = tokenizer(evaluation.lee_background_text(), add_special_tokens=False, return_tensors="pt").input_ids[0]
    n_cal = min(args.calibration_tokens, 8192) // 512
    evaluate, calibrate = ids[:8192].reshape(16, 512), ids[8192:8192 + 512 * n_cal].reshape(n_cal, 512)
    held_out = ids[16384:32768].reshape(32, 512)
    base = evaluation.perplexity(model, evaluate)
    base_held_out = evaluation.perplexity(model, held_out)
    names, _ = select_linears(model)
    batches = [calibrate[i:i + 2] for i in range(0, n_cal, 2)]
    hessians = input_hessians(model, names, batches) if args.weight_rounding == "gptq" else {}
    errors = measure_errors(model, names, batches, DEFAULT_CANDIDATES, hessians=hessians)
    rows = [{"op": "auto_recipe_layer_estimates", "candidate": label,
             "median": round(statistics.median(errors[n][label] for n in names), 6),
             "max": round(max(errors[n][label] for n in names), 6),
             "sum": round(sum(errors[n][label] for n in names), 5)} for label, _ in DEFAULT_CANDIDATES]
    for budget in args.budgets:
        choice = choose_from_errors(model, names, errors, budget, DEFAULT_CANDIDATES)
        m = copy.deepcopy(model)
        for name, recipe in choice.recipes.items():
            if recipe is not None:
                replace_linear(m, name, recipe, hessians.get(name))
        p = evaluation.perplexity(m, evaluate)
        p_held_out = evaluation.perplexity(m, held_out)
        counts = {label: sum(1 for n in names if choice.labels[n] == label) for label, _ in DEFAULT_CANDIDATES}
        rows.append({"op": "auto_recipe", "model": "SmolLM2-135M-Instruct", "max_error": budget,
                     "calibration_tokens": calibrate.numel(), "weight_rounding": args.weight_rounding,
                     "fp8_flop_pct": round(100 * choice.fp8_flop_fraction, 1), "perplexity": round(p, 4),
                     "float32_perplexity": round(base, 4), "delta_pct": round(100 * (p / base - 1), 2),
                     "estimated_pct": round(100 * choice.estimated_increase, 2),
                     "held_out_16k_delta_pct": round(100 * (p_held_out / base_held_out - 1), 2),
                     "layers_per_recipe": counts, "layers_kept": sum(1 for n in names if choice.recipes[n] is None)})
        print(rows[-1], flush=True)
    path = write_results(args.out, args.name, rows)
    print(f"wrote {path}")
    print_table([r for r in rows if r["op"] == "auto_recipe"],
                ["max_error", "fp8_flop_pct", "perplexity", "delta_pct", "estimated_pct", "held_out_16k_delta_pct",
                 "layers_kept"])


if __name__ == "__main__":
    torch.set_num_threads(os.cpu_count() or 1)
    main()
