"""fp8ext.calibrate: fixes the static activation scales of a converted model
from calibration batches, and measures the K/V amax per attention layer and KV
head (the paged FP8 KV cache's k_scale / v_scale)."""
from __future__ import annotations

import contextlib
import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from fp8ext.checks import check_bool, check_positive_int
from fp8ext.formats import E4M3, FP8Format, get_format
from fp8ext.nn.batches import check_batches, eval_mode, linear_input, run_model
from fp8ext.nn.linear import FP8Linear
from fp8ext.ops.reference import amax_finite, scale_from_amax
from fp8ext.recipes import check_margin

KV_PROJ_NAMES = ("k_proj", "v_proj")  # the last name component (not qkv_proj / kv_proj)
# Fused projections calibrate cannot split into K and V (it warns when it meets one).
FUSED_KV_NAMES = ("qkv_proj", "kv_proj", "query_key_value", "W_pack", "c_attn", "Wqkv")


@dataclass
class CalibrationResult:
    """Per-layer activation amax, the static scales set from them, and K/V amax per KV head."""

    input_amax: dict = field(default_factory=dict)  # FP8Linear name -> 0-d float32 amax of its input
    # attention name -> {"k": [H], "v": [H], "k_rotary": [H]}: amax of k_proj's and v_proj's outputs, and
    # a bound on K after rotate-half RoPE at any position (see kv_scales)
    kv_amax: dict = field(default_factory=dict)
    batches: int = 0

    def kv_scales(self, fmt: FP8Format | str = E4M3, margin: int = 0, rotary: bool = True) -> dict:
        """attention name -> {"k_scale": [H], "v_scale": [H]}: dequantization scales for an FP8 KV cache.

        With ``rotary`` (the default) k_scale is sized for K as a Llama-style
        cache stores it, after rotate-half RoPE (Llama, Mistral, Qwen;
        PagedKVCache.write_rotary and Hugging Face's caches): a rotation moves
        each pair (k[i], k[i + D/2]) of a head around a circle of its norm, so
        the largest pair norm seen bounds the rotated K at every position (up
        to sqrt(2) x the amax of k_proj's output). ``rotary=False`` sizes it
        for K as k_proj gives it (no RoPE on the cached K)."""
        dtype = get_format(fmt).torch_dtype
        check_margin(margin)
        check_bool("rotary", rotary)
        out = {}
        for name, d in self.kv_amax.items():
            k = d.get("k_rotary", d.get("k")) if rotary else d.get("k")
            out[name] = {f"{kv}_scale": scale_from_amax(amax, dtype, margin, False)
                         for kv, amax in (("k", k), ("v", d.get("v"))) if amax is not None}
        return out


def _progress(batches, enabled: bool):
    try:
        total = len(batches)
    except TypeError:
        total = None
    if enabled:
        try:
            from tqdm.auto import tqdm  # optional
            yield from tqdm(batches, total=total, desc="calibrating", unit="batch")
            return
        except ImportError:
            pass
    for i, b in enumerate(batches, 1):
        if enabled:
            print(f"\rcalibrating: batch {i}" + (f"/{total}" if total else ""), end="", file=sys.stderr, flush=True)
        yield b
    if enabled:
        print(file=sys.stderr)


def _rotated_bound(k: torch.Tensor, amax: torch.Tensor, per_head: bool) -> torch.Tensor:
    """[H] bound on K [tokens, H, D] after rotate-half RoPE at any position: the
    largest norm of a pair (k[i], k[i + D/2]) of a head, or sqrt(2) x amax where
    the pairs are unknown (no head split, or an odd head width)."""
    if not per_head or k.shape[-1] % 2:
        return amax * math.sqrt(2.0)
    half = k.shape[-1] // 2
    norms = torch.hypot(k[..., :half].float(), k[..., half:].float())  # hypot: no overflow of the squares
    return torch.maximum(amax_finite(norms, dim=(0, 2)), amax)  # a finite k beside an Inf partner still counts


def _kv_norm(model: nn.Module, name: str) -> nn.Module | None:
    """The k_norm / v_norm beside the projection `name`, if the model has one."""
    attn, _, last = name.rpartition(".")
    try:
        norm = model.get_submodule(f"{attn}.{last[0]}_norm" if attn else f"{last[0]}_norm")
    except AttributeError:
        return None
    return norm if isinstance(norm, nn.Module) else None


def _normalized(norm: nn.Module, out: torch.Tensor, name: str) -> torch.Tensor:
    """norm applied to the projection's output [..., width] as the model applies it:
    over each head (its width the norm's, e.g. Qwen3 and Gemma3; the model may
    transpose around it, which changes no value) or over the whole width
    (OLMo2). Applied here, not read from the norm's own output, whose layout
    ([B, T, H, D] or [B, H, T, D]) the model chooses."""
    shape = getattr(norm, "normalized_shape", None)
    weight = getattr(norm, "weight", None)
    size = math.prod(shape) if shape else (weight.numel() if isinstance(weight, torch.Tensor) else None)
    if not size or out.shape[-1] % size:
        raise ValueError(f"cannot tell the width {name}'s norm normalises (normalized_shape {shape}, weight "
                         f"{None if weight is None else tuple(weight.shape)}) against the output width {out.shape[-1]}")
    # forward, not __call__: the norm's own hooks must not see a call the model did not make
    return norm.forward(out.unflatten(-1, (-1, size))).flatten(-2)


def _head_dim(model: nn.Module, head_dim: int | None) -> int | None:
    if head_dim is not None:
        return check_positive_int("head_dim", head_dim, " or None")
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    hd = getattr(cfg, "head_dim", None)
    if hd is None and getattr(cfg, "num_attention_heads", None):
        hd = cfg.hidden_size // cfg.num_attention_heads
    return hd


