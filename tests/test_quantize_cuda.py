"""CUDA quantization (GPU-marked, run on the device): bit-exact with the native
CPU implementation, CUDA-graph capture, delayed state advancing per replay."""
import pytest
import torch

from fp8ext import ScalingState, quantize
from fp8ext.recipes import DelayedScaling
from cuda_kernels import kernels_run
from quant_cases import DTYPES, FP8, input_with_signed_nans, random_input

pytestmark = pytest.mark.gpu

OPS = ["quantize_per_tensor", "quantize_per_row", "quantize_per_group", "quantize_per_block"]
# Per-row blocks hold up to 16384 elements of a row in registers: (16, 14336)
# (448 threads) and (2, 16384) all of it, (3, 20000) reads its tail twice.
SHAPES = [(1, 1), (1, 4100), (7, 1), (3, 127), (5, 129), (130, 257), (16, 8192), (33, 8192), (16, 14336),
          (2, 16384), (3, 20000), (1000, 4100), (16384, 129)]


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cuda_matches_cpu(op, dtype, fp8, shape, seed):
    x = random_input(shape, dtype, seed, non_finite=True, zero_row=True, signed_zeros=True)
    for margin, pow2, pad in [(0, False, 0), (2, True, 16)]:
        q, s = getattr(torch.ops.fp8ext, op)(x.cuda(), fp8, margin, pow2, pad)
        q_cpu, s_cpu = getattr(torch.ops.fp8ext, op)(x, fp8, margin, pow2, pad)
        assert same_bits(q, q_cpu)
        assert s.stride() == s_cpu.stride() and torch.equal(s.cpu(), s_cpu)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols,stride", [(1000, 1003), (129, 136), (4100, 4108)], ids=str)
def test_cuda_strided_rows_match_cpu(op, dtype, cols, stride, seed):
    """Rows further apart than their width (a view of a wider tensor; 1003 elements apart: not
    16-byte aligned), for every scale-computing op (only per-tensor had such a case)."""
    wide = random_input((37, stride), dtype, seed, non_finite=True, signed_zeros=True)
    x = wide.cuda()[:, :cols]  # (Tensor.cuda() of a strided view would make it contiguous)
    assert x.stride() == (stride, 1)
    for pad in (0, 16):
        q, s = getattr(torch.ops.fp8ext, op)(x, FP8[0], 0, False, pad)
        q_cpu, s_cpu = getattr(torch.ops.fp8ext, op)(wide[:, :cols], FP8[0], 0, False, pad)
        assert same_bits(q, q_cpu), pad
        assert s.stride() == s_cpu.stride() and torch.equal(s.cpu(), s_cpu), pad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_cuda_keeps_a_negative_nans_sign_as_the_cpu(dtype, fp8, seed):
    """A NaN x keeps its sign in the code (0xFF, not 0x7F), as on the CPU, where x86's
    division passes a NaN operand through; CUDA's returns a positive canonical NaN, which
    the kernels' exact path used to encode. PyTorch's vectorised bf16 arithmetic makes
    such NaNs (0xFFFF). One negative and one positive NaN per row, scales on the fast
    division's path and off it."""
    x = input_with_signed_nans(dtype, seed)
    for op in OPS:
        q, _ = getattr(torch.ops.fp8ext, op)(x.cuda(), fp8, 0, False, 16)
        assert same_bits(q, getattr(torch.ops.fp8ext, op)(x, fp8, 0, False, 16)[0]), op
    for scale in (0.013, 212.57142639160156, 2.0 ** 70):
        s = torch.tensor(scale)
        q = torch.ops.fp8ext.quantize_with_scale(x.cuda(), s.cuda(), fp8, 0)
        assert same_bits(q, torch.ops.fp8ext.quantize_with_scale(x, s, fp8, 0)), scale
        hist, s_cpu = torch.zeros(4), s.clone()
        q, _ = torch.ops.fp8ext.quantize_delayed(x.cuda(), hist.cuda(), s.cuda(), fp8, 0, False, True, 0)
        assert same_bits(q, torch.ops.fp8ext.quantize_delayed(x, hist, s_cpu, fp8, 0, False, True, 0)[0]), scale
    codes = q.cpu().view(torch.uint8)
    assert (codes[:, 7] == 0xFF).all() and (codes[:, 100] == 0x7F).all()
    # A caller's negative-NaN scale: CUDA's division returned its positive NaN (0x7F) where x86
    # passes the scale through (0xFF), in the exact path every NaN scale takes (helper-56).
    s = torch.tensor(-0x400000, dtype=torch.int32).view(torch.float32)
    q = torch.ops.fp8ext.quantize_with_scale(x.cuda(), s.cuda(), fp8, 0)
    assert same_bits(q, torch.ops.fp8ext.quantize_with_scale(x, s, fp8, 0)), "negative NaN scale"
    hist, s_cpu = torch.zeros(4), s.clone()
    q, _ = torch.ops.fp8ext.quantize_delayed(x.cuda(), hist.cuda(), s.cuda(), fp8, 0, False, True, 0)
    assert same_bits(q, torch.ops.fp8ext.quantize_delayed(x, hist, s_cpu, fp8, 0, False, True, 0)[0]), "delayed"


