"""Reference of the scaled_mm op, in PyTorch: the CPU implementation (so the
same code runs everywhere) and the CUDA path on GPUs without the sm_90a
kernels. Argument checks match csrc/torch/cuda/scaled_mm_cuda.cpp."""
from __future__ import annotations

import torch

from fp8ext.ops.reference import GROUP

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Tile configurations of the CUDA kernels (GemmConfig in csrc/include/fp8ext/scaled_mm.h);
# medium, wide_fast_accum, large_n192, large_cluster_n and pingpong_fast_accum are
# bf16-output only; gemv (CUDA cores, for decode-sized M) and split_k (slices of K
# in one launch, then a sum) take E4M3 operands and any output dtype.
CONFIGS = {"auto": 0, "large": 1, "medium": 2, "swap_small": 3, "swap_medium": 4,
           "wide_fast_accum": 5, "large_n192": 6, "large_cluster_n": 7, "gemv": 8, "split_k": 9,
           "pingpong_fast_accum": 10}
MAX_CONFIG = max(CONFIGS.values())
_CONFIG_NAMES = {v: k for k, v in CONFIGS.items()}
_BF16_ONLY = {"medium", "wide_fast_accum", "large_n192", "large_cluster_n", "pingpong_fast_accum"}


def _instantiated(config: int, a_dtype, b_dtype, out_dtype) -> bool:
    """Whether the CUDA op has a kernel for this config (has_config in
    csrc/gemm/scaled_mm_dispatch.cu): the CPU path refuses what the GPU would, so
    code tested on the CPU does not fail on the GPU first."""
    name = _CONFIG_NAMES[config]
    e4m3 = a_dtype == b_dtype == torch.float8_e4m3fn
    if name == "auto":
        return True
    if name in ("gemv", "split_k"):
        return e4m3
    if name in _BF16_ONLY:
        return e4m3 and out_dtype == torch.bfloat16
    if e4m3:
        return out_dtype != torch.float32 or name in ("large", "swap_medium")
    return name == "large"  # E5M2 operands run the large kernel with fp32 output, then cast


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


