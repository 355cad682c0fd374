"""The CUTLASS scaled_mm kernels on the GPU against a float64 reference of the
dequantized operands: M across the dispatch buckets, unaligned N and K, every
scale kind, output dtype and configuration, E5M2 operands, CUDA graphs."""
import pytest
import torch

import fp8ext
from fp8ext import _native
from cuda_graphs import capture
from gemm_cases import (F8, SLICE_TOLERANCE, TOLERANCE, assert_split_changes_summation, operands, reference,
                        rel_error, worst_slice_error)

pytestmark = pytest.mark.gpu

E5 = torch.float8_e5m2
M_SWEEP = [1, 2, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129, 1000, 4096]


@pytest.fixture(autouse=True)
def _needs_kernels():
    if not _native.gemm_kernels_run_on(torch.cuda.current_device()):
        pytest.skip("the CUTLASS sm_90a GEMMs are not built, or this GPU is not sm_90")


def check(m, n, k, out_dtype=torch.bfloat16, per_row_a=True, per_row_b=True, bias=True, a_dtype=F8, b_dtype=F8,
          config="auto", seed=0, use_fast_accum=False):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias_t = operands(m, n, k, "cuda", a_dtype, b_dtype, per_row_a, per_row_b,
                                    out_dtype if bias else None, g)
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias_t, config=config,
                         use_fast_accum=use_fast_accum)
    assert d.shape == (m, n) and d.dtype == out_dtype and d.is_contiguous()
    want = reference(a, b, sa, sb, bias_t)
    err = rel_error(d, want)
    assert err < TOLERANCE[out_dtype], f"M={m} N={n} K={k} {out_dtype} config={config}: error {err:.2e}"
    if m and n and not use_fast_accum:  # a wrong tile or store hides in the whole output's error, not in a slice's
        worst = worst_slice_error(d, want)
        assert worst < SLICE_TOLERANCE[out_dtype], f"M={m} N={n} K={k} {out_dtype} config={config}: slice {worst:.2e}"


@pytest.mark.parametrize("m", M_SWEEP)
def test_m_sweep(m, seed):
    check(m, 1024, 512, seed=seed)