# Large enough for the two-pass path; (1, 4.3M) has more 16-element chunks in
# its row than the grid has threads along x (1024 blocks of 256), so both
# passes stride along the row.
@pytest.mark.parametrize("shape", [(1, 4_300_000), (3, 1_500_000), (20000, 300), (2048, 4096)], ids=str)
def test_cuda_per_tensor_amax_found_anywhere(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(torch.bfloat16)
    rows, cols = shape
    where = [(0, 0), (rows - 1, cols - 1), (int(torch.randint(rows, (1,), generator=g)),
                                           int(torch.randint(cols, (1,), generator=g)))]
    x_gpu = x.cuda()
    for r, c in where:
        planted = x_gpu.clone()
        planted[r, c] = -1000.0
        q, s = torch.ops.fp8ext.quantize_per_tensor(planted, torch.float8_e4m3fn, 0, False, 0)
        assert s.item() == pytest.approx(1000.0 / 448.0, rel=1e-6), (r, c)
        q_cpu, s_cpu = torch.ops.fp8ext.quantize_per_tensor(planted.cpu(), torch.float8_e4m3fn, 0, False, 0)
        assert torch.equal(s.cpu(), s_cpu) and same_bits(q, q_cpu)


# Scales from the fast division's range to far past it (2^+-70, 1e-30, a float32
# subnormal): the kernels' quotient must stay bit-exact with the CPU's division.
SCALES = [0.013, 2.0 ** 70, 2.0 ** -70, 1e-30, 1e-40]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 127), (77, 4100), (16, 8192), (1000, 4100)], ids=str)
def test_cuda_with_scale_and_cast_match_cpu(fp8, dtype, shape, seed):
    x = random_input(shape, dtype, seed, non_finite=True, zero_row=True, signed_zeros=True)
    for scale in SCALES:
        s = torch.tensor(scale)
        for pad in (0, 16):
            assert same_bits(torch.ops.fp8ext.quantize_with_scale(x.cuda(), s.cuda(), fp8, pad),
                             torch.ops.fp8ext.quantize_with_scale(x, s, fp8, pad)), (scale, pad)
    for sat in (True, False):
        assert same_bits(torch.ops.fp8ext.cast_to_fp8(x.cuda(), fp8, sat), torch.ops.fp8ext.cast_to_fp8(x, fp8, sat))


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1000), (1, 1), (300, 1000)], ids=str)
def test_cuda_delayed_op_matches_cpu_every_format_dtype_and_one_row(fp8, dtype, shape, seed):
    """The op itself, step after step from one state: codes, used scale, history
    and next scale bit-exact with the CPU (both amax rules)."""
    for use_history_max in (True, False):
        hist, scale = torch.zeros(4), torch.ones(())
        hist_g, scale_g = hist.cuda(), scale.cuda()
        for step in range(6):
            x = random_input(shape, dtype, seed + step, non_finite=step == 3) * 4.0 ** (step % 3)
            q, s = torch.ops.fp8ext.quantize_delayed(x.cuda(), hist_g, scale_g, fp8, 1, step % 2 == 1,
                                                     use_history_max, 16)
            q_c, s_c = torch.ops.fp8ext.quantize_delayed(x, hist, scale, fp8, 1, step % 2 == 1, use_history_max, 16)
            assert same_bits(q, q_c) and torch.equal(s.cpu(), s_c), (step, use_history_max)
            assert torch.equal(hist_g.cpu(), hist) and torch.equal(scale_g.cpu(), scale), (step, use_history_max)