def _check_operands(a, b, out_dtype, check_dtypes) -> None:
    """What both GEMM ops check, in the CUDA ops' order: the operand dtypes
    (check_dtypes), a [M, K] and b [N, K] on one device, and the output dtype."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dtypes()
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D ([M, K] and [N, K]), got {a.dim()}-D and {b.dim()}-D")
    if b.device != a.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must share K (a: [M, K], b: [N, K]), got {tuple(a.shape)} and {tuple(b.shape)}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")


def check_scaled_mm_args(a, b, scale_a, scale_b, bias, out_dtype, config) -> None:
    def fp8_operands():
        for name, t in (("a", a), ("b", b)):
            if t.dtype not in FP8_DTYPES:
                raise TypeError(f"{name} must be torch.float8_e4m3fn or torch.float8_e5m2, got {t.dtype}")
    _check_operands(a, b, out_dtype, fp8_operands)
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
    # The CUDA op checks the config once it has a problem to run (an empty one returns first).
    if a.shape[0] and b.shape[0] and a.shape[1] and not _instantiated(config, a.dtype, b.dtype, out_dtype):
        raise ValueError(f"fp8ext.scaled_mm: config {_CONFIG_NAMES[config]} is not instantiated for these operand "
                         f"formats and output dtype (use auto)")


def scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, config, use_fast_accum=False):
    """D = (scale_a * scale_b) * (a @ b^T) + bias, accumulated in float32 (FP8
    products are exact there), rounded once to out_dtype. use_fast_accum only
    allows a faster, less precise accumulation: the reference ignores it."""
    check_scaled_mm_args(a, b, scale_a, scale_b, bias, out_dtype, config)
    acc = a.float() @ b.float().t()
    sa = scale_a.reshape(-1, 1) if scale_a.numel() != 1 else scale_a.reshape(())  # [M] (M may be 0) or one
    sb = scale_b.reshape(1, -1) if scale_b.numel() != 1 else scale_b.reshape(())
    # An empty sum is zero whatever the scales (an infinite one included), as on CUDA.
    d = (sa * sb) * acc if a.shape[1] else acc
    if bias is not None:
        d = d + bias.float()
    return _row_major(d.to(out_dtype))


def _row_major(d):
    """d, or for an empty d an empty tensor with row-major strides: the matmul of
    an empty problem can leave strides such as (1, 0) for [0, 1], where the CUDA
    op and the fake give (1, 1)."""
    return d if d.numel() else torch.empty(d.shape, dtype=d.dtype, device=d.device)


torch.library.impl("fp8ext::scaled_mm", "CPU")(scaled_mm)


# ---- block-wise (1x128 activation groups, 128x128 weight blocks) -------------------
# Tile configurations of the block-wise kernels (BlockwiseConfig in
# csrc/include/fp8ext/scaled_mm_blockwise.h); block_medium and block_swap_small are bf16-only;
# block_split_k slices K (FP8EXT_GEMM_SPLITS, or the rule at 16 < M <= 64), then sums the slices.
BLOCKWISE_CONFIGS = {"auto": 0, "block_large": 1, "block_medium": 2, "block_swap_small": 3, "block_swap_medium": 4,
                     "block_split_k": 5}
_BLOCKWISE_CONFIG_NAMES = {v: k for k, v in BLOCKWISE_CONFIGS.items()}
_BLOCKWISE_BF16_ONLY = {"block_medium", "block_swap_small"}


def is_blockwise(a, b, scale_a, scale_b) -> bool:
    """Whether the scales are block-wise: scale_b one value per 128x128 block of b
    ([ceil(N/128), ceil(K/128)], 2-D, not a single value). A [1, N] scale_b is also a
    per-channel row; it is read as blocks only with group scales for a ([M, G], G > 1)."""
    tensors = all(isinstance(t, torch.Tensor) for t in (a, b, scale_a, scale_b))
    if not tensors or a.dim() != 2 or b.dim() != 2 or scale_b.dim() != 2 or scale_b.numel() == 1:
        return False
    (m, k), n = a.shape, b.shape[0]
    groups = -(-k // GROUP)
    if tuple(scale_b.shape) != (-(-n // GROUP), groups):
        return False
    if tuple(scale_b.shape) == (1, n):
        return tuple(scale_a.shape) == (m, groups) and groups > 1
    return True


def check_blockwise_args(a, b, scale_a, scale_b, bias, out_dtype, config) -> None:
    def e4m3_operands():
        if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
            raise TypeError(f"a and b must be torch.float8_e4m3fn for the block-wise kernels, got {a.dtype} and "
                            f"{b.dtype}")
    _check_operands(a, b, out_dtype, e4m3_operands)
    if not 0 <= config <= max(BLOCKWISE_CONFIGS.values()):
        raise ValueError(f"config must be 0 (auto) to {max(BLOCKWISE_CONFIGS.values())}, got {config}")
    (m, k), n = a.shape, b.shape[0]
    groups = -(-k // GROUP)
    for name, s, shape, what in (("scale_a", scale_a, (m, groups), "one value per 1x128 group of a:"),
                                 ("scale_b", scale_b, (-(-n // GROUP), groups), "one value per 128x128 block of b:")):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {s.dtype if isinstance(s, torch.Tensor) else type(s).__name__}")
        if s.device != a.device:
            raise ValueError(f"{name} must be on {a.device}, got {s.device}")
        if tuple(s.shape) != shape:
            raise ValueError(f"{name} must be {what} {list(shape)}, got shape {tuple(s.shape)}")
    if bias is not None:
        if bias.dtype != out_dtype:
            raise TypeError(f"bias must have out_dtype ({out_dtype}), got {bias.dtype}")
        if bias.dim() != 1 or bias.shape[0] != n or bias.device != a.device:
            raise ValueError(f"bias must be [N] = [{n}] on {a.device}, got {tuple(bias.shape)} on {bias.device}")
    # As the CUDA op (has_config in csrc/gemm/blockwise_mm_dispatch.cu), whatever the shapes.
    config_name = _BLOCKWISE_CONFIG_NAMES[config]
    if config_name in _BLOCKWISE_BF16_ONLY and out_dtype != torch.bfloat16:
        raise ValueError(f"fp8ext.scaled_mm (block-wise): config {config_name} is not instantiated for this output dtype "
                         f"(use auto)")


def scaled_mm_blockwise(a, b, scale_a, scale_b, bias, out_dtype, config):
    """D = sum over 128-wide K blocks kb of scale_a[:, kb] x scale_b[n // 128, kb] x
    (the block's a @ b^T), in float32: each block's products are summed, scaled, then
    added (the kernels' promotion every 128 of K), rounded once to out_dtype."""
    check_blockwise_args(a, b, scale_a, scale_b, bias, out_dtype, config)
    (m, k), n = a.shape, b.shape[0]
    d = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    col_scales = scale_b.repeat_interleave(GROUP, dim=0)[:n]  # [N, G]: each row's block scales
    for kb in range(-(-k // GROUP)):
        cols = slice(kb * GROUP, min(k, (kb + 1) * GROUP))
        partial = a[:, cols].float() @ b[:, cols].float().t()
        d += partial * scale_a[:, kb:kb + 1] * col_scales[:, kb].reshape(1, n)
    if bias is not None:
        d = d + bias.float()
    return _row_major(d.to(out_dtype))


torch.library.impl("fp8ext::scaled_mm_blockwise", "CPU")(scaled_mm_blockwise)
