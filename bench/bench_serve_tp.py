"""Serving at TP = 2 against TP = 1, one run (device kind nvidia-h200-x2):
decode step time of the engine on a Llama-3.1-8B-shaped model (random
weights) in bf16 and in W8A8 + E4M3 KV, at batch 1 and 64, context 4096.
TP = 1 runs on GPU 0 first; then two processes (NCCL) run the same steps.

    python bench/bench_serve_tp.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from fp8ext.serving import LlamaConfig, LlamaModel
from fp8ext.serving.bench import MODES, engine_decode
from fp8ext.serving.launch import spawn_on_gpus
from fp8ext.serving.tensor_parallel import shard_model

CASES = [(1, 4096), (64, 4096)]
BENCH_MODES = ("bf16", "w8a8+fp8kv")


def measure(model, kv_dtype) -> list:
    return [dict(batch=b, context=c, **engine_decode(model, kv_dtype, b, c, repeats=20)) for b, c in CASES]


def build(mode: str, layers: int):
    recipe, kv_dtype = MODES[mode]
    model = LlamaModel.random(LlamaConfig.llama3_8b(layers), torch.bfloat16, "cuda", seed=0)
    return (model.quantize(recipe) if recipe else model), kv_dtype


def tp_worker(rank, world, layers, path):
    rows = []
    for mode in BENCH_MODES:
        model, kv_dtype = build(mode, layers)
        rows += [dict(r, mode=mode, tp=world) for r in measure(shard_model(model), kv_dtype)]
        del model
        torch.cuda.empty_cache()
    if rank == 0:
        with open(path, "w") as f:
            json.dump(rows, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        print("bench_serve_tp: needs 2 GPUs (device kind nvidia-h200-x2); skipped")
        return
    info = {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "commit": os.environ.get("FP8EXT_COMMIT", "unknown"), "model": f"Llama-3.1-8B shape, {args.layers} layers"}
    rows = []
    for mode in BENCH_MODES:
        model, kv_dtype = build(mode, args.layers)
        rows += [dict(r, mode=mode, tp=1) for r in measure(model, kv_dtype)]
        del model
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    tp_path = os.path.join(args.out, "tp2_rows.json")
    spawn_on_gpus(tp_worker, 2, args.layers, tp_path)
    with open(tp_path) as f:
        rows += json.load(f)
    one = {(r["mode"], r["batch"]): r["step_ms"] for r in rows if r["tp"] == 1}
    for r in rows:
        r.update(info)
        r["speedup_vs_tp1"] = round(one[(r["mode"], r["batch"])] / r["step_ms"], 3)
    with open(os.path.join(args.out, "serve_tp.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'mode':<14}{'tp':>4}{'batch':>7}{'step ms':>10}{'tok/s':>10}{'vs tp1':>8}")
    for r in rows:
        print(f"{r['mode']:<14}{r['tp']:>4}{r['batch']:>7}{r['step_ms']:>10}{r['tokens_per_s']:>10}"
              f"{r['speedup_vs_tp1']:>7}x")


if __name__ == "__main__":
    main()
