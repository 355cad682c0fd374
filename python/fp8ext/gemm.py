"""FP8 GEMM with per-tensor, row-wise or block-wise scales: :func:`scaled_mm`."""
from __future__ import annotations

import torch

from fp8ext import _native
from fp8ext.checks import check_bool, refuse_grad
from fp8ext.ops import gemm_reference
from fp8ext.ops.gemm_reference import BLOCKWISE_CONFIGS, CONFIGS, is_blockwise


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
              config: str = "auto", use_fast_accum: bool = False) -> torch.Tensor:
    """``D = (scale_a * A) @ (scale_b * B)^T + bias``.

    By default the tensor cores' partial sums are promoted to float32 every 128
    of K (every 256 in the 128x192-tile kernel that bf16 output takes at M >= 4096,
    N >= 6144): the precision class of
    ``torch._scaled_mm``'s default (on the H200 the error against a float64
    reference is within 0.5% of cuBLAS's). ``use_fast_accum=True`` allows FP8
    fast accumulation with bf16 output: no promotion at all, and at M > 128 a
    ping-pong 128x128-tile kernel (mostly at K < 8192) or a cooperative
    128x256-tile one (mostly longer K; the rule is in scaled_mm_dispatch.cu),
    like ``torch._scaled_mm(use_fast_accum=True)`` and
    Transformer Engine's forward GEMMs, at a larger error that grows with K
    (equal to cuBLAS's in that mode). At M = 1 (E4M3
    operands) ``"auto"`` runs a CUDA-core GEMV that sums in fp32 without the
    tensor cores (faster for decode; ``FP8EXT_GEMV=0`` turns it off): its last
    bits differ from the tensor-core kernels', so a row computed alone is not
    bit-identical to the same row inside a larger M. At 16 < M <= 128 with long
    K (>= 12288) and few tiles of N (the 8B down projection), ``"auto"`` runs
    split-K (``config="split_k"``): slices of K in one launch, then a kernel
    that sums their fp32 partials in order (deterministic; the last bits differ
    from one pass over K). ``FP8EXT_GEMM_SPLITS=N`` forces N slices at M > 16, 1 never.

    **Block-wise** (DeepSeek-V3): when ``scale_b`` is ``[ceil(N/128), ceil(K/128)]``
    (one value per 128x128 block of the weight; a ``[1, N]`` that fits that shape
    is read as per-channel unless ``scale_a`` has group shape), ``scale_a`` must be
    ``[M, ceil(K/128)]`` (one per 1x128 group of the activation, as
    :func:`fp8ext.quantize` writes it: M-major) and both operands E4M3. The
    partial sums of every 128 of K are multiplied by their two scales and added
    in float32 (``use_fast_accum`` does not apply). Every M works (M = 1
    included), and N or K not a multiple of 128 too: the last block is partial.
    At 16 < M <= 64, where the weight's 128-row blocks leave few tiles for the
    SMs, ``"auto"`` runs split-K (``config="block_split_k"``; K a multiple of 128
    x slices): slices of K in one launch, then a kernel that sums their fp32
    partials in order (deterministic; the last bits differ from one pass over K).

    Args:
        a: ``[M, K]`` float8 (``float8_e4m3fn`` or ``float8_e5m2``), the activation.
        b: ``[N, K]`` float8, the weight (K-major, as ``nn.Linear`` stores it).
        scale_a: float32, one value (per-tensor, 0-d), ``[M]`` (per-token) or
            ``[M, ceil(K/128)]`` (1x128 groups, with block-wise ``scale_b``).
        scale_b: float32, one value, ``[N]`` (per-channel) or ``[ceil(N/128), ceil(K/128)]``
            (128x128 blocks). Per-tensor and row-wise scales mix freely.
        out_dtype: ``torch.bfloat16``, ``torch.float16`` or ``torch.float32``.
        bias: optional ``[N]`` in ``out_dtype``, added in the epilogue.
        config: ``"auto"`` (kernel and tile shape chosen by M and N) or one of
            :data:`CONFIGS` (block-wise: :data:`BLOCKWISE_CONFIGS`), for tuning.
        use_fast_accum: allow FP8 fast accumulation (see above).

    On H100/H200 this runs CUTLASS sm_90a kernels (no host synchronisation,
    CUDA-graph capturable); on the CPU and on other GPUs, a PyTorch reference.

    Cost of the padded path (shapes the kernels cannot take as they are):
    K not a multiple of 16, or an operand whose rows are not 16-byte aligned,
    copies A and B into zero-padded buffers (one kernel each: one extra read and
    write of both per call); N not a multiple of 8 (16-bit outputs) or 4 (fp32)
    also copies B with zero rows up to that multiple and writes D to a padded
    buffer that is then copied (one extra pass over D). On an H100 (session 46)
    16x4095x4100 took 23 us against 7.7 for 16x4096x4096: mostly the weight's
    copy. Quantize and store weights padded (``pad_k_to=16``, N rounded up) to
    keep them off this path. E5M2 operands run with a float32 kernel, then add
    the bias and cast (E5M2 x E4M3 also transposes). M is free. Block-wise: K not a multiple of 16 or unaligned
    operands copy A and B as above; N not a multiple of 8 (16-bit outputs) or 4
    (fp32) copies B with zero rows and D through a buffer; group scales in
    another layout than M-major with a column stride that is a multiple of 4
    are copied into it (a pass over M x K/128 floats).
    """
    _check_options(out_dtype, config, use_fast_accum)
    refuse_grad("fp8ext.scaled_mm", a, b, scale_a, scale_b, bias)
    if is_blockwise(a, b, scale_a, scale_b) or _has_group_scales(scale_a):
        return _scaled_mm_blockwise(a, b, scale_a, scale_b, out_dtype, bias, config)
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
    cfg = CONFIGS[config]
    if _needs_reference(a):
        return gemm_reference.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, cfg, use_fast_accum)
    return torch.ops.fp8ext.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, cfg, use_fast_accum)


