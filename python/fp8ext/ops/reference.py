"""Pure-PyTorch reference of every quantize op, following the pinned numerics
(see fp8ext.recipes). Used as the test oracle for the native CPU code and as
the correct-but-slow path on GPUs without native kernels.

Divisions are done in float64 and rounded to float32: for float32 operands that
is exactly IEEE float32 division, whatever shortcuts torch takes for scalars.
"""
from __future__ import annotations

import torch

GROUP = 128
GROUP_SCALE_ROW_ALIGN = 4
FLT_MIN = 2.0**-126
FLT_MAX = torch.finfo(torch.float32).max


def fp8_max(dtype: torch.dtype) -> float:
    return 448.0 if dtype == torch.float8_e4m3fn else 57344.0


def to_f32(x: torch.Tensor) -> torch.Tensor:
    """x.float() with a float16 NaN's sign kept, as the native ops and the
    kernels keep it: torch's scalar float16 conversion (tensors of a few
    elements) gives every NaN the positive sign."""
    f = x.float()
    if x.dtype != torch.float16:
        return f
    return torch.where(f.isnan() & (x.view(torch.int16) < 0), f.abs().neg(), f)


def div_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE float32 a / b (correctly rounded) via float64."""
    return (a.double() / b.double()).float()


def amax_finite(x: torch.Tensor, dim=None) -> torch.Tensor:
    a = x.float().abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    if dim is None:
        return a.amax() if a.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    return a.amax(dim=dim)


def scale_from_amax(amax: torch.Tensor, dtype: torch.dtype, margin: int, power_of_two: bool) -> torch.Tensor:
    amax = amax.float()
    # torch.full, not torch.tensor: a fill, no host-to-device copy, so CUDA graphs can capture it.
    scaled = amax * torch.full((), 2.0**margin, dtype=torch.float32, device=amax.device)
    s = div_f32(scaled, torch.full((), fp8_max(dtype), dtype=torch.float32, device=amax.device))
    s = torch.where(s >= FLT_MIN, s, torch.full_like(s, FLT_MIN))
    s = torch.clamp(s, max=FLT_MAX)
    if power_of_two:
        mantissa, exponent = torch.frexp(s)  # s = mantissa * 2**exponent, mantissa in [0.5, 1)
        s = torch.where(mantissa == 0.5, s, torch.ldexp(torch.ones_like(s), exponent.float()))
        s = torch.clamp(s, max=2.0**127)
    return torch.where(amax > 0, s, torch.ones_like(s))


def saturating_cast(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    m = fp8_max(dtype)
    return to_f32(v).clamp(-m, m).to(dtype)


def pad_cols(q: torch.Tensor, pad_k_to: int) -> torch.Tensor:
    k = q.shape[-1]
    k_pad = -(-k // pad_k_to) * pad_k_to if pad_k_to > 1 else k
    if k_pad == k:
        return q.contiguous()
    out = torch.zeros(q.shape[0], k_pad, dtype=q.dtype, device=q.device)
    out[:, :k] = q
    return out


# Non-saturating casts (torch <= 2.11's `.to(float8)`, the OCP rule): a magnitude
# that rounds past the max becomes NaN (E4M3, code 0x7F) or Inf (E5M2, 0x7C),
# sign kept. Rounding passes the max above the midpoint to the next step up
# (E4M3 448 + 16, E5M2 57344 + 4096), and at the midpoint itself where the max's
# mantissa is odd (E5M2: ties go to the even 65536). Written out because newer
# torch saturates in `.to()`.
_OVERFLOW = {torch.float8_e4m3fn: (464.0, False, 0x7F), torch.float8_e5m2: (61440.0, True, 0x7C)}


def nonsaturating_cast(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    f = to_f32(v)
    mid, tie_overflows, code = _OVERFLOW[dtype]
    a = f.abs()
    over = (a > mid) | (a == mid) if tie_overflows else a > mid
    bits = saturating_cast(f, dtype).view(torch.uint8)
    overflow = torch.where(torch.signbit(f), code | 0x80, code).to(torch.uint8)
    return torch.where(over, overflow, bits).view(dtype)


def cast_to_fp8(x, dtype, saturate):
    return saturating_cast(x, dtype) if saturate else nonsaturating_cast(x, dtype)


def quantize_with_scale(x, scale, dtype, pad_k_to):
    return pad_cols(saturating_cast(div_f32(to_f32(x), scale.float()), dtype), pad_k_to)


def quantize_per_tensor(x, dtype, margin, power_of_two, pad_k_to):
    s = scale_from_amax(amax_finite(x), dtype, margin, power_of_two)
    return quantize_with_scale(x, s, dtype, pad_k_to), s


def quantize_delayed(x, amax_history, scale, dtype, margin, power_of_two, use_history_max, pad_k_to):
    used = scale.detach().clone().reshape(())
    q = quantize_with_scale(x, used, dtype, pad_k_to)
    rolled = torch.cat([amax_finite(x).reshape(1), amax_history[:-1]])
    amax_history.copy_(rolled)
    # The kernels' max starts at 0 and skips NaN (fmaxf), so a NaN or negative
    # value that a caller wrote into the history counts as 0.
    amax = torch.where(rolled > 0, rolled, 0.0).max() if use_history_max else rolled[0]
    scale.copy_(scale_from_amax(amax, dtype, margin, power_of_two).reshape(scale.shape))
    return q, used


def quantize_per_row(x, dtype, margin, power_of_two, pad_k_to):
    m, k = x.shape
    amax = amax_finite(x, dim=1) if k else torch.zeros(m, device=x.device)
    s = scale_from_amax(amax, dtype, margin, power_of_two)
    return pad_cols(saturating_cast(div_f32(to_f32(x), s[:, None]), dtype), pad_k_to), s


def _pad_to_groups(x: torch.Tensor, rows_to: int, cols_to: int) -> torch.Tensor:
    m, k = x.shape
    out = torch.zeros(-(-m // rows_to) * rows_to, -(-k // cols_to) * cols_to, dtype=torch.float32, device=x.device)
    out[:m, :k] = to_f32(x)
    return out


def group_scale_storage(m: int, groups: int, device) -> torch.Tensor:
    m_pad = -(-m // GROUP_SCALE_ROW_ALIGN) * GROUP_SCALE_ROW_ALIGN
    return torch.zeros(groups, m_pad, dtype=torch.float32, device=device)


def quantize_per_group(x, dtype, margin, power_of_two, pad_k_to):
    m, k = x.shape
    g = -(-k // GROUP)
    xp = _pad_to_groups(x, 1, GROUP).reshape(m, g, GROUP)
    s = scale_from_amax(amax_finite(xp, dim=2) if g else torch.zeros(m, 0, device=x.device),
                        dtype, margin, power_of_two)
    q = saturating_cast(div_f32(xp, s[:, :, None]), dtype).reshape(m, g * GROUP)[:, :k]
    storage = group_scale_storage(m, g, x.device)
    storage[:, :m] = s.t()
    return pad_cols(q, pad_k_to), storage.as_strided((m, g), (1, storage.shape[1]))


def quantize_per_block(x, dtype, margin, power_of_two, pad_k_to):
    m, k = x.shape
    bm, bk = -(-m // GROUP), -(-k // GROUP)
    xp = _pad_to_groups(x, GROUP, GROUP).reshape(bm, GROUP, bk, GROUP)
    amax = amax_finite(xp, dim=(1, 3)) if xp.numel() else torch.zeros(bm, bk, device=x.device)
    s = scale_from_amax(amax, dtype, margin, power_of_two)
    q = saturating_cast(div_f32(xp, s[:, None, :, None]), dtype).reshape(bm * GROUP, bk * GROUP)[:m, :k]
    return pad_cols(q, pad_k_to), s.contiguous()