@pytest.mark.parametrize("n,k", [(4095, 512), (1000, 4100), (4096, 1710), (1280, 1710), (8, 16), (24, 16)])
@pytest.mark.parametrize("m", [1, 7, 33, 1000])
def test_unaligned_n_and_k(m, n, k, seed):
    check(m, n, k, seed=seed)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("per_row_a,per_row_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [5, 48, 100, 777])
def test_scale_kinds_dtypes_bias(m, out_dtype, per_row_a, per_row_b, bias, seed):
    check(m, 520, 256, out_dtype, per_row_a, per_row_b, bias, seed=seed)


# kMedium is bf16 only (fp16 gave it up for the ping-pong fast kernel, issue 4's budget).
@pytest.mark.parametrize("config,out_dtype", [(c, d) for c in ("large", "medium", "swap_small", "swap_medium", "gemv")
                                              for d in (torch.bfloat16, torch.float16)
                                              if (c, d) != ("medium", torch.float16)])
@pytest.mark.parametrize("m", [1, 17, 64, 200, 1000])
def test_every_config_at_every_size(config, m, out_dtype, seed):
    check(m, 776, 384, out_dtype, config=config, seed=seed)


@pytest.mark.parametrize("m,n,k", [(1, 776, 384), (8, 136, 128), (17, 200, 256), (64, 776, 384), (100, 1000, 4100),
                                   (200, 520, 256)])
@pytest.mark.parametrize("per_row", [False, True])
def test_medium_clusters(m, n, k, per_row, seed):
    """kMedium's 64x96 tiles in 2x1 clusters: N / 96 not whole, M within one 64-row
    tile (a cluster partly outside the problem), several tiles along M, unaligned K and N."""
    check(m, n, k, torch.bfloat16, per_row, per_row, per_row, config="medium", seed=seed)


# The kernels whose mainloop promotes to fp32 one K tile behind (sm90_deferred_promotion.cuh),
# with an M each can take and the output dtypes each is instantiated for.
DEFERRED = [("swap_small", 16, (torch.bfloat16, torch.float16)), ("swap_medium", 64, tuple(TOLERANCE)),
            ("medium", 128, (torch.bfloat16,)),
            ("large_cluster_n", 128, (torch.bfloat16,)), ("large", 300, tuple(TOLERANCE))]


@pytest.mark.parametrize("config,m,out_dtypes", DEFERRED)
@pytest.mark.parametrize("k", [128, 256, 384, 4100])
def test_deferred_promotion_tile_counts(config, m, out_dtypes, k, seed):
    """One, two, three and 33 K tiles (odd and even counts end the loop over two
    partial sums differently), tiles partly outside M and N, each output dtype."""
    for out_dtype in out_dtypes:
        check(m - 1, 776, k, out_dtype, config=config, seed=seed)


@pytest.mark.parametrize("config,m,out_dtypes", DEFERRED)
def test_deferred_promotion_keeps_the_promoted_precision(config, m, out_dtypes, seed):
    """Promoting every 128 of K is measurably more precise than never promoting
    (use_fast_accum, the same kernel's other loop): at K = 4096 the bf16 error
    against float64 is ~0.78x fast accumulation's on the H200, so a mainloop that
    skipped its promotions fails the 0.92 bound."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(m, 2048, 4096, "cuda", generator=g)
    ref = reference(a, b, sa, sb, None)
    promoted = rel_error(fp8ext.scaled_mm(a, b, sa, sb, config=config), ref)
    fast = rel_error(fp8ext.scaled_mm(a, b, sa, sb, config=config, use_fast_accum=True), ref)
    assert promoted < 0.92 * fast, f"{config}: promoted {promoted:.3e}, fast accumulation {fast:.3e}"


def test_bf16_only_configs_refuse_fp16():
    a = torch.zeros(16, 128, device="cuda").to(F8)
    one = torch.ones((), device="cuda")
    with pytest.raises(ValueError, match="not instantiated"):
        fp8ext.scaled_mm(a, a, one, one, out_dtype=torch.float16, config="large_cluster_n")


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("n,k", [(8, 16), (776, 384), (1000, 4100), (4095, 512)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("per_row_a,per_row_b,bias", [(False, False, False), (True, True, True), (True, False, True),
                                                       (False, True, False)])
def test_gemv_every_m_group_shape_and_scale_kind(m, n, k, out_dtype, per_row_a, per_row_b, bias, seed):
    """The CUDA-core GEMV (decode-sized M; groups of 4 rows of A past that), unaligned N and K
    included (the op pads them as for the tensor-core kernels)."""
    check(m, n, k, out_dtype, per_row_a, per_row_b, bias, config="gemv", seed=seed)


@pytest.mark.parametrize("env,m,want,other", [(None, 1, "gemv", "swap_small"), (None, 2, "swap_small", "gemv"),
                                               ("0", 1, "swap_small", "gemv")])
def test_auto_takes_the_gemv_at_m_1(monkeypatch, env, m, want, other, seed):
    """Auto runs the CUDA-core GEMV at M = 1 (FP8EXT_GEMV=0: never), the tensor-core kernels
    otherwise; the GEMV's fp32 sums differ from the tensor cores' in the last bits, so equal
    bits show which kernel ran."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(m, 776, 384, "cuda", F8, F8, True, True, torch.bfloat16, g)
    monkeypatch.delenv("FP8EXT_GEMV", raising=False)  # the default, whatever the caller's environment
    if env is not None:
        monkeypatch.setenv("FP8EXT_GEMV", env)
    auto = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
    monkeypatch.delenv("FP8EXT_GEMV", raising=False)
    assert torch.equal(auto, fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config=want))
    assert not torch.equal(auto, fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config=other))


