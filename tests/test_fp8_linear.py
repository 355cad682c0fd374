"""FP8Linear and convert: drop-in parity with nn.Linear, dtype/device moves,
state_dict round trips, conversion rules, torch.compile. CPU tests run the exact
reference path; the gpu-marked ones compare the CUDA path to it."""
import warnings

import pytest
import torch
from torch import nn

import fp8ext
from fp8ext import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, RowWise
from fp8ext.nn import FP8Linear, convert

from cuda_graphs import capture

RECIPES = {"current": CurrentScaling(), "row": RowWise(), "block": BlockWise(), "delayed": DelayedScaling(),
           "static": PerTensorStatic()}
# Relative Frobenius error of a W8A8 E4M3 linear against float64 on Gaussian data:
# two operands at ~2^-4 relative rounding each, averaged over K.
W8A8_TOLERANCE = 0.06


def emulate(linear: nn.Linear, x: torch.Tensor, recipe) -> torch.Tensor:
    """float64 reference of the FP8 linear: quantize both operands as the recipe says, dequantize, matmul."""
    w = linear.weight.detach()
    qw, sw = fp8ext.quantize(w, recipe, "weight")
    wd = fp8ext.dequantize(qw, sw, "block" if recipe.weight_granularity == "block" else None).double()
    x2 = x.reshape(-1, x.shape[-1])
    if recipe.activation_mode == "current":
        qx, sx = fp8ext.quantize(x2, recipe, "activation")
        xd = fp8ext.dequantize(qx, sx, "group" if recipe.activation_granularity == "group" else None).double()
    else:  # a fresh delayed state and an uncalibrated static one both quantize with scale 1
        xd = x2.float().to(recipe.activation_format.torch_dtype).double()
    y = xd @ wd.t()
    if linear.bias is not None:
        y = y + linear.bias.detach().double()
    return y.reshape(*x.shape[:-1], w.shape[0])


