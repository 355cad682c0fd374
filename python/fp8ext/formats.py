"""FP8 formats: E4M3 ("fn": no infinities) and E5M2 (IEEE-like).

Bit-exact with ``torch.float8_e4m3fn`` and ``torch.float8_e5m2``. The default
cast is *saturating*: clamp to +-max, then round to nearest even, so a finite
input never becomes NaN or Inf. NaN stays NaN, with its sign. The
non-saturating cast follows the OCP FP8 rules: E4M3 overflow (|x| > 464) gives
NaN, E5M2 overflow (|x| >= 61440) gives Inf. That is torch's ``.to()`` up to
2.11; newer torch saturates E4M3 in ``.to()`` (then equal to our default cast).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FP8Format:
    """Constants of one FP8 encoding.

    ``unit_roundoff`` is half the spacing just above 1 (the relative error bound of
    round-to-nearest for normal numbers); ``dynamic_range`` is max / min_subnormal.
    """

    name: str
    torch_dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    min_normal: float
    min_subnormal: float
    unit_roundoff: float
    has_inf: bool

    @property
    def dynamic_range(self) -> float:
        return self.max / self.min_subnormal

    @property
    def dynamic_range_binades(self) -> float:
        """log2(max / min_subnormal): how many powers of two the format spans."""
        return math.log2(self.dynamic_range)

    def __repr__(self) -> str:
        return f"FP8Format({self.name})"


E4M3 = FP8Format("e4m3", torch.float8_e4m3fn, 4, 3, 7, 448.0, 2.0**-6, 2.0**-9, 2.0**-4, False)
E5M2 = FP8Format("e5m2", torch.float8_e5m2, 5, 2, 15, 57344.0, 2.0**-14, 2.0**-16, 2.0**-3, True)
FORMATS = (E4M3, E5M2)


def get_format(fmt) -> FP8Format:
    """Normalises ``fmt`` (an FP8Format, "e4m3"/"e5m2", or a torch float8 dtype)."""
    if isinstance(fmt, FP8Format):
        return fmt
    for f in FORMATS:
        if fmt == f.torch_dtype or (isinstance(fmt, str) and fmt.lower() == f.name):
            return f
    if isinstance(fmt, (str, torch.dtype)):
        raise ValueError(f"fmt must be 'e4m3' or 'e5m2' (or torch.float8_e4m3fn / torch.float8_e5m2), got {fmt!r}")
    raise TypeError(f"fmt must be an FP8Format, a string or a torch dtype, got {type(fmt).__name__}")


def decode(codes: torch.Tensor, fmt=E4M3) -> torch.Tensor:
    """float32 values of uint8 FP8 codes, computed from the format's definition.

    Matches ``codes.view(fmt.torch_dtype).float()`` on all 256 codes (tested).
    """
    f = get_format(fmt)
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    c = codes.to(torch.int32)
    sign = torch.where((c & 0x80) != 0, -1.0, 1.0)
    exp = (c & 0x7F) >> f.mantissa_bits
    man = (c & ((1 << f.mantissa_bits) - 1)).to(torch.float64)
    normal = torch.ldexp(1.0 + man / 2**f.mantissa_bits, (exp - f.bias).to(torch.float64))
    subnormal = man * 2.0 ** (1 - f.bias - f.mantissa_bits)
    value = sign * torch.where(exp == 0, subnormal, normal)
    top_exp = (1 << f.exponent_bits) - 1
    if f.has_inf:
        value = torch.where((exp == top_exp) & (man == 0), sign * math.inf, value)
        value = torch.where((exp == top_exp) & (man != 0), math.nan, value)
    else:
        value = torch.where((c & 0x7F) == 0x7F, math.nan, value)
    return value.to(torch.float32)


def non_finite_codes(codes: torch.Tensor) -> torch.Tensor:
    """Where a float8 tensor holds NaN (E4M3: S.1111.111) or Inf/NaN (E5M2: exponent
    all ones), read from the bits: no float copy of a large weight."""
    if codes.dtype not in (E4M3.torch_dtype, E5M2.torch_dtype):
        raise TypeError(f"codes must be float8_e4m3fn or float8_e5m2, got {codes.dtype}")
    mask = 0x7C if get_format(codes.dtype).has_inf else 0x7F  # E5M2: the exponent field; E4M3: all but the sign
    bits = codes.view(torch.uint8)
    return (bits & mask) == mask


def cast(x: torch.Tensor, fmt=E4M3, saturate: bool = True) -> torch.Tensor:
    """Element-wise cast to FP8 (no scaling).

    Args:
        x: float32 / float16 / bfloat16 tensor, any shape.
        fmt: target format.
        saturate: True (default) clamps to +-max first; False lets overflow
            become NaN (E4M3) or Inf (E5M2), as the OCP spec and torch <= 2.11 do.
    Returns:
        a tensor of ``fmt.torch_dtype`` with x's shape.
    """
    from fp8ext import _native
    from fp8ext.checks import check_bool
    from fp8ext.quantize import as_kernel_matrix

    f = get_format(fmt)
    _native.check_input(x, "x")
    check_bool("saturate", saturate)  # the op's schema would take None as False (overflow to NaN)
    flat = as_kernel_matrix(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.dim() >= 1 else x.reshape(1, 1))
    return torch.ops.fp8ext.cast_to_fp8(flat, f.torch_dtype, saturate).reshape(x.shape)