@pytest.mark.parametrize("rows_per_warp", ["1", "2", "4"])
def test_gemv_rows_per_warp_variants(monkeypatch, rows_per_warp, seed):
    """Every rows-per-warp variant of the GEMV (FP8EXT_GEMV_ROWS, for timing) is correct, with
    N not a multiple of the rows a block takes (8, 16 or 32): fp32 output, whose N the op does
    not pad (bf16 output pads N to a multiple of 8), and N = 4092 leaves 4, 12 or 28 rows over."""
    monkeypatch.setenv("FP8EXT_GEMV_ROWS", rows_per_warp)
    for m in (1, 4, 5):
        check(m, 4092, 4100, torch.float32, True, True, True, config="gemv", seed=seed)


@pytest.mark.parametrize("config", ["wide_fast_accum", "large_n192", "large_cluster_n", "pingpong_fast_accum"])
@pytest.mark.parametrize("m", [1, 200, 1000])
def test_bf16_tuning_candidates(config, m, seed):
    check(m, 776, 384, torch.bfloat16, config=config, seed=seed)


@pytest.mark.parametrize("config,fast", [("large", False), ("large_n192", False), ("large_cluster_n", False),
                                         ("wide_fast_accum", True), ("pingpong_fast_accum", True)])
def test_tile_order_changes_no_bit(monkeypatch, config, fast, seed):
    """The order the persistent scheduler hands out tiles in (FP8EXT_GEMM_SWIZZLE groups,
    the raster along M or N; read at each launch) changes no bit of D: each tile is summed
    the same way wherever it runs, and the idle tiles that a swizzle of 8 pads the grid
    with (M = 1000 and N = 1800 are 8 x 15 tiles of 128, 1800 not a multiple of 192 or 256)
    write nothing. The dispatch takes groups of 8 where the raster walks over an operand
    larger than L2."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(1000, 1800, 512, "cuda", bias_dtype=torch.bfloat16, generator=g)
    for var in ("FP8EXT_GEMM_SWIZZLE", "FP8EXT_GEMM_RASTER"):
        monkeypatch.delenv(var, raising=False)
    run = lambda: fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config=config, use_fast_accum=fast)  # noqa: E731
    base = run()
    assert rel_error(base, reference(a, b, sa, sb, bias)) < TOLERANCE[torch.bfloat16]
    for swizzle in ("1", "2", "4", "8"):
        for raster in ("1", "2"):
            monkeypatch.setenv("FP8EXT_GEMM_SWIZZLE", swizzle)
            monkeypatch.setenv("FP8EXT_GEMM_RASTER", raster)
            assert torch.equal(run(), base), (swizzle, raster)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m", [1, 100, 300, 1000])
def test_fast_accumulation_allowed(m, out_dtype, seed):
    """use_fast_accum picks the fast kernel for bf16 at large M (the bf16 tolerance
    covers fast accumulation at this K); elsewhere the promoted kernels keep their
    own tolerance."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(m, 1032, 2048, "cuda", bias_dtype=out_dtype, generator=g)
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias, use_fast_accum=True)
    assert rel_error(d, reference(a, b, sa, sb, bias)) < TOLERANCE[out_dtype]


@pytest.mark.parametrize("m,config", [(16, "auto"), (100, "auto"), (64, "swap_medium"), (128, "medium"),
                                      (128, "large_cluster_n"), (300, "large"),
                                      (64, "split_k")])
def test_fast_accumulation_drops_the_promotion_at_decode_m(monkeypatch, m, config, seed):
    """With bf16 output, use_fast_accum also reaches the small-M kernels (and split-K's
    partials): they sum over all of K without promoting, so the bits change (K = 4096,
    15 promotions skipped) and the error stays within bf16's tolerance. fp32 output
    keeps promoting: there the flag changes nothing."""
    if config == "split_k":
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")  # the rule splits only K >= 12288
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(m, 1032, 4096, "cuda", bias_dtype=torch.bfloat16, generator=g)
    promoted = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config=config)
    fast = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config=config, use_fast_accum=True)
    assert not torch.equal(fast, promoted)
    ref = reference(a, b, sa, sb, bias)
    # Never promoting costs ~1.3x the error at K = 4096 (2.1e-3 against 1.66e-3); a
    # loop that let the producer overwrite a stage still being read cost 2.6-7.8x.
    assert rel_error(fast, ref) < min(TOLERANCE[torch.bfloat16], 1.6 * rel_error(promoted, ref))
    exact32 = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert torch.equal(exact32, fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, use_fast_accum=True))


