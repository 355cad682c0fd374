"""Per-token quantization fused with the op before it: RMSNorm
(fp8ext.rms_norm_quantize, op rms_norm_quantize_per_row) and SwiGLU's
silu * up (silu_mul_quantize, op silu_mul_quantize_per_row). On the CPU
bit-identical to the unfused ops, also through the serving engine (which
uses them unless FP8EXT_FUSED_QUANT=0); on the GPU (marked tests) against the CPU."""
import pytest
import torch
import torch.nn.functional as F

import fp8ext
from fp8ext.cuda_graphs import capture
from fp8ext.quantize import add_rms_norm_quantize, quantize, rms_norm_quantize, silu_mul_quantize
from fp8ext.recipes import BlockWise, CurrentScaling, PerTensorStatic, RowWise
from cuda_kernels import kernels_run
from quant_cases import FP8, random_input, same_bits

# 12288: past the cached chunks; 1100 rows: more than a wave of blocks, with a padded tail
SHAPES = [(1, 1), (1, 4100), (3, 127), (5, 129), (33, 1000), (16, 4096), (3, 12288), (1100, 4100)]
# [gate | up] widths: I = 1, 127, 129, 4100, 14336 (Llama-3.1-8B), 20000 (past the cached chunks); and
# more rows than an H100/H200 has SMs (a second wave of blocks)
SWIGLU_SHAPES = [(1, 2), (3, 254), (5, 258), (16, 8200), (2, 28672), (1, 40000),
                 (300, 258), (200, 28672), (140, 32768), (140, 40000),
                 # four waves of blocks or more (on 132 SMs): the CUDA kernel's L2 prefetch, with a padded tail
                 (560, 28660)]
each_dtype = pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
each_fp8 = pytest.mark.parametrize("fp8", FP8, ids=str)
each_device = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def test_fused_quantizers_are_exported_at_the_top_level():
    # `fp8ext.quantize` is the function, so the module's fused ones must be reachable as fp8ext.<name>.
    assert fp8ext.rms_norm_quantize is rms_norm_quantize
    assert fp8ext.add_rms_norm_quantize is add_rms_norm_quantize
    assert fp8ext.silu_mul_quantize is silu_mul_quantize
    assert {"rms_norm_quantize", "add_rms_norm_quantize", "silu_mul_quantize"} <= set(fp8ext.__all__)


def unfused(x, weight, eps, recipe, pad_k_to=None):
    """Hugging Face Llama's RMSNorm written out (not F.rms_norm, which the CPU op uses), then quantize."""
    h = x.float()
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return quantize(weight * normed, recipe, pad_k_to=pad_k_to)


def inputs(shape, dtype, seed, device="cpu", **kw):
    x = random_input(shape, dtype, seed, **kw).to(device)
    g = torch.Generator().manual_seed(seed + 1)
    weight = (torch.rand(shape[-1], generator=g) * 2 + 0.25).to(dtype).to(device)
    return x, weight


def expect_unfused_result(q, s, want_q, want_s, fp8, cols, exact):
    """Against the unfused ops on the CPU: bit for bit on the CPU. The CUDA kernels
    sum squares and exponentiate in their own order, so a value before the
    quantization may differ by one step of the input's dtype: there a few codes
    may move by one FP8 step, nothing more; NaNs, zero rows and the K padding agree."""
    q, s = q.cpu(), s.cpu()
    assert q.shape == want_q.shape and s.shape == want_s.shape
    if exact:
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
        return
    assert torch.allclose(s, want_s, rtol=2 ** -6, atol=0)
    got, want = q.float() * s[:, None], want_q.float() * want_s[:, None]
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(q[:, cols:].view(torch.uint8), want_q[:, cols:].view(torch.uint8))  # padding: 0
    step = 2.0 ** -3 if fp8 == torch.float8_e4m3fn else 2.0 ** -2  # one FP8 step, relative
    close = (got - want).abs() <= step * want.abs() + 2 * s[:, None] * 2.0 ** -9  # subnormals: absolute
    assert close[~nan].all()
    assert (q.view(torch.uint8) != want_q.view(torch.uint8))[~nan].float().mean() < 0.02


