"""FP8Linear inside a Hugging Face transformers Llama built from a config: convert,
calibrate (K/V amax per KV head from the config's head_dim), forward, checkpoints."""
import pytest
import torch

import fp8ext
from fp8ext import PerTensorStatic, RowWise
from fp8ext.nn import FP8Linear

transformers = pytest.importorskip("transformers")


def tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def rel_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def test_convert_a_transformers_llama(seed):
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        ref = model(ids).logits
        summary = fp8ext.convert(model, RowWise())
        got = model(ids).logits
    names = [n for n, _ in summary.converted]
    assert len(names) == 2 * 7 and "model.layers.0.self_attn.k_proj" in names
    assert summary.skipped == [("lm_head", "LM head (high precision by default)")]
    assert isinstance(model.model.layers[1].mlp.down_proj, FP8Linear)
    assert type(model.lm_head) is torch.nn.Linear
    # E4M3 rounds each operand with relative error up to 1/16: over 300 seeds the logits
    # moved by 4.1% (median) and 5.1% (worst). A wrong scale or a broken layer moves them ~100%.
    assert rel_error(got, ref) < 0.08


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_converted_transformers_llama_compiles_whole_and_replays_as_a_cuda_graph(device, seed):
    """Issue 7: torch.compile(fullgraph=True) with no graph break, and (GPU) CUDA-graph
    capture, on a Hugging Face model, not only on the in-repo TinyLM."""
    model = tiny_llama().to(device)
    if device == "cuda":
        model = model.to(torch.bfloat16)
    fp8ext.convert(model, RowWise())
    ids = torch.randint(0, 128, (2, 12), device=device)

    def logits():
        return model(ids, use_cache=False).logits

    with torch.no_grad():
        eager = logits()
        assert torch.equal(torch.compile(logits, fullgraph=True, backend="aot_eager")(), eager)
        if device == "cuda":
            from cuda_graphs import capture
            graph, out = capture(logits)
            ids.copy_(torch.randint(0, 128, (2, 12), device=device))  # new tokens in place
            eager = logits()
            graph.replay()
            assert torch.equal(out, eager)


@pytest.mark.parametrize("arch", ["Qwen3", "Gemma3Text"])
def test_calibrate_measures_k_after_the_models_k_norm(arch, seed):
    """Qwen3 normalises K per head on [B, T, H, D], Gemma3 after a transpose to [B, H, T, D]:
    calibrate's K amax is the amax of what k_norm gives the cache, per KV head."""
    config_cls = getattr(transformers, f"{arch}Config", None)
    model_cls = getattr(transformers, "Gemma3ForCausalLM" if arch == "Gemma3Text" else f"{arch}ForCausalLM", None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {arch}")
    cfg = config_cls(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)
    model = model_cls(cfg).eval()
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.k_norm.weight.normal_(0, 3)  # heads' K far from k_proj's
    seen = []
    attn.k_norm.register_forward_hook(lambda mod, a, o: seen.append(o))
    result = fp8ext.calibrate(model, [torch.randint(0, 64, (2, 8))], progress=False)
    (k,) = seen
    k = k.transpose(1, 2) if arch == "Gemma3Text" else k  # [B, T, H, D]
    want = k.reshape(-1, 2, 16).abs().amax(dim=(0, 2))
    assert torch.allclose(result.kv_amax["model.layers.0.self_attn"]["k"], want, rtol=1e-6)


def test_calibrate_and_reload_a_transformers_llama(seed, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_llama()
    with pytest.warns(UserWarning):
        fp8ext.convert(model, PerTensorStatic())
    batches = [torch.randint(0, 128, (2, 16)) for _ in range(3)]
    result = fp8ext.calibrate(model, batches, progress=False)
    assert set(result.kv_amax) == {"model.layers.0.self_attn", "model.layers.1.self_attn"}
    assert result.kv_amax["model.layers.0.self_attn"]["k"].shape == (2,)  # one per KV head
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))

    fresh = tiny_llama()  # other random weights: everything must come from the file
    with pytest.warns(UserWarning):
        fp8ext.convert(fresh, PerTensorStatic())
    fresh.load_state_dict(load_file(str(path)))
    ids = torch.randint(0, 128, (1, 10))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


def cached_keys(cache, layer):
    """K as the Hugging Face cache stores it (after RoPE), [B, H_kv, T, D]."""
    layers = getattr(cache, "layers", None)
    return layers[layer].keys if layers is not None else cache.key_cache[layer]


def calibrated_keys():
    """A tiny Llama (k_proj widened, so that RoPE's small angles still move K's amax),
    calibrated on two random batches, and the amax of K per (layer, KV head) as the
    Hugging Face cache stores it, after RoPE: (result, stored [2, 2])."""
    model = tiny_llama()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(4)
    batches = [torch.randint(0, 128, (2, 60)) for _ in range(2)]
    result = fp8ext.calibrate(model, batches, progress=False)
    stored = torch.zeros(2, 2)
    with torch.no_grad():
        for ids in batches:
            cache = model(ids, use_cache=True).past_key_values
            for i in range(2):
                stored[i] = torch.maximum(stored[i], cached_keys(cache, i).abs().amax(dim=(0, 2, 3)))
    return result, stored


def test_kv_scales_cover_k_as_the_cache_stores_it_after_rope(seed):
    """k_proj's output is K before RoPE; the cache stores it rotated, which can be up to
    sqrt(2) larger. The default k_scale bounds the stored K (no code saturates); the
    pre-RoPE one (rotary=False) is exactly k_proj's amax."""
    result, stored = calibrated_keys()
    for i in range(2):
        attn = f"model.layers.{i}.self_attn"
        bound = result.kv_scales("e4m3")[attn]["k_scale"] * 448.0
        assert (stored[i] <= bound * (1 + 1e-5)).all(), (stored[i], bound)
        assert (bound <= result.kv_amax[attn]["k"] * 2 ** 0.5 * (1 + 1e-6)).all()
        pre = result.kv_scales("e4m3", rotary=False)[attn]["k_scale"] * 448.0
        assert torch.allclose(pre, result.kv_amax[attn]["k"])


def test_rope_can_raise_k_past_its_pre_rope_amax():
    """Why kv_scales bounds the rotated K: on this data the stored K exceeds k_proj's
    amax. Whether it does depends on the data (about 1 seed in 40 of the test above
    gives none of its four heads), so the seed is pinned here."""
    torch.manual_seed(0)
    result, stored = calibrated_keys()
    assert (stored > torch.stack([result.kv_amax[f"model.layers.{i}.self_attn"]["k"] for i in range(2)])).any()


def test_llama_model_from_hf_refuses_fp8_weights():
    from fp8ext.serving import LlamaModel
    model = tiny_llama()
    fp8ext.convert(model, RowWise())
    with pytest.raises(ValueError, match="hf_model holds FP8 weights"):
        LlamaModel.from_hf(model, torch.float32)