@pytest.mark.parametrize("a_dtype,b_dtype", [(F8, E5), (E5, E5), (E5, F8)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [3, 300])
def test_e5m2_operands(a_dtype, b_dtype, out_dtype, m, seed):
    check(m, 264, 256, out_dtype, a_dtype=a_dtype, b_dtype=b_dtype, seed=seed)


def test_non_finite_inputs_propagate(seed):
    """NaN in A poisons its row only; the other rows stay finite and correct."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(64, 256, 128, "cuda", generator=g)
    a[3, 5] = float("nan")
    d = fp8ext.scaled_mm(a, b, sa, sb)
    assert torch.isnan(d[3]).all()
    rows = torch.arange(64, device="cuda") != 3
    assert rel_error(d[rows], reference(a, b, sa, sb, None)[rows]) < TOLERANCE[torch.bfloat16]


# Every kernel family (the GEMV, the swap-AB tiles, 64- and 128-row tiles, split-K, the E5M2
# kernel): a NaN code in A poisons its row, one in B its column, a NaN per-row scale or bias
# element its row or column; an E5M2 infinity gives a non-finite row as in the reference (the
# tensor cores may make NaN of what the reference calls infinite). The rest is as the reference.
@pytest.mark.parametrize("config,m,fp8", [("gemv", 1, F8), ("swap_small", 16, F8), ("swap_medium", 48, F8),
                                          ("medium", 100, F8), ("large", 300, F8), ("split_k", 48, F8),
                                          ("split_k", 100, F8), ("large_n192", 300, F8),
                                          ("large_cluster_n", 300, F8), ("wide_fast_accum", 300, F8),
                                          ("pingpong_fast_accum", 300, F8), ("auto", 3, E5), ("auto", 300, E5)],
                         ids=str)
def test_non_finite_codes_scales_and_bias_in_every_kernel(monkeypatch, config, m, fp8, seed):
    if config == "split_k":
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")
    out_dtype = torch.float32 if fp8 == E5 else torch.bfloat16  # the E5M2 kernel writes fp32
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(m, 264, 512, "cuda", fp8, fp8, True, True, out_dtype, g)
    b[7, 9] = float("nan")
    sb[100] = float("nan")
    bias[200] = float("nan")
    if m > 1:  # at M = 1 a poisoned row would leave nothing finite
        a[m // 2, 5] = float("nan")
    if m > 2:
        sa[m - 1] = float("nan")
        if fp8 == E5:
            a[0, 11] = float("inf")
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias, config=config).cpu()
    ref = reference(a.cpu(), b.cpu(), sa.cpu(), sb.cpu(), bias.cpu())
    assert torch.isnan(ref[:, 7]).all() and torch.isnan(ref[:, 100]).all() and torch.isnan(ref[:, 200]).all()
    assert torch.equal(torch.isfinite(d), torch.isfinite(ref))
    assert torch.isnan(d)[torch.isnan(ref)].all()
    finite = torch.isfinite(ref)
    assert rel_error(d[finite], ref[finite]) < TOLERANCE[out_dtype]


# fp16 output past 65504: every kernel family rounds to +-inf, as the reference's
# fp32 -> fp16 cast does (and cuBLAS and torch.matmul), never to a saturated or
# wrapped value (medium is bf16-only: auto at M = 100 takes swap_medium for fp16).
# Codes of 448 x 448 over K = 512 overflow; rows of B at 0.25 give
# 57344 exactly (still finite); negative rows give -inf.
@pytest.mark.parametrize("config,m", [("gemv", 1), ("swap_small", 5), ("swap_medium", 48), ("auto", 100),
                                      ("large", 300), ("split_k", 48), ("auto", 17)], ids=str)
def test_fp16_output_overflows_to_inf_as_the_reference(monkeypatch, config, m):
    if config == "split_k":
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")
    k, n = 512, 264
    a = torch.full((m, k), 448.0).to(F8)
    b = torch.full((n, k), 0.25)
    b[::3] = 448.0
    b[1::3] = -448.0
    b = b.to(F8)
    one = torch.ones(())
    want = reference(a, b, one, one, None).to(torch.float16)
    assert torch.isinf(want[:, 0]).all() and torch.isinf(want[:, 1]).all() and (want[:, 2] == 57344).all()
    d = fp8ext.scaled_mm(a.cuda(), b.cuda(), one.cuda(), one.cuda(), out_dtype=torch.float16, config=config)
    assert torch.equal(d.cpu(), want), f"{config}: {d[0, :4].tolist()} against {want[0, :4].tolist()}"


@pytest.mark.parametrize("m", [5, 9])
def test_gemv_poisons_only_its_own_rows(m, seed):
    """The GEMV takes up to four rows of A per warp (rows 0-3, 4-7, ...): a NaN code in
    row 2 and a NaN scale of row m - 4 (1 or 5, each in a group of four) poison those
    rows only, not the others a warp shares."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(m, 776, 384, "cuda", generator=g)
    a[2, 5] = float("nan")
    sa[m - 4] = float("nan")
    d = fp8ext.scaled_mm(a, b, sa, sb, config="gemv").cpu()
    bad = torch.zeros(m, dtype=torch.bool)
    bad[[2, m - 4]] = True
    assert torch.isnan(d[bad]).all() and torch.isfinite(d[~bad]).all()
    want = reference(a.cpu(), b.cpu(), sa.cpu(), sb.cpu(), None)
    assert rel_error(d[~bad], want[~bad]) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("offset", [0, 8])
def test_strided_and_offset_operands(offset, seed):
    """A view with padded rows (stride 1040 != K) is read in place when 16-byte
    aligned (offset 0) and copied by the padded path when not (offset 8)."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(50, 304, 1024, "cuda", generator=g)
    a_view = torch.empty(50, 1040, dtype=F8, device="cuda")[:, offset:offset + 1024]
    a_view.copy_(a)
    d = fp8ext.scaled_mm(a_view, b, sa, sb)
    assert rel_error(d, reference(a, b, sa, sb, None)) < TOLERANCE[torch.bfloat16]


def round_up(x, multiple):
    return (x + multiple - 1) // multiple * multiple


def a_laid_out(a, layout):
    """a's values in another memory layout: rows starting 1, 2, 4 or 8 bytes past
    16 ("offset1" ...), one row repeated (stride 0), or column-major."""
    m, k = a.shape
    if layout.startswith("offset"):
        shift = int(layout[len("offset"):])
        view = torch.empty(m, k + 32, dtype=a.dtype, device=a.device)[:, shift:shift + k]
        view.copy_(a)
        return view
    if layout == "expanded":
        return a[:1].expand(m, k)
    if layout == "transposed":
        return a.t().contiguous().t()
    return a


# The padded path's copy moves 16, 8, 4, 2 or 1 bytes at a time as K, N and the
# source's address allow: K = 4104 (8), 4100 (4), 1710 (2), 33 (1); aligned K
# with unaligned rows of A (offsets); N = 4095 (odd: D's columns dropped 2
# bytes at a time in bf16, 4 in fp32) and 1000, 1004 (N mod 8 = 0, 4).
@pytest.mark.parametrize("m,n,k,layout", [(33, 1000, 4100, "contiguous"), (7, 1001, 1710, "contiguous"),
                                          (64, 264, 33, "contiguous"), (300, 776, 4104, "contiguous"),
                                          (17, 4095, 512, "contiguous"), (129, 1004, 4100, "contiguous"),
                                          (1, 4095, 4100, "contiguous"), (50, 304, 1024, "offset1"),
                                          (50, 304, 1024, "offset2"), (50, 304, 1024, "offset4"),
                                          (50, 305, 1024, "offset8"), (40, 200, 1000, "expanded"),
                                          (40, 200, 1000, "transposed")])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_padded_path_gives_the_bits_of_operands_padded_by_hand(m, n, k, layout, out_dtype, seed):
    """The padded path (operands copied into zero-padded buffers, D's extra
    columns dropped) against the same kernel on operands zero-padded beforehand:
    equal bit for bit, so a byte copied wrong or a padding byte not zero shows."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(m, n, k, "cuda", bias_dtype=out_dtype, generator=g)
    a = a_laid_out(a, layout)
    if layout == "transposed":  # both through the fallback copy: non-zero K padding in either would show
        b = b.t().contiguous().t()
    k16, n16 = round_up(k, 16), round_up(n, 16 // (torch.finfo(out_dtype).bits // 8))
    a_pad = torch.zeros(m, k16, dtype=F8, device="cuda")
    a_pad[:, :k] = a
    b_pad = torch.zeros(n16, k16, dtype=F8, device="cuda")
    b_pad[:n, :k] = b
    sb_pad = torch.ones(n16, device="cuda")
    sb_pad[:n] = sb
    bias_pad = torch.zeros(n16, dtype=out_dtype, device="cuda")
    bias_pad[:n] = bias
    want = fp8ext.scaled_mm(a_pad, b_pad, sa, sb_pad, out_dtype=out_dtype, bias=bias_pad)[:, :n]
    got = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias)
    assert got.is_contiguous() and got.shape == (m, n)
    assert torch.equal(got, want)
    assert rel_error(got, reference(a, b, sa, sb, bias)) < TOLERANCE[out_dtype]


def test_empty_and_k0():
    a = torch.empty(0, 32, dtype=F8, device="cuda")
    b = torch.empty(16, 32, dtype=F8, device="cuda")
    one = torch.ones((), device="cuda")
    assert fp8ext.scaled_mm(a, b, one, one).shape == (0, 16)
    bias = torch.randn(16, device="cuda", dtype=torch.bfloat16)
    d = fp8ext.scaled_mm(torch.empty(3, 0, dtype=F8, device="cuda"), torch.empty(16, 0, dtype=F8, device="cuda"),
                         one, one, bias=bias)
    assert torch.equal(d, bias.expand(3, 16))


def test_cuda_graph_replay_matches_eager(seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(16, 2048, 1024, "cuda", bias_dtype=torch.bfloat16, generator=g)
    eager = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp8ext.scaled_mm(a, b, sa, sb, bias=bias)  # warm up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
    sa.mul_(2.0)  # scales are read on the device at replay time
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), fp8ext.scaled_mm(a, b, sa, sb, bias=bias).float(), rtol=0, atol=0)
    assert not torch.equal(out, eager)