def _scaled_mm_blockwise(a, b, scale_a, scale_b, out_dtype, bias, config: str) -> torch.Tensor:
    if config not in BLOCKWISE_CONFIGS:
        raise ValueError(f"config must be one of {sorted(BLOCKWISE_CONFIGS)} for block-wise scales, got {config!r}")
    cfg = BLOCKWISE_CONFIGS[config]
    if _needs_reference(a):
        return gemm_reference.scaled_mm_blockwise(a, b, scale_a, scale_b, bias, out_dtype, cfg)
    return torch.ops.fp8ext.scaled_mm_blockwise(a, b, scale_a, scale_b, bias, out_dtype, cfg)


def _check_options(out_dtype, config, use_fast_accum) -> None:
    """The non-tensor arguments, checked before the op's schema coerces them
    (an int out_dtype would pass as a dtype code, None as False)."""
    if not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be a torch.dtype (bfloat16, float16 or float32), got {out_dtype!r}")
    if not isinstance(config, str):
        raise TypeError(f"config must be a str (\"auto\" or a name in CONFIGS), got {type(config).__name__}")
    check_bool("use_fast_accum", use_fast_accum)


def _has_group_scales(scale_a) -> bool:
    """scale_a of a shape only 1x128 group scales have (2-D, no dimension of 1):
    such a call goes to the block-wise checks, whose errors name the scale that
    does not fit (scale_b, most often), rather than calling scale_a a bad
    per-token scale."""
    return isinstance(scale_a, torch.Tensor) and scale_a.dim() == 2 and min(scale_a.shape) > 1


def _needs_reference(a) -> bool:
    """A CUDA tensor on a GPU the built sm_90a kernels cannot run on: the PyTorch
    reference runs instead (warned once per device)."""
    if isinstance(a, torch.Tensor) and a.is_cuda and _native.GEMM_KERNELS_BUILT \
            and not _native.gemm_kernels_run_on(a.device.index or 0):
        _native.warn_reference_fallback("scaled_mm", a.device)
        return True
    return False
