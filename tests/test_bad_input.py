"""Bad input: each case raises a Python exception naming the argument."""
import pytest
import torch

from fp8ext import ScalingState, dequantize, quantize
from fp8ext.recipes import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, RowWise

F8 = torch.float8_e4m3fn


@pytest.mark.parametrize("x, exc, match", [
    (torch.ones(4, 4, dtype=torch.int32), TypeError, "x must be float32"),
    (torch.ones(4, 4, dtype=torch.float64), TypeError, "x must be float32"),
    ([1.0, 2.0], TypeError, "x must be a torch.Tensor"),
    (torch.tensor(1.0), ValueError, "x must have at least one dimension"),
])
def test_activation_input_errors(x, exc, match):
    with pytest.raises(exc, match=match):
        quantize(x, CurrentScaling())


def test_weight_must_be_2d():
    with pytest.raises(ValueError, match="x must be a 2-D"):
        quantize(torch.ones(2, 3, 4), RowWise(), role="weight")


def test_recipe_role_pad_errors():
    x = torch.ones(2, 8)
    with pytest.raises(TypeError, match="recipe"):
        quantize(x, "rowwise")
    with pytest.raises(ValueError, match="role"):
        quantize(x, RowWise(), role="bias")
    for bad in [0, -16, 1.5, True]:
        with pytest.raises(ValueError, match="pad_k_to"):
            quantize(x, RowWise(), pad_k_to=bad)


def test_state_required_and_checked():
    x = torch.ones(2, 8)
    for r in [DelayedScaling(), PerTensorStatic()]:
        with pytest.raises(ValueError, match="state is required"):
            quantize(x, r)
        with pytest.raises(TypeError, match="state must be"):
            quantize(x, r, state=torch.ones(()))


def test_scaling_state_validation():
    with pytest.raises(ValueError, match="amax_history"):
        ScalingState(torch.zeros(0), torch.ones(()))
    with pytest.raises(ValueError, match="amax_history"):
        ScalingState(torch.zeros(3, dtype=torch.float16), torch.ones(()))
    with pytest.raises(ValueError, match="scale"):
        ScalingState(torch.zeros(3), torch.ones(2))
    with pytest.raises(TypeError):
        ScalingState([0.0], 1.0)


def test_op_level_errors_name_arguments():
    x = torch.ones(4, 8)
    with pytest.raises(ValueError, match="x must be 2-D"):
        torch.ops.fp8ext.quantize_per_row(torch.ones(2, 3, 4), F8, 0, False, 0)
    with pytest.raises(TypeError, match="dtype must be torch.float8"):
        torch.ops.fp8ext.quantize_per_row(x, torch.float16, 0, False, 0)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        torch.ops.fp8ext.quantize_per_row(torch.ones(8, 4).t(), F8, 0, False, 0)
    with pytest.raises(ValueError, match="margin"):
        torch.ops.fp8ext.quantize_per_row(x, F8, 100, False, 0)
    with pytest.raises(ValueError, match="pad_k_to"):
        torch.ops.fp8ext.quantize_per_row(x, F8, 0, False, -1)
    with pytest.raises(ValueError, match="scale must hold one value"):
        torch.ops.fp8ext.quantize_with_scale(x, torch.ones(2), F8, 0)
    with pytest.raises(TypeError, match="scale must be float32"):
        torch.ops.fp8ext.quantize_with_scale(x, torch.ones((), dtype=torch.float64), F8, 0)
    with pytest.raises(ValueError, match="amax_history"):
        torch.ops.fp8ext.quantize_delayed(x, torch.zeros(2, 2), torch.ones(()), F8, 0, False, True, 0)


def test_dequantize_errors():
    q, s = quantize(torch.ones(4, 200), BlockWise())
    with pytest.raises(ValueError, match="granularity is required"):
        dequantize(q, s)
    with pytest.raises(ValueError, match="block scale must have shape"):
        dequantize(q, s, "block")
    with pytest.raises(ValueError, match="granularity must be one of"):
        dequantize(q, s, "rows")
    with pytest.raises(TypeError, match="q must be"):
        dequantize(torch.ones(2, 2), s)
    with pytest.raises(TypeError, match="scale must be a float32"):
        dequantize(q, s.double(), "group")
    with pytest.raises(ValueError, match="cols"):
        dequantize(q, s, "group", cols=500)
    q, s = quantize(torch.ones(4, 8), RowWise())
    with pytest.raises(ValueError, match="per_row scale"):
        dequantize(q, s[:2])


def test_shapes_not_multiple_of_16_or_128_are_padded_not_refused():
    for r in [CurrentScaling(), RowWise(), BlockWise()]:
        q, s = quantize(torch.randn(7, 1710), r, pad_k_to=16)
        assert q.shape == (7, 1712)
        q, s = quantize(torch.randn(1000, 4095), r, role="weight", pad_k_to=16)
        assert q.shape == (1000, 4096)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), torch.tensor(0.0)])
def test_static_scale_must_be_finite_and_positive(scale):
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        ScalingState.from_scale(scale)


def test_static_scale_holds_one_value():
    with pytest.raises(ValueError, match="scale must hold one value"):
        ScalingState.from_scale(torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("recipe", [CurrentScaling(), RowWise(), BlockWise()], ids=["tensor", "row", "block"])
def test_rows_expanded_with_stride_0_are_taken(recipe, seed):
    # nn.Linear takes a broadcast input; so must the quantizers (and FP8Linear): copied, not refused.
    from fp8ext import formats
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(1, 200, generator=g)
    expanded, copied = row.expand(3, 200), row.expand(3, 200).contiguous()
    for a, b in zip(quantize(expanded, recipe), quantize(copied, recipe)):
        assert torch.equal(a.view(torch.uint8) if a.dtype == F8 else a, b.view(torch.uint8) if b.dtype == F8 else b)
    qw, _ = quantize(expanded, recipe, role="weight")
    assert torch.equal(qw.view(torch.uint8), quantize(copied, recipe, role="weight")[0].view(torch.uint8))
    assert torch.equal(formats.cast(expanded).view(torch.uint8), formats.cast(copied).view(torch.uint8))


def test_small_api_arguments_are_checked_by_name():
    from fp8ext import PagedKVCache, capacity_tokens
    from fp8ext.kv_cache import plan_splits
    from fp8ext.quantize import silu_mul_quantize
    with pytest.raises(ValueError, match="q must have at least one dimension"):
        dequantize(torch.tensor(1.0).to(F8), torch.tensor(1.0))
    q, s = silu_mul_quantize(torch.randn(4, 0), RowWise())  # I = 0: an empty output, not an unpack error
    assert q.shape == (4, 0) and s.shape == (4,)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="history_len must be a positive int"):
            ScalingState.create(history_len=bad)
    with pytest.raises(TypeError, match="power_of_two_scales must be a bool"):
        CurrentScaling(power_of_two_scales="yes")
    with pytest.raises(ValueError, match="amax_history_len must be a positive int"):
        DelayedScaling(amax_history_len=True)
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="max_pages_per_seq must be a positive int"):
            PagedKVCache(1, 2, 64, 8, 16, torch.bfloat16, max_pages_per_seq=bad)
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        capacity_tokens(1 << 30, 32, 8, 128, torch.bfloat16, page_size=0)
    with pytest.raises(ValueError, match="num_sms must be a positive int"):
        plan_splits(1, 8, 4096, num_sms=0)
    with pytest.raises(TypeError, match=r"scales\[0\]\['k_scale'\] must be a float"):
        PagedKVCache(1, 2, 64, 8, 16, torch.bfloat16, scales=[{"k_scale": "a", "v_scale": 1.0}])
