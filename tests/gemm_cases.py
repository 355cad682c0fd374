"""Operands and the float64 reference shared by the scaled_mm tests."""
import torch

F8 = torch.float8_e4m3fn

# Relative Frobenius error allowed against the float64 reference of the
# dequantized operands. FP8 products are exact, but Hopper's FP8 MMA keeps a
# reduced-precision (~14-bit, truncating) accumulator that the kernel promotes to
# float32 every 128 of K: ~1-2.5e-4 relative error whatever K, on top of the
# output rounding (bf16 2^-9, fp16 2^-12 per element). A real bug (wrong scale,
# tile or layout) is off by far more.
TOLERANCE = {torch.bfloat16: 5e-3, torch.float16: 2e-3, torch.float32: 1e-3}


def operands(m, n, k, device, a_dtype=F8, b_dtype=F8, per_row_a=True, per_row_b=True, bias_dtype=None,
             generator=None):
    a = (torch.randn(m, k, generator=generator) * 4).to(a_dtype).to(device)
    b = (torch.randn(n, k, generator=generator) * 4).to(b_dtype).to(device)
    sa = (torch.rand(m if per_row_a else (), generator=generator) * 0.1 + 0.01).to(device)
    sb = (torch.rand(n if per_row_b else (), generator=generator) * 0.1 + 0.01).to(device)
    bias = None if bias_dtype is None else (torch.randn(n, generator=generator) * 2).to(bias_dtype).to(device)
    return a, b, sa, sb, bias


def reference(a, b, sa, sb, bias):
    acc = a.double() @ b.double().t()
    sa = sa.double().reshape(-1, 1) if sa.numel() > 1 else sa.double()
    sb = sb.double().reshape(1, -1) if sb.numel() > 1 else sb.double()
    d = acc * sa * sb
    return d + bias.double() if bias is not None else d


def rel_error(got, ref):
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
