"""The CUTLASS block-wise scaled_mm kernels (1x128 activation groups, 128x128
weight blocks) on the GPU against a float64 reference that applies every scale
to its own elements: M across the dispatch buckets, unaligned N and K, output
dtypes, bias, every configuration, scale layouts, outliers, graphs, compile."""
import pytest
import torch

import fp8ext
from fp8ext import _native
from fp8ext.recipes import BlockWise
from gemm_cases import (F8, SLICE_TOLERANCE, TOLERANCE, assert_split_changes_summation, block_operands,
                        block_reference, compiled_matches_eager, last_group_errors, outlier_errors, rel_error,
                        worst_slice_error)

pytestmark = pytest.mark.gpu

M_SWEEP = [1, 2, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129, 1000, 4096]


@pytest.fixture(autouse=True)
def _needs_kernels():
    if not _native.gemm_kernels_run_on(torch.cuda.current_device()):
        pytest.skip("the CUTLASS sm_90a GEMMs are not built, or this GPU is not sm_90")


def check(m, n, k, out_dtype=torch.bfloat16, bias=True, config="auto", seed=0, m_major=True):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias_t = block_operands(m, n, k, "cuda", out_dtype if bias else None, g, m_major)
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias_t, config=config)
    assert d.shape == (m, n) and d.dtype == out_dtype and d.is_contiguous()
    want = block_reference(a, b, sa, sb, bias_t)
    err = rel_error(d, want)
    assert err < TOLERANCE[out_dtype], f"M={m} N={n} K={k} {out_dtype} config={config}: error {err:.2e}"
    if m and n:  # a wrong tile or store hides in the whole output's error, not in its rows' and columns'
        worst = worst_slice_error(d, want)
        assert worst < SLICE_TOLERANCE[out_dtype], f"M={m} N={n} K={k} {out_dtype} config={config}: slice {worst:.2e}"


@pytest.mark.parametrize("m", M_SWEEP)
def test_m_sweep(m, seed):
    check(m, 1024, 512, seed=seed)


@pytest.mark.parametrize("n,k", [(4095, 512), (1000, 4100), (4096, 1710), (1280, 1710), (8, 16), (24, 16),
                                 (200, 300), (130, 129)])
@pytest.mark.parametrize("m", [1, 7, 33, 1000])
def test_unaligned_n_and_k(m, n, k, seed):
    check(m, n, k, seed=seed)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [5, 48, 100, 777])
def test_output_dtypes_and_bias(m, out_dtype, bias, seed):
    check(m, 520, 640, out_dtype, bias, seed=seed)


@pytest.mark.parametrize("config", ["block_large", "block_medium", "block_swap_small", "block_swap_medium"])
@pytest.mark.parametrize("m", [1, 17, 64, 200, 1000])
def test_every_config_at_every_size(config, m, seed):
    check(m, 776, 384, config=config, seed=seed)


@pytest.mark.parametrize("config", ["block_large", "block_swap_medium"])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m", [1, 100])
def test_fp16_and_fp32_configs(config, out_dtype, m, seed):
    check(m, 264, 256, out_dtype, config=config, seed=seed)


@pytest.mark.parametrize("m", [1, 3, 64, 300])
def test_row_major_group_scales_take_the_padded_path(m, seed):
    check(m, 256, 384, m_major=False, seed=seed)


