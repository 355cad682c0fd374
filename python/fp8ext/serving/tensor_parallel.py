"""The serving model across GPUs: Megatron-style tensor parallelism with
fp8ext.parallel's shards. Each rank keeps 1/world of the query and KV heads
(the fused QKV projection is split per part, column-parallel; the output
projection row-parallel) and 1/world of the MLP's intermediate features
(gate_up column-parallel, down row-parallel), so a decoder layer costs two
output all-reduces (row shards quantize with their own activation scales, no
collective before the GEMM). Embeddings, norms and the LM head stay whole on every rank.
Each rank runs its own Engine and PagedKVCache (its KV heads only) over the
same request stream: the schedule is deterministic, so the collectives line
up, and every rank samples the same tokens from identical logits."""
from __future__ import annotations

import dataclasses

import torch.distributed as dist

from fp8ext import parallel
from fp8ext.nn.linear import FP8Linear
from fp8ext.serving.model import LlamaModel


def shard_model(model: LlamaModel, group=None) -> LlamaModel:
    """Turns ``model`` (quantized or not) into this rank's shard, in place."""
    if not isinstance(model, LlamaModel):
        raise TypeError(f"model must be a fp8ext.serving.LlamaModel, got {type(model).__name__}")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialized (dist.init_process_group) first")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    world = dist.get_world_size(group)
    cfg = model.cfg
    for name in ("num_heads", "num_kv_heads", "intermediate_size"):
        if getattr(cfg, name) % world:
            raise ValueError(f"{name} ({getattr(cfg, name)}) must divide by the {world} ranks")
    _check_shardable(model, world)  # before any layer changes: a refusal leaves the model whole
    local = dataclasses.replace(cfg, num_heads=cfg.num_heads // world, num_kv_heads=cfg.num_kv_heads // world,
                                intermediate_size=cfg.intermediate_size // world)
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        attn.qkv = parallel.shard(attn.qkv, "column", group, parts=cfg.qkv_sizes)
        attn.o = parallel.shard(attn.o, "row", group)
        attn.cfg = local
        mlp.gate_up = parallel.shard(mlp.gate_up, "column", group, parts=(cfg.intermediate_size,) * 2)
        mlp.down = parallel.shard(mlp.down, "row", group)
    model.cfg = local
    return model


def _check_shardable(model: LlamaModel, world: int) -> None:
    """What parallel.shard would refuse, asked of every projection first (block-wise
    layers need 128-multiples per shard), and no projection sharded twice."""
    cfg = model.cfg
    for i, layer in enumerate(model.layers):
        projections = {"qkv": (layer.attn.qkv, "column", cfg.qkv_sizes), "o": (layer.attn.o, "row", None),
                       "gate_up": (layer.mlp.gate_up, "column", (cfg.intermediate_size,) * 2),
                       "down": (layer.mlp.down, "row", None)}
        for name, (module, style, parts) in projections.items():
            if isinstance(module, (parallel.TensorParallelFP8Linear, parallel.TensorParallelLinear)):
                raise ValueError(f"layers.{i}.{name} is already sharded")
            blocks = isinstance(module, FP8Linear) and module.recipe.weight_granularity == "block"
            try:
                if style == "column":
                    parallel._rank_rows(parts, world, 0, blocks)
                else:
                    parallel._rank_cols(module.in_features, world, 0, blocks)
            except ValueError as e:
                raise ValueError(f"layers.{i}.{name}: {e}") from None
