"""fp8ext.scaled_mm on the CPU (the reference path): numerics, argument errors,
torch.compile. The CUDA kernels are tested in test_scaled_mm_cuda.py."""
import pytest
import torch

import fp8ext
from gemm_cases import CPU_TOLERANCE, F8, operands, reference, rel_error


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("per_row_a,per_row_b", [(False, False), (True, False), (False, True), (True, True)])
def test_reference_matches_float64(out_dtype, per_row_a, per_row_b, seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(33, 40, 70, "cpu", per_row_a=per_row_a, per_row_b=per_row_b,
                                  bias_dtype=out_dtype, generator=g)
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias)
    assert d.dtype == out_dtype and d.shape == (33, 40)
    assert rel_error(d, reference(a, b, sa, sb, bias)) < CPU_TOLERANCE[out_dtype]


@pytest.mark.parametrize("b_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_e5m2_operands(b_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(5, 16, 32, "cpu", a_dtype=torch.float8_e5m2, b_dtype=b_dtype, generator=g)
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert rel_error(d, reference(a, b, sa, sb, None)) < CPU_TOLERANCE[torch.float32]


def test_error_is_not_trivially_small(seed):
    """The check can fail: a wrong scale gives a large error."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(8, 8, 32, "cpu", generator=g)
    d = fp8ext.scaled_mm(a, b, sa, sb * 1.01, out_dtype=torch.float32)
    assert rel_error(d, reference(a, b, sa, sb, None)) > 5e-3


def _args():
    a, b, sa, sb, bias = operands(4, 8, 16, "cpu", bias_dtype=torch.bfloat16)
    return dict(a=a, b=b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16)


@pytest.mark.parametrize("change,error,match", [
    (dict(a=torch.randn(4, 16)), TypeError, "a must be torch.float8"),
    (dict(b=torch.randn(8, 16).to(F8).unsqueeze(0)), ValueError, "2-D"),
    (dict(b=torch.randn(8, 32).to(F8)), ValueError, "share K"),
    (dict(scale_a=torch.ones(4, dtype=torch.float64)), TypeError, "scale_a must be a float32"),
    (dict(scale_a=torch.ones(3)), ValueError, "scale_a must hold one value"),
    (dict(scale_b=torch.ones(2, 4)), ValueError, "scale_b must hold one value"),
    (dict(bias=torch.ones(8)), TypeError, "bias must have out_dtype"),
    (dict(bias=torch.ones(7, dtype=torch.bfloat16)), ValueError, "bias must be"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype"),
])
def test_bad_arguments_raise_clear_errors(change, error, match):
    args = _args()
    args.update(change)
    with pytest.raises(error, match=match):
        fp8ext.scaled_mm(**args)


def test_bad_config_name():
    with pytest.raises(ValueError, match="config must be one of"):
        fp8ext.scaled_mm(**_args(), config="huge")


@pytest.mark.parametrize("config,a_dtype,out_dtype", [
    ("medium", torch.float8_e4m3fn, torch.float16), ("swap_small", torch.float8_e4m3fn, torch.float32),
    ("large_cluster_n", torch.float8_e4m3fn, torch.float16), ("gemv", torch.float8_e5m2, torch.float32),
    ("swap_medium", torch.float8_e5m2, torch.float32)])
def test_configs_the_gpu_lacks_are_refused_on_the_cpu_too(config, a_dtype, out_dtype):
    """The CUDA op has no kernel for these (has_config in scaled_mm_dispatch.cu): the CPU path
    refuses them alike, so code tested here does not fail on the GPU first (helper-35). An empty
    problem returns before the check, on both."""
    a, b, _, _, _ = operands(4, 8, 16, "cpu", a_dtype=a_dtype)
    sa = sb = torch.ones(())
    with pytest.raises(ValueError, match=f"config {config} is not instantiated"):
        fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, config=config)
    assert fp8ext.scaled_mm(a[:0], b, sa, sb, out_dtype=out_dtype, config=config).shape == (0, 8)
    ok = "large" if a_dtype == torch.float8_e5m2 else "swap_medium"
    assert fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, config=ok).shape == (4, 8)


def test_k0_gives_zeros_or_the_bias_whatever_the_scales():
    """An empty sum is zero: an infinite scale must not turn it into NaN (CUDA returns first)."""
    a, b = torch.zeros(2, 0, dtype=F8), torch.zeros(3, 0, dtype=F8)
    inf = torch.tensor(float("inf"))
    assert torch.equal(fp8ext.scaled_mm(a, b, inf, torch.ones(()), out_dtype=torch.float32), torch.zeros(2, 3))
    bias = torch.tensor([1.0, -2.0, 3.0])
    d = fp8ext.scaled_mm(a, b, inf, torch.ones(()), out_dtype=torch.float32, bias=bias)
    assert torch.equal(d, bias.expand(2, 3))


def test_compile_fullgraph_matches_eager():
    args = _args()
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, sa, sb, bias: fp8ext.scaled_mm(a, b, sa, sb, bias=bias), fullgraph=True)
    got = compiled(args["a"], args["b"], args["scale_a"], args["scale_b"], args["bias"])
    want = fp8ext.scaled_mm(**args)
    assert torch.equal(got, want)


def test_fast_accumulation_is_only_a_permission_on_cpu():
    """use_fast_accum allows a less precise kernel; the reference accumulates exactly either way,
    and the flag traces through torch.compile."""
    args = _args()
    want = fp8ext.scaled_mm(**args)
    assert torch.equal(fp8ext.scaled_mm(**args, use_fast_accum=True), want)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, sa, sb: fp8ext.scaled_mm(a, b, sa, sb, use_fast_accum=True),
                             fullgraph=True)
    assert torch.equal(compiled(args["a"], args["b"], args["scale_a"], args["scale_b"]),
                       fp8ext.scaled_mm(args["a"], args["b"], args["scale_a"], args["scale_b"]))


@pytest.mark.parametrize("m,n,k", [(0, 1, 16), (0, 5, 16), (3, 0, 16), (0, 1, 0), (2, 1, 32)])
def test_output_strides_are_row_major_like_the_fakes(m, n, k):
    """Empty outputs included: [0, 1] came back with strides (1, 0) where the CUDA op
    and the fake give (1, 1), so a compiled graph's stride guards told them apart."""
    a, b, sa, sb, _ = operands(m, n, k, "cpu", per_row_a=False, per_row_b=False)
    d = fp8ext.scaled_mm(a, b, sa, sb)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.fp8ext.scaled_mm(*(mode.from_tensor(t) for t in (a, b, sa, sb)), None, torch.bfloat16, 0,
                                          False)
    assert d.shape == (m, n) and d.stride() == torch.empty(m, n).stride() == fake.stride()


def test_the_gpu_tests_slice_check_catches_one_wrong_store_the_whole_error_misses():
    """gemm_cases.worst_slice_error, which the GPU tests' check() applies on top of
    the whole output's error: 8 wrong bf16 values (one 16-byte store) of a
    1000 x 776 output pass the whole bound and fail the slice bound; the CPU op's
    correct output passes both, M = 1 included."""
    from gemm_cases import SLICE_TOLERANCE, TOLERANCE, operands, reference, rel_error, worst_slice_error
    g = torch.Generator().manual_seed(0)
    for m in (1, 1000):
        a, b, sa, sb, bias = operands(m, 776, 384, "cpu", bias_dtype=torch.bfloat16, generator=g)
        want = reference(a, b, sa, sb, bias)
        d = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
        assert worst_slice_error(d, want) < SLICE_TOLERANCE[torch.bfloat16] / 2  # bf16 rounding: <= 2^-8
    bad = d.clone()
    bad[500, 96:104] = 0
    assert rel_error(bad, want) < TOLERANCE[torch.bfloat16]
    assert worst_slice_error(bad, want) > SLICE_TOLERANCE[torch.bfloat16]


# What tests/test_scaled_mm_cuda.py holds every kernel to, on the CPU path (also the CUDA
# fallback's), where CI runs it.
def test_non_finite_codes_scales_and_bias_poison_their_rows_and_columns_only(seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = operands(9, 264, 512, "cpu", bias_dtype=torch.bfloat16, generator=g)
    a[2, 5] = float("nan")
    sa[6] = float("nan")
    b[7, 9] = float("nan")
    sb[100] = float("nan")
    bias[200] = float("nan")
    d = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
    bad = torch.zeros(9, 264, dtype=torch.bool)
    bad[[2, 6]] = True
    bad[:, [7, 100, 200]] = True
    assert torch.equal(torch.isnan(d), bad)
    assert rel_error(d[~bad], reference(a, b, sa, sb, bias)[~bad]) < CPU_TOLERANCE[torch.bfloat16]


def test_fp16_output_overflows_to_inf():
    """Past 65504 fp16 output is +-inf (the reference's cast, cuBLAS, torch.matmul), never saturated."""
    a = torch.full((3, 512), 448.0).to(F8)
    b = torch.full((6, 512), 0.25)
    b[::3] = 448.0
    b[1::3] = -448.0
    one = torch.ones(())
    d = fp8ext.scaled_mm(a, b.to(F8), one, one, out_dtype=torch.float16)
    assert (d[:, 0::3] == float("inf")).all() and (d[:, 1::3] == float("-inf")).all()
    assert (d[:, 2::3] == 57344).all()


@pytest.mark.parametrize("layout", ["offset", "expanded", "transposed", "strided_scales"])
def test_operand_and_scale_layouts_give_the_contiguous_result(layout, seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(7, 40, 96, "cpu", generator=g)
    want = fp8ext.scaled_mm(a, b, sa, sb)
    if layout == "offset":  # rows 112 bytes apart, starting 8 bytes into the buffer
        a2 = torch.empty(7, 112, dtype=F8)[:, 8:104]
        a2.copy_(a)
        b2 = b
    elif layout == "expanded":  # one row of A repeated: compared with that row copied
        a2, b2 = a[:1].expand(7, 96), b
        want = fp8ext.scaled_mm(a[:1].repeat(7, 1), b, sa, sb)
    elif layout == "transposed":
        a2, b2 = a.t().contiguous().t(), b.t().contiguous().t()
    else:
        a2, b2 = a, b
        sa, sb = torch.stack([sa, sa], 1)[:, 0], torch.stack([sb, sb], 1)[:, 1]  # stride 2 views
        assert sa.stride() == (2,)
    assert torch.equal(fp8ext.scaled_mm(a2, b2, sa, sb), want)
