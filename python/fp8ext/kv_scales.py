"""An FP8 KV cache's k_scale / v_scale in checkpoints: written under vLLM's names,
read under the names vLLM, compressed-tensors, ModelOpt and AutoFP8 use.

In memory the scales are a mapping attention name -> {"k_scale", "v_scale"}
(what ``calibrate(...).kv_scales(fmt)`` returns and ``PagedKVCache(scales=...)``
takes); each is a dequantization scale (the stored code times the scale gives
K or V), one value or one per KV head.
"""
from __future__ import annotations

import re
from typing import Mapping

import torch

from fp8ext.ops.kv_cache_reference import check_scale_values

# Checkpoint key suffix -> the scales it holds. The longest suffix that fits wins,
# so that ModelOpt's "self_attn.k_proj.k_scale" names the attention "self_attn".
_SUFFIXES = {
    ".k_proj.k_scale": ("k_scale",),        # ModelOpt
    ".v_proj.v_scale": ("v_scale",),
    ".k_proj.output_scale": ("k_scale",),   # AutoFP8's first format
    ".v_proj.output_scale": ("v_scale",),
    ".kv_scale": ("k_scale", "v_scale"),    # vLLM's older single scale for both
    ".k_scale": ("k_scale",),               # vLLM, compressed-tensors
    ".v_scale": ("v_scale",),
}


def by_layer_number(names: list) -> list:
    """Attention names in layer order: where they differ only in their numbers
    ("model.layers.10.self_attn" and "model.layers.2.self_attn", as a checkpoint's
    sorted keys list them), ordered by those numbers; otherwise as given (model
    order, as calibrate returns them)."""
    numbers = [tuple(int(n) for n in re.findall(r"\d+", str(name))) for name in names]
    skeletons = {re.sub(r"\d+", "#", str(name)) for name in names}
    if len(skeletons) != 1 or len(set(numbers)) != len(names):
        return list(names)
    return [name for _, name in sorted(zip(numbers, names))]


def kv_scales_state_dict(scales: Mapping) -> dict:
    """``{attention name: {"k_scale", "v_scale"}}`` as flat checkpoint entries
    ``"<attention name>.k_scale"`` / ``".v_scale"`` (float32 tensors), vLLM's names
    when the attention names are the model's (``model.layers.0.self_attn``): save
    them beside the model's state_dict (safetensors takes the dict as it is)."""
    if not isinstance(scales, Mapping):
        raise TypeError(f"scales must be a mapping of attention name -> {{'k_scale', 'v_scale'}}, got "
                        f"{type(scales).__name__}")
    out = {}
    for attn, entry in scales.items():
        if not isinstance(attn, str) or not isinstance(entry, Mapping) or not {"k_scale", "v_scale"} <= set(entry):
            raise ValueError(f"scales[{attn!r}] must map a str attention name to a mapping with 'k_scale' and "
                             f"'v_scale', got {entry!r}")
        for kind in ("k_scale", "v_scale"):
            key = f"{attn}.{kind}" if attn else kind
            value = entry[kind]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            t = _float_tensor(torch.tensor(float(value)) if number else value, key)
            out[key] = t.reshape(()) if t.numel() == 1 else t  # one value: a 0-d tensor, as vLLM writes it
    return out


def kv_scales_from_state_dict(state_dict: Mapping) -> dict:
    """The KV-cache scales in a checkpoint (a model's whole state_dict will do: other
    entries are ignored), as ``{attention name: {"k_scale", "v_scale"}}`` in layer
    order, for ``PagedKVCache(scales=...)``. Reads ``<attn>.k_scale`` / ``.v_scale``
    (vLLM, compressed-tensors), ``<attn>.k_proj.k_scale`` (ModelOpt),
    ``<attn>.k_proj.output_scale`` (AutoFP8) and ``<attn>.kv_scale`` (one scale for
    both). Attention names come sorted with their digit runs read as numbers
    (layers.2 before layers.10). An attention with only one of K and V, or a
    scale that is not finite and positive, is refused."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    found: dict = {}
    for key, value in state_dict.items():
        suffix = max((s for s in _SUFFIXES if isinstance(key, str) and ("." + key).endswith(s)), key=len, default=None)
        if suffix is None:
            continue
        attn = ("." + key)[:-len(suffix)].lstrip(".")
        for kind in _SUFFIXES[suffix]:
            if kind in found.setdefault(attn, {}):
                raise ValueError(f"the checkpoint gives {attn!r} two {kind}s (one of them under {key!r})")
            found[attn][kind] = _float_tensor(value, key)
    for attn, entry in found.items():
        missing = {"k_scale", "v_scale"} - set(entry)
        if missing:
            raise ValueError(f"the checkpoint gives {attn!r} no {missing.pop()} (an FP8 cache needs both)")
    return {attn: found[attn] for attn in sorted(found, key=_natural)}  # a file has no model order to keep


def _natural(name: str) -> list:
    """Sort key comparing digit runs as numbers: "layers.2" before "layers.10" (and a
    model whose layers are named differently, self_attn and cross_attn, in layer order)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name))]


def _float_tensor(value, name: str) -> torch.Tensor:
    """A checkpoint's scale as float32 [n], finite and > 0 (named otherwise)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got "
                        f"{value.dtype if isinstance(value, torch.Tensor) else type(value).__name__}")
    t = value.detach().to(torch.float32).reshape(-1).contiguous()
    check_scale_values(t, name)
    return t
