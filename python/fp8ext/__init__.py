"""fp8ext: FP8 inference on NVIDIA Hopper.

Formats (:mod:`fp8ext.formats`), scaling recipes (:mod:`fp8ext.recipes`),
device-side scaling state (:class:`ScalingState`), the quantize API and the
FP8 GEMM (:func:`scaled_mm`), the drop-in :class:`FP8Linear` and :func:`convert`.
Native ops are registered under ``torch.ops.fp8ext``.
"""
from fp8ext import _native  # noqa: F401  (loads the ops first)
from fp8ext import ops  # noqa: F401  (fake and fallback implementations)
from fp8ext import formats, recipes
from fp8ext.formats import E4M3, E5M2, FP8Format
from fp8ext.gemm import scaled_mm
from fp8ext.kv_cache import DecodePlan, PagedKVCache, capacity_tokens
from fp8ext.kv_scales import kv_scales_from_state_dict, kv_scales_state_dict
from fp8ext import nn
from fp8ext.nn import FP8Linear, calibrate, convert
from fp8ext.quantize import add_rms_norm_quantize, dequantize, quantize, rms_norm_quantize, silu_mul_quantize
from fp8ext.recipes import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, Recipe, RowWise
from fp8ext.scaling_state import ScalingState

__version__ = "0.1.0"

__all__ = [
    "E4M3", "E5M2", "FP8Format", "formats", "recipes", "Recipe", "CurrentScaling", "DelayedScaling",
    "PerTensorStatic", "RowWise", "BlockWise", "ScalingState", "quantize", "dequantize", "rms_norm_quantize",
    "add_rms_norm_quantize", "silu_mul_quantize", "scaled_mm", "nn", "FP8Linear", "convert", "calibrate", "info",
    "PagedKVCache", "DecodePlan", "capacity_tokens", "kv_scales_state_dict", "kv_scales_from_state_dict",
]


def info() -> dict:
    """Build capabilities, the GPU if any, formats and recipes (what `fp8ext info` prints)."""
    from fp8ext.cli import collect_info

    return collect_info()
