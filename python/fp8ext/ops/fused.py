"""Fused ops whose CPU implementation (and GPU fallback) is the composition of
the ops they fuse, so on the CPU the fused and the unfused paths agree bit for
bit; the CUDA kernels (csrc/quant/rms_norm_quantize.cu, silu_mul_quantize.cu,
csrc/attention/kv_cache_write.cu) do it in one launch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8ext._native import INPUT_DTYPES
from fp8ext.ops import quantize_checks as qc
from fp8ext.ops.kv_cache_reference import check_apart_from_pools, check_cache


def check_norm_weight(x, weight, eps) -> None:
    """The RMSNorm weight: x's dtype and device, one contiguous value per column."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.shape[0] != x.shape[-1] \
            or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous [{x.shape[-1]}] tensor, got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype ({x.dtype}), got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight must be on x's device ({x.device}), got {weight.device}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def check_residual(x, residual) -> None:
    if not isinstance(residual, torch.Tensor) or residual.shape != x.shape or residual.device != x.device:
        raise ValueError(f"residual must match x ({tuple(x.shape)} on {x.device}), got "
                         f"{tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual must have x's dtype ({x.dtype}), got {residual.dtype}")


def check_gate_up(x) -> None:
    if x.shape[-1] % 2:
        raise ValueError(f"x must be [M, 2 * I] (gate, then up), got {x.shape[-1]} columns")


def rms_norm_quantize_per_row(x, weight, eps, dtype, margin, power_of_two, pad_k_to):
    """quantize_per_row(weight * rms_norm(x)), RMSNorm rounded as Hugging Face's
    Llama rounds it (fp32, then x's dtype, then the weight multiply)."""
    qc.check_input_matrix(x)  # first, as the fake and the CUDA op check it
    check_norm_weight(x, weight, eps)
    y = weight * F.rms_norm(x, (x.shape[-1],), None, eps)
    return torch.ops.fp8ext.quantize_per_row(y, dtype, margin, power_of_two, pad_k_to)


def add_rms_norm_quantize_per_row(x, residual, weight, eps, dtype, margin, power_of_two, pad_k_to):
    """h = x + residual (rounded to x's dtype), then rms_norm_quantize_per_row(h);
    returns (q, scale, h)."""
    qc.check_input_matrix(x)
    check_residual(x, residual)
    h = (x + residual).contiguous()  # row-major whatever x's row stride, as the CUDA op and the fake give it
    q, s = rms_norm_quantize_per_row(h, weight, eps, dtype, margin, power_of_two, pad_k_to)
    return q, s, h


def silu_mul_quantize_per_row(x, dtype, margin, power_of_two, pad_k_to):
    """quantize_per_row(silu(gate) * up) for x = [gate | up] ([M, 2I], a SwiGLU
    gate_up output), each op rounded to x's dtype as PyTorch does."""
    qc.check_input_matrix(x)
    check_gate_up(x)
    half = x.shape[-1] // 2
    gate, up = x[..., :half], x[..., half:]  # (split() refuses a split size of 0: I = 0 is an empty output)
    return torch.ops.fp8ext.quantize_per_row(F.silu(gate) * up, dtype, margin, power_of_two, pad_k_to)


def rotate_half(x, cos, sin):
    """RoPE in the rotate-half layout with Hugging Face's tables (cos and sin of
    the angles, the two halves equal): x * cos + [-x2, x1] * sin, rounded as
    transformers' apply_rotary_pos_emb rounds it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def check_rotary_tables_are_tensors(cos, sin) -> None:
    """(The CUDA op's schema takes None for a tensor and names only its shape.)"""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")


def check_rotary(qkv, cos, sin, k_cache, v_cache, num_q_heads, read_memory: bool = True) -> None:
    """kv_cache_write_rotary's own checks (kv_cache_write checks the rest);
    read_memory=False (the fakes) leaves out the overlap checks (pools, qkv)."""
    check_cache(k_cache, v_cache, read_memory)
    if not isinstance(qkv, torch.Tensor) or qkv.dtype not in INPUT_DTYPES:
        raise TypeError(f"qkv must be a bfloat16, float16 or float32 tensor, got "
                        f"{qkv.dtype if isinstance(qkv, torch.Tensor) else type(qkv).__name__}")
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    if dim % 32:
        raise ValueError(f"head_dim must be a multiple of 32 for the rotary write, got {dim}")
    if not 1 <= num_q_heads <= 65535:
        raise ValueError(f"num_q_heads must be in [1, 65535], got {num_q_heads}")
    cols = (num_q_heads + 2 * heads) * dim
    if qkv.dim() != 2 or qkv.shape[1] != cols:
        raise ValueError(f"qkv must be [num_tokens, {cols}] ((num_q_heads + 2 * num_kv_heads) * head_dim), "
                         f"got {tuple(qkv.shape)}")
    check_rotary_tables_are_tensors(cos, sin)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (qkv.shape[0], dim):
            raise ValueError(f"{name} must be [{qkv.shape[0]}, {dim}] (num_tokens, head_dim), got {tuple(t.shape)}")
        if t.dtype != qkv.dtype:
            raise TypeError(f"{name} must have qkv's dtype {qkv.dtype}, got {t.dtype}")
    if read_memory:
        check_apart_from_pools(qkv, "qkv", k_cache, v_cache)


def kv_cache_write_rotary(qkv, cos, sin, k_cache, v_cache, slot_mapping, k_scale, v_scale, num_q_heads):
    """qkv [T, (H_q + 2 H_kv) * D] split into q, K, V; q and K rotated with the
    tables cos, sin [T, D]; K and V written as kv_cache_write writes them.
    Returns the rotated q [T, H_q, D]."""
    check_rotary(qkv, cos, sin, k_cache, v_cache, num_q_heads)
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    tokens = qkv.shape[0]
    q, k, v = qkv.split((num_q_heads * dim, heads * dim, heads * dim), dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    k = rotate_half(k.reshape(tokens, heads, dim), cos, sin)
    torch.ops.fp8ext.kv_cache_write(k, v.reshape(tokens, heads, dim), k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return rotate_half(q.reshape(tokens, num_q_heads, dim), cos, sin)


torch.library.impl("fp8ext::rms_norm_quantize_per_row", "CPU")(rms_norm_quantize_per_row)
torch.library.impl("fp8ext::add_rms_norm_quantize_per_row", "CPU")(add_rms_norm_quantize_per_row)
torch.library.impl("fp8ext::silu_mul_quantize_per_row", "CPU")(silu_mul_quantize_per_row)
torch.library.impl("fp8ext::kv_cache_write_rotary", "CPU")(kv_cache_write_rotary)