def test_cuda_delayed_matches_cpu(seed):
    recipe = DelayedScaling(amax_history_len=5)
    gpu, cpu = ScalingState.create(recipe, device="cuda"), ScalingState.create(recipe)
    for step in range(8):
        x = random_input((300, 1000), torch.bfloat16, seed + step) * 4.0 ** (step % 4)
        q, s = quantize(x.cuda(), recipe, state=gpu)
        q_c, s_c = quantize(x, recipe, state=cpu)
        assert same_bits(q, q_c) and torch.equal(s.cpu(), s_c)
        assert torch.equal(gpu.amax_history.cpu(), cpu.amax_history) and torch.equal(gpu.scale.cpu(), cpu.scale)


@pytest.mark.parametrize("op", OPS + ["quantize_delayed", "quantize_with_scale", "cast_to_fp8"])
def test_cuda_graph_capture(op, seed):
    x = random_input((64, 4100), torch.bfloat16, seed).cuda()
    hist, scale = torch.zeros(4, device="cuda"), torch.ones((), device="cuda")
    f8 = torch.float8_e4m3fn

    def run():
        if op == "quantize_delayed":
            return torch.ops.fp8ext.quantize_delayed(x, hist, scale, f8, 0, False, True, 16)
        if op == "quantize_with_scale":
            return torch.ops.fp8ext.quantize_with_scale(x, scale, f8, 16), scale
        if op == "cast_to_fp8":
            return torch.ops.fp8ext.cast_to_fp8(x, f8, True), scale
        return getattr(torch.ops.fp8ext, op)(x, f8, 0, False, 16)

    run()  # warm up outside the graph
    torch.cuda.synchronize()
    hist.zero_()
    scale.fill_(1.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = run()
    hist.zero_()
    scale.fill_(1.0)
    hist_cpu, scale_cpu = hist.cpu(), scale.cpu()  # the delayed state's CPU twin, advanced beside each replay
    for step in range(3):
        x.copy_(random_input((64, 4100), torch.bfloat16, seed + step + 1).cuda() * (step + 1))
        if op == "quantize_with_scale":  # a new scale each replay: read from device memory, not baked in
            scale.fill_(0.01 * (step + 1))
        graph.replay()
        torch.cuda.synchronize()
        if op == "quantize_delayed":
            q_cpu, s_cpu = torch.ops.fp8ext.quantize_delayed(x.cpu(), hist_cpu, scale_cpu, f8, 0, False, True, 16)
            assert torch.equal(hist.cpu(), hist_cpu) and torch.equal(scale.cpu(), scale_cpu), step
        elif op == "quantize_with_scale":
            q_cpu, s_cpu = torch.ops.fp8ext.quantize_with_scale(x.cpu(), scale.cpu(), f8, 16), scale.cpu()
        elif op == "cast_to_fp8":
            q_cpu, s_cpu = torch.ops.fp8ext.cast_to_fp8(x.cpu(), f8, True), scale.cpu()
        else:
            q_cpu, s_cpu = getattr(torch.ops.fp8ext, op)(x.cpu(), f8, 0, False, 16)
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu), step


# The one-launch kept-share path (quantize_per_tensor_kept.cu; off by default,
# FP8EXT_QUANT_KEEP=1 takes it past the one-pass cluster kernel's sizes, =auto
# from 16 MiB up): a grid of one block per SM, tiles of 16384 elements, 7
# kept per block for 16-bit inputs (3 for fp32). Sizes in tiles per block
# around those edges: fewer tiles than blocks, two, a share shorter than the
# ring, exactly the ring, one more, several rings; each with a partial last tile.
KEPT_KERNEL = "kept_pass_kernel"


