"""Loads the native extension (which registers torch.ops.fp8ext) and answers
what this build and this device support."""
from __future__ import annotations

import functools
import warnings

import torch

try:
    from fp8ext import _C  # noqa: F401  (registers the TORCH_LIBRARY ops)
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "fp8ext's native extension fp8ext._C is missing or failed to load; build and install the "
        "package with `pip install --no-build-isolation .` (see README.md)") from e

INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Whether this build has the sm_90a CUTLASS GEMMs (asked before ops/cuda_fallback
# fills the CUDA key of ops without kernels with the reference).
GEMM_KERNELS_BUILT = torch._C._dispatch_has_kernel_for_dispatch_key("fp8ext::scaled_mm", "CUDA")


@functools.lru_cache(maxsize=None)
def cuda_archs() -> tuple:
    """CUDA architectures the kernels were compiled for (empty for a CPU-only build)."""
    archs = torch.ops.fp8ext.cuda_archs()
    return tuple(a for a in archs.split(",") if a)


def has_cuda_kernels() -> bool:
    return bool(cuda_archs())


@functools.lru_cache(maxsize=None)
def native_kernels_run_on(device_index: int) -> bool:
    """True when the quantization and KV-cache kernels run on this GPU: the build
    has CUDA kernels and the GPU is sm_80 or newer (the built archs' own code, or
    the compute_80 PTX every build carries, compiled by the driver). Older GPUs
    get a clear error from the CUDA ops; only a CPU-only build falls back to the
    PyTorch reference on a GPU."""
    return has_cuda_kernels() and torch.cuda.get_device_capability(device_index)[0] >= 8


@functools.lru_cache(maxsize=None)
def gemm_kernels_run_on(device_index: int) -> bool:
    """True when the CUTLASS GEMMs are built and the GPU is sm_90 (H100/H200)."""
    return GEMM_KERNELS_BUILT and torch.cuda.get_device_capability(device_index) == (9, 0)


_warned = set()


def warn_reference_fallback(what: str, device: torch.device) -> None:
    """One warning per (op family, device): the reference path is correct but slow."""
    key = (what, str(device))
    if key in _warned:
        return
    _warned.add(key)
    reason = ("this build has no CUDA kernels" if not has_cuda_kernels()
              else f"the kernels are built for {', '.join(cuda_archs())}, not this GPU")
    warnings.warn(f"fp8ext: {what} on {device} uses the PyTorch reference path ({reason})",
                  RuntimeWarning, stacklevel=3)


def check_input(x, name: str) -> None:
    """Type and dtype checks shared by the Python API (errors name the argument)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
