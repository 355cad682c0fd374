"""The fakes of the quantize, fused and KV-cache ops refuse a bad argument as
the real ops do: each case below is one bad argument, run through the CPU op
and, with every tensor on the meta device (same shapes, strides and dtypes),
through the fake; both must raise the same exception type, naming the same
argument. Checks that read values (scale values, slots, page ids) are the real
op's alone and are not among the cases."""
import re

import pytest
import torch

import fp8ext  # noqa: F401  (registers the ops)
from fp8ext.ops import cuda_fallback

F8 = torch.float8_e4m3fn
ops = torch.ops.fp8ext


def to_meta(arg):
    if isinstance(arg, torch.Tensor):
        return torch.empty_strided(arg.shape, arg.stride(), dtype=arg.dtype, device="meta")
    return arg


def x_of(m=6, k=256, dtype=torch.bfloat16):
    return torch.randn(m, k, dtype=dtype)


def quantize_cases():
    x = x_of()
    bad_x = {
        "1-D": x[0],
        "3-D": x.reshape(2, 3, 256),
        "int32": torch.ones(6, 256, dtype=torch.int32),
        "float64": x.double(),
        "column-major": x_of(256, 6).t(),
        "overlapping rows": x.reshape(-1).as_strided((6, 256), (100, 1)),
    }
    for name in ("quantize_per_tensor", "quantize_per_row", "quantize_per_group", "quantize_per_block"):
        op = getattr(ops, name)
        for what, bx in bad_x.items():
            yield f"{name}: x {what}", op, (bx, F8, 0, False, 16), "x"
        yield f"{name}: dtype bf16", op, (x, torch.bfloat16, 0, False, 16), "dtype"
        yield f"{name}: margin 65", op, (x, F8, 65, False, 16), "margin"
        yield f"{name}: pad_k_to -1", op, (x, F8, 0, False, -1), "pad_k_to"
        yield f"{name}: pad_k_to 2^21", op, (x, F8, 0, False, 1 << 21), "pad_k_to"
    for what, bx in bad_x.items():
        yield f"cast_to_fp8: x {what}", ops.cast_to_fp8, (bx, F8, True), "x"
    yield "cast_to_fp8: dtype fp16", ops.cast_to_fp8, (x, torch.float16, True), "dtype"
    one = torch.tensor(0.5)
    yield "quantize_with_scale: x 3-D", ops.quantize_with_scale, (bad_x["3-D"], one, F8, 0), "x"
    yield "quantize_with_scale: scale float64", ops.quantize_with_scale, (x, one.double(), F8, 0), "scale"
    yield "quantize_with_scale: scale [2]", ops.quantize_with_scale, (x, torch.ones(2), F8, 0), "scale"
    yield "quantize_with_scale: dtype", ops.quantize_with_scale, (x, one, torch.int8, 0), "dtype"
    yield "quantize_with_scale: pad_k_to", ops.quantize_with_scale, (x, one, F8, -2), "pad_k_to"
    hist = torch.zeros(8)
    yield "quantize_delayed: history float64", ops.quantize_delayed, (
        x, hist.double(), one.clone(), F8, 0, False, True, 0), "amax_history"
    yield "quantize_delayed: history 2-D", ops.quantize_delayed, (
        x, torch.zeros(2, 4), one.clone(), F8, 0, False, True, 0), "amax_history"
    yield "quantize_delayed: history empty", ops.quantize_delayed, (
        x, torch.zeros(0), one.clone(), F8, 0, False, True, 0), "amax_history"
    yield "quantize_delayed: history strided", ops.quantize_delayed, (
        x, torch.zeros(16)[::2], one.clone(), F8, 0, False, True, 0), "amax_history"
    yield "quantize_delayed: scale [3]", ops.quantize_delayed, (
        x, hist, torch.ones(3), F8, 0, False, True, 0), "scale"
    yield "quantize_delayed: margin", ops.quantize_delayed, (x, hist, one.clone(), F8, -65, False, True, 0), "margin"
    yield "quantize_delayed: x float64", ops.quantize_delayed, (
        x.double(), hist, one.clone(), F8, 0, False, True, 0), "x"


