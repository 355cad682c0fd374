"""The quantize ops' argument checks in Python, as csrc/torch/tensor_checks.h
makes them in C++ (same exception types, same wording), for the fake
implementations: a traced graph with a bad argument then fails while it is
traced, naming the argument, instead of when the real op first runs. They read
metadata only (no values, no data pointers), so FakeTensors pass through them."""
from __future__ import annotations

import torch

from fp8ext._native import INPUT_DTYPES

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MAX_PAD_K_TO = 1 << 20  # tensor_checks.h kMaxPadKTo
MAX_MARGIN = 64


def check_input_rank_and_dtype(x: torch.Tensor, name: str = "x") -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, cols], got {x.dim()}-D")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def check_input_matrix(x: torch.Tensor, name: str = "x") -> None:
    """2-D float32/float16/bfloat16 with a contiguous last dimension; rows may be
    strided but must not overlap (input_matrix)."""
    check_input_rank_and_dtype(x, name)
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {tuple(x.stride())}")
    if x.shape[0] > 1 and x.stride(0) < x.shape[1]:
        raise ValueError(f"{name} rows must not overlap, got strides {tuple(x.stride())}")


def check_fp8_dtype(dtype, name: str = "dtype") -> None:
    if dtype not in FP8_DTYPES:
        raise TypeError(f"{name} must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")


def check_scale_rule(dtype, margin: int) -> None:
    check_fp8_dtype(dtype)
    if not -MAX_MARGIN <= margin <= MAX_MARGIN:
        raise ValueError(f"margin must be in [-{MAX_MARGIN}, {MAX_MARGIN}], got {margin}")


def check_pad_k_to(pad_k_to: int) -> None:
    if not 0 <= pad_k_to <= MAX_PAD_K_TO:
        raise ValueError(f"pad_k_to must be in [0, {MAX_PAD_K_TO}] (0 or 1: no padding), got {pad_k_to}")


def check_scalar_fp32(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")
    if t.numel() != 1:
        raise ValueError(f"{name} must hold one value (0-d), got shape {tuple(t.shape)}")


def check_amax_history(h: torch.Tensor) -> None:
    if h.dtype != torch.float32:
        raise TypeError(f"amax_history must be float32, got {h.dtype}")
    if h.dim() != 1 or h.numel() < 1 or not h.is_contiguous():
        raise ValueError(f"amax_history must be a contiguous 1-D tensor of length >= 1, got shape {tuple(h.shape)}")


def check_quantize(x: torch.Tensor, dtype, margin: int, pad_k_to: int) -> None:
    """What every scale-computing quantize op checks (the order of quantize_scaled_cpu)."""
    check_input_matrix(x)
    check_scale_rule(dtype, margin)
    check_pad_k_to(pad_k_to)
