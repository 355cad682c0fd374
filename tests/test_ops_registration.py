"""Every op: schema, fake implementation (opcheck) and torch.compile(fullgraph=True)."""
import pytest
import torch

import fp8ext
from fp8ext import ScalingState, quantize
from fp8ext.recipes import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, RowWise

F8 = torch.float8_e4m3fn


def op_cases(device):
    x = torch.randn(37, 300, device=device, dtype=torch.bfloat16)
    yield torch.ops.fp8ext.cast_to_fp8.default, (x, F8, True)
    yield torch.ops.fp8ext.quantize_with_scale.default, (x, torch.tensor(0.5, device=device), F8, 16)
    for name in ["quantize_per_tensor", "quantize_per_row", "quantize_per_group", "quantize_per_block"]:
        yield getattr(torch.ops.fp8ext, name).default, (x, F8, 0, False, 16)
    yield torch.ops.fp8ext.rms_norm_quantize_per_row.default, (
        x, torch.rand(300, device=device, dtype=torch.bfloat16) + 0.5, 1e-5, F8, 0, False, 16)
    yield torch.ops.fp8ext.add_rms_norm_quantize_per_row.default, (
        x, x.flip(0), torch.rand(300, device=device, dtype=torch.bfloat16) + 0.5, 1e-5, F8, 0, False, 16)
    # x with padded rows (row stride 310): h (x + residual) comes back row-major, as the fake says.
    yield torch.ops.fp8ext.add_rms_norm_quantize_per_row.default, (
        torch.randn(37, 310, device=device, dtype=torch.bfloat16)[:, :300], x,
        torch.rand(300, device=device, dtype=torch.bfloat16) + 0.5, 1e-5, F8, 0, False, 0)
    yield torch.ops.fp8ext.silu_mul_quantize_per_row.default, (x, F8, 0, False, 16)
    yield torch.ops.fp8ext.quantize_delayed.default, (
        x, torch.zeros(8, device=device), torch.ones((), device=device), F8, 0, False, True, 16)
    a = torch.randn(37, 64, device=device).to(F8)
    b = torch.randn(24, 64, device=device).to(F8)
    yield torch.ops.fp8ext.scaled_mm.default, (
        a, b, torch.rand(37, device=device), torch.tensor(0.5, device=device),
        torch.randn(24, device=device, dtype=torch.bfloat16), torch.bfloat16, 0)
    a = torch.randn(37, 300, device=device).to(F8)  # block-wise: 3 groups of K, 2 blocks of N
    b = torch.randn(136, 300, device=device).to(F8)
    yield torch.ops.fp8ext.scaled_mm_blockwise.default, (
        a, b, torch.rand(3, 40, device=device).t()[:37], torch.rand(2, 3, device=device),
        torch.randn(136, device=device, dtype=torch.bfloat16), torch.bfloat16, 0)
    # M = 0, N = 1 with a bias: D [0, 1] with row-major strides (the bias's broadcast gave (1, 0); helper-39).
    yield torch.ops.fp8ext.scaled_mm_blockwise.default, (
        a[:0], b[:1], torch.rand(0, 3, device=device), torch.rand(1, 3, device=device),
        torch.randn(1, device=device, dtype=torch.bfloat16), torch.bfloat16, 0)
    # Paged KV cache: pools [pages, page_size, H_kv, D]; a bf16 pool lets test_schema check the write's mutation.
    for cache_dtype in (torch.bfloat16, F8):
        k_cache = torch.zeros(6, 16, 2, 64, device=device, dtype=cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        k = torch.randn(5, 2, 64, device=device, dtype=torch.bfloat16)
        scale = torch.full((2,), 0.5, device=device)
        slots = torch.tensor([3, -1, 17, 40, 95], device=device)
        yield torch.ops.fp8ext.kv_cache_write.default, (k, k, k_cache, v_cache, slots, scale, scale)
        qkv = torch.randn(5, (8 + 2 * 2) * 64, device=device, dtype=torch.bfloat16)  # 8 q heads, 2 KV heads
        cos, sin = torch.randn(2, 5, 64, device=device, dtype=torch.bfloat16)
        yield torch.ops.fp8ext.kv_cache_write_rotary.default, (qkv, cos, sin, k_cache, v_cache, slots, scale, scale, 8)
        table = torch.tensor([[2, 0, 5], [1, 4, 0]], device=device, dtype=torch.int32)
        lens = torch.tensor([40, 9], device=device, dtype=torch.int32)
        q = torch.randn(2, 8, 64, device=device, dtype=torch.bfloat16)
        yield torch.ops.fp8ext.paged_decode_attention.default, (
            q, k_cache, v_cache, table, lens, scale, scale, 0.125, 2, 0, 0.0)


def test_an_input_left_on_the_meta_device_is_refused_by_name():
    """Meta outranks CPU and CUDA in dispatch, so a call with one meta tensor among
    real ones reaches the fake kernel; it must refuse it (the real ops require one
    device) instead of returning uninitialised memory. Every op, every tensor
    argument in turn."""
    checked = 0
    for op, args in op_cases("cpu"):
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor) or i == 0:
                continue
            bad = list(args)
            bad[i] = arg.to("meta")
            with pytest.raises(ValueError, match=r"must be on .*'s device cpu, got meta"):
                op(*bad)
            checked += 1
    assert checked >= 30