def fused_cases():
    x = x_of()
    w = torch.rand(256, dtype=torch.bfloat16) + 0.5
    rms = ops.rms_norm_quantize_per_row
    yield "rms: weight length", rms, (x, w[:100], 1e-5, F8, 0, False, 0), "weight"
    yield "rms: weight 2-D", rms, (x, w.reshape(2, 128), 1e-5, F8, 0, False, 0), "weight"
    yield "rms: weight strided", rms, (x, torch.rand(512, dtype=torch.bfloat16)[::2], 1e-5, F8, 0, False, 0), "weight"
    yield "rms: weight dtype", rms, (x, w.float(), 1e-5, F8, 0, False, 0), "weight"
    yield "rms: eps < 0", rms, (x, w, -1.0, F8, 0, False, 0), "eps"
    yield "rms: eps nan", rms, (x, w, float("nan"), F8, 0, False, 0), "eps"
    overlapping = torch.randn(1, 256, dtype=torch.bfloat16).expand(6, 256)
    yield "rms: x overlapping rows", rms, (overlapping, w, 1e-5, F8, 0, False, 0), "x"
    yield "add: x overlapping rows", ops.add_rms_norm_quantize_per_row, (
        overlapping, x.clone(), w, 1e-5, F8, 0, False, 0), "x"
    yield "silu: x overlapping rows", ops.silu_mul_quantize_per_row, (overlapping, F8, 0, False, 0), "x"
    yield "rms: x column-major", rms, (x_of(256, 256).t(), w, 1e-5, F8, 0, False, 0), "x"
    # x's rank and dtype first (the CPU compositions computed first: IndexError, NotImplementedError; helper-60)
    yield "rms: x int32", rms, (torch.ones(6, 256, dtype=torch.int32), w, 1e-5, F8, 0, False, 0), "x"
    yield "rms: x 0-d", rms, (torch.ones((), dtype=torch.bfloat16), w, 1e-5, F8, 0, False, 0), "x"
    yield "add: x 0-d", ops.add_rms_norm_quantize_per_row, (
        torch.ones((), dtype=torch.bfloat16), torch.ones((), dtype=torch.bfloat16), w, 1e-5, F8, 0, False, 0), "x"
    yield "silu: x bool", ops.silu_mul_quantize_per_row, (torch.ones(6, 256, dtype=torch.bool), F8, 0, False, 0), "x"
    yield "silu: x fp8", ops.silu_mul_quantize_per_row, (x.to(F8), F8, 0, False, 0), "x"
    yield "rms: dtype", rms, (x, w, 1e-5, torch.float16, 0, False, 0), "dtype"
    yield "rms: margin", rms, (x, w, 1e-5, F8, 100, False, 0), "margin"
    yield "rms: pad_k_to", rms, (x, w, 1e-5, F8, 0, False, -3), "pad_k_to"
    add = ops.add_rms_norm_quantize_per_row
    yield "add: residual shape", add, (x, x[:5], w, 1e-5, F8, 0, False, 0), "residual"
    yield "add: residual dtype", add, (x, x.half(), w, 1e-5, F8, 0, False, 0), "residual"
    yield "add: weight length", add, (x, x.clone(), w[:8], 1e-5, F8, 0, False, 0), "weight"
    yield "add: x column-major", add, (x_of(256, 6).t(), x_of(256, 6).t(), w[:6], 1e-5, F8, 0, False, 0), "x"
    yield "add: pad_k_to", add, (x, x.clone(), w, 1e-5, F8, 0, False, 1 << 22), "pad_k_to"
    silu = ops.silu_mul_quantize_per_row
    yield "silu: odd columns", silu, (x_of(6, 255), F8, 0, False, 0), "x"
    yield "silu: x 3-D", silu, (x.reshape(2, 3, 256), F8, 0, False, 0), "x"
    yield "silu: dtype", silu, (x, torch.float32, 0, False, 0), "dtype"
    yield "silu: margin", silu, (x, F8, 65, False, 0), "margin"


def cache(pages=4, page_size=16, heads=2, dim=64, dtype=F8):
    return torch.zeros(pages, page_size, heads, dim, dtype=dtype), torch.zeros(pages, page_size, heads, dim, dtype=dtype)