def test_compile_fullgraph_on_cuda(seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(40, 512, 256, "cuda", bias_dtype=torch.bfloat16, generator=g)
    torch._dynamo.reset()
    f = torch.compile(lambda *t: fp8ext.scaled_mm(*t[:4], bias=t[4]), fullgraph=True)
    assert torch.equal(f(a, b, sa, sb, bias), fp8ext.scaled_mm(a, b, sa, sb, bias=bias))


def test_scale_on_wrong_device_raises():
    a = torch.randn(4, 32, device="cuda").to(F8)
    b = torch.randn(8, 32, device="cuda").to(F8)
    with pytest.raises(ValueError, match="scale_a must be on"):
        fp8ext.scaled_mm(a, b, torch.ones(()), torch.ones((), device="cuda"))


@pytest.mark.parametrize("out_dtype,config", [(torch.float32, "medium"), (torch.float16, "medium"),
                                              (torch.float16, "pingpong_fast_accum")])
def test_config_not_instantiated_for_dtype_raises(out_dtype, config):
    a = torch.randn(4, 32, device="cuda").to(F8)
    b = torch.randn(8, 32, device="cuda").to(F8)
    one = torch.ones((), device="cuda")
    with pytest.raises(ValueError, match="not instantiated"):
        fp8ext.scaled_mm(a, b, one, one, out_dtype=out_dtype, config=config)


# ---- split-K (config "split_k"): slices of K in one launch, then a sum ---------------

@pytest.mark.parametrize("splits", ["2", "3", "4", "8"])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 1000, 4100), (17, 776, 1536), (64, 264, 2048),
                                   (33, 4095, 512), (7, 8, 16), (65, 1032, 1024), (128, 4096, 4096),
                                   (100, 1000, 4100), (300, 264, 2048), (2, 264, 1024), (8, 264, 1024)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_split_k_every_split_count(monkeypatch, splits, m, n, k, out_dtype, seed):
    """Each forced split count (FP8EXT_GEMM_SPLITS) gives the reference's result, bias
    included once, with swap-AB tiles (M <= 64) and 128x128 cluster tiles (above; M = 300:
    three tile rows): K that the count does not divide into multiples of 16 takes fewer
    slices (4100 pads to 4112 = 16 x 257: one slice), unaligned N pads as elsewhere;
    M <= 16 runs whole K."""
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", splits)
    check(m, n, k, out_dtype, config="split_k", seed=seed)
    check(m, n, k, out_dtype, per_row_a=False, per_row_b=False, bias=False, config="split_k", seed=seed + 1)