def rel_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("k,n", [(64, 48), (100, 30), (130, 257)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_fp8_emulation(recipe, k, n, bias, seed):
    r = RECIPES[recipe]
    linear = nn.Linear(k, n, bias=bias)
    x = torch.randn(2, 3, k) * (0.5 if r.activation_mode != "current" else 3.0)
    layer = FP8Linear.from_linear(linear, r)
    y = layer(x)
    assert y.shape == (2, 3, n) and y.dtype == torch.float32
    want = emulate(linear, x, r)
    assert rel_error(y, want) < 1e-5, "the CPU path computes the emulated function (fp32 accumulation)"
    assert rel_error(y, linear(x).double()) < W8A8_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_output_follows_input_dtype(dtype, seed):
    linear = nn.Linear(64, 32).to(dtype)
    layer = FP8Linear.from_linear(linear, RowWise())
    x = torch.randn(5, 64, dtype=dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (5, 32)
    assert rel_error(y, linear(x).double()) < W8A8_TOLERANCE
    # Against the emulated function, within the output dtype's rounding: an output 4% off
    # passed the W8A8 bound above (helper-37). Seeds 0-1499 give at most 2.05e-3 in bf16
    # and 2.6e-4 in fp16; an output 0.6% (bf16) or 0.15% (fp16) off fails (helper-61).
    assert rel_error(y, emulate(linear, x, RowWise())) < {torch.float32: 1e-5, torch.float16: 5e-4,
                                                           torch.bfloat16: 3e-3}[dtype]
    assert layer(x.float()).dtype == torch.float32  # any supported input dtype works


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_sets_the_compute_and_output_dtype_as_for_nn_linear(dtype, seed):
    linear = nn.Linear(64, 32)
    layer = FP8Linear.from_linear(linear, RowWise())
    x = torch.randn(5, 64)
    with torch.autocast("cpu", dtype=dtype):
        y = layer(x)
        assert y.dtype == linear(x).dtype == dtype
    assert torch.equal(y, layer(x.to(dtype)))  # the input cast as autocast casts it, nothing else changed
    with torch.autocast("cpu", dtype=dtype, enabled=False):
        assert layer(x).dtype == torch.float32

    def under_autocast(x):
        with torch.autocast("cpu", dtype=dtype):
            return layer(x)
    assert torch.equal(torch.compile(under_autocast, fullgraph=True, backend="aot_eager")(x), y)


def test_constructor_like_nn_linear():
    layer = FP8Linear(96, 40, bias=False, dtype=torch.bfloat16, recipe=RowWise())
    assert (layer.in_features, layer.out_features, layer.bias) == (96, 40, None)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight.shape == (40, 96)
    assert layer.weight_scale.shape == (40,) and layer.weight_scale.dtype == torch.float32
    assert layer(torch.randn(7, 96, dtype=torch.bfloat16)).shape == (7, 40)
    assert FP8Linear(20, 10).weight.shape == (10, 32), "K is stored padded to 16"
    assert "e4m3/per_channel" in repr(layer)


@pytest.mark.parametrize("cast", ["to_bf16", "half", "bfloat16", "float", "double"])
def test_casts_keep_fp8_weight_and_float32_scales(cast):
    layer = FP8Linear.from_linear(nn.Linear(32, 16), DelayedScaling(amax_history_len=4))
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    layer = layer.to(torch.bfloat16) if cast == "to_bf16" else getattr(layer, cast)()
    assert layer.weight.dtype == torch.float8_e4m3fn and torch.equal(layer.weight.view(torch.uint8),
                                                                     before["weight"].view(torch.uint8))
    for name in ("weight_scale", "input_scale", "amax_history"):
        assert getattr(layer, name).dtype == torch.float32
    want = {"to_bf16": torch.bfloat16, "half": torch.float16, "bfloat16": torch.bfloat16, "float": torch.float32,
            "double": torch.float64}[cast]
    assert layer.bias.dtype == want


def test_model_to_dtype_keeps_converted_layers_fp8():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    convert(model, RowWise())
    model.to(torch.bfloat16)
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in model if isinstance(m, FP8Linear))
    assert model(torch.randn(3, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_delayed_scaling_history_advances_each_call():
    layer = FP8Linear.from_linear(nn.Linear(16, 8), DelayedScaling(amax_history_len=3))
    x1, x2 = torch.full((4, 16), 2.0), torch.full((4, 16), -5.0)
    layer(x1)
    layer(x2)
    assert torch.equal(layer.amax_history, torch.tensor([5.0, 2.0, 0.0]))
    assert layer.input_scale.item() == pytest.approx(5.0 / 448.0)


def test_static_scale_is_used():
    layer = FP8Linear.from_linear(nn.Linear(16, 8, bias=False), PerTensorStatic())
    x = torch.randn(4, 16) * 1000
    coarse = layer(x)  # scale 1: values beyond 448 saturate
    layer.input_scale.fill_(x.abs().max().item() / 448.0)
    fine = layer(x)
    ref = nn.functional.linear(x, fp8ext.dequantize(layer.weight, layer.weight_scale, cols=16))
    assert rel_error(fine, ref.double()) < W8A8_TOLERANCE < rel_error(coarse, ref.double())


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_state_dict_round_trip_is_bit_identical(recipe, tmp_path, seed):
    r = RECIPES[recipe]
    src = FP8Linear.from_linear(nn.Linear(100, 24), r)
    if r.activation_mode == "static":
        src.input_scale.fill_(0.01)
    x = torch.randn(3, 100)
    src(torch.randn(2, 100) * 5)  # delayed: a non-trivial history and scale travel too
    from safetensors.torch import load_file, save_file

    path = tmp_path / "layer.safetensors"
    save_file(src.state_dict(), str(path))
    dst = FP8Linear(100, 24, recipe=r)
    dst.load_state_dict(load_file(str(path)))
    assert torch.equal(src(x), dst(x))


def test_bad_input_raises_clear_errors():
    layer = FP8Linear(16, 8)
    with pytest.raises(ValueError, match=r"input must be \[\.\.\., 16\]"):
        layer(torch.randn(4, 15))
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        layer([1.0] * 16)
    with pytest.raises(TypeError, match="input must be float32, float16 or bfloat16"):
        layer(torch.ones(4, 16, dtype=torch.int64))
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear"):
        FP8Linear.from_linear(nn.Conv1d(1, 1, 1))
    with pytest.raises(TypeError, match="recipe must be"):
        FP8Linear(16, 8, recipe="rowwise")


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm": nn.LayerNorm(32), "up": nn.Linear(32, 64), "down": nn.Linear(64, 32)})
            for _ in range(2))
        self.lm_head = nn.Linear(32, 50, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = h + b["down"](torch.relu(b["up"](b["norm"](h))))
        return self.lm_head(h)


def test_convert_keeps_lm_head_embeddings_and_norms():
    model = TinyLM()
    ids = torch.randint(0, 50, (2, 9))
    ref = model(ids)
    summary = convert(model, RowWise())
    assert [n for n, _ in summary.converted] == ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"]
    assert summary.skipped == [("lm_head", "LM head (high precision by default)")]
    assert type(model.lm_head) is nn.Linear and type(model.embed) is nn.Embedding
    assert isinstance(model.blocks[0]["norm"], nn.LayerNorm)
    assert rel_error(model(ids), ref.double()) < W8A8_TOLERANCE
    assert "converted 4 linear layers" in str(summary)


def test_convert_include_exclude_and_tied_weights():
    model = TinyLM()
    s = convert(model, CurrentScaling(), include="blocks.1.*", exclude=lambda name, m: name.endswith("down"))
    assert [n for n, _ in s.converted] == ["blocks.1.up"]
    assert ("blocks.1.down", "excluded") in s.skipped and ("blocks.0.up", "not included") in s.skipped
    tied = TinyLM()
    tied.lm_head.weight = tied.embed.weight
    s = convert(tied, keep_lm_head=False)
    assert ("lm_head", "weight tied to an embedding") in s.skipped
    s = convert(TinyLM(), keep_lm_head=False)
    assert "lm_head" in [n for n, _ in s.converted]
    for bad in ("False", None, 0):  # "False" kept the head, None and 0 converted it (helper-60)
        with pytest.raises(TypeError, match="keep_lm_head must be a bool"):
            convert(TinyLM(), keep_lm_head=bad)
    with pytest.warns(UserWarning, match="matches no nn.Linear"):
        s = convert(TinyLM(), include=[])  # an empty allow-list converts nothing
    assert s.converted == [] and ("blocks.0.up", "not included") in s.skipped


def test_a_second_convert_lists_the_layers_already_converted():
    model = TinyLM()
    convert(model, RowWise())
    with pytest.warns(UserWarning, match=r"matches no nn.Linear of the model \(2 matching layers are already "
                                         r"FP8Linear\)"):
        s = convert(model, PerTensorStatic(), include="blocks.1.*")
    assert s.converted == []
    assert ("blocks.1.up", "already FP8Linear (RowWise)") in s.skipped
    assert ("blocks.0.down", "already FP8Linear (RowWise)") in s.skipped
    assert model.blocks[1]["up"].recipe == RowWise()
    assert "kept 1 in high precision, 4 already FP8Linear" in str(s)
    with pytest.raises(ValueError, match="model is itself an FP8Linear"):
        convert(model.blocks[0]["up"], RowWise())


def test_convert_lists_the_linear_subclasses_it_keeps():
    class LoRALinear(nn.Linear):  # a subclass with its own forward: converting it would drop the adapter
        pass

    model = TinyLM()
    model.blocks[0]["up"] = LoRALinear(32, 64)
    mha = nn.MultiheadAttention(32, 4)  # its out_proj is NonDynamicallyQuantizableLinear
    model.add_module("attn", mha)
    s = convert(model, RowWise())
    assert type(model.blocks[0]["up"]) is LoRALinear and type(mha.out_proj) is not FP8Linear
    reasons = dict(s.skipped)
    assert reasons["blocks.0.up"] == "LoRALinear subclasses nn.Linear (its forward may differ)"
    assert "NonDynamicallyQuantizableLinear" in reasons["attn.out_proj"]
    assert [n for n, _ in s.converted] == ["blocks.0.down", "blocks.1.up", "blocks.1.down"]


def test_convert_static_warns_until_calibrated():
    with pytest.warns(UserWarning, match="input_scale is 1.0 until calibrated") as caught:
        convert(TinyLM(), PerTensorStatic())
    assert len([w for w in caught if "until calibrated" in str(w.message)]) == 1  # once, not once a layer
    with pytest.warns(UserWarning, match="input_scale is 1.0 until calibrated"):
        FP8Linear.from_linear(nn.Linear(16, 8), PerTensorStatic())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FP8Linear.from_linear(nn.Linear(16, 8), RowWise())  # dynamic scales: nothing to calibrate
        FP8Linear.quantized_from(nn.Linear(16, 8), PerTensorStatic())


def test_compile_fullgraph_without_graph_breaks(seed):
    model = TinyLM()
    convert(model, RowWise())
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        eager = model(ids)
        torch._dynamo.reset()
        traced = torch.compile(model, fullgraph=True, backend="aot_eager")  # the same ops, traced
        assert torch.equal(traced(ids), eager)
        torch._dynamo.reset()
        # Inductor fuses the norms and residuals (other rounding), which moves some FP8 codes.
        assert rel_error(torch.compile(model, fullgraph=True)(ids), eager.double()) < 1e-2


def test_compile_delayed_scaling_updates_state(seed):
    layer = FP8Linear.from_linear(nn.Linear(32, 16), DelayedScaling(amax_history_len=2))
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    compiled(torch.full((3, 32), 4.0))
    compiled(torch.full((3, 32), 1.0))
    assert torch.equal(layer.amax_history, torch.tensor([1.0, 4.0]))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("m", [1, 16, 100, 1000])
def test_cuda_matches_cpu_reference(recipe, m, seed):
    r = RECIPES[recipe]
    linear = nn.Linear(576, 1536).to(torch.bfloat16)
    x = torch.randn(m, 576, dtype=torch.bfloat16)
    cpu = FP8Linear.from_linear(linear, r)
    gpu = FP8Linear.from_linear(linear, r).cuda()
    assert gpu.weight.is_cuda and gpu.weight.dtype == torch.float8_e4m3fn
    assert torch.equal(gpu.weight.cpu().view(torch.uint8), cpu.weight.view(torch.uint8))
    want = cpu(x)
    got = gpu(x.cuda()).cpu()
    # Same quantized operands; the GEMMs differ only in accumulation order and bf16 rounding.
    assert rel_error(got, want.double()) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [CurrentScaling(fast_accum=True), RowWise(fast_accum=True)], ids=["tensor", "row"])
@pytest.mark.parametrize("m", [16, 1000, 2048])
def test_cuda_fast_accum_close_to_cpu_reference(recipe, m, seed):
    # M > 128 takes the fast-accumulation kernel; K = 4096 gives its error room to show.
    linear = nn.Linear(4096, 1536).to(torch.bfloat16)
    x = torch.randn(m, 4096, dtype=torch.bfloat16)
    want = FP8Linear.from_linear(linear, recipe)(x)  # the CPU path is exact either way
    got = FP8Linear.from_linear(linear, recipe).cuda()(x.cuda()).cpu()
    assert rel_error(got, want.double()) < 1e-2


def test_fast_accum_reaches_the_gemm(monkeypatch, seed):
    calls = []
    real = fp8ext.gemm.scaled_mm

    def spy(*args, **kwargs):
        calls.append(kwargs.get("use_fast_accum"))
        return real(*args, **kwargs)

    monkeypatch.setattr(fp8ext.gemm, "scaled_mm", spy)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 64)
    slow = FP8Linear.from_linear(linear, RowWise())
    fast = FP8Linear.from_linear(linear, RowWise(fast_accum=True))
    assert torch.equal(fast(x), slow(x))  # the CPU reference is exact with or without it
    assert calls == [True, False]
    assert "fast_accum" in repr(fast) and "fast_accum" not in repr(slow)


@pytest.mark.gpu
def test_cuda_graph_replay_of_a_converted_model(seed):
    model = TinyLM().cuda().to(torch.bfloat16)
    convert(model, RowWise())
    ids = torch.randint(0, 50, (4, 16), device="cuda")
    graph, out = capture(lambda: model(ids))
    ids.copy_(torch.randint(0, 50, (4, 16), device="cuda"))  # new input in place: a graph that baked the old one fails
    eager = model(ids)
    graph.replay()
    assert torch.equal(out, eager)


def test_checkpoint_holds_the_unpadded_weight():
    layer = FP8Linear(100, 24, recipe=RowWise())
    sd = layer.state_dict()
    assert sd["weight"].shape == (24, 100) and layer.weight.shape == (24, 112)
    assert set(sd) == {"weight", "weight_scale", "bias"}


def test_loads_a_vllm_style_static_checkpoint(seed):
    """weight [N, K] float8_e4m3fn, per-channel weight_scale [N, 1], static input_scale [1]."""
    n, k = 40, 100
    w = torch.randn(n, k)
    w_scale = w.abs().amax(dim=1, keepdim=True) / 448.0
    q = (w / w_scale).to(torch.float8_e4m3fn)
    sd = {"weight": q, "weight_scale": w_scale, "input_scale": torch.tensor([0.02]), "bias": torch.randn(n)}
    layer = FP8Linear(k, n, recipe=PerTensorStatic(weight_granularity="per_channel"))
    layer.load_state_dict(sd)
    x = torch.randn(3, k)
    xq = (x / 0.02).to(torch.float8_e4m3fn).double() * 0.02
    want = xq @ (q.double() * w_scale.double()).t() + sd["bias"].double()
    assert rel_error(layer(x), want) < 1e-6


def test_loads_a_deepseek_style_block_checkpoint(seed):
    """weight [N, K] float8_e4m3fn with weight_scale_inv [ceil(N/128), ceil(K/128)] (w = q * scale_inv)."""
    n, k = 300, 200
    q = (torch.randn(n, k) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)  # an unsaturated cast makes NaN past 448
    scale_inv = torch.rand(3, 2) * 0.01 + 0.001
    layer = FP8Linear(k, n, bias=False, recipe=BlockWise())
    layer.load_state_dict({"weight": q, "weight_scale_inv": scale_inv})
    x = torch.randn(5, k)
    w = q.double() * scale_inv.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    qx, sx = fp8ext.quantize(x, BlockWise(), "activation")
    xd = fp8ext.dequantize(qx, sx, "group").double()
    assert rel_error(layer(x), xd @ w.t()) < 1e-6


def test_checkpoint_format_mismatch_is_a_clear_error():
    layer = FP8Linear(32, 16, recipe=CurrentScaling(weight_format="e5m2"))
    with pytest.raises(TypeError, match="weight: the checkpoint holds torch.float8_e4m3fn"):
        layer.load_state_dict(FP8Linear(32, 16).state_dict())


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_empty_batch(recipe):
    layer = FP8Linear(20, 7, recipe=RECIPES[recipe])
    assert layer(torch.randn(0, 20)).shape == (0, 7)
    assert layer(torch.randn(2, 0, 20)).shape == (2, 0, 7)


def test_share_memory_and_meta_init_reach_the_fp8_buffers():
    layer = FP8Linear(20, 8, recipe=DelayedScaling(amax_history_len=4)).share_memory()
    assert layer.weight.is_shared() and layer.amax_history.is_shared()
    meta = FP8Linear(20, 8, device="meta", recipe=RowWise())
    real = meta.to_empty(device="cpu")
    assert real.weight.device.type == "cpu" and real.weight.dtype == torch.float8_e4m3fn
    real.load_state_dict(FP8Linear(20, 8, recipe=RowWise()).state_dict())


def test_bf16_scales_in_a_checkpoint_become_float32_even_with_assign():
    src = FP8Linear(32, 16, recipe=RowWise())
    sd = src.state_dict()
    sd["weight_scale"] = sd["weight_scale"].bfloat16()
    layer = FP8Linear(32, 16, recipe=RowWise())
    layer.load_state_dict(sd, assign=True)
    assert layer.weight_scale.dtype == torch.float32
    assert layer(torch.randn(3, 32)).shape == (3, 16)


def test_checkpoint_of_another_granularity_is_refused():
    # Row-wise [2] scales hold as many values as block-wise [1, 2] here: no silent reshape.
    src = FP8Linear.from_linear(nn.Linear(256, 2), RowWise())
    dst = FP8Linear(256, 2, recipe=BlockWise())
    with pytest.raises(RuntimeError, match="size mismatch for weight_scale"):
        dst.load_state_dict(src.state_dict())
    # The other libraries' spellings of the same layout still load: [N, 1] and [1].
    sd = src.state_dict()
    sd["weight_scale"] = sd["weight_scale"].reshape(2, 1)
    row = FP8Linear(256, 2, recipe=RowWise())
    row.load_state_dict(sd)
    assert torch.equal(row.weight_scale, src.weight_scale)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_backward_reaches_the_layers_before(recipe, seed):
    # A frozen FP8 layer passes gradients through: x.grad = grad @ W (dequantized), quantization straight through.
    first = nn.Linear(16, 40)
    layer_src = nn.Linear(40, 24)
    layer = FP8Linear.from_linear(layer_src, RECIPES[recipe])
    layer.bias.requires_grad_(True)
    x = torch.randn(2, 3, 16)
    h = first(x)
    h.retain_grad()
    y = layer(h)
    g = torch.randn_like(y)
    y.backward(g)
    assert first.weight.grad is not None and first.weight.grad.abs().sum() > 0
    # The weight rebuilt by hand from its codes and scales (not dequantized_weight, which backward uses).
    codes, s = layer.weight[:, :40].double(), layer.weight_scale.double()
    w = codes * (s if s.dim() == 0 else s[:, None] if s.dim() == 1 else
                 s.repeat_interleave(128, 0)[:24].repeat_interleave(128, 1)[:, :40])
    want = g.reshape(-1, 24).double() @ w
    assert rel_error(h.grad.reshape(-1, 40), want) < 1e-6
    assert rel_error(h.grad.reshape(-1, 40), g.reshape(-1, 24).double() @ layer_src.weight.double()) < W8A8_TOLERANCE
    assert torch.allclose(layer.bias.grad, g.reshape(-1, 24).sum(0), atol=1e-5)
    assert layer.weight.grad is None  # the FP8 weight is a buffer
    if RECIPES[recipe].activation_mode != "delayed":  # (delayed scaling moves its scale at every call)
        with torch.no_grad():
            assert torch.equal(layer(h), y), "the forward is the same with and without autograd"


def test_backward_in_low_precision_keeps_the_input_dtype(seed):
    layer = FP8Linear.from_linear(nn.Linear(32, 8).to(torch.bfloat16), RowWise())
    x = torch.randn(5, 32, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape


def test_backward_under_compile_fullgraph(seed):
    layer = FP8Linear.from_linear(nn.Linear(32, 8), RowWise())
    x = torch.randn(5, 32, requires_grad=True)
    layer(x).sum().backward()
    want, x.grad = x.grad, None
    torch._dynamo.reset()
    torch.compile(layer, fullgraph=True, backend="aot_eager")(x).sum().backward()
    assert torch.equal(x.grad, want)


def test_broadcast_input_like_nn_linear():
    layer = FP8Linear(40, 24, recipe=RowWise())
    row = torch.randn(1, 40)
    assert torch.equal(layer(row.expand(3, 40)), layer(row.expand(3, 40).contiguous()))


def test_convert_checks_everything_before_swapping_anything():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).double(), nn.Linear(8, 4))
    summary = convert(model, RowWise())
    assert [name for name, _ in summary.converted] == ["0", "2"]
    assert summary.skipped == [("1", "weight is torch.float64 (FP8Linear takes float32, float16, bfloat16)")]
    assert type(model[1]) is nn.Linear
    with pytest.raises(ValueError, match="use fp8ext.FP8Linear.from_linear"):
        convert(nn.Linear(8, 8))
    for bad in (5, [None], ["0", 3]):
        with pytest.raises(TypeError, match="include must be a name pattern"):
            convert(nn.Sequential(nn.Linear(8, 8)), include=bad)
    plain = nn.Sequential(nn.Linear(8, 8))
    with pytest.warns(UserWarning, match="matches no nn.Linear"):
        assert not convert(plain, include="decoder.*").converted
    assert type(plain[0]) is nn.Linear


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_pickle_and_deepcopy_round_trip(recipe, seed):
    # multiprocessing pickles modules; torch 2.14 cannot pickle float8 tensors by itself.
    import copy
    import pickle
    layer = FP8Linear.from_linear(nn.Linear(40, 24), RECIPES[recipe])
    twins = [pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)]
    x = torch.randn(3, 40)
    want = layer(x)  # every copy starts from the same state (delayed scaling moves it per call)
    for twin in twins:
        assert twin.weight.dtype == layer.weight.dtype
        assert torch.equal(twin.weight.view(torch.uint8), layer.weight.view(torch.uint8))
        assert torch.equal(twin(x), want)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_checkpoint_scales_must_be_finite_and_positive(bad):
    sd = FP8Linear(20, 8, recipe=RowWise()).state_dict()
    sd["weight_scale"][0] = bad
    with pytest.raises(ValueError, match="weight_scale: every scale must be finite and > 0"):
        FP8Linear(20, 8, recipe=RowWise()).load_state_dict(sd)
    sd = FP8Linear(20, 8, recipe=RowWise()).state_dict()
    sd["weight_scale"] = torch.ones(8, dtype=torch.int32)
    with pytest.raises(TypeError, match="weight_scale: scales must be floating point"):
        FP8Linear(20, 8, recipe=RowWise()).load_state_dict(sd)


