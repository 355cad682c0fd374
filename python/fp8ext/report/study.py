"""The CPU measurements of `fp8ext report` on a real model (SmolLM2-135M,
float32 through the exact CPU reference): formats, scaling recipes,
selective precision and the FP8 KV cache. Each function returns plain rows
(dicts) that the renderer turns into tables and plots, so the report shows
the numbers the library computed."""
from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import nn

import fp8ext
from fp8ext import evaluation, formats
from fp8ext.kv_cache import capacity_tokens
from fp8ext.nn.convert import convert
from fp8ext.nn.linear import FP8Linear
from fp8ext.ops.kv_cache_reference import encode
from fp8ext.serving import LlamaModel
from fp8ext.serving.evaluate import perplexity as engine_perplexity

RECIPES = {  # name: recipe (E4M3 unless named)
    "per-tensor current": fp8ext.CurrentScaling(),
    "delayed (history 16)": fp8ext.DelayedScaling(amax_history_len=16),
    "per-tensor static": fp8ext.PerTensorStatic(),
    "row-wise": fp8ext.RowWise(),
    "block-wise": fp8ext.BlockWise(),
}

GPTQ_ROW = "block-wise, GPTQ weights"


def _round_trip(x: torch.Tensor, fmt, per_row: bool = False) -> torch.Tensor:
    """x (float32) through the library's own weight quantize and dequantize: one scale per tensor or per row."""
    recipe = (fp8ext.RowWise if per_row else fp8ext.CurrentScaling)(weight_format=fmt)
    q, s = fp8ext.quantize(x.detach().float().reshape(-1, x.shape[-1]), recipe, "weight")
    return fp8ext.dequantize(q, s).reshape(x.shape)


def sqnr_db(x: torch.Tensor, fmt) -> float:
    """Signal-to-quantization-noise ratio of x rounded to `fmt` with a per-tensor amax scale, in dB."""
    x = x.detach().float()
    err = _round_trip(x, fmt) - x
    return 10 * math.log10(x.pow(2).sum().item() / max(err.pow(2).sum().item(), 1e-30))


def format_constants() -> list:
    return [{"format": f.name.upper(), "exponent bits": f.exponent_bits, "mantissa bits": f.mantissa_bits,
             "max": f.max, "min normal": f.min_normal, "min subnormal": f.min_subnormal,
             "unit roundoff": f.unit_roundoff, "binades": round(f.dynamic_range_binades, 1), "inf": f.has_inf}
            for f in formats.FORMATS]


def layer_inputs(model: nn.Module, batch: torch.Tensor) -> dict:
    """Each decoder linear's input on one batch (forward pre-hooks)."""
    seen, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name != "lm_head":
            hooks.append(m.register_forward_pre_hook(lambda mod, args, n=name: seen.__setitem__(n, args[0].detach())))
    try:
        with torch.no_grad():
            model(batch)
    finally:
        for h in hooks:
            h.remove()
    return seen


def sqnr_per_layer(model: nn.Module, batch: torch.Tensor) -> list:
    inputs = layer_inputs(model, batch)
    rows = []
    for name, m in model.named_modules():
        if name in inputs:
            row = {"layer": name}
            for f in formats.FORMATS:
                row[f"weight {f.name}"] = round(sqnr_db(m.weight, f), 2)
                row[f"activation {f.name}"] = round(sqnr_db(inputs[name], f), 2)
            rows.append(row)
    return rows


def converted(model: nn.Module, recipe, calibration=None, **kw) -> nn.Module:
    m = copy.deepcopy(model)
    with warnings.catch_warnings():  # static scales are 1.0 only until the calibration just below
        if calibration is not None:
            warnings.filterwarnings("ignore", message="static recipe")
        convert(m, recipe, **kw)
    if calibration is not None:
        fp8ext.calibrate(m, calibration, progress=False)
    return m