@torch.no_grad()
def calibrate(model: nn.Module, batches: Iterable, *, margin: int = 0, head_dim: int | None = None,
              progress: bool = True) -> CalibrationResult:
    """Runs ``model`` on each batch in eval mode (``model(batch)``,
    ``model(*batch)`` for a tuple or list, ``model(**batch)`` for a mapping; each
    module's own mode is restored afterwards) and records the amax of every :class:`FP8Linear`'s input and of every
    ``k_proj`` / ``v_proj`` output per KV head, with a bound on K after RoPE
    (:meth:`CalibrationResult.kv_scales`). Where a ``k_norm`` (``v_norm``) sits
    beside the projection (Qwen3, OLMo2 and Gemma3 normalise K before RoPE),
    the cache stores the normalised K: the norm is applied to the projection's
    output (per head, or over the whole width, as its size says) and that is
    measured. The last name component must be exactly ``k_proj`` or
    ``v_proj``: fused projections (``qkv_proj``, ``query_key_value``, ...) are
    not split, and calibrate warns when the model has some and no K/V was measured.

    During calibration every FP8Linear computes with its dequantized weight and
    unquantized input, so that no uncalibrated scale distorts the amax of the
    layers after it. Afterwards the layers with a static recipe get
    ``input_scale = amax * 2**margin / fp8_max`` (the recipe's own margin is
    added); delayed-scaling layers get a history holding that amax alone
    (newest slot) and the scale their recipe derives from it (its own margin,
    not ``margin``), as if the calibration data had been their last call, so
    their first calls do not quantize with scale 1; current scaling needs nothing.

    ``head_dim`` splits the K/V projections' outputs into heads; it defaults to
    ``model.config.head_dim`` (or hidden_size / num_attention_heads) when the
    model has a Hugging Face config, else K/V amax is recorded per tensor (H = 1).
    Given explicitly, it must divide every K/V projection's output width.
    ``margin`` is an int; with each static layer's own margin it must stay in
    [-64, 64].
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_margin(margin)
    check_batches(batches)
    result = CalibrationResult()
    hd = _head_dim(model, head_dim)
    fp8_layers = {name: m for name, m in model.named_modules() if isinstance(m, FP8Linear)}
    seeded = {name: m for name, m in fp8_layers.items() if m.recipe.needs_state}  # static and delayed
    for name, m in seeded.items():
        if m.recipe.activation_mode == "static":
            check_margin(m.recipe.margin + margin, f"margin + {name}'s recipe margin")
    kv_layers = {name: m for name, m in model.named_modules()
                 if isinstance(m, (nn.Linear, FP8Linear)) and name.rpartition(".")[2] in KV_PROJ_NAMES}

    def record_input(name):
        def hook(_module, args, kwargs):
            amax = amax_finite(linear_input(args, kwargs))
            prev = result.input_amax.get(name)
            result.input_amax[name] = amax if prev is None else torch.maximum(prev, amax)
        return hook

    def record_kv(name):
        attn, _, proj = name.rpartition(".")
        kv = proj[0]  # "k" or "v"
        norm = _kv_norm(model, name)

        def hook(_module, _args, out):
            if norm is not None:
                out = _normalized(norm, out, name)
            o = out.reshape(-1, out.shape[-1])
            if o.shape[0] == 0:
                return  # a batch without tokens has no K/V to record
            if head_dim is not None and o.shape[-1] % head_dim:
                raise ValueError(f"head_dim={head_dim} does not divide {name}'s output width {o.shape[-1]}")
            per_head = bool(hd) and o.shape[-1] % hd == 0
            heads = o.shape[-1] // hd if per_head else 1
            o = o.reshape(o.shape[0], heads, -1)
            found = {kv: amax_finite(o, dim=(0, 2))}
            if kv == "k":
                found["k_rotary"] = _rotated_bound(o, found["k"], per_head)
            d = result.kv_amax.setdefault(attn, {})
            for key, amax in found.items():
                d[key] = amax if key not in d else torch.maximum(d[key], amax)
        return hook

    handles = [m.register_forward_pre_hook(record_input(n), with_kwargs=True) for n, m in fp8_layers.items()]
    handles += [m.register_forward_hook(record_kv(n)) for n, m in kv_layers.items()]
    try:
        with contextlib.ExitStack() as stack, torch.no_grad():
            stack.enter_context(eval_mode(model))
            for m in fp8_layers.values():
                stack.enter_context(m.high_precision())
            for batch in _progress(batches, progress):
                run_model(model, batch)
                result.batches += 1
    finally:
        for h in handles:
            h.remove()
    if result.batches == 0:
        raise ValueError("batches is empty: calibration needs at least one batch")
    fused = [n for n, _ in model.named_modules() if n.rpartition(".")[2] in FUSED_KV_NAMES]
    if fused and not result.kv_amax:
        warnings.warn(f"calibrate measures K and V at k_proj / v_proj only: the fused projections {fused[:3]} "
                      "are not split, so no k_scale / v_scale was measured", stacklevel=2)
    unseen = [n for n in seeded if n not in result.input_amax]
    if unseen:
        warnings.warn(f"calibration never ran {len(unseen)} static or delayed layers (their input_scale stays "
                      f"as it was): {unseen[:5]}", stacklevel=2)
    for name, m in seeded.items():
        if name in result.input_amax:
            amax, static = result.input_amax[name], m.recipe.activation_mode == "static"
            m.input_scale.copy_(scale_from_amax(amax, m.recipe.activation_format.torch_dtype,
                                                m.recipe.margin + (margin if static else 0),
                                                m.recipe.power_of_two_scales))
            if not static:
                m.amax_history.zero_()
                m.amax_history[0] = amax
    return result
