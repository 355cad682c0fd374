"""k_scale / v_scale in checkpoints (fp8ext.kv_scales): vLLM's names written, the
names vLLM, compressed-tensors, ModelOpt and AutoFP8 use read back in layer order."""
import pytest
import torch

import fp8ext
from fp8ext import PagedKVCache, kv_scales_from_state_dict, kv_scales_state_dict

E4M3 = torch.float8_e4m3fn


def calibrated(layers=12, heads=2):
    g = torch.Generator().manual_seed(0)
    return {f"model.layers.{i}.self_attn": {"k_scale": torch.rand(heads, generator=g) + 0.01,
                                            "v_scale": torch.rand(heads, generator=g) + 0.01}
            for i in range(layers)}


def test_round_trip_through_a_checkpoint_keeps_every_layer_its_own_scales(tmp_path):
    scales = calibrated()
    flat = kv_scales_state_dict(scales)
    assert set(flat) == {f"model.layers.{i}.self_attn.{kv}_scale" for i in range(12) for kv in "kv"}
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save_file(flat, tmp_path / "kv.safetensors")
    loaded = safetensors.load_file(tmp_path / "kv.safetensors")  # keys come back sorted: layers.10 before layers.2
    back = kv_scales_from_state_dict(loaded)
    assert list(back) == list(scales)
    cache = PagedKVCache(12, 2, 64, 4, 16, E4M3, scales=back)
    for i, entry in enumerate(scales.values()):
        assert torch.equal(cache.k_scale[i], entry["k_scale"]) and torch.equal(cache.v_scale[i], entry["v_scale"])


def test_reads_the_other_libraries_names_and_ignores_everything_else():
    w = torch.zeros(4, 4, dtype=E4M3)
    sd = {
        "model.layers.1.self_attn.k_scale": torch.tensor(0.5), "model.layers.1.self_attn.v_scale": torch.tensor(0.25),
        "model.layers.0.self_attn.k_proj.k_scale": torch.tensor(2.0, dtype=torch.bfloat16),  # ModelOpt
        "model.layers.0.self_attn.v_proj.v_scale": torch.tensor([3.0]),
        "model.layers.0.self_attn.k_proj.weight": w, "model.layers.0.self_attn.k_proj.weight_scale": torch.ones(()),
        "model.layers.0.self_attn.k_proj.input_scale": torch.ones(()),
    }
    got = kv_scales_from_state_dict(sd)
    assert list(got) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert got["model.layers.0.self_attn"]["k_scale"].tolist() == [2.0]
    assert got["model.layers.0.self_attn"]["k_scale"].dtype == torch.float32
    assert got["model.layers.1.self_attn"]["v_scale"].tolist() == [0.25]
    autofp8 = {"layers.0.attn.k_proj.output_scale": torch.tensor(1.5), "layers.0.attn.v_proj.output_scale": torch.tensor(2.5)}
    assert {k: v.item() for k, v in kv_scales_from_state_dict(autofp8)["layers.0.attn"].items()} == \
        {"k_scale": 1.5, "v_scale": 2.5}
    both = kv_scales_from_state_dict({"layers.3.self_attn.kv_scale": torch.tensor(4.0)})["layers.3.self_attn"]
    assert both["k_scale"].item() == both["v_scale"].item() == 4.0
    assert kv_scales_from_state_dict({"lm_head.weight": w}) == {}


def test_layers_named_two_ways_come_back_in_layer_order():
    """Mllama-style: every fourth layer a cross-attention; a file lists the names sorted as strings."""
    names = [f"model.layers.{i}.{'cross_attn' if i % 4 == 3 else 'self_attn'}" for i in range(12)]
    sd = {}
    for i, name in enumerate(names):
        sd[f"{name}.k_scale"], sd[f"{name}.v_scale"] = torch.tensor(float(i + 1)), torch.tensor(1.0)
    got = kv_scales_from_state_dict(dict(sorted(sd.items())))
    assert list(got) == names


def test_writes_one_value_as_vllm_does_and_takes_plain_numbers():
    flat = kv_scales_state_dict({"self_attn": {"k_scale": 0.5, "v_scale": torch.tensor([0.25])}})
    assert flat["self_attn.k_scale"].shape == () and flat["self_attn.v_scale"].shape == ()
    assert kv_scales_state_dict({"a": {"k_scale": 2, "v_scale": 1}})["a.k_scale"].dtype == torch.float32
    assert kv_scales_state_dict({"": {"k_scale": 1.0, "v_scale": 2.0}}).keys() == {"k_scale", "v_scale"}


def test_calibrate_output_goes_straight_in():
    from torch import nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.k_proj, self.v_proj = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.k_proj(x) + self.v_proj(x)

    model = nn.Sequential(Attn(), Attn())
    result = fp8ext.calibrate(model, [torch.randn(3, 8)], head_dim=4, progress=False)
    flat = kv_scales_state_dict(result.kv_scales("e4m3"))
    assert set(flat) == {"0.k_scale", "0.v_scale", "1.k_scale", "1.v_scale"} and flat["0.k_scale"].shape == (2,)
    assert torch.equal(kv_scales_from_state_dict(flat)["1"]["v_scale"], result.kv_scales("e4m3")["1"]["v_scale"])


def test_bad_checkpoints_are_named():
    with pytest.raises(ValueError, match=r"gives 'layers.0.self_attn' no v_scale"):
        kv_scales_from_state_dict({"layers.0.self_attn.k_scale": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="two k_scales"):
        kv_scales_from_state_dict({"a.k_scale": torch.tensor(1.0), "a.k_proj.k_scale": torch.tensor(1.0),
                                   "a.v_scale": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="a.k_scale must be a floating-point tensor, got torch.int64"):
        kv_scales_from_state_dict({"a.k_scale": torch.tensor(1), "a.v_scale": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        kv_scales_from_state_dict([("a.k_scale", torch.tensor(1.0))])
    with pytest.raises(ValueError, match=r"scales\['a'\] must map"):
        kv_scales_state_dict({"a": {"k_scale": 1.0}})
    with pytest.raises(TypeError, match="a.v_scale must be a floating-point tensor"):
        kv_scales_state_dict({"a": {"k_scale": 1.0, "v_scale": "2"}})
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="a.k_scale must be finite and positive"):
            kv_scales_state_dict({"a": {"k_scale": bad, "v_scale": 1.0}})
        with pytest.raises(ValueError, match="a.k_scale must be finite and positive"):
            kv_scales_from_state_dict({"a.k_scale": torch.tensor([1.0, bad]), "a.v_scale": torch.tensor(1.0)})
