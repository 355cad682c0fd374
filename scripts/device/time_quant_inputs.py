"""Times the quantize kernels on inputs with and without exact zeros, for an
A/B of two builds in separate processes (the second build installed with
`pip install --target DIR`, run with PYTHONPATH=DIR): each run appends one
JSON line per (input, op) to OUT, tagged with --label.

A part of 8 values holding a zero took the IEEE division path in the per-row,
per-group, per-block and per-tensor kernels (bench/NOTES.md, session 44):
ReLU-like activations (about half zeros) and zero padding rows send most parts
there, random normal data almost none.

    python3 scripts/device/time_quant_inputs.py --label main --out FILE [--shape 16384x8192]
"""
import argparse
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import time_ms  # noqa: E402

import fp8ext  # noqa: E402

F8 = torch.float8_e4m3fn


def inputs(m, k):
    """name -> bf16 [m, k]: bench_quantize's spread normal data, its ReLU (half
    zeros), and the same data with every other block of 64 rows zero (padding)."""
    torch.manual_seed(0)
    x = (torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-4, 4, (m, k), device="cuda").float()))
    padded = x.clone().view(-1, 64, k)
    padded[1::2] = 0
    return {"normal": x.bfloat16(), "relu": x.relu().bfloat16(), "padded_rows": padded.view(m, k).bfloat16()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="16384x8192")
    args = ap.parse_args()
    m, k = map(int, args.shape.split("x"))
    ops = torch.ops.fp8ext
    s = torch.tensor(0.05, device="cuda")
    by_name = {
        "static": lambda x: ops.quantize_with_scale(x, s, F8, 0),
        "per_tensor_current": lambda x: ops.quantize_per_tensor(x, F8, 0, False, 0),
        "per_token": lambda x: ops.quantize_per_row(x, F8, 0, False, 0),
        "group_1x128": lambda x: ops.quantize_per_group(x, F8, 0, False, 0),
        "block_128x128": lambda x: ops.quantize_per_block(x, F8, 0, False, 0),
    }
    with open(args.out, "a") as f:
        for input_name, x in inputs(m, k).items():
            for op_name, op in by_name.items():
                out = op(x)
                codes = out[0] if isinstance(out, tuple) else out
                digest = hashlib.sha1(codes.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:12]
                t = time_ms(lambda: op(x))
                rec = {"label": args.label, "input": input_name, "op": op_name, "shape": args.shape,
                       "us": round(1e3 * t, 2), "TBps_3B": round(3 * m * k / t / 1e9, 3), "codes_sha1": digest,
                       "fp8ext": os.path.dirname(fp8ext.__file__)}
                print(json.dumps(rec), flush=True)
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