def test_convert_keeps_a_shared_linear_shared():
    """nn.Sequential(lin, act, lin): one module under two names becomes one FP8Linear under both."""
    lin = nn.Linear(16, 16)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    summary = convert(model, RowWise())
    assert type(model[0]) is FP8Linear and model[0] is model[2]
    assert [name for name, _ in summary.converted] == ["0"]


def test_a_non_finite_weight_is_refused_and_convert_swaps_nothing():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    with torch.no_grad():
        model[2].weight[3, 5] = float("inf")
    with pytest.raises(ValueError, match="2: the weight holds non-finite values"):
        convert(model, RowWise())
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]  # untouched
    with pytest.raises(ValueError, match="non-finite"):
        FP8Linear.from_linear(model[2])


def test_compute_dtype_must_be_a_float_the_kernels_take():
    for dtype in (torch.int32, torch.float8_e4m3fn, torch.float64):
        with pytest.raises(TypeError, match="dtype \\(the bias and compute dtype\\) must be"):
            FP8Linear(4, 4, dtype=dtype)
    layer = FP8Linear(4, 4)
    with pytest.raises(TypeError, match="cannot cast it to torch.float8_e4m3fn"):
        layer.to(torch.float8_e4m3fn)
    assert layer.bias.dtype == torch.float32 and layer.half().bias.dtype == torch.float16


