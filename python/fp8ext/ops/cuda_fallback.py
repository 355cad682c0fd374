"""CUDA implementations for builds or GPUs without native kernels: the
PyTorch reference path (correct, not fast), with a one-time warning.

Ops whose CUDA kernels are built register the CUDA dispatch key in
csrc/torch/cuda; this module fills in only the ops that have none.
"""
from __future__ import annotations

import torch

from fp8ext import _native
from fp8ext.ops import fake, fused, gemm_reference, kv_cache_reference, reference

# op name -> (reference implementation, what the warning calls it)
_OPS = {name: (getattr(reference, name), "quantization")
        for name in ("cast_to_fp8", "quantize_with_scale", "quantize_per_tensor", "quantize_delayed",
                     "quantize_per_row", "quantize_per_group", "quantize_per_block")}
_OPS["rms_norm_quantize_per_row"] = (fused.rms_norm_quantize_per_row, "quantization")
_OPS["add_rms_norm_quantize_per_row"] = (fused.add_rms_norm_quantize_per_row, "quantization")
_OPS["silu_mul_quantize_per_row"] = (fused.silu_mul_quantize_per_row, "quantization")
_OPS["scaled_mm"] = (gemm_reference.scaled_mm, "scaled_mm")
_OPS["scaled_mm_blockwise"] = (gemm_reference.scaled_mm_blockwise, "scaled_mm")
_OPS["kv_cache_write"] = (kv_cache_reference.kv_cache_write, "the KV-cache write")
_OPS["kv_cache_write_rotary"] = (fused.kv_cache_write_rotary, "the KV-cache write")
_OPS["paged_decode_attention"] = (kv_cache_reference.paged_decode_attention, "paged decode attention")


def run_reference(name: str, *args):
    """The op's fake first, for its argument checks (the quantize references
    check nothing themselves: a [K] scale would be applied per column), then
    the reference. Real tensors have concrete sizes, so the fake checks all it
    can; the empty outputs it allocates are dropped."""
    fake.CHECKED[f"fp8ext::{name}"](*args)
    return _OPS[name][0](*args)


def _register(name: str) -> None:
    what = _OPS[name][1]

    def cuda_impl(x, *args):
        _native.warn_reference_fallback(what, x.device)
        return run_reference(name, x, *args)

    torch.library.impl(f"fp8ext::{name}", "CUDA")(cuda_impl)


for _name in _OPS:
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"fp8ext::{_name}", "CUDA"):
        _register(_name)
