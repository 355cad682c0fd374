"""fp8ext.calibrate: static scales from calibration batches, K/V amax per head."""
import copy

import pytest
import torch
from torch import nn

import fp8ext
from fp8ext import PerTensorStatic, RowWise
from fp8ext.nn import FP8Linear, convert


class Attention(nn.Module):
    def __init__(self, hidden=64, kv_heads=2, head_dim=16):
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim)
        self.o_proj = nn.Linear(hidden, hidden)
        self.kv_heads, self.head_dim = kv_heads, head_dim

    def forward(self, x):  # a stand-in mixing of q, k, v (the shapes are what matters here)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv = (k * v).repeat(1, 1, x.shape[-1] // k.shape[-1])
        return x + self.o_proj(torch.tanh(q + kv))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Attention() for _ in range(2))
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.down(torch.relu(self.up(x)))


def dequantized_twin(model):
    """The converted model with every FP8Linear replaced by an nn.Linear holding its dequantized weight."""
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, FP8Linear):
            lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            lin.weight.data = m.dequantized_weight()
            if m.bias is not None:
                lin.bias.data = m.bias.data.float()
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, child, lin)
    return twin


def test_static_scales_are_the_high_precision_amax(seed):
    model = Model()
    with pytest.warns(UserWarning):
        convert(model, PerTensorStatic())
    batches = [torch.randn(2, 5, 64) * (i + 1) for i in range(3)]
    twin = dequantized_twin(model)
    seen = {}
    for name, m in twin.named_modules():
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(
                name, max(seen.get(name, 0.0), args[0].abs().max().item())))
    with torch.no_grad():
        for b in batches:
            twin(b)
    result = fp8ext.calibrate(model, batches, progress=False)
    assert result.batches == 3 and set(result.input_amax) == set(seen)
    for name, amax in seen.items():
        assert result.input_amax[name].item() == pytest.approx(amax, rel=1e-5)
        assert model.get_submodule(name).input_scale.item() == pytest.approx(amax / 448.0, rel=1e-5)
    # Calibrated static scaling is accurate on data like the calibration data.
    x = torch.randn(2, 5, 64) * 2
    err = ((model(x) - twin(x)).norm() / twin(x).norm()).item()
    assert err < 0.06


def test_kv_amax_per_head_and_scales(seed):
    model = Model()
    convert(model, RowWise())
    batches = [{"x": torch.randn(3, 4, 64)} for _ in range(2)]  # dict batches are passed as keywords
    twin = dequantized_twin(model)
    outs = {}
    for name, m in twin.named_modules():
        if name.endswith(("k_proj", "v_proj")):
            m.register_forward_hook(lambda mod, a, o, name=name: outs.setdefault(name, []).append(o))
    with torch.no_grad():
        for b in batches:
            twin(**b)
    result = fp8ext.calibrate(model, batches, head_dim=16, progress=False)
    assert set(result.kv_amax) == {"layers.0", "layers.1"}
    for attn in ("layers.0", "layers.1"):
        for kv in ("k", "v"):
            o = torch.cat([t.reshape(-1, 2, 16) for t in outs[f"{attn}.{kv}_proj"]])
            want = o.abs().amax(dim=(0, 2))
            assert torch.allclose(result.kv_amax[attn][kv], want, rtol=1e-5)
        k = torch.cat([t.reshape(-1, 2, 16) for t in outs[f"{attn}.k_proj"]])
        pairs = (k[..., :8].square() + k[..., 8:].square()).sqrt().amax(dim=(0, 2))  # rotate-half pairs' norms
        assert torch.allclose(result.kv_amax[attn]["k_rotary"], pairs, rtol=1e-5)
        scales = result.kv_scales("e4m3")[attn]
        assert torch.allclose(scales["k_scale"], pairs / 448.0, rtol=1e-5)
        assert torch.allclose(scales["v_scale"], result.kv_amax[attn]["v"] / 448.0)
        assert torch.allclose(result.kv_scales("e4m3", rotary=False)[attn]["k_scale"], result.kv_amax[attn]["k"] / 448.0)
        assert result.kv_scales("e5m2")[attn]["v_scale"].shape == (2,)