def test_delayed_scaling_state_is_untouched_by_a_call_without_tokens():
    """An MoE expert that gets no tokens: an amax of 0 in the history would reset a
    most_recent scale to 1."""
    layer = FP8Linear(20, 8, recipe=DelayedScaling(amax_history_len=4, amax_compute_algo="most_recent"))
    layer(torch.randn(3, 20) * 10)
    scale, history = layer.input_scale.clone(), layer.amax_history.clone()
    assert layer(torch.randn(0, 20)).shape == (0, 8) and layer(torch.randn(2, 0, 20)).shape == (2, 0, 8)
    assert torch.equal(layer.input_scale, scale) and torch.equal(layer.amax_history, history)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_checkpoint_amax_history_must_be_finite_and_non_negative(bad):
    recipe = DelayedScaling(amax_history_len=4)
    sd = FP8Linear(20, 8, recipe=recipe).state_dict()
    sd["amax_history"][0] = bad
    with pytest.raises(ValueError, match="amax_history: every amax must be finite and >= 0"):
        FP8Linear(20, 8, recipe=recipe).load_state_dict(sd)


@pytest.mark.parametrize("fmt, bits", [("e4m3", 0x7F), ("e4m3", 0xFF), ("e5m2", 0x7C), ("e5m2", 0xFE)])
def test_checkpoint_weight_codes_must_be_finite(fmt, bits):
    """A NaN (or E5M2 Inf) code in the weight would make its output column NaN / Inf:
    refused on load as from_linear refuses non-finite weights (helper-60)."""
    recipe = RowWise(weight_format=fmt)
    sd = FP8Linear(20, 8, recipe=recipe).state_dict()
    sd["weight"].view(torch.uint8)[3, 7] = bits
    with pytest.raises(ValueError, match="weight: the checkpoint holds NaN or Inf codes"):
        FP8Linear(20, 8, recipe=recipe).load_state_dict(sd)
    sd["weight"].view(torch.uint8)[3, 7] = bits & 0xFB  # finite: E4M3 +-352, E5M2 32768 or -49152
    FP8Linear(20, 8, recipe=recipe).load_state_dict(sd)


