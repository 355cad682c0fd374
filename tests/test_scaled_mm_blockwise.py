"""fp8ext.scaled_mm with block-wise scales on the CPU (the reference path):
numerics against float64, which scale shapes select it, argument errors, the
outlier advantage over per-tensor scaling, torch.compile (opcheck: test_ops_registration.py). The CUDA
kernels are tested in test_scaled_mm_blockwise_cuda.py."""
import pytest
import torch

import fp8ext
from fp8ext.ops.gemm_reference import is_blockwise
from gemm_cases import (CPU_TOLERANCE, F8, block_operands, block_reference, compiled_matches_eager, last_group_errors,
                        operands, outlier_errors, reference, rel_error)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (33, 200, 300), (5, 130, 129), (64, 256, 512)])
@pytest.mark.parametrize("m_major", [True, False])
def test_reference_matches_float64(m, n, k, out_dtype, m_major, seed):
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, bias = block_operands(m, n, k, "cpu", out_dtype, g, m_major)
    d = fp8ext.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias)
    assert d.dtype == out_dtype and d.shape == (m, n)
    assert rel_error(d, block_reference(a, b, sa, sb, bias)) < CPU_TOLERANCE[out_dtype]


def test_a_wrong_block_scale_shows(seed):
    """The check can fail: one block's scale off by 1% is seen. How much it moves the
    whole output depends on that block's share of it (random scales: 0.07% for one
    seed), so it is judged against the error of the right scales, ~1e-7 in fp32."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = block_operands(16, 256, 256, "cpu", generator=g)
    wrong = sb.clone()
    wrong[1, 0] *= 1.01
    want = block_reference(a, b, sa, sb, None)
    right_error = rel_error(fp8ext.scaled_mm(a, b, sa, sb, out_dtype=torch.float32), want)
    wrong_error = rel_error(fp8ext.scaled_mm(a, b, sa, wrong, out_dtype=torch.float32), want)
    assert wrong_error > 100 * max(right_error, 1e-7), (wrong_error, right_error)


def test_which_scale_shapes_are_block_wise():
    a, b = torch.zeros(5, 260, dtype=F8), torch.zeros(300, 260, dtype=F8)
    groups = torch.ones(5, 3)
    assert is_blockwise(a, b, groups, torch.ones(3, 3))
    assert not is_blockwise(a, b, torch.ones(5), torch.ones(300))       # per-channel
    assert not is_blockwise(a, b, torch.ones(5), torch.ones(300, 1))    # per-channel, 2-D
    assert not is_blockwise(a, b, torch.ones(()), torch.ones(()))       # per-tensor
    small = torch.zeros(100, 100, dtype=F8)
    assert not is_blockwise(small, small, torch.ones(100, 1), torch.ones(1, 1))  # one block = per-tensor
    # [1, N] with N = ceil(K/128) <= 128: per-channel unless a has group scales
    a, b = torch.zeros(5, 2048, dtype=F8), torch.zeros(16, 2048, dtype=F8)
    assert not is_blockwise(a, b, torch.ones(5), torch.ones(1, 16))
    assert is_blockwise(a, b, torch.ones(5, 16), torch.ones(1, 16))


def test_per_channel_row_that_looks_like_blocks_stays_per_channel(seed):
    """N = 16, K = 2048: a per-channel scale_b [1, 16] has the block shape too."""
    g = torch.Generator().manual_seed(seed)
    a, b, sa, sb, _ = operands(5, 16, 2048, "cpu", generator=g)
    d = fp8ext.scaled_mm(a, b, sa, sb.reshape(1, 16), out_dtype=torch.float32)
    assert rel_error(d, reference(a, b, sa, sb, None)) < CPU_TOLERANCE[torch.float32]


def test_k0_and_n0_through_scaled_mm():
    bias = torch.randn(16, dtype=torch.bfloat16)
    d = fp8ext.scaled_mm(torch.empty(3, 0, dtype=F8), torch.empty(16, 0, dtype=F8), torch.ones(3, 0),
                         torch.ones(1, 0), bias=bias)
    assert torch.equal(d, bias.expand(3, 16))
    d = fp8ext.scaled_mm(torch.randn(3, 300).to(F8), torch.empty(0, 300, dtype=F8), torch.ones(3, 3),
                         torch.ones(0, 3))
    assert d.shape == (3, 0)


def test_partial_last_group_alone(seed):
    whole, last_block = last_group_errors("cpu", seed)
    assert whole < CPU_TOLERANCE[torch.float32] and last_block < CPU_TOLERANCE[torch.float32], (whole, last_block)


def test_block_scales_beat_per_tensor_on_outliers(seed):
    """Planted outlier tokens and channels: per-tensor scales flush the other values
    to zero, block-wise scales keep them (the outputs the outliers do not touch)."""
    errors = outlier_errors(64, 384, 512, "cpu", seed)
    assert errors["block"] < 0.06 and errors["tensor"] > 10 * errors["block"], errors


def _args():
    a, b, sa, sb, bias = block_operands(4, 200, 256, "cpu", torch.bfloat16)
    return dict(a=a, b=b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16)


@pytest.mark.parametrize("change,error,match", [
    (dict(a=torch.zeros(4, 256, dtype=torch.float8_e5m2)), TypeError, "float8_e4m3fn for the block-wise"),
    (dict(scale_a=torch.ones(4, 3)), ValueError, r"scale_a must be one value per 1x128 group of a: \[4, 2\]"),
    (dict(scale_a=torch.ones(4)), ValueError, "scale_a must be one value per 1x128 group"),
    (dict(scale_a=torch.ones(4, 2, dtype=torch.float64)), TypeError, "scale_a must be float32"),
    (dict(bias=torch.zeros(200)), TypeError, "bias must have out_dtype"),
    (dict(bias=torch.zeros(7, dtype=torch.bfloat16)), ValueError, r"bias must be \[N\] = \[200\]"),
    (dict(out_dtype=torch.int32), TypeError, "out_dtype must be"),
])
def test_bad_arguments_raise_clear_errors(change, error, match):
    args = _args()
    args.update(change)
    with pytest.raises(error, match=match):
        fp8ext.scaled_mm(**args)


def test_bad_config_name():
    with pytest.raises(ValueError, match="config must be one of"):
        fp8ext.scaled_mm(**_args(), config="swap_small")


@pytest.mark.parametrize("config", ["block_medium", "block_swap_small"])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_bf16_only_configs_are_refused_on_the_cpu_too(config, out_dtype):
    """As the CUDA op (has_config in blockwise_mm_dispatch.cu) refuses them (helper-35)."""
    args = _args()
    args.update(out_dtype=out_dtype, bias=None)
    with pytest.raises(ValueError, match=f"config {config} is not instantiated"):
        fp8ext.scaled_mm(**args, config=config)
    assert fp8ext.scaled_mm(**args, config="block_large").dtype == out_dtype


def test_compile_fullgraph(seed):
    assert compiled_matches_eager(9, 136, 200, "cpu", seed)


@pytest.mark.parametrize("m,n,k", [(0, 1, 200), (0, 1, 0), (0, 5, 130), (3, 1, 200)])
def test_output_strides_are_row_major_like_the_fakes(m, n, k):
    """Empty outputs included: with a bias, [0, 1] came back with strides (1, 0) (the
    bias's broadcast) where the CUDA op and the fake give (1, 1) (helper-39)."""
    a, b, sa, sb, bias = block_operands(m, n, k, "cpu", bias_dtype=torch.bfloat16)
    d = fp8ext.scaled_mm(a, b, sa, sb, bias=bias)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.fp8ext.scaled_mm_blockwise(*(mode.from_tensor(t) for t in (a, b, sa, sb, bias)),
                                                    torch.bfloat16, 0)
    assert d.shape == (m, n) and d.stride() == torch.empty(m, n).stride() == fake.stride()
