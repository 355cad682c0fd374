"""Reference of the scaled_mm op, in PyTorch: the CPU implementation (so the
same code runs everywhere) and the CUDA path on GPUs without the sm_90a
kernels. Argument checks match csrc/torch/cuda/scaled_mm_cuda.cpp."""
from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Tile configurations of the CUDA kernels (GemmConfig in csrc/include/fp8ext/scaled_mm.h);
# from wide_fast_accum on they are bf16-output only.
CONFIGS = {"auto": 0, "large": 1, "medium": 2, "swap_small": 3, "swap_medium": 4,
           "wide_fast_accum": 5, "large_n192": 6, "large_cluster_n": 7}
MAX_CONFIG = max(CONFIGS.values())


def _check_scale(s, rows: int, name: str, operand: str, like: torch.Tensor) -> bool:
    """True for one value per row of the operand, False for one value."""
    if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got "
                        f"{s.dtype if isinstance(s, torch.Tensor) else type(s).__name__}")
    if s.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {s.device}")
    if s.numel() == 1:
        return False
    vector = s.numel() == rows and (s.dim() == 1 or (s.dim() == 2 and 1 in s.shape))
    if not vector:
        raise ValueError(f"{name} must hold one value (per-tensor) or one per row of {operand} ({rows}), "
                         f"got shape {tuple(s.shape)}")
    return True


def check_scaled_mm_args(a, b, scale_a, scale_b, bias, out_dtype, config) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D ([M, K] and [N, K]), got {a.dim()}-D and {b.dim()}-D")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in FP8_DTYPES:
            raise TypeError(f"{name} must be torch.float8_e4m3fn or torch.float8_e5m2, got {t.dtype}")
    if b.device != a.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must share K (a: [M, K], b: [N, K]), got {tuple(a.shape)} and {tuple(b.shape)}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    if not 0 <= config <= MAX_CONFIG:
        raise ValueError(f"config must be 0 (auto) to {MAX_CONFIG}, got {config}")
    _check_scale(scale_a, a.shape[0], "scale_a", "a", a)
    _check_scale(scale_b, b.shape[0], "scale_b", "b", a)
    if bias is not None:
        if bias.dtype != out_dtype:
            raise TypeError(f"bias must have out_dtype ({out_dtype}), got {bias.dtype}")
        if bias.dim() != 1 or bias.shape[0] != b.shape[0] or bias.device != a.device:
            raise ValueError(f"bias must be [N] = [{b.shape[0]}] on {a.device}, got {tuple(bias.shape)} "
                             f"on {bias.device}")


def scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, config, use_fast_accum=False):
    """D = (scale_a * scale_b) * (a @ b^T) + bias, accumulated in float32 (FP8
    products are exact there), rounded once to out_dtype. use_fast_accum only
    allows a faster, less precise accumulation: the reference ignores it."""
    check_scaled_mm_args(a, b, scale_a, scale_b, bias, out_dtype, config)
    acc = a.float() @ b.float().t()
    sa = scale_a.reshape(-1, 1) if scale_a.numel() != 1 else scale_a.reshape(())  # [M] (M may be 0) or one
    sb = scale_b.reshape(1, -1) if scale_b.numel() != 1 else scale_b.reshape(())
    d = (sa * sb) * acc
    if bias is not None:
        d = d + bias.float()
    return d.to(out_dtype)


torch.library.impl("fp8ext::scaled_mm", "CPU")(scaled_mm)