def kept_sizes(dtype):
    sms, tile = torch.cuda.get_device_properties(0).multi_processor_count, 16384
    ring = 3 if dtype == torch.float32 else 7
    return [tile * 50 + 8, sms * tile * 2 + 24, sms * tile * 5 + 24, sms * tile * ring,
            sms * tile * (ring + 1) + 8 * 5, sms * tile * (3 * ring) + 4096]


def per_tensor(x, fp8=torch.float8_e4m3fn, margin=0, pad=0):
    return torch.ops.fp8ext.quantize_per_tensor(x, fp8, margin, False, pad)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_cuda_per_tensor_kept_pass_matches_cpu_and_two_passes(dtype, fp8, seed, monkeypatch):
    for n in kept_sizes(dtype):
        x = random_input((n // 8, 8), dtype, seed + n, non_finite=True, zero_row=True)
        q_cpu, s_cpu = per_tensor(x, fp8, 1)
        with monkeypatch.context() as m:
            m.setenv("FP8EXT_QUANT_KEEP", "1")
            (q, s), ran = kernels_run(lambda: per_tensor(x.cuda(), fp8, 1))
        assert KEPT_KERNEL in ran, n
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu), n
        with monkeypatch.context() as m:
            m.setenv("FP8EXT_QUANT_KEEP", "0")
            (q2, s2), ran = kernels_run(lambda: per_tensor(x.cuda(), fp8, 1))
        assert KEPT_KERNEL not in ran and same_bits(q, q2) and torch.equal(s, s2), n


# Taken with FP8EXT_QUANT_KEEP=auto from 16 MiB: fp32 4100 x 4100 (an earlier
# one-launch attempt got it wrong, bench/NOTES.md session 8), bf16 2048 x 8192,
# an all-zero tensor.
@pytest.mark.parametrize("shape,dtype,zeros", [((4100, 4100), torch.float32, False),
                                               ((2048, 8192), torch.bfloat16, False),
                                               ((4096, 4096), torch.bfloat16, True)], ids=str)
def test_cuda_per_tensor_kept_pass_auto_from_16_mib(shape, dtype, zeros, seed, monkeypatch):
    monkeypatch.setenv("FP8EXT_QUANT_KEEP", "auto")
    x = torch.zeros(shape, dtype=dtype) if zeros else random_input(shape, dtype, seed, non_finite=True)
    (q, s), ran = kernels_run(lambda: per_tensor(x.cuda()))
    assert KEPT_KERNEL in ran
    q_cpu, s_cpu = per_tensor(x)
    assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu)


# What the kernel cannot take goes to the two passes even when forced: a start
# 2 bytes off 16, a length of a whole number of elements but not of 16 bytes,
# strided rows, padded output columns.
def test_cuda_per_tensor_kept_pass_refuses_what_it_cannot_take(seed, monkeypatch):
    monkeypatch.setenv("FP8EXT_QUANT_KEEP", "1")
    base = random_input((1, 600 * 1024 + 8), torch.bfloat16, seed).cuda()
    cases = {"offset": (base[0, 1:600 * 1024 + 1].view(600, 1024), 0),
             "odd length": (base[0, :300 * 1027].view(300, 1027), 0),
             "strided rows": (base[0, :600 * 1024].view(600, 1024)[:, :1000], 0),
             "padded columns": (base[0, :600 * 1000].view(600, 1000), 16)}
    for name, (x, pad) in cases.items():
        (q, s), ran = kernels_run(lambda: per_tensor(x, pad=pad))
        assert KEPT_KERNEL not in ran, name
        q_cpu, s_cpu = per_tensor(x.cpu(), pad=pad)
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu), name


