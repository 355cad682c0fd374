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
    with pytest.raises(TypeError, match="must be torch.Tensors"):
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
    for bad in (True, 2.5, "4"):
        with pytest.raises(TypeError, match="cols must be an int or None"):
            dequantize(q, s, cols=bad)
    with pytest.raises(ValueError, match="scale must be on q's device \\(cpu\\), got meta"):
        dequantize(q, s.to("meta"))  # (torch's own error named neither argument: helper-60)


def test_dequantize_reads_other_libraries_scale_shapes():
    """vLLM's per-tensor [1] (and [1, 1]) and compressed-tensors' per-channel [N, 1]."""
    x = torch.randn(6, 40)
    q, s = quantize(x, CurrentScaling())
    want = dequantize(q, s)
    assert torch.equal(dequantize(q, s.reshape(1)), want) and torch.equal(dequantize(q, s.reshape(1, 1)), want)
    q, s = quantize(x, RowWise())
    want = dequantize(q, s)
    assert torch.equal(dequantize(q, s.reshape(6, 1)), want)
    assert torch.equal(dequantize(q, s.reshape(6, 1), "per_row"), want)
    with pytest.raises(ValueError, match="granularity is required"):  # also a block scale's shape
        dequantize(q, s.reshape(1, 6))
    with pytest.raises(ValueError, match=r"per_row scale must have shape \(6,\) \(or \[6, 1\]\)"):
        dequantize(q, s.reshape(1, 6), "per_row")


@pytest.mark.parametrize("recipe", [RowWise(), BlockWise(), CurrentScaling()], ids=lambda r: type(r).__name__)
def test_dequantize_takes_what_quantize_gives_for_zero_columns(recipe):
    """K = 0 is a valid (empty) quantize; dequantize gives the [M, 0] back (it
    reshaped with -1, which torch refuses for 0 elements), as does cols=0 where
    the scales do not depend on K (group scales hold one column per 128 of it)."""
    q, s = quantize(torch.randn(3, 0), recipe)
    g = {"RowWise": "per_row", "BlockWise": "group", "CurrentScaling": "per_tensor"}[type(recipe).__name__]
    assert dequantize(q, s, g).shape == (3, 0)
    if g != "group":
        q, s = quantize(torch.randn(3, 40), recipe)
        assert dequantize(q, s, g, cols=0).shape == (3, 0)


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
    # A float32 copy would drop a complex scale's imaginary part with a warning and take True as 1.0.
    for bad in (torch.tensor(2.0 + 1.0j), torch.tensor(True)):
        with pytest.raises(TypeError, match="scale must be a real number or a real tensor, got a torch"):
            ScalingState.from_scale(bad)


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


# ---- review helper-22 (session 41): each case below was accepted or crashed before ----