def _opcheck(device):
    for op, args in op_cases(device):
        # test_aot_dispatch_dynamic is skipped: FP8 outputs have no autograd formula to check.
        # test_schema can't take FP8 *inputs* (its mutation check multiplies them: "not
        # implemented for Float8_e4m3fn"); the schema of such ops declares no mutation.
        fp8_inputs = any(isinstance(a, torch.Tensor) and a.dtype in (F8, torch.float8_e5m2) for a in args)
        utils = ("test_faketensor", "test_autograd_registration") + (() if fp8_inputs else ("test_schema",))
        torch.library.opcheck(op, args, test_utils=utils)


def test_opcheck_cpu():
    _opcheck("cpu")


@pytest.mark.gpu
def test_opcheck_cuda():
    _opcheck("cuda")


RECIPES = [CurrentScaling(), RowWise(), BlockWise(), DelayedScaling(amax_history_len=4), PerTensorStatic()]


def _compile_matches_eager(device):
    for recipe in RECIPES:
        torch._dynamo.reset()  # each recipe is a fresh compile, not a recompile of the last
        x = torch.randn(2, 9, 200, device=device, dtype=torch.bfloat16)
        s_eager = ScalingState.create(recipe, device=device) if recipe.activation_mode != "static" else \
            ScalingState.from_scale(0.01, device=device)
        s_comp = ScalingState(s_eager.amax_history.clone(), s_eager.scale.clone())

        def f(t, state):
            return quantize(t, recipe, state=state, pad_k_to=16)

        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        for _ in range(2):  # twice: delayed state must advance identically
            q_e, s_e = f(x, s_eager)
            q_c, s_c = compiled(x, s_comp)
            assert torch.equal(q_e.view(torch.uint8), q_c.view(torch.uint8)), recipe
            assert torch.equal(s_e, s_c)
        assert torch.equal(s_eager.amax_history, s_comp.amax_history)
        assert torch.equal(s_eager.scale, s_comp.scale)


def test_compile_fullgraph_cpu():
    _compile_matches_eager("cpu")


@pytest.mark.gpu
def test_compile_fullgraph_cuda():
    _compile_matches_eager("cuda")


def test_capabilities_query():
    archs = torch.ops.fp8ext.cuda_archs()
    assert isinstance(archs, str)
    info = fp8ext.info()
    assert info["formats"]["e4m3"]["max"] == 448.0 and "BlockWise" in info["recipes"]
