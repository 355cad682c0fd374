"""Programmatic dependent launch (csrc/include/fp8ext/cuda_launch.h): on Hopper
the quantize and GEMM kernels launch before the kernel ahead of them has
finished and wait for it on the device. A missing wait is a race, so a chain
of layers (quantize, GEMM, quantize, GEMM, ...), run eagerly and replayed from
a CUDA graph, must give bit for bit what it gives with PDL off (FP8EXT_PDL=0,
read at each launch)."""
import contextlib

import pytest
import torch
from torch import nn

import fp8ext
from cuda_graphs import capture

pytestmark = pytest.mark.gpu

WIDTHS = [512, 1024, 256, 2048, 512]  # a chain of linears, K and N varying layer to layer


@contextlib.contextmanager
def env(**values):
    """Sets environment variables the library reads at each launch, for the block."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in values.items():
            mp.setenv(name, value)
        yield


def pdl(on: bool):
    return env(FP8EXT_PDL="1" if on else "0")


def chain(recipe, seed):
    torch.manual_seed(seed)  # the same weights for both launch modes
    model = nn.Sequential(*(nn.Linear(k, n) for k, n in zip(WIDTHS, WIDTHS[1:]))).to("cuda", torch.bfloat16)
    fp8ext.convert(model, recipe, keep_lm_head=False)
    assert all(isinstance(m, fp8ext.FP8Linear) for m in model)
    return model


RECIPES = {"current": fp8ext.CurrentScaling, "row-wise": fp8ext.RowWise, "delayed": fp8ext.DelayedScaling,
           "block-wise": fp8ext.BlockWise}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("m", [1, 16, 300])  # 300 rows: per-tensor takes its two-pass path
def test_pdl_chain_matches_plain_launches(recipe, m, seed):
    x = torch.randn(m, WIDTHS[0], device="cuda", dtype=torch.bfloat16)
    steps = 3  # delayed scaling's history moves each step: the sequences must match step by step
    with pdl(False), torch.no_grad():
        plain_model = chain(RECIPES[recipe](), seed)
        plain = [plain_model(x).clone() for _ in range(steps)]
    with pdl(True), torch.no_grad():
        model = chain(RECIPES[recipe](), seed)
        eager = [model(x).clone() for _ in range(steps)]
    for got, want in zip(eager, plain):
        assert torch.isfinite(want).all()
        assert torch.equal(got, want)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("m", [16, 300])  # 300 rows: per-tensor takes its two-pass path (zeroing, amax, quantize)
def test_pdl_chain_in_a_cuda_graph(recipe, m, seed):
    x = torch.randn(m, WIDTHS[0], device="cuda", dtype=torch.bfloat16)
    calls, replays = 4, 5
    with pdl(False), torch.no_grad():  # delayed scaling's history moves each call: compare call by call
        plain_model = chain(RECIPES[recipe](), seed)
        plain = [plain_model(x).clone() for _ in range(1 + calls * replays)]
    with pdl(True), torch.no_grad():
        model = chain(RECIPES[recipe](), seed)
        # One warm-up call outside the graph (call 0), then the calls back to
        # back, each layer's input the previous layer's output.
        graph, outs = capture(lambda: [model(x) for _ in range(calls)], warm_up=lambda: model(x))
        for r in range(replays):
            graph.replay()
            torch.cuda.synchronize()
            for j, out in enumerate(outs):
                assert torch.equal(out, plain[1 + r * calls + j]), (r, j)


# The swap-AB GEMMs' L2 prefetch of their weight before the PDL wait (csrc/gemm/
# weight_prefetch.h: 4 MiB over the grid by default for per-tensor/row-wise,
# none for block-wise) and the optional early launch of the next kernel. Both
# are hints: the default, none, part of each row (1 MiB), whole rows (64 MiB
# over 2048 x 2048 weights), with and without the early launch, a chain
# replayed from a graph gives what it gives with PDL off.
PREFETCH_SETTINGS = [{}, {"FP8EXT_GEMM_PREFETCH_MB": "0"}, {"FP8EXT_GEMM_PREFETCH_MB": "1"},
                     {"FP8EXT_GEMM_PREFETCH_MB": "64"}, {"FP8EXT_EARLY_LAUNCH": "1"},
                     {"FP8EXT_GEMM_PREFETCH_MB": "4", "FP8EXT_EARLY_LAUNCH": "1"}]


@pytest.mark.parametrize("recipe", ["row-wise", "block-wise"])
# M = 1: row-wise runs the GEMV, block-wise swap-AB 128x16; 16 and 64: swap-AB 64x16 / 64x64 (row-wise),
# 128x16 / 128x64 (block-wise).
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("setting", range(len(PREFETCH_SETTINGS)))
def test_weight_prefetch_and_early_launch_change_nothing(recipe, m, setting, seed):
    widths = [2048, 2048, 4096, 2048]
    model = nn.Sequential(*(nn.Linear(k, n) for k, n in zip(widths, widths[1:]))).to("cuda", torch.bfloat16)
    fp8ext.convert(model, RECIPES[recipe](), keep_lm_head=False)
    x = torch.randn(m, widths[0], device="cuda", dtype=torch.bfloat16)
    with pdl(False), torch.no_grad():
        want = model(x).clone()
    with env(FP8EXT_PDL="1", **PREFETCH_SETTINGS[setting]), torch.no_grad():
        assert torch.equal(model(x), want)
        graph, outs = capture(lambda: [model(x) for _ in range(3)])
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            for out in outs:
                assert torch.equal(out, want)


@pytest.mark.parametrize("setting", [{"FP8EXT_GEMM_PREFETCH_MB": "0"}, {"FP8EXT_GEMM_PREFETCH_MB": "64"},
                                     {"FP8EXT_GEMM_PREFETCH_MB": "64", "FP8EXT_EARLY_LAUNCH": "1"}])
@pytest.mark.parametrize("m", [16, 64])
def test_weight_prefetch_past_one_wave_on_a_strided_weight(m, setting, seed):
    """133 row tiles of 64 for 132 SMs (the last one partial): with a budget that
    covers them, CTAs prefetch a second tile and the row guard cuts the last;
    K = 144 (not a multiple of 128) and a weight whose rows are 176 bytes apart.
    The same bits as the default, and the float64 reference's values."""
    n, k = 8488, 144
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    storage = (torch.randn(n, k + 32, device="cuda") * 2).to(torch.float8_e4m3fn)
    b = storage[:, :k]  # row stride 176: a multiple of 16, larger than K
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    with env(FP8EXT_PDL="1"):
        want = fp8ext.scaled_mm(a, b, sa, sb)
    with env(FP8EXT_PDL="1", **setting):
        got = [fp8ext.scaled_mm(a, b, sa, sb) for _ in range(3)]  # back to back: PDL chains them
    ref = (a.double() * sa.double()[:, None]) @ (b.double() * sb.double()[:, None]).t()
    assert ((want.double() - ref).norm() / ref.norm()).item() < 1e-2
    for g in got:
        assert torch.equal(g, want)