def test_a_scaling_state_scale_on_the_host_must_be_finite_and_positive():
    # A zero scale turned finite zeros into NaN (0/0) on the next static or delayed call.
    for bad in (0.0, -0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scale must be finite and > 0"):
            ScalingState(torch.zeros(4), torch.tensor(bad))


def test_scaling_state_factories_check_their_arguments():
    for bad in ("0.5", None, True):
        with pytest.raises(TypeError, match="scale must be a float or a tensor"):
            ScalingState.from_scale(bad)
    with pytest.raises(TypeError, match="recipe must be a fp8ext.recipes.Recipe"):
        ScalingState.create("x")
    st = ScalingState.from_scale(0.5, device="meta")  # checked on the host, placed on meta
    assert st.scale.device.type == "meta"


def test_delayed_state_history_must_match_the_recipe():
    # A longer history would keep an old large amax past the recipe's window.
    with pytest.raises(ValueError, match="amax_history holds 1024 values but the recipe's amax_history_len is 2"):
        quantize(torch.ones(2, 8), DelayedScaling(amax_history_len=2), state=ScalingState.create(history_len=1024))


def test_inputs_that_require_grad_are_refused_while_grad_is_on():
    from fp8ext import scaled_mm
    x = torch.randn(4, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="fp8ext.quantize has no backward"):
        quantize(x, RowWise())
    with torch.no_grad():
        quantize(x, RowWise())
    a = torch.ones(2, 16).to(F8)
    with pytest.raises(RuntimeError, match="fp8ext.scaled_mm has no backward"):
        scaled_mm(a, a, torch.ones((), requires_grad=True), torch.ones(()))


def test_pad_k_to_is_bounded():
    # 2**63 - 1 rounded K up past int64 to 0 columns, and the kernel wrote past its buffer (a segfault).
    with pytest.raises(ValueError, match="pad_k_to must be at most"):
        quantize(torch.randn(3, 20), CurrentScaling(), pad_k_to=2**63 - 1)
    with pytest.raises(ValueError, match="pad_k_to must be in"):
        torch.ops.fp8ext.quantize_per_tensor(torch.randn(3, 20), F8, 0, False, 2**62)


def test_non_bool_flags_are_refused():
    from fp8ext import formats, scaled_mm
    with pytest.raises(TypeError, match="saturate must be a bool"):
        formats.cast(torch.tensor([1.0, 500.0]), saturate=None)  # was [1, nan]
    a = torch.ones(2, 16).to(F8)
    one = torch.ones(())
    with pytest.raises(TypeError, match="use_fast_accum must be a bool"):
        scaled_mm(a, a, one, one, use_fast_accum="no")
    with pytest.raises(TypeError, match="out_dtype must be a torch.dtype"):
        scaled_mm(a, a, one, one, out_dtype=5)  # was read as a dtype code (float16)
    with pytest.raises(TypeError, match="out_dtype must be a torch.dtype"):
        scaled_mm(a, a, one, one, out_dtype="bfloat16")
    with pytest.raises(TypeError, match="config must be a str"):
        scaled_mm(a, a, one, one, config=[1])


def test_block_scale_errors_name_the_scale_that_does_not_fit():
    from fp8ext import scaled_mm
    m, n, k = 5, 300, 300
    a, b = torch.ones(m, k).to(F8), torch.ones(n, k).to(F8)
    group_a = torch.ones(m, 3)
    with pytest.raises(ValueError, match=r"scale_b must be one value per 128x128 block of b: \[3, 3\]"):
        scaled_mm(a, b, group_a, torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"scale_b must be one value per 128x128 block of b: \[3, 3\]"):
        scaled_mm(a, b, group_a, torch.ones(n))


def test_meta_tensors_get_the_real_ops_checks():
    from fp8ext import scaled_mm
    a = torch.empty(4, 32, dtype=F8, device="meta")
    one = torch.ones((), device="meta")
    with pytest.raises(ValueError, match="a and b must share K"):
        scaled_mm(a, torch.empty(8, 48, dtype=F8, device="meta"), one, one)
    with pytest.raises(ValueError, match="scale_a must hold one value"):
        scaled_mm(a, torch.empty(8, 32, dtype=F8, device="meta"), torch.ones(5, device="meta"), one)
    with pytest.raises(TypeError, match="out_dtype must be bfloat16"):
        scaled_mm(a, torch.empty(8, 32, dtype=F8, device="meta"), one, one, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="scale_a must be one value per 1x128 group"):
        scaled_mm(torch.empty(4, 300, dtype=F8, device="meta"), torch.empty(300, 300, dtype=F8, device="meta"),
                  torch.ones(4, 2, device="meta"), torch.ones(3, 3, device="meta"))


def test_a_nan_in_a_user_written_history_is_skipped_as_the_kernels_skip_it():
    from fp8ext.ops import reference
    x = torch.full((2, 8), 2.0)
    native_hist, ref_hist = torch.tensor([float("nan"), 7.0, 1.0]), torch.tensor([float("nan"), 7.0, 1.0])
    native_scale, ref_scale = torch.ones(()), torch.ones(())
    torch.ops.fp8ext.quantize_delayed(x, native_hist, native_scale, F8, 0, False, True, 0)
    reference.quantize_delayed(x, ref_hist, ref_scale, F8, 0, False, True, 0)
    # History after the roll: [2, nan, 7]: its max skipping NaN is 7 (the reference's max gave NaN, so scale 1).
    assert native_scale.item() == ref_scale.item() == pytest.approx(7.0 / 448)


def test_delayed_state_tensors_must_not_overlap():
    # A scale inside the history (or either inside x) was read and written in an order that assumes them apart.
    x = torch.full((2, 8), 2.0)
    h = torch.zeros(4)
    with pytest.raises(ValueError, match="amax_history and scale must not overlap"):
        torch.ops.fp8ext.quantize_delayed(x, h, h[0], F8, 0, False, True, 0)
    buf = torch.ones(20)
    with pytest.raises(ValueError, match="x and amax_history must not overlap"):
        torch.ops.fp8ext.quantize_delayed(buf[:16].view(2, 8), buf[12:16], torch.ones(()), F8, 0, False, True, 0)


def test_from_scale_checks_the_float32_value_and_takes_array_likes():
    # 1e39 and 1e-46 pass as float64 but are inf and 0 in float32: checked after the conversion.
    for bad in (1e39, 1e-46, torch.tensor(1e-50, dtype=torch.float64)):
        with pytest.raises(ValueError, match="scale must be finite and > 0"):
            ScalingState.from_scale(bad, device="meta")
    assert float(ScalingState.from_scale([0.5]).scale) == 0.5
    np = pytest.importorskip("numpy")
    assert float(ScalingState.from_scale(np.array(0.25)).scale) == 0.25


def test_a_row_strided_x_overlapping_the_history_is_refused():
    # get_overlap_status gives up on a strided x: the byte spans are compared instead.
    big = torch.randn(8, 64)
    with pytest.raises(ValueError, match="x and amax_history must not overlap"):
        torch.ops.fp8ext.quantize_delayed(big[:, :32], big.view(-1)[40:44], torch.ones(()), F8, 0, False, True, 0)
    torch.ops.fp8ext.quantize_delayed(big[:, :32], torch.zeros(4), torch.ones(()), F8, 0, False, True, 0)


def test_gemm_fakes_skip_their_checks_for_data_dependent_rows():
    # Rows picked by a mask (MoE routing) have a size compile cannot decide: the fake must not guard on it.
    from fp8ext import scaled_mm
    w = torch.randn(256, 128).to(F8)
    sw = torch.ones(256)

    def f(x, mask):
        xs = x[mask.nonzero().squeeze(1)]
        q, s = torch.ops.fp8ext.quantize_per_row(xs, F8, 0, False, 0)
        return scaled_mm(q, w, s, sw)

    import torch._dynamo.config as dynamo_config
    x, mask = torch.randn(9, 128), torch.tensor([1, 0, 1, 1, 0, 1, 0, 0, 1], dtype=torch.bool)
    with dynamo_config.patch(capture_dynamic_output_shape_ops=True):
        torch._dynamo.reset()
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x, mask)
    assert out.shape == (5, 256) and torch.equal(out, f(x, mask))