@each_dtype
@each_fp8
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@each_device
def test_rms_norm_quantize_is_the_unfused_path(dtype, fp8, shape, device, seed):
    x, weight = inputs(shape, dtype, seed, non_finite=shape[0] > 2, zero_row=True)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    want_q, want_s = unfused(x, weight, 1e-5, recipe, pad_k_to=16)
    q, s = rms_norm_quantize(x.to(device), weight.to(device), 1e-5, recipe, pad_k_to=16)
    expect_unfused_result(q, s, want_q, want_s, fp8, shape[1], exact=device == "cpu")


@each_dtype
@each_fp8
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@each_device
def test_add_rms_norm_quantize_is_the_add_then_the_unfused_path(dtype, fp8, shape, device, seed):
    x, weight = inputs(shape, dtype, seed, non_finite=shape[0] > 2, zero_row=True)
    residual = random_input(shape, dtype, seed + 2)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    want_h = x + residual
    want_q, want_s = unfused(want_h, weight, 1e-5, recipe, pad_k_to=16)
    q, s, h = add_rms_norm_quantize(x.to(device), residual.to(device), weight.to(device), 1e-5, recipe, pad_k_to=16)
    assert h.dtype == dtype and same_bits(h.cpu(), want_h)  # the add rounds the same way on both devices
    expect_unfused_result(q, s, want_q, want_s, fp8, shape[1], exact=device == "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_rms_norm_quantize_with_rows_prefetched(dtype, seed):
    """2^24 elements or more over four waves of blocks: the CUDA residual kernel asks L2 for the
    rows one wave ahead with 16-bit inputs (fp32: the kernel without it), with a padded tail and
    non-finite values."""
    shape, fp8 = (4200, 4100), torch.float8_e4m3fn
    x, weight = inputs(shape, dtype, seed, non_finite=True, zero_row=True)
    residual = random_input(shape, dtype, seed + 2)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    want_q, want_s = unfused(x + residual, weight, 1e-5, recipe, pad_k_to=16)
    q, s, h = add_rms_norm_quantize(x.cuda(), residual.cuda(), weight.cuda(), 1e-5, recipe, pad_k_to=16)
    assert same_bits(h.cpu(), x + residual)
    expect_unfused_result(q, s, want_q, want_s, fp8, shape[1], exact=False)


# The CUDA ring kernel (rows streamed through shared memory by the TMA unit;
# FP8EXT_RMS_RING): rows of whole 16-element chunks up to 16 KB. (3000, 4096):
# several rows per block, so each block's ring wraps (its barriers' phases
# flip); (600, 8192): 512 threads and 32-KB slots with the residual; (700,
# 1008) padded to 1024 (a thread with no input chunk writes zero codes); fp32
# (64, 8192) is past 16 KB a row and the strided x is not 16-byte aligned, so
# those take the one-row kernel whatever the setting.
RING_SHAPES = [(1, 4096), (7, 64), (1000, 576), (3000, 4096), (600, 8192), (700, 1008), (64, 8192)]
RING_KERNEL = "rms_norm_quantize_ring_kernel"


def on_hopper():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("ring", ["1", "0", "auto"])
@each_dtype
@pytest.mark.parametrize("shape", RING_SHAPES, ids=str)
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
def test_rms_norm_ring_kernel_and_its_fallbacks_match_the_cpu(ring, dtype, shape, add, monkeypatch, seed):
    monkeypatch.setenv("FP8EXT_RMS_RING", ring)
    fp8 = torch.float8_e4m3fn if seed % 2 else torch.float8_e5m2
    x, weight = inputs(shape, dtype, seed, non_finite=shape[0] > 2, zero_row=True)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    pad = 128 if shape[1] % 128 else 16
    residual = random_input(shape, dtype, seed + 2)
    h = x + residual if add else x
    want_q, want_s = unfused(h, weight, 1e-5, recipe, pad_k_to=pad)
    if add:
        q, s, got_h = add_rms_norm_quantize(x.cuda(), residual.cuda(), weight.cuda(), 1e-5, recipe, pad_k_to=pad)
        assert same_bits(got_h.cpu(), h)
    else:
        q, s = rms_norm_quantize(x.cuda(), weight.cuda(), 1e-5, recipe, pad_k_to=pad)
    expect_unfused_result(q, s, want_q, want_s, fp8, shape[1], exact=False)


@pytest.mark.gpu
@each_dtype
@pytest.mark.parametrize("shape", RING_SHAPES, ids=str)
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
def test_rms_norm_ring_kernel_gives_the_one_row_kernels_bits(dtype, shape, add, monkeypatch, seed):
    """Both kernels sum each row's squares in the same order (a thread's chunk,
    then the block's tree) and round alike, so their outputs are equal bit for
    bit; the CPU comparisons above allow a code one step off and would not
    notice a ring kernel that rounds or sums differently."""
    x, weight = inputs(shape, dtype, seed, device="cuda", non_finite=shape[0] > 2, zero_row=True)
    residual = random_input(shape, dtype, seed + 2).cuda()
    recipe = RowWise(activation_format=torch.float8_e4m3fn if seed % 2 else torch.float8_e5m2)
    pad = 128 if shape[1] % 128 else 16
    outs = []
    for ring in ("1", "0"):
        monkeypatch.setenv("FP8EXT_RMS_RING", ring)
        if add:
            out, ran = kernels_run(lambda: add_rms_norm_quantize(x, residual, weight, 1e-5, recipe, pad_k_to=pad))
        else:
            out, ran = kernels_run(lambda: rms_norm_quantize(x, weight, 1e-5, recipe, pad_k_to=pad))
        # "1" takes the ring kernel wherever a row fits its 16-KB slot; were it
        # to fall back, this test would compare the one-row kernel with itself.
        takes_ring = ring == "1" and on_hopper() and shape[1] * x.element_size() <= 16384
        assert (RING_KERNEL in ran) == takes_ring, (ring, ran)
        outs.append(out)
    for ring_t, row_t in zip(*outs):
        assert same_bits(ring_t.cpu(), row_t.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
def test_rms_norm_ring_kernel_on_unaligned_rows_and_in_a_cuda_graph(add, monkeypatch, seed):
    """A strided x whose rows are not 16-byte aligned takes the one-row kernel
    under FP8EXT_RMS_RING=1; the ring kernel replays in a CUDA graph on new data."""
    monkeypatch.setenv("FP8EXT_RMS_RING", "1")
    recipe = RowWise()
    base, weight = inputs((900, 4104), torch.bfloat16, seed)
    weight = weight[4:4100].contiguous()
    w_cuda = weight.cuda()

    def run(x, residual):
        if add:
            return add_rms_norm_quantize(x, residual, w_cuda, 1e-5, recipe)[:2]
        return rms_norm_quantize(x, w_cuda, 1e-5, recipe)

    def want(x, residual):
        return unfused(x + residual if add else x, weight, 1e-5, recipe)

    x_cuda = base.cuda()[:, 4:4100]  # rows 8 bytes past a 16-byte boundary (stride 4104)
    assert x_cuda.data_ptr() % 16 == 8
    residual = random_input((900, 4096), torch.bfloat16, seed + 2)
    expect_unfused_result(*run(x_cuda, residual.cuda()), *want(base[:, 4:4100], residual), torch.float8_e4m3fn, 4096,
                          exact=False)
    static_x = torch.zeros(3000, 4096, dtype=torch.bfloat16, device="cuda")
    residual = random_input((3000, 4096), torch.bfloat16, seed + 3)
    static_residual = residual.cuda()
    graph, out = capture(lambda: run(static_x, static_residual))
    for step in range(2):
        new_x = random_input((3000, 4096), torch.bfloat16, seed + 10 + step) * (step + 1)
        static_x.copy_(new_x.cuda())
        graph.replay()
        expect_unfused_result(*out, *want(new_x, residual), torch.float8_e4m3fn, 4096, exact=False)


@each_dtype
@each_fp8
@pytest.mark.parametrize("shape", SWIGLU_SHAPES, ids=str)
@each_device
def test_silu_mul_quantize_is_the_unfused_path(dtype, fp8, shape, device, seed):
    x = random_input(shape, dtype, seed, non_finite=shape[0] > 2, zero_row=True)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    gate, up = x.split(shape[1] // 2, dim=-1)
    want_q, want_s = quantize(F.silu(gate) * up, recipe, pad_k_to=16)
    q, s = silu_mul_quantize(x.to(device), recipe, pad_k_to=16)
    expect_unfused_result(q, s, want_q, want_s, fp8, shape[1] // 2, exact=device == "cpu")


@each_dtype
@pytest.mark.parametrize("shape", [(3, 4100), (300, 258)], ids=str)
@each_device
def test_rows_whose_largest_value_is_subnormal(dtype, shape, device, seed):
    """Both kernels take each row's amax of y in x's dtype before scaling. Here every |y| is a
    subnormal of that dtype (SwiGLU's first row a mix of subnormals and zeros), and the scales and
    codes are still the unfused path's: a max that flushed subnormals would give a zero row's scale
    of 1 (with bf16 and fp32 the scale is the rule's smallest, fp32's tiny; with fp16 it is not)."""
    tiny = torch.finfo(dtype).tiny  # the smallest normal
    recipe = RowWise()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    weight = ((torch.rand(shape[1], generator=g) * 2 + 0.25) * tiny / 16).to(dtype)
    h = x.float()
    assert weight.float().abs().max() * (h * h.pow(2).mean(-1, keepdim=True).rsqrt()).abs().max() < tiny
    want_q, want_s = unfused(x, weight, 1e-5, recipe, pad_k_to=16)
    q, s = rms_norm_quantize(x.to(device), weight.to(device), 1e-5, recipe, pad_k_to=16)
    assert (want_s < 1).all()  # no row's amax is 0
    expect_unfused_result(q, s, want_q, want_s, recipe.activation_format.torch_dtype, shape[1],
                          exact=device == "cpu")

    gate = torch.randn(shape[0], shape[1] // 2, generator=g).clamp(-4, 4)  # |silu(gate)| < 4
    up = torch.rand(gate.shape, generator=g) * tiny / 8
    up[0, ::2] = 0
    x = torch.cat([gate, up], dim=1).to(dtype)
    gate, up = x.split(shape[1] // 2, dim=-1)
    want_q, want_s = quantize(F.silu(gate) * up, recipe, pad_k_to=16)
    q, s = silu_mul_quantize(x.to(device), recipe, pad_k_to=16)
    assert (want_s < 1).all()
    expect_unfused_result(q, s, want_q, want_s, recipe.activation_format.torch_dtype, shape[1] // 2,
                          exact=device == "cpu")


@each_device
def test_silu_mul_quantize_of_no_columns_gives_empty_codes_and_unit_scales(device):
    """[4, 0]: gate and up are empty, so each row's amax is 0 and its scale 1 (as quantize gives an
    all-zero row), on both devices."""
    q, s = silu_mul_quantize(torch.randn(4, 0, dtype=torch.bfloat16, device=device), RowWise())
    assert q.shape == (4, 0) and q.dtype == torch.float8_e4m3fn and q.device.type == device
    assert torch.equal(s.cpu(), torch.ones(4))


@each_dtype
@each_fp8
@pytest.mark.parametrize("shape", SWIGLU_SHAPES, ids=str)
def test_silu_mul_quantize_matches_silu_written_out(dtype, fp8, shape, seed):
    """Against silu(g) = g / (1 + exp(-g)) in float64, rounded to x's dtype, times up (not
    F.silu, which the CPU op itself calls): the same codes but where a double rounding of
    silu moves one by an FP8 step. exp(-g) is taken as fp32 computes it: infinite past
    fp32's max (g < -88.72), where silu is -0 (float64 would give a tiny nonzero value,
    the whole row's amax when it is the only one; a seed of session 33 drew g = -100.6)."""
    x = random_input(shape, dtype, seed, non_finite=shape[0] > 2, zero_row=True)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    gate, up = x[:, :shape[1] // 2], x[:, shape[1] // 2:]
    g = gate.double()
    e = torch.exp(-g)
    e = torch.where(e > torch.finfo(torch.float32).max, torch.inf, e)
    want_q, want_s = quantize((g / (1 + e)).to(dtype) * up, recipe, pad_k_to=16)
    q, s = silu_mul_quantize(x, recipe, pad_k_to=16)
    expect_unfused_result(q, s, want_q, want_s, fp8, shape[1] // 2, exact=False)


def strided(t, device):
    """t on `device` as a view whose rows are 3 elements further apart than its width (unaligned:
    the kernels' element-wise loads; Tensor.to would make a strided view contiguous)."""
    wide = torch.zeros(t.shape[0], t.shape[1] + 3, dtype=t.dtype, device=device)
    wide[:, :t.shape[1]] = t.to(device)
    return wide[:, :t.shape[1]]


@pytest.mark.parametrize("pad", [None, 128])
@pytest.mark.parametrize("cols", [127, 1000])
@each_device
def test_other_k_padding_and_strided_rows(pad, cols, device, seed):
    """K padded to 128 (whole chunks of padding) or not at all (a row ending mid-chunk, stored
    element-wise), with inputs whose rows are views of a wider tensor, for each fused op."""
    fp8, recipe = torch.float8_e4m3fn, RowWise()
    x, weight = inputs((5, cols), torch.bfloat16, seed)
    residual = random_input((5, cols), torch.bfloat16, seed + 2)
    w = weight.to(device)
    want_q, want_s = unfused(x, weight, 1e-5, recipe, pad_k_to=pad)
    q, s = rms_norm_quantize(strided(x, device), w, 1e-5, recipe, pad_k_to=pad)
    expect_unfused_result(q, s, want_q, want_s, fp8, cols, exact=device == "cpu")
    want_q, want_s = unfused(x + residual, weight, 1e-5, recipe, pad_k_to=pad)
    q, s, h = add_rms_norm_quantize(strided(x, device), strided(residual, device), w, 1e-5, recipe, pad_k_to=pad)
    assert same_bits(h.cpu(), x + residual)
    expect_unfused_result(q, s, want_q, want_s, fp8, cols, exact=device == "cpu")
    gate_up = torch.cat([x, residual], dim=-1)
    want_q, want_s = quantize(F.silu(x) * residual, recipe, pad_k_to=pad)
    q, s = silu_mul_quantize(strided(gate_up, device), recipe, pad_k_to=pad)
    expect_unfused_result(q, s, want_q, want_s, fp8, cols, exact=device == "cpu")


def test_leading_dims_and_bad_arguments():
    x, weight = inputs((2, 3, 64), torch.bfloat16, 0)
    q, s = rms_norm_quantize(x, weight, 1e-6, RowWise())
    assert q.shape == (2, 3, 64) and s.shape == (6,)
    with pytest.raises(ValueError, match="per-token current scaling"):
        rms_norm_quantize(x, weight, 1e-6, CurrentScaling())
    with pytest.raises(ValueError, match="per-token current scaling"):
        rms_norm_quantize(x, weight, 1e-6, BlockWise())
    with pytest.raises(ValueError, match=r"weight must be a contiguous \[64\] tensor"):
        rms_norm_quantize(x, weight[:10], 1e-6, RowWise())
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        rms_norm_quantize(x, weight.float(), 1e-6, RowWise())
    for eps in (-1.0, float("nan"), float("inf"), 1e300):  # 1e300: inf in fp32
        with pytest.raises(ValueError, match=r"eps must be finite and >= 0"):
            rms_norm_quantize(x, weight, eps, RowWise())
    for eps in (None, True, "1e-6", torch.tensor(1e-6)):
        with pytest.raises(TypeError, match="eps must be a float"):
            add_rms_norm_quantize(x, x, weight, eps, RowWise())
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        rms_norm_quantize(x, [1.0] * 64, 1e-6, RowWise())
    # On another device than x (here meta: a model built on it and never loaded), the meta kernel would
    # answer with uninitialised memory; refused by name, also when the op is called directly.
    with pytest.raises(ValueError, match="weight must be on x's device"):
        rms_norm_quantize(x, weight.to("meta"), 1e-6, RowWise())
    with pytest.raises(ValueError, match="residual must be on x's device"):
        add_rms_norm_quantize(x, x.to("meta"), weight, 1e-6, RowWise())
    with pytest.raises(ValueError, match="weight must be on x's device"):
        torch.ops.fp8ext.add_rms_norm_quantize_per_row(x[0], x[0], weight.to("meta"), 1e-6,
                                                       torch.float8_e4m3fn, 0, False, 0)
    # No backward: inputs that require grad are refused while grad mode is on, taken under no_grad.
    param = torch.nn.Parameter(weight.clone())
    with pytest.raises(RuntimeError, match="rms_norm_quantize has no backward"):
        rms_norm_quantize(x, param, 1e-6, RowWise())
    with pytest.raises(RuntimeError, match="silu_mul_quantize has no backward"):
        silu_mul_quantize(x.clone().requires_grad_(), RowWise())
    with torch.no_grad():
        assert torch.equal(rms_norm_quantize(x, param, 1e-6, RowWise())[1], rms_norm_quantize(x, weight, 1e-6,
                                                                                             RowWise())[1])
    with pytest.raises(TypeError, match="recipe"):
        rms_norm_quantize(x, weight, 1e-6, "rowwise")
    q, s, h = add_rms_norm_quantize(x, x, weight, 1e-6, RowWise())
    assert q.shape == (2, 3, 64) and s.shape == (6,) and torch.equal(h, x + x)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        add_rms_norm_quantize(x, x[:1], weight, 1e-6, RowWise())
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        add_rms_norm_quantize(x, x.float(), weight, 1e-6, RowWise())
    with pytest.raises(ValueError, match="per-token current scaling"):
        add_rms_norm_quantize(x, x, weight, 1e-6, CurrentScaling())
    q, s = silu_mul_quantize(x, RowWise())
    assert q.shape == (2, 3, 32) and s.shape == (6,)
    with pytest.raises(ValueError, match=r"x must be \[M, 2 \* I\]"):
        silu_mul_quantize(x[..., :63], RowWise())
    with pytest.raises(ValueError, match="per-token current scaling"):
        silu_mul_quantize(x, CurrentScaling())


@each_device
def test_block_wise_fp8_linear_takes_its_own_group_quantized_input(device, seed):
    from fp8ext.nn.linear import FP8Linear
    layer = FP8Linear.from_linear(torch.nn.Linear(300, 24), BlockWise()).to(device)
    x = random_input((7, 300), torch.float32, seed).to(device)
    q, s = quantize(x, BlockWise(), pad_k_to=16)
    assert s.shape == (7, 3)
    assert torch.equal(layer.forward_quantized(q, s, torch.float32), layer(x))
    qr, sr = quantize(x, RowWise())
    with pytest.raises(ValueError, match=r"scale must be a float32 tensor of shape \[7, 3\] \(1x128 groups\)"):
        layer.forward_quantized(qr, sr, torch.float32)


def test_fp8_linear_takes_the_fused_input_as_its_own(seed):
    from fp8ext.nn.linear import FP8Linear
    layer = FP8Linear.from_linear(torch.nn.Linear(100, 24, dtype=torch.bfloat16), RowWise())
    x, weight = inputs((7, 100), torch.bfloat16, seed)
    q, s = rms_norm_quantize(x, weight, 1e-5, RowWise(), pad_k_to=16)
    want = layer(weight * F.rms_norm(x, (100,), None, 1e-5))
    assert torch.equal(layer.forward_quantized(q, s, torch.bfloat16), want)
    assert torch.equal(layer.forward_quantized(q[:, :100].contiguous(), s, torch.bfloat16), want)  # K unpadded
    with pytest.raises(ValueError, match=r"q must be \[M, 100\]"):
        layer.forward_quantized(q[:, :50], s, torch.bfloat16)
    with pytest.raises(TypeError, match="q must be torch.float8_e4m3fn"):
        layer.forward_quantized(q.view(torch.uint8), s, torch.bfloat16)
    with pytest.raises(ValueError, match=r"scale must be a float32 tensor of shape \(\) or \[7\]"):
        layer.forward_quantized(q, s[:3], torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype"):
        layer.forward_quantized(q, s, torch.int8)
    with layer.high_precision(), pytest.raises(RuntimeError, match="inside high_precision"):
        layer.forward_quantized(q, s, torch.bfloat16)
    static = FP8Linear.from_linear(torch.nn.Linear(100, 24, dtype=torch.bfloat16), PerTensorStatic())
    with pytest.raises(ValueError, match="needs current scaling"):
        static.forward_quantized(q, s, torch.bfloat16)


def test_engine_with_fused_quantization_is_bit_identical_on_cpu(monkeypatch, seed):
    """The serving model with the fused ops (the default; FP8EXT_FUSED_QUANT=0 is the unfused path) gives the same
    logits (RowWise W8A8)."""
    from fp8ext.serving import layers
    from test_serving import make_cache, tiny_model
    model = tiny_model(seed=seed).quantize(RowWise())
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,)) for n in (5, 9)]

    def logits():
        cache = make_cache(model)
        slots = [cache.append(i, len(p)) for i, p in enumerate(prompts)]
        return model.prefill(prompts, slots, cache)

    monkeypatch.setenv("FP8EXT_FUSED_QUANT", "0")
    want = logits()
    monkeypatch.delenv("FP8EXT_FUSED_QUANT")
    calls = []  # the fused ops must really run: two norms (all but the first with the residual add) and one SwiGLU a layer
    for name in ("rms_norm_quantize", "add_rms_norm_quantize", "silu_mul_quantize"):
        fused = getattr(layers, name)
        monkeypatch.setattr(layers, name, lambda *a, _f=fused, _n=name, **k: calls.append(_n) or _f(*a, **k))
    assert torch.equal(logits(), want)
    n = model.cfg.num_layers
    assert sorted(calls) == ["add_rms_norm_quantize"] * (2 * n - 1) + ["rms_norm_quantize"] + ["silu_mul_quantize"] * n


def _fused_call(op, x, weight):
    recipe = RowWise()  # built outside the traced function, as a module attribute would be
    if op == "rms_norm":
        return lambda: rms_norm_quantize(x, weight, 1e-5, recipe, pad_k_to=16)
    if op == "add_rms_norm":
        return lambda: add_rms_norm_quantize(x, x.flip(0), weight, 1e-5, recipe, pad_k_to=16)
    return lambda: silu_mul_quantize(x, recipe, pad_k_to=16)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "swiglu"])
def test_compile_traces_the_fused_apis(op, seed):
    """torch.compile(fullgraph=True) traces the Python APIs (the GPU test compiles them with Inductor)."""
    x, weight = inputs((4, 256), torch.bfloat16, seed)
    fn = _fused_call(op, x, weight)
    want = fn()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")()
    assert len(got) == len(want) and all(same_bits(g, w) for g, w in zip(got, want))


# ---- GPU (run on the device) -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "swiglu"])
def test_cuda_graph_capture_and_compile(op, seed):
    x, weight = inputs((16, 4096), torch.bfloat16, seed, device="cuda")
    fn = _fused_call(op, x, weight)
    want = fn()
    graph, out = capture(fn)
    for t in out:  # poison: the replay must write everything
        if t.element_size() == 1:
            t.view(torch.uint8).fill_(0xAB)
        else:
            t.fill_(-1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert all(same_bits(o, w) for o, w in zip(out, want))
    compiled = torch.compile(fn, fullgraph=True)()
    assert len(compiled) == len(want) and all(same_bits(c, w) for c, w in zip(compiled, want))


@pytest.mark.gpu
def test_cuda_refuses_bad_arguments():
    x, weight = inputs((4, 64), torch.bfloat16, 0, device="cuda")
    op = torch.ops.fp8ext.rms_norm_quantize_per_row
    with pytest.raises(ValueError, match="weight must be a contiguous"):
        op(x, weight.repeat(2)[::2], 1e-5, torch.float8_e4m3fn, 0, False, 16)  # [64], stride 2
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        op(x, weight.float(), 1e-5, torch.float8_e4m3fn, 0, False, 16)
    with pytest.raises(ValueError, match="weight must be on x's device"):
        op(x, weight.cpu(), 1e-5, torch.float8_e4m3fn, 0, False, 16)
    with pytest.raises(ValueError, match=r"x must be \[M, 2 \* I\]"):
        torch.ops.fp8ext.silu_mul_quantize_per_row(x[:, :63], torch.float8_e4m3fn, 0, False, 16)


@pytest.mark.gpu
@each_fp8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_kernels_keep_the_sign_of_a_zero(fp8, dtype, seed):
    """The fused CUDA kernels keep a zero on their fast path (no IEEE division for it), sign
    included: where the value quantized is exactly +0 or -0 (x's own zeros, x + residual
    cancelling, gate or up zero), the CUDA code is the CPU's byte, 0x00 or 0x80. (Elsewhere a
    fused kernel may differ from the CPU by one step: tests above.)"""
    shape = (48, 4096)
    x, weight = inputs(shape, dtype, seed, signed_zeros=True)
    residual = random_input(shape, dtype, seed + 2)
    cancel = torch.rand(shape, generator=torch.Generator().manual_seed(seed + 3)) < 1 / 64
    residual[cancel] = -x[cancel]  # x + residual = +0 there
    residual[(x == 0) & torch.signbit(x)] = -0.0  # -0 + -0 = -0
    gate_up = random_input((shape[0], 2 * shape[1]), dtype, seed + 4, signed_zeros=True)
    gate, up = gate_up.chunk(2, dim=-1)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    runs = {"rms_norm": (lambda d: rms_norm_quantize(x.to(d), weight.to(d), 1e-5, recipe), x == 0),
            "add_rms_norm": (lambda d: add_rms_norm_quantize(x.to(d), residual.to(d), weight.to(d), 1e-5, recipe),
                             x + residual == 0),
            "silu_mul": (lambda d: silu_mul_quantize(gate_up.to(d), recipe), (gate == 0) | (up == 0))}
    for name, (run, zero) in runs.items():
        want, got = run("cpu")[0].view(torch.uint8), run("cuda")[0].cpu().view(torch.uint8)
        assert ((want[zero] & 0x7F) == 0).all(), name
        assert (want[zero] == 0x80).any() and (want[zero] == 0).any(), name  # both signs are tested
        assert torch.equal(got[zero], want[zero]), name


@pytest.mark.gpu
@each_fp8
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_silu_mul_quantize_is_bit_exact_where_silu_is_exact(fp8, dtype, seed):
    """With gate = 32, silu(gate) rounds to 32 in a 16-bit type on both devices (e^-32 vanishes
    beside 1; the CUDA kernel's approximate reciprocal errs by an fp32 ulp at most), so y = 32 * up
    exactly, and the fused kernels' quantization must match the CPU bit for bit: signed zeros,
    NaN, +-Inf and subnormals within parts of 8; in bf16 also rows whose scale (~7e17, still on
    the fast division) makes tiny values' quotients underflow to zero or to subnormals."""
    rows, inter = 40, 4100
    up = random_input((rows, inter), dtype, seed, non_finite=True, zero_row=True, signed_zeros=True)
    smallest = {torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133}[dtype]
    tiny = torch.finfo(dtype).tiny
    specials = [smallest, -smallest, 3 * smallest, tiny, -tiny / 2]
    if dtype == torch.bfloat16:
        up[::4, 7] = 1e19
        specials += [1e-35, -1e-35, 1e-28, -1e-28]
    specials = torch.tensor(specials, dtype=torch.float32).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    where = torch.randperm(up.numel(), generator=g)[:40 * len(specials)]
    up.view(-1)[where] = specials.repeat(40)
    x = torch.cat([torch.full_like(up, 32.0), up], dim=-1)
    recipe = RowWise(activation_format=fp8, weight_format=fp8)
    want_q, want_s = silu_mul_quantize(x, recipe, pad_k_to=16)
    q, s = silu_mul_quantize(x.cuda(), recipe, pad_k_to=16)
    assert same_bits(q.cpu(), want_q)
    assert torch.equal(s.cpu(), want_s)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "silu_mul"])
def test_a_column_major_x_is_refused_on_the_cpu_as_on_cuda(op):
    """The CUDA ops take rows with a contiguous last dimension only; the CPU
    composition refuses the same x (it took it and, for add_rms_norm, gave h in
    x's layout where the fake says row-major: helper-39)."""
    x = torch.randn(64, 8, dtype=torch.bfloat16).t()  # [8, 64], strides (1, 8)
    w = torch.ones(64, dtype=torch.bfloat16)
    calls = {"rms_norm": lambda: torch.ops.fp8ext.rms_norm_quantize_per_row(x, w, 1e-6, FP8[0], 0, False, 0),
             "add_rms_norm": lambda: torch.ops.fp8ext.add_rms_norm_quantize_per_row(
                 x, x.contiguous(), w, 1e-6, FP8[0], 0, False, 0),
             "silu_mul": lambda: torch.ops.fp8ext.silu_mul_quantize_per_row(x, FP8[0], 0, False, 0)}
    with pytest.raises(ValueError, match=r"x must have a contiguous last dimension \(stride 1\), got strides \(1, 8\)"):
        calls[op]()
    # The public functions make x contiguous first: they still take it.
    assert rms_norm_quantize(x, w, 1e-6, RowWise())[0].shape == (8, 64)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_silu_mul_checks_the_width_before_the_format(device):
    """An odd width and a wrong dtype together: the fake (meta) raises what the
    CPU composition and the CUDA op raise, the width's error."""
    x = torch.randn(4, 7, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"x must be \[M, 2 \* I\] \(gate, then up\), got 7 columns"):
        torch.ops.fp8ext.silu_mul_quantize_per_row(x, torch.float16, 0, False, 0)