def test_quantized_operands_end_to_end(seed):
    """fp8ext.quantize's group and block scales feed the kernel as they are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(77, 1000, generator=g).cuda().bfloat16()
    w = torch.randn(300, 1000, generator=g).cuda().bfloat16()
    qa, sa = fp8ext.quantize(x, BlockWise(), "activation", pad_k_to=16)
    qb, sb = fp8ext.quantize(w, BlockWise(), "weight", pad_k_to=16)
    d = fp8ext.scaled_mm(qa, qb, sa, sb)
    ref = block_reference(qa[:, :1000], qb[:, :1000], sa, sb, None)
    assert rel_error(d, ref) < TOLERANCE[torch.bfloat16]
    assert rel_error(d, x.double() @ w.double().t()) < 0.06  # the FP8 rounding of both operands


def test_block_scales_beat_per_tensor_on_outliers(seed):
    errors = outlier_errors(256, 512, 1024, "cuda", seed)
    assert errors["block"] < 0.06 and errors["tensor"] > 10 * errors["block"], errors


@pytest.mark.parametrize("config,col", [("auto", 5), ("auto", 200), ("block_split_k", 5), ("block_split_k", 200)])
def test_non_finite_inputs_propagate(monkeypatch, config, col, seed):
    """NaN in A poisons its row only; the other rows stay finite and correct (split-K:
    2 slices of 128, the NaN in either, through the sum of the partials; auto: the
    whole-K 128x64 kernel, K = 256 being too short for its rule to slice)."""
    monkeypatch.delenv("FP8EXT_GEMM_SPLITS", raising=False)
    if config == "block_split_k":
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = block_operands(64, 256, 256, "cuda", generator=g)
    a[3, col] = float("nan")
    d = fp8ext.scaled_mm(a, b, sa, sb, config=config)
    assert torch.isnan(d[3]).all()
    rows = torch.arange(64, device="cuda") != 3
    assert rel_error(d[rows], block_reference(a, b, sa, sb, None)[rows]) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("config,m", [("block_swap_small", 5), ("block_swap_medium", 48), ("block_medium", 100),
                                      ("block_large", 300), ("block_split_k", 48)], ids=str)
def test_non_finite_codes_scales_and_bias_in_every_config(monkeypatch, config, m, seed):
    """A NaN code in B poisons its column, a NaN group scale its row, an infinite block
    scale its block's columns (+-inf or NaN: the kernel scales a block's partial sum,
    the reference each product, so only "not finite" is compared there), a NaN bias
    element its column; the rest is as the reference."""
    monkeypatch.delenv("FP8EXT_GEMM_SPLITS", raising=False)
    if config == "block_split_k":
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = block_operands(m, 264, 512, "cuda", torch.bfloat16, g)
    b[7, 9] = float("nan")
    sa[m // 2, 1] = float("nan")  # row m // 2, K 128-255
    sb[1, 0] = float("inf")  # columns 128-255, K 0-127
    bias[20] = float("nan")
    d = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, config=config).cpu()
    ref = block_reference(a.cpu(), b.cpu(), sa.cpu(), sb.cpu(), bias.cpu())
    assert not torch.isfinite(ref[m // 2]).any() and not torch.isfinite(ref[:, [7, 20]]).any()
    assert not torch.isfinite(ref[:, 128:256]).any()
    assert torch.equal(torch.isfinite(d), torch.isfinite(ref))
    assert torch.isnan(d[:, [7, 20]]).all() and torch.isnan(d[m // 2]).all()
    finite = torch.isfinite(ref)
    assert rel_error(d[finite], ref[finite]) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("offset", [0, 8])
def test_strided_and_offset_operands(offset, seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = block_operands(50, 304, 1024, "cuda", generator=g)
    a_view = torch.empty(50, 1040, dtype=F8, device="cuda")[:, offset:offset + 1024]
    a_view.copy_(a)
    assert rel_error(fp8ext.scaled_mm(a_view, b, sa, sb), block_reference(a, b, sa, sb, None)) < \
        TOLERANCE[torch.bfloat16]


def test_empty_and_k0():
    bias = torch.randn(16, device="cuda", dtype=torch.bfloat16)
    d = fp8ext.scaled_mm(torch.empty(3, 0, dtype=F8, device="cuda"), torch.empty(16, 0, dtype=F8, device="cuda"),
                         torch.ones(3, 0, device="cuda"), torch.ones(1, 0, device="cuda"), bias=bias)
    assert torch.equal(d, bias.expand(3, 16))
    d = fp8ext.scaled_mm(torch.randn(3, 300, device="cuda").to(F8), torch.empty(0, 300, dtype=F8, device="cuda"),
                         torch.ones(3, 3, device="cuda"), torch.ones(0, 3, device="cuda"))
    assert d.shape == (3, 0)


def test_partial_last_group_alone(seed):
    whole, last_block = last_group_errors("cuda", seed)
    assert whole < TOLERANCE[torch.float32] and last_block < TOLERANCE[torch.float32], (whole, last_block)


def test_expanded_and_offset_scale_views(seed):
    """Scale views the kernels cannot read as they are get copied: an expanded
    block-scale row (stride 0) and group scales at a storage offset with a short tail."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = block_operands(7, 256, 256, "cuda", generator=g)
    expanded = sb[:1].expand(2, 2)
    ref = block_reference(a, b, sa, expanded, None)
    assert rel_error(fp8ext.scaled_mm(a, b, sa, expanded), ref) < TOLERANCE[torch.bfloat16]
    # Columns at stride 8, the last one ending right after row 7: the TMA would read 8.
    tight = torch.zeros(8 + 7, device="cuda").as_strided((7, 2), (1, 8))
    tight.copy_(sa)
    assert rel_error(fp8ext.scaled_mm(a, b, tight, sb), block_reference(a, b, sa, sb, None)) < \
        TOLERANCE[torch.bfloat16]


