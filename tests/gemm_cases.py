"""Operands and the float64 reference shared by the scaled_mm tests."""
import pathlib
import sys

import torch

# The benchmarks' output check (the worst of the whole output, its rows and its
# columns): one wrong 16-byte store (8 bf16 values) of a 1000 x 776 output moves
# the whole output's error by ~3e-3, its row's by 0.1.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from benchlib import worst_slice_error  # noqa: E402,F401

F8 = torch.float8_e4m3fn

# Relative Frobenius error allowed against the float64 reference of the
# dequantized operands. FP8 products are exact, but Hopper's FP8 MMA keeps a
# reduced-precision (~14-bit, truncating) accumulator that the kernel promotes to
# float32 every 128 of K: ~1-2.5e-4 relative error whatever K, on top of the
# output rounding (bf16 2^-9, fp16 2^-12 per element). A real bug (wrong scale,
# tile or layout) is off by far more.
TOLERANCE = {torch.bfloat16: 5e-3, torch.float16: 2e-3, torch.float32: 1e-3}
# The CPU reference accumulates the exact FP8 products in fp32 (errors ~1e-7):
# only the output's rounding may show, so a 1% error in one block scale
# (~1e-3 overall) fails a float32 check there, where the GPU bound lets it pass.
CPU_TOLERANCE = {**TOLERANCE, torch.float32: 1e-6}


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


# Per row and column (promoted accumulation): twice the whole output's bound. A
# value's own rounding (at most bf16 2^-8, fp16 2^-11 relative: an M = 1 output's
# column is one value) and the accumulator's ~5e-4 of a typical value at worst
# stay inside it (bf16: <= ~0.0045 of 0.01).
SLICE_TOLERANCE = {dtype: 2 * tol for dtype, tol in TOLERANCE.items()}


# ---- block-wise: 1x128 groups of A, 128x128 blocks of B ---------------------------
BLOCK = 128


def group_scale_storage(values: torch.Tensor) -> torch.Tensor:
    """[M, G] group scales in fp8ext's layout: M-major, column stride a multiple of 4."""
    m, g = values.shape
    storage = torch.zeros(g, -(-max(m, 1) // 4) * 4, device=values.device)
    storage[:, :m] = values.t()
    return storage.t()[:m]


def block_operands(m, n, k, device, bias_dtype=None, generator=None, m_major=True):
    groups = -(-k // BLOCK)
    a = (torch.randn(m, k, generator=generator) * 4).to(F8).to(device)
    b = (torch.randn(n, k, generator=generator) * 4).to(F8).to(device)
    sa = (torch.rand(m, groups, generator=generator) * 0.1 + 0.01).to(device)
    sa = group_scale_storage(sa) if m_major else sa.contiguous()
    sb = (torch.rand(-(-n // BLOCK), groups, generator=generator) * 0.1 + 0.01).to(device)
    bias = None if bias_dtype is None else (torch.randn(n, generator=generator) * 2).to(bias_dtype).to(device)
    return a, b, sa, sb, bias


def block_reference(a, b, sa, sb, bias):
    """float64: every element of A and B times its own group / block scale, then the product."""
    (m, k), n = a.shape, b.shape[0]
    a_scale = sa.double().repeat_interleave(BLOCK, dim=1)[:, :k]
    b_scale = sb.double().repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]
    d = (a.double() * a_scale) @ (b.double() * b_scale).t()
    return d + bias.double() if bias is not None else d


def outlier_problem(m, n, k, generator, factor=1e5):
    """Activations and weights with planted outliers: tokens 0-3 of x and output
    channels 0-3 of w are `factor` times larger. Per-tensor scales then push every
    other value below E4M3's subnormals; 1x128 groups and 128x128 blocks keep the
    outliers in their own rows and in the first 128-row block of w."""
    x = torch.randn(m, k, generator=generator)
    w = torch.randn(n, k, generator=generator)
    x[:4] *= factor
    w[:4] *= factor
    return x, w


def outlier_free(d: torch.Tensor) -> torch.Tensor:
    """The outputs the outliers do not touch: tokens >= 4, channels past the first block."""
    return d[4:, BLOCK:]


def outlier_errors(m, n, k, device, seed):
    """Relative error of the outputs the outliers do not touch, block-wise vs
    per-tensor current scaling (both through fp8ext.quantize and scaled_mm)."""
    import fp8ext
    from fp8ext.recipes import BlockWise, CurrentScaling
    x, w = outlier_problem(m, n, k, torch.Generator().manual_seed(seed))
    x, w = x.to(device), w.to(device)
    exact = outlier_free(x.double() @ w.double().t())
    errors = {}
    for name, recipe in (("block", BlockWise()), ("tensor", CurrentScaling())):
        qa, sa = fp8ext.quantize(x, recipe, "activation")
        qb, sb = fp8ext.quantize(w, recipe, "weight")
        errors[name] = rel_error(outlier_free(fp8ext.scaled_mm(qa, qb, sa, sb, out_dtype=torch.float32)), exact)
    return errors


def last_group_errors(device, seed):
    """(error of the whole output, error of the last, partial 128-row block of N)
    for a problem whose only nonzero K group is the last, partial one (K = 4100:
    4 columns), so a wrong scale there is the whole error, not a few percent of it."""
    import fp8ext
    a, b, sa, sb, _ = block_operands(33, 1000, 4100, device, generator=torch.Generator().manual_seed(seed))
    a[:, :4096] = 0
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    ref = block_reference(a, b, sa, sb, None)
    return rel_error(d, ref), rel_error(d[:, 896:], ref[:, 896:])


def compiled_matches_eager(m, n, k, device, seed):
    """Block-wise scaled_mm with bias under torch.compile(fullgraph=True) gives
    exactly the eager result (no graph break: fullgraph raises on one)."""
    import fp8ext
    a, b, sa, sb, bias = block_operands(m, n, k, device, torch.bfloat16, torch.Generator().manual_seed(seed))
    torch._dynamo.reset()
    f = torch.compile(lambda *t: fp8ext.scaled_mm(*t[:4], bias=t[4]), fullgraph=True)
    return torch.equal(f(a, b, sa, sb, bias), fp8ext.scaled_mm(a, b, sa, sb, bias=bias))


def assert_split_changes_summation(monkeypatch, operands, reference_fn, whole_config, split_config):
    """The split kernel really ran: fp32 sums over four slices of K differ from one pass
    over K (whole_config) in the last bits, which fp32 output shows, while staying within
    the reference's tolerance. The same count gives the same bits on every run, because
    the slices are added in order."""
    import fp8ext
    a, b, sa, sb, bias = operands
    run = lambda config: fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, bias=bias,  # noqa: E731
                                          config=config)
    whole = run(whole_config)
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "4")
    split = run(split_config)
    assert not torch.equal(split, whole)
    assert rel_error(split, reference_fn(a, b, sa, sb, bias)) < TOLERANCE[torch.float32]
    for _ in range(3):
        assert torch.equal(run(split_config), split)
