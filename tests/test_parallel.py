"""Tensor-parallel FP8Linear on 2 CPU processes (gloo, through the CPU
reference): a column-parallel layer feeding a row-parallel one, as in a
Megatron MLP, against the same unsharded layers. Column shards and the
unquantized layers must agree exactly; FP8 row shards quantize their slice of
the input with their own scales, so TP = 2 is held to TP = 1's distance from a
float64 reference instead."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from fp8ext import parallel
from fp8ext.nn.linear import FP8Linear
from fp8ext.recipes import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, RowWise

RECIPES = {"per_tensor": CurrentScaling(), "row": RowWise(), "block": BlockWise(), "static": PerTensorStatic(),
           "delayed": DelayedScaling()}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (Frobenius), in float64."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def assert_fp8_tp2_close(got, want, hi, label, eps=1e-4, max_fp8_err=0.1):
    """got (TP = 2) may differ from want (TP = 1, the same FP8 layers unsharded)
    by FP8 noise: it must be about as close to hi (unquantized) as want is, and
    its distance to want must be of the size of want's own FP8 error, which
    itself must be FP8-sized (below max_fp8_err), so that a fault both share
    cannot pass."""
    e_want, e_got, e_diff = rel_err(want, hi), rel_err(got, hi), rel_err(got, want)
    msg = f"{label}: err(tp2, hi)={e_got:.4g} err(tp1, hi)={e_want:.4g} err(tp2, tp1)={e_diff:.4g}"
    assert e_want <= max_fp8_err, msg
    assert e_got <= 1.25 * e_want + eps, msg
    assert e_diff <= 1.5 * e_want + eps, msg


def _linears(seed):
    torch.manual_seed(seed)
    up, down = nn.Linear(192, 512), nn.Linear(512, 160)
    with torch.no_grad():
        for layer in (up, down):
            layer.weight.mul_(1 + torch.arange(layer.in_features) // 128)  # each block of K its own scale
            layer.bias.mul_(8)  # as large as the outputs, so a bias added twice shows
    x = torch.randn(32, 192)  # enough rows that the FP8 error norms are stable from seed to seed
    x[3, 5] = 40.0  # an outlier: it sets the per-tensor scale and row 3's per-token scale
    return up, down, x


def _mlp(up, down, x):
    return down(torch.relu(up(x)))


def _worker(rank, world, init_file, seed):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        up_hp, down_hp, x = _linears(seed)
        hi = _mlp(lambda t: F.linear(t, up_hp.weight.double(), up_hp.bias.double()),
                  lambda t: F.linear(t, down_hp.weight.double(), down_hp.bias.double()), x.double())
        # Unquantized shards: the same products, summed in another order.
        got = _mlp(parallel.shard(up_hp, "column"), parallel.shard(down_hp, "row"), x)
        assert rel_err(got, hi) < 1e-5, rel_err(got, hi)
        hidden = slice(rank * 512 // world, (rank + 1) * 512 // world)
        for name, recipe in RECIPES.items():
            up, down = FP8Linear.from_linear(up_hp, recipe), FP8Linear.from_linear(down_hp, recipe)
            if recipe.activation_mode == "static":  # calibrated by hand: the amax of each layer's input
                up.input_scale.fill_(x.abs().max() / 448)
                down.input_scale.fill_(torch.relu(up(x)).abs().max() / 448)
            col, row = parallel.shard(up, "column"), parallel.shard(down, "row")
            for call in range(2):  # delayed scaling's second call uses the amax history of the first
                h = up(x)
                want = down(torch.relu(h))
                h_local = col(x)
                torch.testing.assert_close(h_local, h[:, hidden], rtol=0, atol=0)  # replicated input: same codes
                got = row(torch.relu(h_local))
                assert got.dtype == want.dtype and got.shape == want.shape
                assert_fp8_tp2_close(got, want, hi, f"{name}, call {call}")
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


def test_sharding_refuses_what_it_cannot_do():
    layer = FP8Linear.from_linear(nn.Linear(256, 256), CurrentScaling())
    with pytest.raises(RuntimeError, match="torch.distributed must be initialized"):
        parallel.shard(layer, "column")
    with pytest.raises(ValueError, match="style must be one of"):
        parallel.shard(layer, "diagonal")
    with pytest.raises(TypeError, match="layer must be an FP8Linear or a plain nn.Linear"):
        parallel.shard(nn.Conv1d(4, 4, 1), "row")
    for bad in ("False", 0, None):  # used as a truth value, "False" would gather
        with pytest.raises(TypeError, match="gather_output must be a bool"):
            parallel.shard(layer, "column", gather_output=bad)
    with pytest.raises(TypeError, match=r"layer must be an FP8Linear \(fp8ext.parallel.shard takes an nn.Linear"):
        parallel.TensorParallelFP8Linear(nn.Linear(4, 4), "column")
    with pytest.raises(TypeError, match=r"layer must be a plain nn.Linear \(TensorParallelFP8Linear takes"):
        parallel.TensorParallelLinear(layer, "column")  # its FP8 codes would be taken as the weight (helper-63)
    for bad in ((100,), (128, 256), (0, 256), (-16, 272), (128.0, 128.0), (), 32):
        with pytest.raises(ValueError, match=r"parts must be positive ints adding up to out_features \(256\)"):
            parallel.shard(layer, "column", parts=bad)


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

    def build(recipe, gain=1.0):
        model = LlamaModel.random(cfg, torch.float32, "cpu", seed)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(gain)
        return model.quantize(recipe) if recipe is not None else model

    def tp1_and_tp2(recipe, cache_dtype, gain=1.0):
        """(the unsharded model, its KV scales), (this rank's shard, its KV head's scales)."""
        full = build(recipe, gain)
        scales = full.kv_scales(prompts) if cache_dtype == torch.float8_e4m3fn else None
        part = shard_model(build(recipe, gain))
        assert part.cfg.num_kv_heads == 1 and part.cfg.num_heads == 2
        local = None if scales is None else [{k: v[rank:rank + 1] for k, v in entry.items()} for entry in scales]
        return (full, scales), (part, local)

    def cache_for(model, cache_dtype, scales):
        c = model.cfg
        return PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, 32, 16, cache_dtype, scales=scales)

    def teacher_forced(model, cache_dtype, scales):
        """Logits of a prefill and three decode steps fed the same tokens: FP8 at TP = 2
        may pick other greedy tokens than TP = 1, which would make the runs incomparable."""
        cache = cache_for(model, cache_dtype, scales)
        slots = [cache.append(i, len(p)) for i, p in enumerate(prompts)]
        logits = [model.prefill([torch.tensor(p) for p in prompts], slots, cache)]
        for step in range(3):
            tokens = torch.tensor([p[step] for p in prompts])  # fixed inputs
            step_slots = torch.cat([cache.append(i, 1) for i in range(len(prompts))])
            positions = torch.tensor([len(p) + step for p in prompts])
            logits.append(model.decode(tokens, positions, step_slots, cache.plan(range(len(prompts))), cache))
        return torch.stack(logits)

    def generate(model, cache_dtype, scales):
        return Engine(model, cache_for(model, cache_dtype, scales)).generate(prompts, 8)

    try:
        # Unquantized: the same products summed in another order, so the same greedy tokens
        # (weights 8x random()'s, so that the tokens vary).
        (full, _), (part, _) = tp1_and_tp2(None, torch.float32, gain=8.0)
        err = rel_err(teacher_forced(part, torch.float32, None), teacher_forced(full, torch.float32, None))
        assert err < 1e-5, err
        assert generate(part, torch.float32, None) == generate(full, torch.float32, None)
        # FP8 (random()'s weight scale: errors of a few %): TP = 2 against TP = 1 and the unquantized model.
        hi = teacher_forced(build(None), torch.float32, None)
        for recipe, cache_dtype in ((CurrentScaling(), torch.float32), (DelayedScaling(), torch.float32),
                                    (RowWise(), torch.float8_e4m3fn)):
            (full, scales), (part, local) = tp1_and_tp2(recipe, cache_dtype)
            got, want = teacher_forced(part, cache_dtype, local), teacher_forced(full, cache_dtype, scales)
            assert_fp8_tp2_close(got, want, hi, f"{type(recipe).__name__}, {cache_dtype}")
            assert [len(t) for t in generate(part, cache_dtype, local)] == [8] * len(prompts)
    finally:
        dist.destroy_process_group()


def test_serving_model_at_tp2_matches_tp1(seed):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_serving_worker, args=(2, os.path.join(d, "rendezvous"), seed), nprocs=2, join=True)


def test_shard_model_checks_every_projection_before_changing_any():
    from fp8ext.recipes import BlockWise
    from fp8ext.serving import LlamaConfig, LlamaModel
    from fp8ext.serving.tensor_parallel import _check_shardable
    cfg = LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=192, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=128)  # attention shards: whole blocks; the MLP's: not
    model = LlamaModel.random(cfg, torch.float32).quantize(BlockWise())
    # 192 / 2 = 96 rows per shard: not whole 128-row blocks. shard_model asks this before any change.
    with pytest.raises(ValueError, match="layers.0.gate_up: out_features part of 192 rows"):
        _check_shardable(model, 2)


# ---- world 1 ---------------------------------------------------------------------


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", ["block", "row", "per_tensor"])
def test_world_of_one_shards_any_shape_into_the_whole_layer(world_of_one, name, seed):
    # SmolLM2-135M's sizes: 576 is not a multiple of 128, so no block-wise shard
    # could be cut at world 2; at world 1 the shard is the layer.
    torch.manual_seed(seed)
    qkv = FP8Linear.from_linear(nn.Linear(576, 576 + 192 + 192), RECIPES[name])
    o = FP8Linear.from_linear(nn.Linear(576, 576), RECIPES[name])
    x = torch.randn(5, 576)
    for gather in (False, True):
        col = parallel.shard(qkv, "column", gather_output=gather, parts=(576, 192, 192))
        torch.testing.assert_close(col(x), qkv(x), rtol=0, atol=0)
    torch.testing.assert_close(parallel.shard(o, "row")(x), o(x), rtol=0, atol=0)


def test_shards_name_a_wrong_input_width_and_shard_model_its_arguments(world_of_one):
    from fp8ext.serving.tensor_parallel import shard_model
    layer = nn.Linear(64, 32)
    for style in ("column", "row"):
        with pytest.raises(ValueError, match=r"x must be .*\[\.\.\., 64\], got \(3, 63\)"):
            parallel.shard(layer, style)(torch.randn(3, 63))
    with pytest.raises(TypeError, match="model must be a fp8ext.serving.LlamaModel, got Linear"):
        shard_model(layer)
    from fp8ext.serving import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=16)
    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup or None, got str"):
        shard_model(LlamaModel.random(cfg, torch.float32), group="x")


def test_serving_model_shards_at_world_one_whatever_its_sizes(world_of_one, seed):
    from fp8ext.kv_cache import PagedKVCache
    from fp8ext.serving import Engine, LlamaConfig, LlamaModel
    from fp8ext.serving.tensor_parallel import _check_shardable, shard_model
    cfg = LlamaConfig(vocab_size=97, hidden_size=192, intermediate_size=320, num_layers=1, num_heads=3,
                      num_kv_heads=1, head_dim=64)
    full, part = (LlamaModel.random(cfg, torch.float32, "cpu", seed).quantize(BlockWise()) for _ in range(2))
    with pytest.raises(ValueError, match="layers.0.qkv"):  # every size here refuses a 2-way block-wise split
        _check_shardable(full, 2)
    part = shard_model(part)
    prompts = [torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist() for n in (3, 20)]

    def generate(model):
        return Engine(model, PagedKVCache(1, 1, 64, 16, 16, torch.float32)).generate(prompts, 6)

    assert generate(part) == generate(full)