def kv_cases():
    kc, vc = cache()
    k = torch.randn(3, 2, 64, dtype=torch.bfloat16)
    slots = torch.tensor([0, 5, 17])
    s = torch.ones(())
    w = ops.kv_cache_write
    yield "write: k_cache 3-D", w, (k, k, kc[0], vc[0], slots, s, s), "k_cache"
    yield "write: v_cache shape", w, (k, k, kc, vc[:2], slots, s, s), "v_cache"
    yield "write: cache int8", w, (k, k, *cache(dtype=torch.int8), slots, s, s), "k_cache"
    yield "write: cache strided", w, (k, k, kc.transpose(0, 1), vc.transpose(0, 1), slots, s, s), "contiguous"
    yield "write: k heads", w, (k[:, :1], k[:, :1], kc, vc, slots, s, s), "k"
    yield "write: v shape", w, (k, k[:2], kc, vc, slots, s, s), "v"
    yield "write: k int", w, (k.int(), k.int(), kc, vc, slots, s, s), "k"
    yield "write: slot_mapping float", w, (k, k, kc, vc, slots.float(), s, s), "slot_mapping"
    yield "write: slot_mapping length", w, (k, k, kc, vc, slots[:2], s, s), "slot_mapping"
    yield "write: k_scale float64", w, (k, k, kc, vc, slots, s.double(), s), "k_scale"
    yield "write: v_scale [3]", w, (k, k, kc, vc, slots, s, torch.ones(3)), "v_scale"
    yield "write: v_scale 2-D", w, (k, k, kc, vc, slots, s, torch.ones(1, 2)), "v_scale"

    kc32, vc32 = cache(dim=32)
    qkv = torch.randn(3, (4 + 4) * 32, dtype=torch.bfloat16)
    cos = torch.randn(3, 32, dtype=torch.bfloat16)
    r = ops.kv_cache_write_rotary
    yield "rotary: head_dim 16", r, (torch.randn(3, 128, dtype=torch.bfloat16), cos[:, :16], cos[:, :16],
                                     *cache(dim=16), slots, s, s, 4), "head_dim"
    yield "rotary: num_q_heads 0", r, (qkv, cos, cos, kc32, vc32, slots, s, s, 0), "num_q_heads"
    yield "rotary: qkv columns", r, (qkv[:, :200], cos, cos, kc32, vc32, slots, s, s, 4), "qkv"
    yield "rotary: qkv int", r, (qkv.int(), cos, cos, kc32, vc32, slots, s, s, 4), "qkv"
    yield "rotary: cos shape", r, (qkv, cos[:2], cos, kc32, vc32, slots, s, s, 4), "cos"
    yield "rotary: sin dtype", r, (qkv, cos, cos.half(), kc32, vc32, slots, s, s, 4), "sin"
    yield "rotary: slot_mapping length", r, (qkv, cos, cos, kc32, vc32, slots[:1], s, s, 4), "slot_mapping"
    yield "rotary: k_scale [5]", r, (qkv, cos, cos, kc32, vc32, slots, torch.ones(5), s, 4), "k_scale"
    yield "rotary: cache 3-D", r, (qkv, cos, cos, kc32[0], vc32[0], slots, s, s, 4), "k_cache"

    q = torch.randn(2, 4, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.tensor([5, 20], dtype=torch.int32)
    d = ops.paged_decode_attention
    yield "decode: q 2-D", d, (q[0], kc, vc, table, lens, s, s, 0.1), "q"
    yield "decode: q head_dim", d, (q[..., :32], kc, vc, table, lens, s, s, 0.1), "q"
    yield "decode: q int", d, (q.int(), kc, vc, table, lens, s, s, 0.1), "q"
    yield "decode: GQA ratio", d, (q[:, :3], kc, vc, table, lens, s, s, 0.1), "num_q_heads"
    yield "decode: block_table float", d, (q, kc, vc, table.float(), lens, s, s, 0.1), "block_table"
    yield "decode: block_table batch", d, (q, kc, vc, table[:1], lens, s, s, 0.1), "block_table"
    yield "decode: seq_lens shape", d, (q, kc, vc, table, lens[:1], s, s, 0.1), "seq_lens"
    yield "decode: v_scale dtype", d, (q, kc, vc, table, lens, s, s.half(), 0.1), "v_scale"
    yield "decode: num_splits 0", d, (q, kc, vc, table, lens, s, s, 0.1, 0), "num_splits"
    yield "decode: window < 0", d, (q, kc, vc, table, lens, s, s, 0.1, 1, -1), "window"
    yield "decode: softcap < 0", d, (q, kc, vc, table, lens, s, s, 0.1, 1, 0, -1.0), "softcap"
    yield "decode: softmax_scale inf", d, (q, kc, vc, table, lens, s, s, float("inf")), "softmax_scale"
    yield "decode: cache dtype", d, (q, *cache(dtype=torch.int16), table, lens, s, s, 0.1), "k_cache"


CASES = [*quantize_cases(), *fused_cases(), *kv_cases()]


def raised(op, args):
    try:
        op(*args)
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return e
    return None


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fake_refuses_what_the_cpu_op_refuses(case):
    _, op, args, name = case
    on_cpu = raised(op, args)
    assert on_cpu is not None, "the CPU op took the bad argument: the case is wrong"
    assert type(on_cpu) in (ValueError, TypeError), f"the CPU op raised {type(on_cpu).__name__}: {on_cpu}"
    on_meta = raised(op, [to_meta(a) for a in args])
    assert on_meta is not None, f"the fake took what the CPU op refused with: {on_cpu}"
    assert type(on_meta) is type(on_cpu), f"CPU: {on_cpu!r}; fake: {on_meta!r}"
    if name is not None:
        for e in (on_cpu, on_meta):
            assert re.search(rf"\b{name}\b", str(e)), f"{name!r} not named in {e}"


def valid_cases():
    x = x_of()
    w = torch.rand(256, dtype=torch.bfloat16) + 0.5
    for name in ("quantize_per_tensor", "quantize_per_row", "quantize_per_group", "quantize_per_block"):
        yield getattr(ops, name), (x, F8, 0, False, 16)
        yield getattr(ops, name), (x_of(6, 300)[:, :256], F8, 0, False, 0)  # strided rows are fine
    yield ops.quantize_delayed, (x, torch.zeros(8), torch.ones(()), F8, 0, False, True, 0)
    yield ops.quantize_with_scale, (x, torch.ones(1, 1), F8, 0)  # one value, any shape
    yield ops.rms_norm_quantize_per_row, (x, w, 0.0, F8, 0, False, 0)
    yield ops.add_rms_norm_quantize_per_row, (x, x.clone(), w, 1e-5, F8, 0, False, 0)
    yield ops.silu_mul_quantize_per_row, (x, F8, 0, False, 0)
    kc, vc = cache()
    k = torch.randn(3, 2, 64, dtype=torch.bfloat16)
    yield ops.kv_cache_write, (k, k.clone(), kc, vc, torch.tensor([0, -1, 9]), torch.ones(2), torch.ones(()))
    yield ops.paged_decode_attention, (torch.randn(2, 4, 64, dtype=torch.bfloat16), kc, vc,
                                       torch.zeros(2, 3, dtype=torch.int32), torch.tensor([5, 20]),
                                       torch.ones(()), torch.ones(2), 0.1, 2, 4, 30.0)
    kc32, vc32 = cache(dim=32)
    yield ops.kv_cache_write_rotary, (torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(3, 32, dtype=torch.bfloat16),
                                      torch.randn(3, 32, dtype=torch.bfloat16), kc32, vc32, torch.tensor([0, 5, 17]),
                                      torch.ones(()), torch.ones(()), 4)


VALID = list(valid_cases())


@pytest.mark.parametrize("case", VALID, ids=[f"{op._qualified_op_name}-{i}" for i, (op, _) in enumerate(VALID)])
def test_fake_takes_what_the_cpu_op_takes(case):
    """Including what only the values would refuse: the fake cannot read them."""
    op, args = case
    op(*args)
    op(*[to_meta(a) for a in args])


def test_fake_reads_no_values():
    """A scale of 0 and a repeated slot are refused by the CPU op, which reads
    them; the fake cannot (meta tensors hold none) and must not try."""
    kc, vc = cache()
    k = torch.randn(2, 2, 64, dtype=torch.bfloat16)
    args = (k, k.clone(), kc, vc, torch.tensor([3, 3]), torch.zeros(()), torch.ones(()))
    with pytest.raises(ValueError, match="k_scale must be finite and positive"):
        ops.kv_cache_write(*args)
    ops.kv_cache_write(*[to_meta(a) for a in args])


def test_compile_names_the_bad_argument_while_tracing():
    """Under torch.compile the fake runs first: a bad margin fails while the
    graph is traced, with the op's message, before any backend sees a graph."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    f = torch.compile(lambda x: ops.quantize_per_row(x, F8, 65, False, 0), fullgraph=True, backend=backend)
    with pytest.raises(Exception, match=r"margin must be in \[-64, 64\]"):
        f(x_of())
    assert not graphs, "the graph was traced through the bad call: the fake did not check margin"


def fallback_name(op) -> str:
    return op._qualified_op_name.split("::")[1]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cuda_fallback_refuses_what_the_cpu_op_refuses(case):
    """The reference path that serves CUDA tensors where no kernel was built
    (ops/cuda_fallback.py) runs the fake's checks first: without them a [2]
    scale was applied per column and a bf16 'FP8' dtype was taken. Run here on
    CPU tensors, the same function the CUDA key calls."""
    _, op, args, name = case
    on_cpu = raised(op, args)
    on_fallback = raised(lambda *a: cuda_fallback.run_reference(fallback_name(op), *a), args)
    assert on_fallback is not None, f"the fallback took what the CPU op refused with: {on_cpu}"
    assert type(on_fallback) is type(on_cpu), f"CPU: {on_cpu!r}; fallback: {on_fallback!r}"
    if name is not None:
        assert re.search(rf"\b{name}\b", str(on_fallback)), f"{name!r} not named in {on_fallback}"


@pytest.mark.parametrize("case", VALID, ids=[f"{op._qualified_op_name}-{i}" for i, (op, _) in enumerate(VALID)])
def test_cuda_fallback_takes_what_the_cpu_op_takes(case):
    op, args = case
    cuda_fallback.run_reference(fallback_name(op), *args)


@pytest.mark.parametrize("bad, match", [((F8, 65, 0), r"margin must be in"), ((torch.bfloat16, 0, 0), r"dtype must be"),
                                        ((F8, 0, -7), r"pad_k_to must be in")])
def test_dynamic_shapes_still_check_what_reads_no_sizes(bad, match):
    """With symbolic sizes the fakes skip the checks that read them (they would
    become guards), but a dtype, margin or pad_k_to is refused while tracing."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    dtype, margin, pad = bad
    f = torch.compile(lambda x: ops.quantize_per_row(x, dtype, margin, False, pad), fullgraph=True, dynamic=True,
                      backend=backend)
    with pytest.raises(Exception, match=match):
        f(x_of())
    assert not graphs


def cuda_only_cases():
    """Limits of the CUDA kernels alone (the CPU op takes these): the fake of a CUDA call
    must refuse them as the CUDA op does (csrc/torch/cuda), with its message. Each case
    builds its arguments when called (inside FakeTensorMode: no GPU needed)."""
    bf16 = torch.bfloat16

    def attention(dim=64, q_heads=4, pages=4, page_size=16):
        def build():
            kc = torch.empty(pages, page_size, 2, dim, dtype=F8, device="cuda")
            one = torch.ones((), device="cuda")
            return (torch.empty(2, q_heads, dim, dtype=bf16, device="cuda"), kc, kc.clone(),
                    torch.zeros(2, 3, dtype=torch.int32, device="cuda"),
                    torch.ones(2, dtype=torch.int32, device="cuda"), one, one, 0.1, 1, 0, 0.0)
        return build

    def write():
        k = torch.empty(3, 2, 40, dtype=bf16, device="cuda")
        kc = torch.empty(4, 16, 2, 40, dtype=F8, device="cuda")
        one = torch.ones((), device="cuda")
        return k, k, kc, kc.clone(), torch.zeros(3, dtype=torch.long, device="cuda"), one, one

    yield "decode head_dim 96", ops.paged_decode_attention, attention(dim=96), "head_dim must be 64, 128 or 256 on CUDA"
    yield "decode head_dim 40", ops.paged_decode_attention, attention(dim=40), "multiple of 16"
    yield "decode 65536 q heads", ops.paged_decode_attention, attention(q_heads=65536), "at most 65535 heads"
    yield "decode 2^31 tokens", ops.paged_decode_attention, attention(pages=2**27), "fewer than 2\\^31"
    yield "write head_dim 40", ops.kv_cache_write, write, "multiple of 16"
    yield "128x128 blocks past 65535 block rows", ops.quantize_per_block, lambda: (
        torch.empty(65535 * 128 + 1, 16, dtype=bf16, device="cuda"), F8, 0, False, 0), "65535 blocks of 128"


CUDA_ONLY = list(cuda_only_cases())


@pytest.mark.parametrize("case", CUDA_ONLY, ids=[c[0] for c in CUDA_ONLY])
def test_fakes_of_cuda_calls_refuse_the_cuda_kernels_limits(case):
    from torch._subclasses.fake_tensor import FakeTensorMode
    _, op, build, match = case
    with FakeTensorMode():  # CUDA tensors without a GPU: shapes, dtypes and devices only
        args = build()
        with pytest.raises(ValueError, match=match):
            op(*args)