@pytest.mark.parametrize("m", [48, 300])  # the cooperative block-wise kernels: kSwapMedium / split-K, kLarge
def test_blockwise_gemm_waits_for_weight_scales_written_just_before(m, seed):
    """Weights quantized into 128x128 blocks right before the block-wise GEMM, in one
    stream: the GEMM launches early (PDL) and must wait before it reads any block
    scale. CUTLASS 4.2's cooperative kernel did not make its scale-copying warp
    wait (helper-36, session 45), so the first K blocks' scales could be the stale
    contents of the buffer, which the caching allocator hands out again each
    round; the weight's scale changes from round to round."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    n, k = 8192, 8192  # a quantize kernel long enough for the GEMM's first blocks to start while it writes
    recipe = fp8ext.BlockWise()
    qa, sa = fp8ext.quantize(torch.randn(m, k, device="cuda", generator=g).bfloat16(), recipe, "activation")
    for round_ in range(6):
        w = (torch.randn(n, k, device="cuda", generator=g) * 2.0 ** round_).bfloat16()
        torch.cuda.synchronize()
        with pdl(True):
            qw, sw = fp8ext.quantize(w, recipe, "weight")
            got = fp8ext.scaled_mm(qa, qw, sa, sw, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        with pdl(False):
            want = fp8ext.scaled_mm(qa, qw, sa, sw, out_dtype=torch.bfloat16)
        assert torch.isfinite(want).all()
        assert torch.equal(got, want), f"round {round_}: {(got != want).sum().item()} elements differ"
        del qw, sw, got, want


@pytest.mark.parametrize("recipe", ["row-wise", "block-wise"])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_pdl_through_the_padded_gemm_path(recipe, m, seed):
    """K and N the kernels cannot take (4100 -> 1001 -> 520): each GEMM copies its
    operands into padded buffers right after the quantize kernel that wrote
    them, and drops D's padded columns into the output the next quantize reads.
    With PDL those copies launch early and must wait. Eager and replayed from a
    CUDA graph, the chain gives bit for bit what it gives with PDL off."""
    torch.manual_seed(seed)
    rec = RECIPES[recipe]()
    weights = [fp8ext.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), rec, "weight")
               for n, k in ((1001, 4100), (520, 1001))]
    x = torch.randn(m, 4100, device="cuda", dtype=torch.bfloat16)

    def layers():
        h = x
        for w, w_scale in weights:
            q, scale = fp8ext.quantize(h, rec, "activation")
            h = fp8ext.scaled_mm(q, w, scale, w_scale)
        return h

    with pdl(False):
        plain = layers().clone()
    with pdl(True):
        assert torch.isfinite(plain).all() and torch.equal(layers(), plain)
        graph, out = capture(layers)
        for step in range(2):
            x.copy_(torch.randn(m, 4100, device="cuda", dtype=torch.bfloat16) * (step + 2))
            graph.replay()
            torch.cuda.synchronize()
            with pdl(False):
                assert torch.equal(out, layers()), step