# The amax planted in the first tile, in the last (partial) one, in the kept
# tiles of a middle share and in the tiles it reads twice: every share must
# reach the grid barrier. A different magnitude each time, so every code changes
# between calls; with PDL on and off.
def test_cuda_per_tensor_kept_pass_amax_found_anywhere(seed, monkeypatch):
    monkeypatch.setenv("FP8EXT_QUANT_KEEP", "1")
    sms, tile = torch.cuda.get_device_properties(0).multi_processor_count, 16384
    n = sms * tile * 20 + 8 * 3
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n // 8, 8, generator=g).to(torch.bfloat16).cuda()
    share = n // sms
    spots = [0, n - 1, share * (sms // 2) + share - 5, share * (sms // 3) + 7, int(torch.randint(n, (1,), generator=g))]
    for i, where in enumerate(spots):
        for pdl in ["1", "0"]:
            monkeypatch.setenv("FP8EXT_PDL", pdl)
            big = -1000.0 * 2.0 ** (2 * i + int(pdl))
            planted = x.clone()
            planted.view(-1)[where] = big
            q, s = per_tensor(planted)
            assert s.item() == pytest.approx(-big / 448.0, rel=1e-6), (where, pdl)
            q_cpu, s_cpu = per_tensor(planted.cpu())
            assert torch.equal(s.cpu(), s_cpu) and same_bits(q, q_cpu), (where, pdl)


# Calls back to back without a sync (the workspace's zeroing, PDL-chained, between
# them), and two calls on two streams of different priorities at once: the
# blocks that run claim the shares, so neither waits for SMs the other holds.
def test_cuda_per_tensor_kept_pass_back_to_back_and_on_two_streams(seed, monkeypatch):
    monkeypatch.setenv("FP8EXT_QUANT_KEEP", "auto")
    shape = (4096, 4096)
    xs = [random_input(shape, torch.bfloat16, seed + i).cuda() * 2.0 ** i for i in range(4)]
    outs = [per_tensor(x) for x in xs]
    streams = [torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)]
    torch.cuda.synchronize()
    for _ in range(3):
        for st, x in zip(streams, xs[:2]):
            with torch.cuda.stream(st):
                outs.append(per_tensor(x))
    torch.cuda.synchronize()
    for i, (q, s) in enumerate(outs):
        q_cpu, s_cpu = per_tensor(xs[i if i < 4 else (i - 4) % 2].cpu())
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu), i


