"""The decoder's small pieces: RMSNorm, rotary embeddings, and fused projections."""
from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fp8ext.checks import is_finite_number, is_int
from fp8ext.nn.linear import K_ALIGN, STATIC_UNCALIBRATED, FP8Linear
from fp8ext.ops.fused import rotate_half
from fp8ext.quantize import add_rms_norm_quantize, rms_norm_quantize, silu_mul_quantize
from fp8ext.ops.reference import GROUP  # the block-wise recipe's weight block
from fp8ext.recipes import Recipe


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 and rounded to x's dtype before the weight (as Hugging Face's Llama)."""

    def __init__(self, size: int, eps: float, dtype=None, device=None):
        super().__init__()
        if not (is_finite_number(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm upcasts to float32 and rounds back before returning, as HF does: one op where
        # the float32 formula took five (bit-identical on the CPU: tests/test_serving.py).
        return self.weight * F.rms_norm(x, (x.shape[-1],), None, self.eps)


class Rotary(nn.Module):
    """Plain RoPE on [tokens, heads, head_dim] at given positions (rotate-half layout). The tables
    depend on the positions only, so a step computes them once for all layers (`tables`) and each
    layer applies them to its q and k (`rotate`)."""

    def __init__(self, head_dim: int, theta: float, device=None):
        super().__init__()
        if not is_int(head_dim) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be an even positive int (RoPE rotates pairs), got {head_dim!r}")
        if not (is_finite_number(theta) and theta > 0):
            raise ValueError(f"theta must be a finite number > 0, got {theta!r}")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta ** exponents), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple:
        """cos and sin [tokens, 1, head_dim] in `dtype`, as Hugging Face Llama's
        rotary embedding gives them (each half the same angles)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((sin, sin), dim=-1)[:, None, :]

    @staticmethod
    def rotate(x: torch.Tensor, tables: tuple) -> torch.Tensor:
        return rotate_half(x, *tables)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.rotate(x, self.tables(positions, x.dtype))


class QuantizedActivation(NamedTuple):
    """A norm's output already quantized for the FP8Linear it feeds (`norm_for`)."""
    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype  # the dtype of the unquantized activation, which the layer's output takes


def _fusion_on(switch: str) -> bool:
    """The engine's fusions are on unless their environment switch is "0" (read
    at each call, so an A/B run can flip them between graph captures)."""
    return os.environ.get(switch, "1") != "0"


def takes_fused_quantize(linear: nn.Module) -> bool:
    """Whether the op before `linear` (RMSNorm, SwiGLU's silu * up) should also
    quantize its output for it: `linear` quantizes its input per token (RowWise).
    On by default (0.2 ms of a 9.9 ms step at batch 64 x 4096 on the H200,
    bench/NOTES.md session 9); FP8EXT_FUSED_QUANT=0 turns it off."""
    return _fusion_on("FP8EXT_FUSED_QUANT") and isinstance(linear, FP8Linear) and \
        not linear.computes_in_high_precision and linear.recipe.activation_mode == "current" and \
        linear.recipe.activation_granularity == "per_token"


def fused_rotary_write() -> bool:
    """Whether decode writes the cache with RoPE fused in (PagedKVCache.write_rotary):
    on unless FP8EXT_FUSED_ROPE=0."""
    return _fusion_on("FP8EXT_FUSED_ROPE")


def norm_for(norm: RMSNorm, h: torch.Tensor, linear: nn.Module):
    """norm(h) in the form `linear` takes it (see `apply_linear`): FP8 codes and
    scales from one kernel where `takes_fused_quantize(linear)`, else the
    normalized tensor."""
    if takes_fused_quantize(linear):
        q, s = rms_norm_quantize(h.reshape(-1, h.shape[-1]), norm.weight, norm.eps, linear.recipe, pad_k_to=K_ALIGN)
        return QuantizedActivation(q, s, h.dtype)
    return norm(h)


def add_norm_for(norm: RMSNorm, h: torch.Tensor, delta: torch.Tensor | None, linear: nn.Module):
    """The residual step before a norm: ``h = h + delta`` (none when delta is None),
    then ``norm_for(norm, h, linear)``; returns (that, h). Where
    `takes_fused_quantize(linear)`, the add, the norm and the quantization are
    one kernel."""
    if delta is None:
        return norm_for(norm, h, linear), h
    if takes_fused_quantize(linear) and _fusion_on("FP8EXT_FUSED_ADD"):
        k = h.shape[-1]
        q, s, h_new = add_rms_norm_quantize(delta.reshape(-1, k), h.reshape(-1, k), norm.weight, norm.eps,
                                            linear.recipe, pad_k_to=K_ALIGN)
        return QuantizedActivation(q, s, h.dtype), h_new.reshape(h.shape)
    h = h + delta
    return norm_for(norm, h, linear), h


def apply_linear(linear: nn.Module, x) -> torch.Tensor:
    """linear(x), for x as `norm_for` returns it."""
    if isinstance(x, QuantizedActivation):
        return linear.forward_quantized(x.q, x.scale, x.dtype)
    return linear(x)


def swiglu_into(down: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
    """down(silu(gate) * up) for gate_up = [gate | up]; the activation and the
    quantization of down's input in one kernel where `takes_fused_quantize(down)`."""
    if takes_fused_quantize(down):
        q, s = silu_mul_quantize(gate_up.reshape(-1, gate_up.shape[-1]), down.recipe, pad_k_to=K_ALIGN)
        return down.forward_quantized(q, s, gate_up.dtype).reshape(*gate_up.shape[:-1], -1)
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return down(F.silu(gate) * up)


def fuse_linears(shards, recipe: Recipe | None = None) -> nn.Module:
    """One projection computing several (q/k/v, gate/up) that read the same input.

    Without a recipe: an nn.Linear over the concatenated weights. With one: an
    FP8Linear whose shards are quantized on their own, as separate layers (and
    separate checkpoint tensors) would be, then concatenated: per-channel and
    128x128 block scales concatenate exactly; per-tensor shards keep their
    scales as a per-channel vector, so the fused GEMM applies each shard's own
    scale. Block-wise shards whose row count is not a multiple of 128 would
    share a block: then the fused weight is quantized as one.
    """
    shards = list(shards)
    if not shards or not all(isinstance(s, nn.Linear) for s in shards):
        raise TypeError("shards must be a non-empty list of nn.Linear")
    if len({s.in_features for s in shards}) != 1 or len({s.bias is None for s in shards}) != 1:
        raise ValueError("shards must share in_features and all have or all lack a bias")
    w = shards[0].weight
    fused = nn.Linear(shards[0].in_features, sum(s.out_features for s in shards), bias=shards[0].bias is not None,
                      device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([s.weight for s in shards]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([s.bias for s in shards]))
    fused.weight.requires_grad_(False)
    if recipe is None:
        return fused
    if recipe.activation_mode == "static":  # once for the fused layer, not once a shard
        warnings.warn(STATIC_UNCALIBRATED, stacklevel=2)
    layer = FP8Linear.quantized_from(fused, recipe)
    if recipe.weight_granularity == "block" and any(s.out_features % GROUP for s in shards):
        return layer
    parts = [FP8Linear.quantized_from(s, recipe) for s in shards]
    layer.weight.copy_(torch.cat([p.weight for p in parts]))
    if recipe.weight_granularity == "per_tensor":
        scale = torch.cat([p.weight_scale.reshape(1).expand(p.out_features) for p in parts])
    else:
        scale = torch.cat([p.weight_scale for p in parts])
    layer.weight_scale = scale.contiguous()
    return layer