def ppl(model: nn.Module, windows: torch.Tensor) -> float:
    return evaluation.perplexity(model, windows)


def format_perplexity(model, windows, base: float) -> list:
    rows = []
    for f in formats.FORMATS:
        recipe = fp8ext.CurrentScaling(weight_format=f.name, activation_format=f.name)
        p = ppl(converted(model, recipe), windows)
        rows.append({"format": f.name.upper(), "perplexity": round(p, 3), "increase %": round(100 * (p / base - 1), 2)})
    return rows


def clipping_rate(model: nn.Module, windows: torch.Tensor) -> float:
    """Share of the static layers' input values beyond their scale's range."""
    counts = [0, 0]
    hooks = []
    for m in model.modules():
        if isinstance(m, FP8Linear) and m.recipe.activation_mode == "static":
            limit = m.input_scale * m.recipe.activation_format.max

            def hook(mod, args, limit=limit):
                x = args[0].detach().float()
                counts[0] += int((x.abs() > limit).sum())
                counts[1] += x.numel()
            hooks.append(m.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(windows)
    finally:
        for h in hooks:
            h.remove()
    return counts[0] / max(counts[1], 1)


def recipe_study(model, windows, shifted, calibration, base, base_shifted) -> list:
    """Perplexity of every recipe on the text and on a shifted text (static scales calibrated on the text)."""
    rows = []
    for name, recipe in [*RECIPES.items(), (GPTQ_ROW, fp8ext.BlockWise())]:
        if name == GPTQ_ROW:  # the same block-wise layers, their codes chosen on the calibration text
            m = copy.deepcopy(model)
            convert(m, recipe, calibration=calibration, weight_rounding="gptq")
        else:
            m = converted(model, recipe, calibration if recipe.activation_mode == "static" else None)
        if recipe.activation_mode == "delayed":  # fill the amax history as serving would
            with torch.no_grad():
                for batch in calibration:
                    m(batch)
        p, ps = ppl(m, windows), ppl(m, shifted)
        row = {"recipe": name, "perplexity": round(p, 3), "increase %": round(100 * (p / base - 1), 2),
               "shifted perplexity": round(ps, 3), "shifted increase %": round(100 * (ps / base_shifted - 1), 2)}
        if recipe.activation_mode == "static":
            row["clipped % (shifted)"] = round(100 * clipping_rate(m, shifted), 4)
        rows.append(row)
    return rows


def layer_sensitivity(model, windows, base, blocks, recipe=None) -> list:
    """Perplexity increase with only one decoder block's linears in FP8."""
    recipe = recipe or fp8ext.CurrentScaling()
    rows = []
    for i in blocks:
        m = converted(model, recipe, include=f"model.layers.{i}.*")
        p = ppl(m, windows)
        rows.append({"block": i, "perplexity": round(p, 3), "increase %": round(100 * (p / base - 1), 3)})
    return sorted(rows, key=lambda r: -r["increase %"])


def _fake_quant_(t: torch.Tensor, fmt=formats.E4M3) -> None:
    """t rounded to FP8 with one scale per row (embeddings) or per tensor (norm weights), in place."""
    with torch.no_grad():
        t.copy_(_round_trip(t, fmt, per_row=t.dim() > 1).to(t.dtype))


def selective_precision(model, windows, base) -> list:
    """Decoder linears in FP8 (row-wise) with the embedding, LM head and norms kept or quantized too."""
    rows = []
    for label, lm_head, embed, norms in (("kept in high precision (default)", False, False, False),
                                         ("+ LM head in FP8", True, False, False),
                                         ("+ embedding in FP8", False, True, False),
                                         ("+ norm weights in FP8", False, False, True),
                                         ("everything in FP8", True, True, True)):
        m = copy.deepcopy(model)
        tied = m.get_output_embeddings().weight is m.get_input_embeddings().weight
        if tied and lm_head != embed:  # untie, so that only the one named is quantized
            m.lm_head.weight = nn.Parameter(m.lm_head.weight.detach().clone(), requires_grad=False)
        if embed:
            _fake_quant_(m.get_input_embeddings().weight)
        convert(m, fp8ext.RowWise(), keep_lm_head=not lm_head)
        if norms:
            for name, mod in m.named_modules():
                if "norm" in type(mod).__name__.lower() and getattr(mod, "weight", None) is not None:
                    _fake_quant_(mod.weight)
        p = ppl(m, windows)
        rows.append({"configuration": label, "perplexity": round(p, 3), "increase %": round(100 * (p / base - 1), 2)})
    return rows


def kv_cache_study(hf_model, windows, prefix: int) -> list:
    """The serving engine's perplexity (teacher-forced through the paged cache) per cache dtype,
    attention-output error of the cache on the model's real K/V, and capacity per GiB."""
    model = LlamaModel.from_hf(hf_model, torch.float32)
    cfg = model.cfg
    calib = [w.tolist() for w in windows[:1]]
    evalw = windows[1:]
    base = engine_perplexity(model, evalw, torch.float32, prefix)
    rows = []
    for label, dtype, fmt in (("float32", torch.float32, None), ("bf16", torch.bfloat16, None),
                              ("E4M3", torch.float8_e4m3fn, "e4m3"), ("E5M2", torch.float8_e5m2, "e5m2")):
        scales = model.kv_scales(calib, fmt) if fmt else None
        p = base if dtype == torch.float32 else engine_perplexity(model, evalw, dtype, prefix, kv_scales=scales)
        rows.append({"cache": label, "perplexity": round(p, 3), "increase %": round(100 * (p / base - 1), 2),
                     "attention error %": round(100 * _attention_error(model, calib[0], dtype, scales), 3),
                     "tokens per GiB (this model)": capacity_tokens(2**30, cfg.num_layers, cfg.num_kv_heads,
                                                                     cfg.head_dim, dtype),
                     "tokens per GiB (Llama-3.1-8B)": capacity_tokens(2**30, 32, 8, 128, dtype)})
    return rows


def _attention_error(model, prompt, dtype, scales) -> float:
    """Relative error of every layer's prefill attention output when K and V
    are stored in `dtype` (with the calibrated per-head scales), mean over layers."""
    if dtype == torch.float32:
        return 0.0
    captured = []
    hooks = [layer.attn.o.register_forward_pre_hook(lambda mod, args: captured.append(args[0])) for layer in
             model.layers]
    qkv = []
    hooks += [layer.attn.qkv.register_forward_hook(lambda mod, args, out: qkv.append(out)) for layer in model.layers]
    cfg = model.cfg
    try:
        scratch = fp8ext.PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, -(-len(prompt) // 16), 16,
                                      torch.float32)
        model.prefill([torch.tensor(prompt)], [scratch.append(0, len(prompt))], scratch)
    finally:
        for h in hooks:
            h.remove()
    errs = []
    positions = torch.arange(len(prompt))
    for i, (out, y) in enumerate(zip(captured, qkv)):
        q, k, v = y.split(cfg.qkv_sizes, dim=-1)
        q = model.rotary(q.reshape(-1, cfg.num_heads, cfg.head_dim), positions)
        k = model.rotary(k.reshape(-1, cfg.num_kv_heads, cfg.head_dim), positions)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        ones = torch.ones(cfg.num_kv_heads)
        ks, vs = (scales[i]["k_scale"], scales[i]["v_scale"]) if scales is not None else (ones, ones)
        k = encode(k, ks, dtype).float() * ks[:, None]  # what the cache write stores, dequantized
        v = encode(v, vs, dtype).float() * vs[:, None]
        got = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True,
            enable_gqa=True)[0].transpose(0, 1).reshape(out.shape)
        errs.append(((got - out).norm() / out.norm()).item())
    return sum(errs) / len(errs)