def test_a_batch_without_tokens_records_nothing(seed):
    """An empty batch among real ones (a padding-only step) leaves the amax of the others."""
    model = Model()
    convert(model, RowWise())
    batches = [{"x": torch.randn(3, 4, 64)}]
    want = fp8ext.calibrate(model, batches, head_dim=16, progress=False)
    got = fp8ext.calibrate(model, [{"x": torch.randn(3, 0, 64)}] + batches, head_dim=16, progress=False)
    for attn in ("layers.0", "layers.1"):
        for kv in ("k", "v"):
            assert torch.equal(got.kv_amax[attn][kv], want.kv_amax[attn][kv])


def test_calibration_leaves_dynamic_recipes_and_restores_fp8_compute(seed):
    model = Model()
    convert(model, RowWise())
    x = torch.randn(2, 3, 64)
    before = model(x)
    fp8ext.calibrate(model, [x], progress=False)
    assert torch.equal(model(x), before)  # nothing to fix for current scaling; FP8 compute is back


def test_delayed_layers_start_from_the_calibrated_amax(seed):
    """A delayed layer's first call after calibration quantizes with the scale its recipe derives
    from the calibration amax (as if that data had been its last call), not with 1.0."""
    model = Model()
    convert(model, fp8ext.DelayedScaling(amax_history_len=4, margin=1))
    batches = [torch.randn(2, 5, 64) * 300 for _ in range(2)]  # inputs past 448: scale 1 would saturate them
    result = fp8ext.calibrate(model, batches, margin=3, progress=False)  # margin applies to static layers only
    for name, m in model.named_modules():
        if isinstance(m, FP8Linear):
            amax = result.input_amax[name]
            assert m.amax_history.tolist() == [amax.item(), 0.0, 0.0, 0.0], name
            assert m.input_scale.item() == pytest.approx(amax.item() * 2 / 448.0, rel=1e-6), name
    twin = dequantized_twin(model)
    x = batches[0]
    err = ((model(x) - twin(x)).norm() / twin(x).norm()).item()
    assert err < 0.06


def test_calibrate_errors():
    with pytest.raises(ValueError, match="batches is empty"):
        fp8ext.calibrate(Model(), [], progress=False)
    with pytest.raises(TypeError, match="model must be"):
        fp8ext.calibrate(object(), [1])
    x = torch.randn(2, 3, 64)
    for bad in (200, -65):
        with pytest.raises(ValueError, match=r"margin must be in \[-64, 64\]"):
            fp8ext.calibrate(Model(), [x], margin=bad, progress=False)
    static = Model()
    with pytest.warns(UserWarning, match="static recipe"):
        convert(static, PerTensorStatic(margin=40))
    with pytest.raises(ValueError, match=r"margin \+ layers.0.q_proj's recipe margin must be in"):
        fp8ext.calibrate(static, [x], margin=30, progress=False)
    for bad in (-16, 0, 2.5, True):
        with pytest.raises(ValueError, match="head_dim must be a positive int or None"):
            fp8ext.calibrate(Model(), [x], head_dim=bad, progress=False)
    with pytest.raises(ValueError, match="head_dim=7 does not divide layers.0.k_proj's output width 32"):
        fp8ext.calibrate(Model(), [x], head_dim=7, progress=False)
    result = fp8ext.calibrate(Model(), [x], head_dim=16, progress=False)
    with pytest.raises(ValueError, match="margin must be in"):
        result.kv_scales(margin=500)
    with pytest.raises(TypeError, match="rotary must be a bool, got 'yes'"):
        result.kv_scales(rotary="yes")
    # Without a head split the rotate-half pairs are unknown: K's bound is sqrt(2) x its amax.
    whole = fp8ext.calibrate(Model(), [x], progress=False).kv_amax["layers.0"]
    assert torch.allclose(whole["k_rotary"], whole["k"] * 2 ** 0.5)