def captured(fn):
    """fn() captured in a CUDA graph, after a warm-up call on a side stream: (graph, its output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def test_cuda_graph_replay_matches_eager(seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = block_operands(16, 2048, 1024, "cuda", torch.bfloat16, g)
    eager = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
    graph, out = captured(lambda: fp8ext.scaled_mm(a, b, sa, sb, bias=bias))
    sb.mul_(2.0)  # scales are read on the device at replay time
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fp8ext.scaled_mm(a, b, sa, sb, bias=bias)) and not torch.equal(out, eager)


def test_compile_fullgraph(seed):
    assert compiled_matches_eager(40, 512, 256, "cuda", seed)


def test_fp8_linear_blockwise_matches_the_cpu_reference(seed):
    """FP8Linear with the block-wise recipe runs the kernel on the GPU and the
    reference on the CPU: the same codes and scales, so the outputs agree."""
    g = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(1000, 520, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(520, 1000, generator=g) * 0.05)
    layer = fp8ext.FP8Linear.from_linear(linear, BlockWise())
    x = torch.randn(3, 33, 1000, generator=g)
    cpu = layer(x)
    gpu = layer.cuda()(x.cuda())
    assert rel_error(gpu.cpu(), cpu.double()) < TOLERANCE[torch.float32]


# ---- split-K (config "block_split_k"): slices of K in one launch, then a sum ---------

@pytest.mark.parametrize("splits", ["2", "3", "4", "8"])
@pytest.mark.parametrize("m,n,k", [(1, 1000, 4096), (16, 4096, 1024), (17, 776, 1536), (33, 4095, 1024),
                                   (64, 264, 2048), (64, 136, 4100), (100, 1000, 768), (128, 520, 1024),
                                   (300, 264, 2048), (7, 8, 256)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_split_k_every_split_count(monkeypatch, splits, m, n, k, out_dtype, seed):
    """Each forced split count (FP8EXT_GEMM_SPLITS) gives the reference's result, bias
    included once: slices of whole 128-column groups (K = 1536 takes 6 slices of 256 where
    8 are asked, K = 768 two where 4 or 8 are; 4100, with a partial last group, runs
    whole), unaligned N padded as elsewhere, every M the swap-AB 128x64 fp32 kernel takes
    (M = 300: five column tiles). That the split path runs is shown by
    test_split_k_slices_change_the_summation and test_auto_split_k_setting."""
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", splits)
    check(m, n, k, out_dtype, config="block_split_k", seed=seed)
    check(m, n, k, out_dtype, bias=False, config="block_split_k", seed=seed + 1)


def test_split_k_slices_change_the_summation(monkeypatch, seed):
    """gemm_cases.assert_split_changes_summation with the fp32 128x64 swap-AB kernel (M = 40)."""
    g = torch.Generator().manual_seed(seed)
    assert_split_changes_summation(monkeypatch, block_operands(40, 2048, 4096, "cuda", torch.float32, g),
                                   block_reference, "block_swap_medium", "block_split_k")


@pytest.mark.parametrize("setting,m,k,split", [(None, 64, 4096, True), (None, 17, 4096, True),
                                               (None, 16, 4096, False), (None, 65, 4096, False),
                                               (None, 64, 512, False), (None, 64, 4100, False),
                                               ("1", 64, 4096, False), ("2", 16, 4096, True),
                                               ("2", 128, 4096, True)])
def test_auto_split_k_setting(monkeypatch, setting, m, k, split, seed):
    """kAuto slices K by its rule (16 < M <= 64 with N = 4096: 32 weight tiles for the
    SMs; each slice >= 1024 of K, whole groups) or as FP8EXT_GEMM_SPLITS forces (at
    M <= 128; 1: never): equal bits with the explicit configuration (under the same
    setting) and unequal ones with the whole-K kernel show which ran."""
    if torch.cuda.get_device_properties(0).multi_processor_count < 128:
        pytest.skip("the cases assume >= 128 SMs (H100 SXM, H200: 132): 32 tiles of N = 4096 leave most idle")
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = block_operands(m, 4096, k, "cuda", torch.float32, g)
    monkeypatch.delenv("FP8EXT_GEMM_SPLITS", raising=False)
    if setting is not None:
        monkeypatch.setenv("FP8EXT_GEMM_SPLITS", setting)
    auto = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    assert torch.equal(auto, fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32,
                                              config="block_split_k"))
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "1")
    whole = fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    assert torch.equal(auto, whole) != split
    assert rel_error(auto, block_reference(a, b, sa, sb, bias)) < TOLERANCE[torch.float32]


def test_split_k_in_a_cuda_graph(monkeypatch, seed):
    """The rule's split (64 x 4096 x 4096: 4 slices) inside a graph: the workspace is the
    graph's, the scales are read at replay time. fp32 output, so that the split's sums
    differ from the whole-K kernel's in the last bits (the split ran)."""
    if torch.cuda.get_device_properties(0).multi_processor_count < 128:
        pytest.skip("the rule splits 32 tiles of N = 4096 only with >= 96 SMs; the case assumes 132")
    monkeypatch.delenv("FP8EXT_GEMM_SPLITS", raising=False)
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = block_operands(64, 4096, 4096, "cuda", torch.float32, g)
    run = lambda: fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)  # noqa: E731
    eager = run()
    assert not torch.equal(eager, fp8ext.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32,
                                                   config="block_swap_medium"))
    graph, out = captured(run)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    sb.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run()) and not torch.equal(out, eager)


def test_bad_input_raises():
    a = torch.randn(4, 256, device="cuda").to(F8)
    b = torch.randn(8, 256, device="cuda").to(F8)
    sa, sb = torch.ones(4, 2, device="cuda"), torch.ones(1, 2, device="cuda")
    with pytest.raises(TypeError, match="float8_e4m3fn for the block-wise"):
        fp8ext.scaled_mm(a.to(torch.float8_e5m2), b, sa, sb)
    with pytest.raises(ValueError, match=r"scale_a must be one value per 1x128 group"):
        fp8ext.scaled_mm(a, b, torch.ones(4, 3, device="cuda"), sb)
    with pytest.raises(ValueError, match="not instantiated"):
        fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, config="block_medium")
    with pytest.raises(ValueError, match="config must be one of"):
        fp8ext.scaled_mm(a, b, sa, sb, config="large")
    with pytest.raises(ValueError, match="scale_b must be on"):
        fp8ext.scaled_mm(a, b, sa, torch.ones(1, 2))
