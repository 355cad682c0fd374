"""A/B of environment switches on the serving engine's decode step, in one
process: the same W8A8 + FP8 KV model, each variant's graph captured and timed
in turn, twice round (so drift shows), at batch 1 and 64, context 4096.

    python3 scripts/device/ab_serve_env.py --variants "" "FP8EXT_FUSED_QUANT=0" [--out DIR]

A variant is a space-separated list of NAME=VALUE; the empty string is the
default engine. Switches are read when a graph is captured, so each capture
sees its own variant.
"""
import argparse
import json
import os

import torch

from fp8ext.recipes import RowWise
from fp8ext.serving.bench import engine_decode
from fp8ext.serving.config import LlamaConfig
from fp8ext.serving.model import LlamaModel


def set_variant(variant: str, names: set) -> None:
    for name in names:
        os.environ.pop(name, None)
    for item in variant.split():
        name, value = item.split("=", 1)
        os.environ[name] = value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    names = {item.split("=", 1)[0] for v in args.variants for item in v.split()}
    model = LlamaModel.random(LlamaConfig.llama3_8b(32), torch.bfloat16, "cuda").quantize(RowWise())
    rows = []
    for rnd in range(args.rounds):
        for variant in args.variants:
            set_variant(variant, names)
            for batch in args.batches:
                r = engine_decode(model, torch.float8_e4m3fn, batch, args.context, repeats=20)
                rows.append(dict(r, variant=variant or "default", batch=batch, context=args.context, round=rnd))
                print(rows[-1], flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ab_serve_env.json"), "w") as f:
            json.dump(dict(commit=os.environ.get("FP8EXT_COMMIT", "unknown"), gpu=torch.cuda.get_device_name(0),
                           torch=torch.__version__, mode="w8a8+fp8kv", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
