"""The CUDA paged KV-cache kernels (csrc/attention) against the CPU reference
(python/fp8ext/ops/kv_cache_reference.py): the write bit for bit, the decode
attention within float32 accumulation error, on scattered pages."""
import pytest
import torch

import fp8ext
from fp8ext.ops import kv_cache_reference as ref

pytestmark = pytest.mark.gpu

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
CACHE_DTYPES = [E4M3, E5M2, torch.bfloat16, torch.float16]


# The kernel multiplies on the tensor cores with q and the softmax weights
# rounded to fp16 (bf16 for a bf16 cache) and fp32 accumulation: the relative
# error that costs on top of the query dtype's own rounding.
MMA_TOL = {E4M3: 2e-3, E5M2: 2e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def random_pool(pages, page_size, heads, dim, dtype, scale=2.0):
    return (torch.randn(pages, page_size, heads, dim) * scale).clamp(-400, 400).to(dtype)


def scattered_tables(lengths, page_size, num_pages, generator=None):
    """Each sequence gets distinct random pages; returns block_table [B, max_pages] int32 (unused
    entries -1, so a kernel reading past a sequence's length would give NaN) and seq_lens."""
    need = [-(-n // page_size) for n in lengths]
    order = torch.randperm(num_pages, generator=generator)
    width = max(1, max(need))
    table = torch.full((len(lengths), width), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = order[used:used + n].to(torch.int32)
        used += n
    assert used <= num_pages
    return table, torch.tensor(lengths, dtype=torch.int32)


def decode_on_cuda(q, k_pool, v_pool, args):
    """paged_decode_attention on the GPU for CPU inputs (the reference's argument tuple after the pools)."""
    return torch.ops.fp8ext.paged_decode_attention(q.cuda(), k_pool.cuda(), v_pool.cuda(),
                                                   *(a.cuda() if isinstance(a, torch.Tensor) else a for a in args))


@pytest.fixture(params=["pipelined", "registers"])
def decode_kernel(request, monkeypatch):
    """FP8 caches at head_dim 128 take the cp.async pipeline unless FP8EXT_DECODE_PIPELINE=0
    (read at each launch): the decode tests run both kernels."""
    monkeypatch.setenv("FP8EXT_DECODE_PIPELINE", "1" if request.param == "pipelined" else "0")
    return request.param


@pytest.mark.parametrize("dtype", CACHE_DTYPES)
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dim", [16, 48, 64, 80, 128, 256])  # the write takes any multiple of 16
def test_write_matches_reference_bit_for_bit(dtype, in_dtype, dim, seed):
    pages, page_size, heads, n = 12, 16, 4, 70
    k = (torch.randn(n, heads, dim) * 30).to(in_dtype)
    v = (torch.randn(n, heads, dim) * 30).to(in_dtype)
    k[0, 0, :3] = torch.tensor([float("nan"), float("inf"), 1e30]).to(in_dtype)  # saturation and NaN as the reference
    slots = torch.randperm(pages * page_size)[:n]
    slots[::7] = -1
    k_scale, v_scale = torch.rand(heads) + 0.1, torch.tensor(0.7)
    want_k = torch.zeros(pages, page_size, heads, dim, dtype=dtype)
    want_v = torch.zeros_like(want_k)
    ref.kv_cache_write(k, v, want_k, want_v, slots, k_scale, v_scale)
    got_k, got_v = want_k.new_zeros(want_k.shape).cuda(), want_v.new_zeros(want_v.shape).cuda()
    torch.ops.fp8ext.kv_cache_write(k.cuda(), v.cuda(), got_k, got_v, slots.cuda(), k_scale.cuda(), v_scale.cuda())
    for got, want in ((got_k, want_k), (got_v, want_v)):
        if dtype in (E4M3, E5M2):  # bit for bit, NaN codes and signed zeros included
            assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
        else:  # same values (16-bit NaN payloads may differ between CPU and GPU casts)
            torch.testing.assert_close(got.cpu().float(), want.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [E4M3, torch.bfloat16])
def test_write_reads_views_in_place_and_copies_the_rest(dtype, seed):
    """K and V split from a fused QKV output (tokens a whole qkv row apart, an odd row pitch
    too: the element-wise path) are read in place; a transposed or expanded view is copied.
    Every case writes what its contiguous copy writes."""
    pages, page_size, heads, dim, n = 8, 16, 4, 64, 37
    slots = torch.randperm(pages * page_size)[:n].cuda()
    scale = torch.tensor(0.05, device="cuda")
    for pad in (0, 8, 1):
        qkv = torch.randn(n, (8 + 2 * heads) * dim + pad, device="cuda", dtype=torch.bfloat16) * 10
        k = qkv[:, 8 * dim:(8 + heads) * dim].unflatten(1, (heads, dim))
        v = qkv[:, (8 + heads) * dim:(8 + 2 * heads) * dim].unflatten(1, (heads, dim))
        odd = (k, v.transpose(0, 1).contiguous().transpose(0, 1), v[:1].expand(n, -1, -1))
        for kk, vv in ((k, v), (odd[0], odd[1]), (odd[0], odd[2])):
            pools = [torch.zeros(pages, page_size, heads, dim, device="cuda", dtype=dtype) for _ in range(4)]
            torch.ops.fp8ext.kv_cache_write(kk, vv, pools[0], pools[1], slots, scale, scale)
            torch.ops.fp8ext.kv_cache_write(kk.contiguous(), vv.contiguous(), pools[2], pools[3], slots, scale, scale)
            assert torch.equal(pools[0].view(torch.uint8), pools[2].view(torch.uint8)), pad
            assert torch.equal(pools[1].view(torch.uint8), pools[3].view(torch.uint8)), pad


CASES = [  # (q heads, kv heads, head_dim, page_size)
    (8, 8, 128, 16), (32, 8, 128, 16), (32, 8, 128, 64), (16, 1, 64, 16), (12, 4, 256, 256), (4, 2, 64, 64),
    (24, 2, 128, 16),  # 12 query heads per KV head: a full block of 8 and a partial one of 4
    (32, 8, 128, 24), (8, 2, 64, 48)]  # pages of a size that is not a power of two: the division path


@pytest.mark.parametrize("q_heads,kv_heads,dim,page_size", CASES)
@pytest.mark.parametrize("dtype", CACHE_DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(q_heads, kv_heads, dim, page_size, dtype, num_splits, seed, decode_kernel):
    lengths = [1, page_size - 1, page_size, page_size + 1, 700, 0]
    table, lens = scattered_tables(lengths, page_size, 64)
    k_pool, v_pool = (random_pool(64, page_size, kv_heads, dim, dtype) for _ in range(2))
    k_scale, v_scale = torch.rand(kv_heads) + 0.2, torch.rand(kv_heads) + 0.2
    for q_dtype, tol in ((torch.bfloat16, 1e-2), (torch.float16, 2e-3), (torch.float32, 1e-4)):
        q = torch.randn(len(lengths), q_heads, dim).to(q_dtype)
        args = (table, lens, k_scale, v_scale, dim ** -0.5, num_splits, 0, 0.0)
        want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
        got = decode_on_cuda(q, k_pool, v_pool, args)
        assert got.dtype == q_dtype and got.shape == q.shape
        got = got.cpu()
        assert (got[-1] == 0).all()  # length 0
        for b in range(len(lengths) - 1):
            assert rel(got[b], want[b]) < max(tol, MMA_TOL[dtype]), (b, lengths[b], q_dtype)


@pytest.mark.parametrize("num_splits", [1, 4, 33])
def test_long_sequence_split_kv_with_window_and_softcap(num_splits, seed, decode_kernel):
    page_size, heads, dim, n = 64, 2, 128, 9000
    table, lens = scattered_tables([n, 300], page_size, 200)
    k_pool, v_pool = (random_pool(200, page_size, heads, dim, E4M3) for _ in range(2))
    scale = torch.tensor(0.05)
    q = torch.randn(2, 8, dim)
    for window, softcap in ((0, 0.0), (1000, 0.0), (0, 30.0), (257, 10.0)):
        args = (table, lens, scale, scale, dim ** -0.5, num_splits, window, softcap)
        want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
        got = decode_on_cuda(q, k_pool, v_pool, args)
        assert rel(got.cpu(), want) < MMA_TOL[E4M3], (window, softcap)


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_merge_of_more_splits_than_it_prefetches(dim, seed, decode_kernel):
    """150 splits: past the merge's one-round prefetch (16 per thread: 128, 64 and 32
    splits at head_dim 64, 128 and 256), so its tail loop runs; empty splits included."""
    page_size, heads = 16, 2
    table, lens = scattered_tables([3000, 100, 1], page_size, 200)
    k_pool, v_pool = (random_pool(200, page_size, heads, dim, E4M3) for _ in range(2))
    scale = torch.tensor(0.05)
    q = torch.randn(3, 4, dim)
    args = (table, lens, scale, scale, dim ** -0.5, 150, 0, 0.0)
    want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
    got = decode_on_cuda(q, k_pool, v_pool, args)
    assert rel(got.cpu(), want) < MMA_TOL[E4M3]


@pytest.mark.parametrize("num_splits", [1, 3])
def test_split_merge_with_very_negative_scores(num_splits, seed, decode_kernel):
    """Every score is -128 (each split's log2-sum-exp near -180): softmax is shift-invariant,
    so the output is the mean of V. A merge that takes max(0, lse) as its reference
    underflows every weight to 0 and returns 0 (the bug fixed in session 7)."""
    page_size, heads, dim = 16, 2, 128
    table, lens = scattered_tables([200, 37], page_size, 40)
    k_pool = torch.ones(40, page_size, heads, dim).to(E4M3)
    v_pool = random_pool(40, page_size, heads, dim, E4M3)
    q = -torch.ones(2, 8, dim)
    args = (table, lens, torch.tensor(1.0), torch.tensor(1.0), 1.0, num_splits, 0, 0.0)
    want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
    got = decode_on_cuda(q, k_pool, v_pool, args)
    assert torch.isfinite(want).all() and want.abs().max() > 0
    assert rel(got.cpu(), want) < MMA_TOL[E4M3]


# An FP8 cache at head_dim 128 is the one the pipelined kernel takes (the others run the register kernel
# whatever decode_kernel says); E4M3 has no infinity, so its planted inf is a NaN code; E5M2 keeps it.
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype,dim", [(torch.bfloat16, 64), (E4M3, 128), (E5M2, 128)], ids=str)
def test_non_finite_values_propagate_as_in_the_reference(num_splits, dtype, dim, seed, decode_kernel):
    page_size, heads = 16, 2
    table, lens = scattered_tables([40, 40, 40, 40], page_size, 16)
    k_pool = random_pool(16, page_size, heads, dim, dtype)
    v_pool = random_pool(16, page_size, heads, dim, dtype)
    k_pool[table[1, 1], 3, 0, 5] = float("nan")  # sequence 1, token 19, KV head 0: NaN score
    k_pool[table[2, 2], 0, 1, 0] = float("inf")  # sequence 2, token 32, KV head 1: an infinite score
    q = torch.randn(4, 4, dim)
    q[3, 2, 0] = float("nan")  # sequence 3, query head 2
    one = torch.ones(())
    args = (table, lens, one, one, 0.125, num_splits, 0, 0.0)
    want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
    got = decode_on_cuda(q, k_pool, v_pool, args)
    assert torch.isnan(want[1, :2]).all() and torch.isnan(want[3, 2]).all() and torch.isfinite(want[0]).all()
    got = got.cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert rel(got[finite], want[finite]) < MMA_TOL[dtype]


@pytest.mark.parametrize("dtype", [E4M3, torch.bfloat16])
def test_write_replays_in_a_cuda_graph(dtype, seed):
    """The write captured once, replayed on new K, V, slots and scales (all read from
    device memory at each replay), as the reference writes them."""
    pages, page_size, heads, dim, n = 12, 16, 4, 128, 9
    k, v = (torch.zeros(n, heads, dim, device="cuda") for _ in range(2))
    slots = torch.zeros(n, dtype=torch.int64, device="cuda")
    k_scale, v_scale = torch.ones(heads, device="cuda"), torch.ones((), device="cuda")
    k_pool, v_pool = (torch.zeros(pages, page_size, heads, dim, dtype=dtype, device="cuda") for _ in range(2))

    def write():
        torch.ops.fp8ext.kv_cache_write(k, v, k_pool, v_pool, slots, k_scale, v_scale)

    write()  # warm up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write()
    want_k, want_v = (torch.zeros(pages, page_size, heads, dim, dtype=dtype) for _ in range(2))
    for step in range(3):
        k.copy_(torch.randn(n, heads, dim) * 20)
        v.copy_(torch.randn(n, heads, dim) * 20)
        slots.copy_(torch.randperm(pages * page_size)[:n])
        slots[step] = -1
        k_scale.copy_(torch.rand(heads) + 0.1)
        v_scale.fill_(0.5 + step)
        graph.replay()
        ref.kv_cache_write(k.cpu(), v.cpu(), want_k, want_v, slots.cpu(), k_scale.cpu(), v_scale.cpu())
        assert torch.equal(k_pool.cpu().view(torch.uint8), want_k.view(torch.uint8)), step
        assert torch.equal(v_pool.cpu().view(torch.uint8), want_v.view(torch.uint8)), step


def poison_unattended(pool, table, lengths, window, page_size):
    """A copy of `pool` with NaN in every slot its sequences do not attend to: past
    each length in its last page, and before the window's start."""
    out = pool.clone()
    for b, n in enumerate(lengths):
        start = max(0, n - window) if window > 0 else 0
        for t in [*range(start), *range(n, -(-n // page_size) * page_size)]:
            out[table[b, t // page_size], t % page_size] = float("nan")
    return out


# Stale NaN (a reused page, an uninitialised pool) where a sequence does not attend must
# not reach its output: P = 0 times NaN is NaN, so the kernels must not load those rows.
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype,dim", [(E4M3, 128), (torch.bfloat16, 64), (torch.float16, 256)], ids=str)
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (100, 0.0), (45, 30.0)])
def test_stale_nan_where_a_sequence_does_not_attend_is_never_read(num_splits, dtype, dim, window, softcap, seed,
                                                                 decode_kernel):
    page_size, heads, lengths = 16, 2, [37, 300, 5]
    table, lens = scattered_tables(lengths, page_size, 32)
    k_pool, v_pool = (random_pool(32, page_size, heads, dim, dtype) for _ in range(2))
    q = torch.randn(len(lengths), 4, dim)
    args = (table, lens, torch.rand(heads) + 0.2, torch.tensor(0.7), dim ** -0.5, num_splits, window, softcap)
    want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
    k_bad, v_bad = (poison_unattended(p, table, lengths, window, page_size) for p in (k_pool, v_pool))
    got = decode_on_cuda(q, k_bad, v_bad, args).cpu()
    assert torch.isfinite(got).all(), [b for b in range(len(lengths)) if not torch.isfinite(got[b]).all()]
    assert rel(got, want) < MMA_TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype,dim", [(E4M3, 128), (torch.bfloat16, 64)], ids=str)
@pytest.mark.parametrize("bad_page", [-1, 10**6])
def test_pages_wholly_before_the_window_are_not_checked(num_splits, dtype, dim, bad_page, seed, decode_kernel):
    """With a window only the attended tokens' pages are read and checked (the
    header's contract): bad ids in the table before the window change nothing.
    (The CPU reference checks every page within the length, so it runs on the
    good table.)"""
    page_size, heads, window = 16, 2, 64
    table, lens = scattered_tables([300, 20], page_size, 32)
    k_pool, v_pool = (random_pool(32, page_size, heads, dim, dtype) for _ in range(2))
    q = torch.randn(2, 4, dim)
    one = torch.ones(())
    want = ref.paged_decode_attention(q, k_pool, v_pool, table, lens, one, one, dim ** -0.5, num_splits, window, 0.0)
    bad = table.clone()
    bad[0, :(300 - window) // page_size] = bad_page  # pages 0-13 end before token 236, the window's start
    got = decode_on_cuda(q, k_pool, v_pool, (bad, lens, one, one, dim ** -0.5, num_splits, window, 0.0)).cpu()
    assert torch.isfinite(got).all()
    assert rel(got, want) < MMA_TOL[dtype]


@pytest.mark.parametrize("dim", [64, 128])
def test_int64_tables_out_of_int32_range_give_nan(dim, seed, decode_kernel):
    page_size, heads = 16, 2
    k_pool, v_pool = (random_pool(8, page_size, heads, dim, E4M3).cuda() for _ in range(2))
    table = torch.tensor([[0, 1], [2, 2**32 + 3]], dtype=torch.int64, device="cuda")  # wraps to page 3 if narrowed
    lens = torch.tensor([20, 20], dtype=torch.int64, device="cuda")
    one = torch.ones((), device="cuda")
    out = torch.ops.fp8ext.paged_decode_attention(torch.randn(2, 4, dim, device="cuda"), k_pool, v_pool, table, lens,
                                                  one, one, 0.125, 1, 0, 0.0)
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).all()


@pytest.mark.parametrize("dim", [64, 128])
def test_bad_pages_and_lengths_give_nan_not_a_crash(dim, seed, decode_kernel):
    page_size, heads = 16, 2
    k_pool, v_pool = (random_pool(8, page_size, heads, dim, E4M3).cuda() for _ in range(2))
    table = torch.tensor([[0, 1], [2, 99], [3, 4]], dtype=torch.int32, device="cuda")  # page 99 is outside the pool
    lens = torch.tensor([20, 20, 33], dtype=torch.int32, device="cuda")  # 33 > 2 pages x 16
    one = torch.ones((), device="cuda")
    q = torch.randn(3, 4, dim, device="cuda")
    for splits in (1, 2):
        out = torch.ops.fp8ext.paged_decode_attention(q, k_pool, v_pool, table, lens, one, one, 0.125, splits, 0, 0.0)
        torch.cuda.synchronize()
        assert torch.isfinite(out[0]).all()
        assert torch.isnan(out[1]).all() and torch.isnan(out[2]).all()
    k = torch.randn(2, heads, dim, device="cuda")
    before = k_pool.clone()
    torch.ops.fp8ext.kv_cache_write(k, k, k_pool, v_pool, torch.tensor([5000, -3], device="cuda"), one, one)
    torch.cuda.synchronize()
    assert torch.equal(k_pool.view(torch.uint8), before.view(torch.uint8))  # out-of-range slots are skipped


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [1, 3])
def test_a_head_whose_every_score_is_minus_inf_gives_zeros_as_on_the_cpu(dtype, splits, seed):
    from test_kv_cache import minus_inf_keys_case
    q, k, v, table, lens = minus_inf_keys_case(dtype)
    one = torch.ones(())
    want = torch.ops.fp8ext.paged_decode_attention(q, k, v, table, lens, one, one, 0.125, splits, 0, 0.0)
    got = decode_on_cuda(q, k, v, (table, lens, one, one, 0.125, splits, 0, 0.0)).cpu()
    assert torch.equal(got[0, :4], torch.zeros(4, 64)) and torch.equal(want[0, :4], torch.zeros(4, 64))
    assert rel(got[0, 4:], want[0, 4:]) < MMA_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [1, 3])
def test_minus_inf_score_against_inf_in_v_gives_nan_whatever_the_splits(dtype, splits, seed):
    """A key whose score is -inf weighs 0, and 0 * inf in V is NaN in the reference's p @ v.
    A split holding only such keys (den 0) kept its output 0 and the NaN was lost once
    the splits were merged; so was it for a head whose every score is -inf."""
    page_size, heads, dim = 16, 2, 64
    table, lens = scattered_tables([3, 20], page_size, 8)
    k_pool = random_pool(8, page_size, heads, dim, dtype)
    v_pool = random_pool(8, page_size, heads, dim, dtype)
    q = torch.randn(2, heads, dim)
    q[:, :, 0] = 1.0
    k_pool[table[0, 0], 0, 0, 0] = float("-inf")  # sequence 0, head 0: token 0 alone in split 0 of 3
    v_pool[table[0, 0], 0, 0, 3] = float("inf")
    for t in range(20):  # sequence 1, head 1: every score -inf
        k_pool[table[1, t // page_size], t % page_size, 1, 0] = float("-inf")
    v_pool[table[1, 0], 5, 1, 7] = float("inf")
    one = torch.ones(())
    args = (table, lens, one, one, 0.125, splits, 0, 0.0)
    want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
    got = decode_on_cuda(q, k_pool, v_pool, args).cpu()
    nan = torch.zeros(2, heads, dim, dtype=torch.bool)
    nan[0, 0, 3] = nan[1, 1, 7] = True
    assert torch.equal(torch.isnan(want), nan)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[1, 1].nan_to_num(), torch.zeros(dim, dtype=got.dtype))
    assert rel(got[~nan], want[~nan]) < MMA_TOL[dtype]


def test_manager_on_cuda_matches_cpu_and_replays_in_a_cuda_graph(seed, decode_kernel):
    def build(device):
        torch.manual_seed(seed)  # the same cache contents on both devices
        cache = fp8ext.PagedKVCache(2, 4, 128, 64, 16, E4M3, device=device,
                                    scales=[{"k_scale": 0.02, "v_scale": 0.02}] * 2)
        for s, n in enumerate([5, 40, 17]):
            for layer in range(2):
                slots = cache.append(s, n) if layer == 0 else slots
                k = torch.randn(n, 4, 128).to(device)
                cache.write(layer, k, k * 0.5, slots)
        return cache

    gpu, cpu = build("cuda"), build("cpu")
    for layer in range(2):
        assert torch.equal(gpu.k[layer].cpu().view(torch.uint8), cpu.k[layer].view(torch.uint8))
    q = torch.randn(3, 16, 128)
    plan_gpu, plan_cpu = gpu.plan([0, 1, 2]), cpu.plan([0, 1, 2], num_sms=132)
    assert rel(gpu.attention(1, q.cuda(), plan_gpu).cpu(), cpu.attention(1, q, plan_cpu)) < MMA_TOL[E4M3]

    # Capture one decode step; append a token to every sequence, refill the plan in place, replay.
    q_gpu = q.cuda()
    plan = gpu.plan([0, 1, 2], out=None)
    plan.block_table = torch.zeros(3, 8, dtype=torch.int32, device="cuda")  # room to grow
    gpu.plan([0, 1, 2], out=plan)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gpu.attention(0, q_gpu, plan)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gpu.attention(0, q_gpu, plan)
    for _ in range(3):
        new = torch.randn(3, 4, 128, device="cuda")
        slots = torch.cat([gpu.append(s, 1) for s in range(3)])
        gpu.write(0, new, new, slots)
        gpu.plan([0, 1, 2], out=plan)
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, gpu.attention(0, q_gpu, plan)) < 1e-6


def test_compiles_fullgraph_on_cuda(seed):
    cache = fp8ext.PagedKVCache(1, 2, 64, 16, 16, E4M3, device="cuda", scales=[{"k_scale": 0.1, "v_scale": 0.1}])
    slots = cache.append(0, 30)
    k = torch.randn(30, 2, 64, device="cuda")
    plan = cache.plan([0])
    q = torch.randn(1, 4, 64, device="cuda")

    def step(k, q):
        torch.ops.fp8ext.kv_cache_write(k, k, cache.k[0], cache.v[0], slots, cache.k_scale[0], cache.v_scale[0])
        return torch.ops.fp8ext.paged_decode_attention(q, cache.k[0], cache.v[0], plan.block_table, plan.seq_lens,
                                                       cache.k_scale[0], cache.v_scale[0], 0.125, 2)

    eager = step(k, q)
    assert torch.equal(torch.compile(step, fullgraph=True)(k, q), eager)


def test_cuda_ops_refuse_overlapping_pools_and_oversized_grids():
    # Views of one buffer a page apart passed the data_ptr check, and V overwrote the next page's K;
    # grids past the hardware's y limit gave a generic "invalid argument".
    pool = torch.zeros(9, 16, 2, 64, dtype=E4M3, device="cuda")
    k = torch.randn(3, 2, 64, device="cuda")
    one = torch.ones((), device="cuda")
    slots = torch.tensor([0, 1, 2], device="cuda")
    with pytest.raises(ValueError, match="k_cache and v_cache must not overlap"):
        torch.ops.fp8ext.kv_cache_write(k, k, pool[:-1], pool[1:], slots, one, one)
    k_cache = torch.zeros(1, 1, 65536, 64, dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(1, 65536, 64, dtype=torch.bfloat16, device="cuda")
    table = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    lens = torch.ones(1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="q must have at most 65535 heads"):
        torch.ops.fp8ext.paged_decode_attention(q, k_cache, k_cache.clone(), table, lens, one, one, 0.125, 1, 0, 0.0)
    # An empty pool passed the tokens check (0 x page_size) with a page size past int32, which the
    # kernel truncates (16 from 2^32 + 16): it read the block table past its one entry (helper-34).
    empty = torch.zeros(0, 2**32 + 16, 2, 64, dtype=E4M3, device="cuda")
    q = torch.zeros(1, 2, 64, dtype=torch.bfloat16, device="cuda")
    lens = torch.full((1,), 1000, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="page_size must be below 2"):
        torch.ops.fp8ext.paged_decode_attention(q, empty, empty.clone(), table, lens, one, one, 0.125, 1, 0, 0.0)
