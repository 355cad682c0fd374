"""Fused ops whose CPU implementation (and GPU fallback) is the composition of
the ops they fuse, so on the CPU the fused and the unfused paths agree bit for
bit; the CUDA kernels (csrc/quant/rms_norm_quantize.cu, silu_mul_quantize.cu)
do it in one launch."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_quantize_per_row(x, weight, eps, dtype, margin, power_of_two, pad_k_to):
    """quantize_per_row(weight * rms_norm(x)), RMSNorm rounded as Hugging Face's
    Llama rounds it (fp32, then x's dtype, then the weight multiply)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be a [{x.shape[-1]}] tensor, got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype ({x.dtype}), got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight must be on x's device ({x.device}), got {weight.device}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    y = weight * F.rms_norm(x, (x.shape[-1],), None, eps)
    return torch.ops.fp8ext.quantize_per_row(y, dtype, margin, power_of_two, pad_k_to)


def silu_mul_quantize_per_row(x, dtype, margin, power_of_two, pad_k_to):
    """quantize_per_row(silu(gate) * up) for x = [gate | up] ([M, 2I], a SwiGLU
    gate_up output), each op rounded to x's dtype as PyTorch does."""
    if x.shape[-1] % 2:
        raise ValueError(f"x must be [M, 2 * I] (gate, then up), got {x.shape[-1]} columns")
    gate, up = x.split(x.shape[-1] // 2, dim=-1)
    return torch.ops.fp8ext.quantize_per_row(F.silu(gate) * up, dtype, margin, power_of_two, pad_k_to)


torch.library.impl("fp8ext::rms_norm_quantize_per_row", "CPU")(rms_norm_quantize_per_row)
torch.library.impl("fp8ext::silu_mul_quantize_per_row", "CPU")(silu_mul_quantize_per_row)
