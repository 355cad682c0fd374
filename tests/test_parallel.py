"""Tensor-parallel FP8Linear on 2 CPU processes (gloo, through the CPU
reference): a column-parallel layer feeding a row-parallel one, as in a
Megatron MLP, against the same unsharded FP8 layers."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from fp8ext import parallel
from fp8ext.nn.linear import FP8Linear
from fp8ext.recipes import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, RowWise

RECIPES = {"per_tensor": CurrentScaling(), "row": RowWise(), "block": BlockWise(), "static": PerTensorStatic()}


def _layers(recipe, seed):
    torch.manual_seed(seed)
    up = FP8Linear.from_linear(nn.Linear(192, 512, bias=True), recipe)
    down = FP8Linear.from_linear(nn.Linear(512, 160, bias=True), recipe)
    if recipe.activation_mode == "static":
        up.input_scale.fill_(0.02)
        down.input_scale.fill_(0.01)
    x = torch.randn(7, 192)  # float32 in and out: the check below can see a single changed code
    x[3, 5] = 40.0  # an outlier: its hidden features land on different ranks' slices
    return up, down, x


def _worker(rank, world, init_file, seed):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for name, recipe in RECIPES.items():
            up, down, x = _layers(recipe, seed)
            want = down(torch.relu(up(x)))
            col = parallel.shard(up, "column")
            row = parallel.shard(down, "row")
            h = torch.relu(col(x))  # this rank's 256 of the 512 hidden features
            assert h.shape == (7, 512 // world)
            got = row(h)
            assert got.dtype == want.dtype and got.shape == want.shape
            err = ((got.float() - want.float()).norm() / want.float().norm()).item()
            assert err < 1e-5, (name, err)  # the same codes and scales; only the summation order differs
            gathered = parallel.shard(up, "column", gather_output=True)(x)
            torch.testing.assert_close(gathered, up(x), rtol=0, atol=0)
            fused = FP8Linear.from_linear(nn.Linear(192, 768), recipe)  # q, k, v parts of 256 rows
            gathered = parallel.shard(fused, "column", gather_output=True, parts=(256, 256, 256))(x)
            torch.testing.assert_close(gathered, fused(x), rtol=0, atol=0)  # part by part, not rank by rank
    finally:
        dist.destroy_process_group()


def test_column_then_row_parallel_matches_the_unsharded_layers(seed):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(2, os.path.join(d, "rendezvous"), seed), nprocs=2, join=True)


def test_sharding_refuses_what_it_cannot_do_exactly():
    layer = FP8Linear.from_linear(nn.Linear(256, 256), CurrentScaling())
    with pytest.raises(RuntimeError, match="torch.distributed must be initialized"):
        parallel.shard(layer, "column")
    with pytest.raises(ValueError, match="delayed scaling is not supported"):
        parallel.shard(FP8Linear.from_linear(nn.Linear(256, 256), DelayedScaling()), "row")
    with pytest.raises(ValueError, match="style must be one of"):
        parallel.shard(layer, "diagonal")
    with pytest.raises(TypeError, match="layer must be an FP8Linear or an nn.Linear"):
        parallel.shard(nn.Conv1d(4, 4, 1), "row")


# ---- the serving model at TP = 2 --------------------------------------------------
def _serving_worker(rank, world, init_file, seed):
    from fp8ext.kv_cache import PagedKVCache
    from fp8ext.serving import Engine, LlamaConfig, LlamaModel
    from fp8ext.serving.tensor_parallel import shard_model
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (5, 17, 33)]

    def build(recipe):
        model = LlamaModel.random(cfg, torch.float32, "cpu", seed)
        with torch.no_grad():  # larger weights than random()'s, so greedy tokens vary
            for p in model.parameters():
                p.mul_(8)
        return model.quantize(recipe) if recipe is not None else model

    def run(model, cache_dtype, scales):
        c = model.cfg
        cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, 32, 16, cache_dtype, scales=scales)
        slots = [cache.append(i, len(p)) for i, p in enumerate(prompts)]
        logits = [model.prefill([torch.tensor(p) for p in prompts], slots, cache)]
        for step in range(3):
            tokens = logits[-1].argmax(-1)
            step_slots = torch.cat([cache.append(i, 1) for i in range(len(prompts))])
            positions = torch.tensor([len(p) + step for p in prompts])
            logits.append(model.decode(tokens, positions, step_slots, cache.plan(range(len(prompts))), cache))
        engine_cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, 32, 16, cache_dtype, scales=scales)
        return torch.stack(logits), Engine(model, engine_cache).generate(prompts, 8)

    try:
        for recipe, cache_dtype in ((None, torch.float32), (CurrentScaling(), torch.float32),
                                    (RowWise(), torch.float8_e4m3fn)):
            full = build(recipe)
            scales = full.kv_scales(prompts) if cache_dtype == torch.float8_e4m3fn else None
            want_logits, want_tokens = run(full, cache_dtype, scales)
            part = shard_model(build(recipe))
            assert part.cfg.num_kv_heads == 1 and part.cfg.num_heads == 2
            local_scales = None if scales is None else [
                {k: v[rank:rank + 1] for k, v in entry.items()} for entry in scales]  # this rank's KV head
            got_logits, got_tokens = run(part, cache_dtype, local_scales)
            err = ((got_logits - want_logits).norm() / want_logits.norm()).item()
            assert err < 1e-5, (recipe, cache_dtype, err)
            assert got_tokens == want_tokens, (recipe, cache_dtype)
    finally:
        dist.destroy_process_group()


def test_serving_model_at_tp2_matches_tp1(seed):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_serving_worker, args=(2, os.path.join(d, "rendezvous"), seed), nprocs=2, join=True)