def test_checkpoint_amax_history_must_be_floating_point():
    recipe = DelayedScaling(amax_history_len=4)
    sd = FP8Linear(20, 8, recipe=recipe).state_dict()
    sd["amax_history"] = sd["amax_history"].to(torch.complex64)
    with pytest.raises(TypeError, match="amax_history: amaxes must be floating point, the checkpoint holds "
                                        "torch.complex64"):
        FP8Linear(20, 8, recipe=recipe).load_state_dict(sd)


def test_checkpoint_weight_stored_padded_and_non_tensor_entries():
    """A weight saved in the module's own padded layout loads if its K padding is zero
    (-0 too) and is refused otherwise; a non-tensor entry is refused by key."""
    layer = FP8Linear(20, 8, recipe=RowWise())
    sd = layer.state_dict()
    padded = torch.zeros(8, 32, dtype=torch.float8_e4m3fn)
    padded[:, :20] = sd["weight"]
    x = torch.randn(3, 20)
    for pad_bits, ok in ((0x00, True), (0x80, True), (0x7F, False), (0x01, False)):
        w = padded.clone()
        w.view(torch.uint8)[:, 25] = pad_bits
        twin = FP8Linear(20, 8, recipe=RowWise())
        if ok:
            twin.load_state_dict({**sd, "weight": w})
            assert torch.equal(twin(x), layer(x))
        else:
            with pytest.raises(ValueError, match="columns past in_features=20 \\(K padding\\) must be zero"):
                twin.load_state_dict({**sd, "weight": w})
    with pytest.raises(TypeError, match="weight_scale: the checkpoint holds a str, not a tensor"):
        FP8Linear(20, 8, recipe=RowWise()).load_state_dict({**sd, "weight_scale": "abc"})


def test_convert_keeps_hooked_linears_and_transformer_encoder_layers():
    """An FP8Linear in place of a hooked nn.Linear would drop its hooks, and
    nn.TransformerEncoderLayer's inference fast path multiplies by linear1.weight
    itself: both are kept in high precision, and the summary says why."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64),
                          nn.TransformerEncoderLayer(64, 4, 128, batch_first=True))
    model[0].register_forward_hook(lambda m, args, out: out * 0)
    model[1].forward = lambda x, lin=model[1]: nn.functional.linear(x, lin.weight, lin.bias)
    summary = convert(model, RowWise())
    assert [n for n, _ in summary.converted] == ["2"]
    reasons = dict(summary.skipped)
    assert "forward hooks or a patched forward" in reasons["0"] and "forward hooks" in reasons["1"]
    assert "TransformerEncoderLayer" in reasons["3.linear1"] and "TransformerEncoderLayer" in reasons["3.linear2"]
    model.eval()
    with torch.no_grad():  # the encoder layer's fast path runs, and the hook still zeroes layer 0's output
        assert model(torch.randn(2, 5, 64)).isfinite().all()
        assert not model[0](torch.randn(3, 64)).any()