def test_progress_is_printed(capsys):
    model = Model()
    convert(model, RowWise())
    fp8ext.calibrate(model, [torch.randn(1, 2, 64)] * 2, progress=True)
    err = capsys.readouterr().err
    assert "calibrating" in err


def test_fused_qkv_projections_are_not_taken_for_k_or_v():
    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = nn.Linear(16, 48)
            self.kv_proj = nn.Linear(16, 32)

        def forward(self, x):
            return self.qkv_proj(x).sum() + self.kv_proj(x).sum()

    with pytest.warns(UserWarning, match=r"the fused projections \['qkv_proj', 'kv_proj'\] are not split"):
        result = fp8ext.calibrate(Fused(), [torch.randn(2, 16)], progress=False)
    assert result.kv_amax == {}


@pytest.mark.parametrize("layout", ["qwen3", "gemma3", "olmo2"])
def test_a_k_norm_beside_k_proj_is_what_is_measured(layout, seed):
    """K normalised after k_proj, as the cache stores it: per head on [B, T, H, D] (Qwen3), per
    head after a transpose to [B, H, T, D] (Gemma3), or over the whole width (OLMo2)."""
    class NormedK(Attention):
        def __init__(self):
            super().__init__()
            self.k_norm = nn.RMSNorm(32 if layout == "olmo2" else 16)
            self.k_norm.weight.data.uniform_(0.5, 8.0)

        def forward(self, x):
            k = self.k_proj(x)
            if layout == "olmo2":
                k = self.k_norm(k)
            elif layout == "qwen3":
                k = self.k_norm(k.unflatten(-1, (2, 16))).flatten(-2)
            else:
                k = self.k_norm(k.unflatten(-1, (2, 16)).transpose(1, 2)).transpose(1, 2).flatten(-2)
            return x + self.o_proj(torch.tanh(self.q_proj(x) + (k * self.v_proj(x)).repeat(1, 1, 2)))

    model = NormedK()
    seen = []
    model.k_norm.register_forward_hook(lambda mod, a, o: seen.append(o.transpose(1, 2) if layout == "gemma3" else o))
    batches = [torch.randn(3, 4, 64) for _ in range(2)]
    result = fp8ext.calibrate(model, batches, head_dim=16, progress=False)
    k = torch.cat([t.reshape(-1, 2, 16) for t in seen])  # [tokens, heads, head_dim]
    assert torch.allclose(result.kv_amax[""]["k"], k.abs().amax(dim=(0, 2)), rtol=1e-6)
    pairs = torch.hypot(k[..., :8], k[..., 8:]).amax(dim=(0, 2))
    assert torch.allclose(result.kv_amax[""]["k_rotary"], pairs, rtol=1e-6)
    with torch.no_grad():
        raw = model.k_proj(torch.cat(batches)).reshape(-1, 2, 16).abs().amax(dim=(0, 2))
    assert not torch.allclose(result.kv_amax[""]["k"], raw, rtol=0.1)  # what measuring k_proj's output gave
    model.k_norm = nn.RMSNorm(12)  # a norm of a width that does not divide K's: named, not guessed
    with pytest.raises(ValueError, match="cannot tell the width k_proj's norm normalises"):
        fp8ext.calibrate(model, batches, head_dim=16, progress=False)


def test_static_layers_the_batches_never_reach_are_reported():
    model = nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Linear(8, 8)})
    with pytest.warns(UserWarning):
        convert(model, PerTensorStatic())
    with pytest.warns(UserWarning, match="calibration never ran 1 static or delayed layers"):
        fp8ext.calibrate(_Only(model), [torch.randn(2, 8)], progress=False)
    assert model["b"].input_scale.item() == 1.0


class _Only(nn.Module):
    """Runs only model["a"]."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model["a"](x)