def test_split_k_slices_change_the_summation(monkeypatch, seed):
    """gemm_cases.assert_split_changes_summation with swap-AB 64x64 tiles (M = 17)."""
    g = torch.Generator().manual_seed(seed)
    assert_split_changes_summation(monkeypatch, operands(17, 2048, 4096, "cuda", bias_dtype=torch.float32, generator=g),
                                   reference, "swap_medium", "split_k")


@pytest.mark.parametrize("setting,m,k,split", [(None, 64, 14336, True), (None, 128, 14336, True),
                                               (None, 16, 14336, False), (None, 129, 14336, False),
                                               (None, 64, 4096, False), ("auto", 100, 14336, True),
                                               ("1", 64, 14336, False), ("2", 64, 4096, True),
                                               ("2", 16, 4096, False)])
def test_auto_split_k_setting(monkeypatch, setting, m, k, split, seed):
    """kAuto slices K by its rule (16 < M <= 128, K >= 12288, N = 4096: too few tiles to fill
    the SMs), or as FP8EXT_GEMM_SPLITS forces (1: never; M <= 16: never): equal bits with
    the explicit configuration (under the same setting) show which kernel ran."""
    if torch.cuda.get_device_properties(0).multi_processor_count < 128:
        pytest.skip("the cases assume >= 128 SMs (H100 SXM, H200: 132): 64 tiles of N = 4096 leave half idle")
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(m, 4096, k, "cuda", bias_dtype=torch.float32, generator=g)
    monkeypatch.delenv("FP8EXT_GEMM_SPLITS", raising=False)
    if setting is not None:
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", setting)
    auto = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    # the explicit configuration slices as kAuto would (one slice: the whole-K kernel kAuto picks)
    assert torch.equal(auto, fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32, config="split_k"))
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "1")
    whole = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    assert torch.equal(auto, whole) != split
    assert rel_error(auto, reference(a, b, sa, sb, bias)) < TOLERANCE[torch.float32]


def test_split_k_in_a_cuda_graph(monkeypatch, seed):
    """The partials live in a workspace taken from the caching allocator at capture;
    replays re-read the scales and give the eager bits."""
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(32, 4096, 4096, "cuda", bias_dtype=torch.bfloat16, generator=g)
    run = lambda: fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config="split_k")  # noqa: E731
    graph, out = capture(run)
    sa.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run())