def replays_follow_a_falling_amax(shape, seed, steps=3):
    """per_tensor captured in a CUDA graph, then replayed on new data whose amax
    falls 4x a step and moves (last row and column, first row, the middle): a
    stale amax in the reused workspace, or one block's max lost, shows as a
    scale or codes other than the CPU's."""
    rows, cols = shape
    x = random_input(shape, torch.bfloat16, seed, outliers=False).cuda()
    per_tensor(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = per_tensor(x)
    for step in range(steps):
        new = random_input(shape, torch.bfloat16, seed + step + 1, outliers=False) * 4.0 ** (1 - step)
        r, c = [(rows - 1, cols - 1), (0, cols - 1), (rows // 2, cols // 2)][step % 3]
        new[r, c] = 4096.0 * 4.0 ** (1 - step)  # random_input stays below ~600 * 4 ** (1 - step)
        x.copy_(new.cuda())
        graph.replay()
        torch.cuda.synchronize()
        q_cpu, s_cpu = per_tensor(x.cpu())
        assert s_cpu.item() == pytest.approx(4096.0 * 4.0 ** (1 - step) / 448.0), step  # the planted max is the amax
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu), step


# Replays reuse the workspace (amax, counters): zeroed in the graph too; 20
# tiles per block, so the replays refill the ring and re-read.
def test_cuda_per_tensor_kept_pass_graph_replays(seed, monkeypatch):
    monkeypatch.setenv("FP8EXT_QUANT_KEEP", "1")  # read when the graph is captured
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    replays_follow_a_falling_amax((sms * 16384 * 20 // 4096 + 3, 4096), seed)


# The two-pass current scaling keeps nothing between calls: replays of one graph
# (the same workspace each time) with a falling amax give the CPU's scale.
def test_cuda_per_tensor_two_passes_graph_replays_with_falling_amax(seed):
    replays_follow_a_falling_amax((2048, 4100), seed, steps=4)  # past the one-pass kernel's 131072 elements


# Eager two-pass calls take their stream's amax slots in turn (csrc/torch/cuda/
# amax_slots.h): no zeroing kernel; each quantize pass zeroes the slot the next
# call takes. A slot left unzeroed would keep an earlier, larger amax, so every
# sequence here has its amax fall 16x a step, with no sync between calls.
def falling_inputs(shape, seed, steps):
    rows, cols = shape
    xs = []
    for step in range(steps):
        x = random_input(shape, torch.bfloat16, seed + step, outliers=False) * 16.0 ** (1 - step)
        r, c = [(rows - 1, cols - 1), (0, 0), (rows // 2, cols // 3)][step % 3]
        x[r, c] = 4096.0 * 16.0 ** (1 - step)  # above the rest: the planted value is the amax
        xs.append(x.cuda())
    return xs


def assert_per_tensor_matches_cpu(xs, outs):
    for i, (x, (q, s)) in enumerate(zip(xs, outs)):
        q_cpu, s_cpu = per_tensor(x.cpu())
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu), i


TWO_PASSES = (2048, 4100)  # past the one-pass kernel's 131072 elements, unaligned rows


def test_cuda_per_tensor_eager_calls_run_no_zeroing_kernel(seed, monkeypatch):
    x = falling_inputs(TWO_PASSES, seed, 1)[0]
    per_tensor(x)  # the stream's first call zeroes its new slots (a memset)
    (q, s), names = kernels_run(lambda: per_tensor(x))
    assert "amax_kernel" in names and "zero_workspace" not in names, names
    monkeypatch.setenv("FP8EXT_QUANT_ZERO_FREE", "0")
    (q0, s0), names = kernels_run(lambda: per_tensor(x))
    assert "zero_workspace" in names, names
    assert same_bits(q, q0) and torch.equal(s, s0)


def test_cuda_per_tensor_eager_calls_follow_a_falling_amax(seed, monkeypatch):
    xs = falling_inputs(TWO_PASSES, seed, 6)
    small = random_input((16, 4096), torch.bfloat16, seed).cuda() * 1e-3  # one pass: slots untouched
    outs, want = [], []
    for i, x in enumerate(xs):
        outs.append(per_tensor(x)); want.append(x)
        if i == 1:
            outs.append(per_tensor(small)); want.append(small)
        if i == 2:
            empty = torch.empty(0, 4100, dtype=torch.bfloat16, device="cuda")
            outs.append(per_tensor(empty)); want.append(empty)
        if i == 3:
            monkeypatch.setenv("FP8EXT_QUANT_ZERO_FREE", "0")  # one call with the zeroing kernel between
            outs.append(per_tensor(x)); want.append(x)
            monkeypatch.delenv("FP8EXT_QUANT_ZERO_FREE")
    torch.cuda.synchronize()
    assert_per_tensor_matches_cpu(want, outs)


def test_cuda_per_tensor_eager_calls_around_the_kept_kernel_and_a_graph(seed, monkeypatch):
    """The kept-share kernel and graph capture leave the slots alone (the
    capture takes the zeroing kernel's path); eager calls before, between and
    after still see no stale amax, and the graph's replays follow their own."""
    xs = falling_inputs(TWO_PASSES, seed, 6)
    outs = [per_tensor(xs[0])]
    monkeypatch.setenv("FP8EXT_QUANT_KEEP", "1")
    outs.append(per_tensor(xs[1]))
    monkeypatch.delenv("FP8EXT_QUANT_KEEP")
    outs.append(per_tensor(xs[2]))
    torch.cuda.synchronize()
    g_in = xs[0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out = per_tensor(g_in)
    outs.append(per_tensor(xs[3]))
    g_in.copy_(xs[4])
    graph.replay()
    outs.append(per_tensor(xs[5]))
    torch.cuda.synchronize()
    assert_per_tensor_matches_cpu(xs[:4] + [xs[5]], outs)
    assert_per_tensor_matches_cpu([xs[4]], [g_out])


def test_cuda_per_tensor_eager_calls_on_several_streams(seed):
    """Each stream has its own slots: two streams (and the default one) run
    falling sequences at once, unsynchronized with each other, at amaxes 1x, 2x
    and 4x apart, so a call that met another stream's amax would show it."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream(priority=-1)]
    seqs = [[x * 2.0**i for x in falling_inputs(TWO_PASSES, seed + 10 * i, 5)] for i in range(3)]
    torch.cuda.synchronize()
    outs = [[], [], []]
    for step in range(5):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                outs[i].append(per_tensor(seqs[i][step]))
        outs[2].append(per_tensor(seqs[2][step]))
    torch.cuda.synchronize()
    for i in range(3):
        assert_per_tensor_matches_cpu(seqs[i], outs[i])


def test_cuda_per_tensor_eager_calls_from_several_threads_on_one_stream(seed):
    """Host threads sharing a stream: the pair's lock keeps each call's slot
    and its parity flip together (the ops run without the GIL)."""
    import threading
    seqs = [[x * 2.0**i for x in falling_inputs(TWO_PASSES, seed + 10 * i, 4)] for i in range(4)]
    outs = [[] for _ in seqs]
    torch.cuda.synchronize()

    def run(i):
        for x in seqs[i]:
            outs[i].append(per_tensor(x))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(seqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for i, seq in enumerate(seqs):
        assert_per_tensor_matches_cpu(seq, outs[i])


# FP8EXT_POISON_WORKSPACE=1: the binding fills the per-tensor recipes' workspace
# with FLT_MAX before each call. One pass (16 x 4096), two passes (one and
# several x-blocks a row, unaligned), the empty tensor, and delayed scaling;
# the two passes read the workspace only without the stream's amax slots
# (FP8EXT_QUANT_ZERO_FREE=0, as under graph capture).
@pytest.mark.parametrize("zero_free", ["1", "0"])
@pytest.mark.parametrize("shape", [(16, 4096), (2048, 4100), (3, 1_500_000), (0, 4096)], ids=str)
def test_cuda_per_tensor_recipes_take_no_workspace_as_zeroed(shape, zero_free, seed, monkeypatch):
    monkeypatch.setenv("FP8EXT_POISON_WORKSPACE", "1")
    monkeypatch.setenv("FP8EXT_QUANT_ZERO_FREE", zero_free)
    x = random_input(shape, torch.bfloat16, seed, non_finite=True)
    q, s = per_tensor(x.cuda())
    q_cpu, s_cpu = per_tensor(x)
    assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu)
    recipe = DelayedScaling(amax_history_len=4)
    gpu, cpu = ScalingState.create(recipe, device="cuda"), ScalingState.create(recipe)
    for _ in range(2):
        q, s = quantize(x.cuda(), recipe, state=gpu)
        q_cpu, s_cpu = quantize(x, recipe, state=cpu)
        assert same_bits(q, q_cpu) and torch.equal(s.cpu(), s_cpu)
        assert torch.equal(gpu.amax_history.cpu(), cpu.amax_history)


def test_per_row_ops_refuse_2_to_the_31_rows_by_name():
    # One block per row: the grid's x dimension holds at most 2^31 - 1 (4 GiB of bf16 here).
    x = torch.empty(2**31, 1, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="quantize_per_row: x must have fewer than 2\\^31 rows"):
        torch.ops.fp8ext.quantize_per_row(x, torch.float8_e4m3fn, 0, False, 0)
    w = torch.ones(1, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="rms_norm_quantize_per_row: x must have fewer than 2\\^31 rows"):
        torch.ops.fp8ext.rms_norm_quantize_per_row(x, w, 1e-5, torch.float8_e4m3fn, 0, False, 0)
    del x
    # The next op runs cleanly: nothing was launched, no error is left behind.
    assert torch.equal(torch.ones(4, device="cuda").sum().cpu(), torch.tensor(4.0))


def test_cuda_delayed_state_must_not_overlap_and_block_rows_are_bounded():
    x = torch.full((2, 8), 2.0, device="cuda")
    h = torch.zeros(4, device="cuda")
    with pytest.raises(ValueError, match="amax_history and scale must not overlap"):
        torch.ops.fp8ext.quantize_delayed(x, h, h[0], torch.float8_e4m3fn, 0, False, True, 0)
    # 65535 blocks of 128 rows is the 128x128 kernel's grid.y: one row more is refused by name.
    too_many = torch.zeros(65535 * 128 + 1, 16, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="quantize_per_block: x must have at most 8388480 rows"):
        torch.ops.fp8ext.quantize_per_block(too_many, torch.float8_e4m3fn, 0, False, 0)
