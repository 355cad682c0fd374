"""PagedKVCache (python/fp8ext/kv_cache.py) and the reference of its ops
(python/fp8ext/ops/kv_cache_reference.py), on the CPU. The attention is
checked against an independent float64 computation over the sequence's pages,
read through the manager's own page lists."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fp8ext
from fp8ext.kv_cache import (BLOCKS_PER_SM, MIN_TOKENS_PER_SPLIT, PagedKVCache, UnknownSequenceError, bytes_per_token,
                              capacity_tokens, plan_splits)
from fp8ext.ops import kv_cache_reference as ref
from test_kv_cache_cuda import poison_unattended, random_pool, scattered_tables  # (helpers only)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def make_cache(dtype=E4M3, heads=2, dim=64, pages=64, page_size=16, layers=1, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # uncalibrated FP8 scales
        return PagedKVCache(layers, heads, dim, pages, page_size, dtype, **kw)


def fill(cache, lengths, layer=0, scale=1.0, interleave=True):
    """Sequences 0.. of these lengths, written a few tokens at a time in turn so
    that their pages interleave; returns the float32 K/V each sequence was given."""
    data = {s: (torch.randn(n, cache.num_kv_heads, cache.head_dim) * scale,
                torch.randn(n, cache.num_kv_heads, cache.head_dim) * scale) for s, n in enumerate(lengths)}
    done = dict.fromkeys(data, 0)
    while any(done[s] < len(data[s][0]) for s in data):
        for s, (k, v) in data.items():
            step = min(len(k) - done[s], 5 if interleave else len(k))
            if step <= 0:
                continue
            slots = cache.append(s, step)
            cache.write(layer, k[done[s]:done[s] + step], v[done[s]:done[s] + step], slots)
            done[s] += step
    for s, n in enumerate(lengths):
        if n == 0:
            cache.append(s, 0)
    return data


def stored(cache, layer, seq):
    """A sequence's dequantized K and V in float64, read through its page list."""
    pages = cache._pages[seq]
    n = cache.length(seq)
    out = []
    for pool, scale in ((cache.k[layer], cache.k_scale[layer]), (cache.v[layer], cache.v_scale[layer])):
        rows = torch.cat([pool[p] for p in pages]) if pages else pool[:0].reshape(0, *pool.shape[2:])
        out.append(rows[:n].double() * scale.double()[:, None])
    return out


def attention_f64(q, k, v, scale, window=0, softcap=0.0):
    """q [H_q, D], k/v [T, H_kv, D] float64 -> [H_q, D]."""
    if window:
        k, v = k[-window:], v[-window:]
    if k.shape[0] == 0:
        return torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("hd,thd->ht", q.double(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    return torch.einsum("ht,thd->hd", torch.softmax(s, -1), v)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


# ---- sizing and planning ------------------------------------------------------------
def test_fp8_cache_holds_twice_the_tokens_of_bf16():
    args = (32, 8, 128)  # Llama-3.1-8B: layers, KV heads, head_dim
    assert bytes_per_token(*args, torch.bfloat16) == 2 * 32 * 8 * 128 * 2
    gib = 2**30
    assert capacity_tokens(gib, *args, E4M3) == 2 * capacity_tokens(gib, *args, torch.bfloat16)
    assert capacity_tokens(gib, *args, torch.bfloat16, page_size=16) == 8192
    assert make_cache(pages=10, page_size=16).memory_bytes() == 10 * 16 * 2 * 2 * 64


def test_plan_splits_fills_the_gpu_with_one_long_sequence():
    slots = BLOCKS_PER_SM * 132
    for batch, heads, length in ((1, 8, 131072), (8, 8, 32768), (1, 1, 131072), (1, 8, 32768)):
        blocks = batch * heads * plan_splits(batch, heads, length, num_sms=132)
        assert 0.9 * slots <= blocks <= slots, (batch, heads, length, blocks)  # one full wave
    # The choices the H200 runs of 2026-11-29 measured best.
    assert plan_splits(64, 8, 4096, num_sms=132) == 3  # 1536 blocks: 3.9 waves beat 512 blocks' 1.3
    assert plan_splits(256, 8, 1024, num_sms=132) == 1  # already 5 waves: splitting only adds merges
    # Batch 1 at a moderate context still spreads over the GPU, down to MIN_TOKENS_PER_SPLIT.
    assert plan_splits(1, 8, 4096, num_sms=132) == 4096 // MIN_TOKENS_PER_SPLIT
    assert plan_splits(1, 8, 300, num_sms=132) == 2
    assert plan_splits(1, 8, 0) == 1


def test_plan_splits_pipelined_few_sequences_take_two_blocks_per_sm():
    # One sequence on the pipelined FP8 kernel: 33 longer splits (two blocks per SM),
    # which the H200 sweep of 2026-12-01 measured 4-10% faster than 49.
    for length in (16384, 32768, 131072):
        assert plan_splits(1, 8, length, num_sms=132, pipelined=True) == 33
        assert plan_splits(1, 8, length, num_sms=132) == 49  # bf16 keeps three per SM
    assert plan_splits(2, 8, 32768, num_sms=132, pipelined=True) == 24  # not measured: three per SM
    assert plan_splits(1, 8, 4096, num_sms=132, pipelined=True) == 16  # short: MIN_TOKENS_PER_SPLIT decides
    # Batch 8 (64 pairs) keeps three per SM, as measured (6 splits: 143 us vs 161 at 4).
    assert plan_splits(8, 8, 32768, num_sms=132, pipelined=True) == plan_splits(8, 8, 32768, num_sms=132) == 6
    assert plan_splits(1, 8, 32768, num_sms=132, blocks_per_sm=3, pipelined=True) == 49  # explicit wins
    # The edge: 8 pairs on 132 SMs (<= 8.25) take two per SM, 9 pairs three.
    assert plan_splits(8, 1, 32768, num_sms=132, pipelined=True) == 33
    assert plan_splits(9, 1, 32768, num_sms=132, pipelined=True) == plan_splits(9, 1, 32768, num_sms=132) == 44


@pytest.mark.parametrize("dtype, dim, pipeline_env, splits", [
    (torch.float8_e4m3fn, 128, None, 33),  # the pipelined kernel: two blocks per SM
    (torch.float8_e5m2, 128, "1", 33),
    (torch.float8_e4m3fn, 128, "0", 49),  # FP8EXT_DECODE_PIPELINE=0: the register kernel, three per SM
    (torch.float8_e4m3fn, 64, None, 49),  # other head dims take the register kernel
    (torch.float8_e4m3fn, 256, None, 49),
    (torch.bfloat16, 128, None, 49),
])
def test_cache_plan_uses_its_kernels_rule(monkeypatch, dtype, dim, pipeline_env, splits):
    if pipeline_env is None:
        monkeypatch.delenv("FP8EXT_DECODE_PIPELINE", raising=False)
    else:
        monkeypatch.setenv("FP8EXT_DECODE_PIPELINE", pipeline_env)
    cache = make_cache(dtype, heads=8, dim=dim, pages=2048)
    cache.append("a", 32768)
    assert cache.takes_pipelined_decode() == (splits == 33)
    assert cache.plan(["a"], num_sms=132).num_splits == cache.plan_splits(1, 32768, 132) == splits


# ---- pages ------------------------------------------------------------------------
def test_append_hands_out_slots_page_by_page():
    cache = make_cache(pages=8, page_size=4)
    assert cache.append("a", 3).tolist() == [0, 1, 2]
    assert cache.append("b", 2).tolist() == [4, 5]  # page 1
    assert cache.append("a", 3).tolist() == [3, 8, 9]  # rest of page 0, then page 2
    assert cache.length("a") == 6 and cache.free_pages == 5
    cache.free("a")
    assert cache.free_pages == 7 and cache.length("a") == 0
    assert cache.append("c", 4).tolist() == [0, 1, 2, 3]  # freed pages come back
    with pytest.raises(UnknownSequenceError) as e:
        cache.free("a")
    assert str(e.value) == "unknown sequence 'a' (seq_id was never appended, or was freed)"  # not quoted again
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match=r"^unknown sequence 'zz' in seq_ids"):
        cache.plan(["c", "zz"])


def test_running_out_of_pages_raises_and_changes_nothing():
    cache = make_cache(pages=5, page_size=4)
    cache.append(0, 10)  # 3 pages
    cache.append(2, 4)  # 1 page: 1 left
    before = (cache.free_pages, cache.length(0), list(cache._pages[0]))
    with pytest.raises(RuntimeError, match="out of KV-cache pages: sequence 1 needs 2 more, 1 of 5"):
        cache.append(1, 5)
    with pytest.raises(RuntimeError, match="out of KV-cache pages: sequence 0 needs 2 more"):
        cache.append(0, 7)
    assert (cache.free_pages, cache.length(0), list(cache._pages[0])) == before
    assert 1 not in cache._pages
    limited = make_cache(pages=16, page_size=4, max_pages_per_seq=2)
    with pytest.raises(RuntimeError, match="max_pages_per_seq = 2"):
        limited.append(0, 9)


# ---- the write ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [E4M3, E5M2, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float32])
def test_write_stores_x_over_scale_in_the_slots(dtype, in_dtype, seed):
    heads, dim = 3, 64
    scales = [{"k_scale": torch.rand(heads) + 0.5, "v_scale": 0.25}]
    cache = PagedKVCache(1, heads, dim, 8, 16, dtype, scales=scales)
    k = (torch.randn(20, heads, dim) * 50).to(in_dtype)
    v = (torch.randn(20, heads, dim) * 50).to(in_dtype)
    slots = cache.append(0, 20)
    slots[3] = -1  # padding: skipped
    cache.write(0, k, v, slots)
    for x, pool, s in ((k, cache.k[0], cache.k_scale[0]), (v, cache.v[0], cache.v_scale[0])):
        want = (x.double() / s.double()[:, None]).float()  # IEEE float32 division
        if dtype in (E4M3, E5M2):
            limit = torch.finfo(dtype).max
            want = want.clamp(-limit, limit)
        want = want.to(dtype)
        got = pool.view(-1, heads, dim)[slots.clamp_min(0)]
        keep = slots >= 0
        assert torch.equal(got[keep].view(torch.uint8) if dtype in (E4M3, E5M2) else got[keep],
                           want[keep].view(torch.uint8) if dtype in (E4M3, E5M2) else want[keep])
    assert (cache.k[0].view(-1, heads, dim)[3].float() == 0).all()  # the skipped token's slot stays empty


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_write_saturates_finite_values_and_keeps_nan(dtype):
    cache = make_cache(dtype, heads=1, dim=16, pages=2, page_size=4)
    k = torch.tensor([[[1e9, -1e9, math.inf, -math.inf, math.nan] + [0.0] * 11]])
    cache.write(0, k, k, cache.append(0, 1))
    got = cache.k[0][0, 0, 0, :5].float()
    top = torch.finfo(dtype).max
    assert got[:4].tolist() == [top, -top, top, -top]
    assert math.isnan(got[4].item())


# ---- the attention -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [E4M3, E5M2, torch.bfloat16])
@pytest.mark.parametrize("q_heads,kv_heads", [(4, 4), (8, 2), (6, 1)])  # MHA, GQA, MQA
@pytest.mark.parametrize("dim", [64, 128])
def test_attention_over_scattered_pages(dtype, q_heads, kv_heads, dim, seed):
    page_size = 16
    cache = make_cache(dtype, heads=kv_heads, dim=dim, pages=64, page_size=page_size)
    lengths = [1, page_size - 1, page_size, page_size + 1, 100, 0]
    fill(cache, lengths)
    assert any(b - a != 1 for a, b in zip(cache._pages[4], cache._pages[4][1:]))  # scattered
    plan = cache.plan(range(len(lengths)))
    q = torch.randn(len(lengths), q_heads, dim, dtype=torch.bfloat16)
    out = cache.attention(0, q, plan)
    assert out.shape == q.shape and out.dtype == q.dtype
    for s in range(len(lengths)):
        k, v = stored(cache, 0, s)
        want = attention_f64(q[s], k, v, dim ** -0.5)
        if lengths[s] == 0:
            assert (out[s] == 0).all()
        else:
            assert rel(out[s], want) < 1e-2  # bf16 output rounding
    # In float32 the reference must match float64 closely: a 0.6% error passed the bf16 bound (helper-37).
    out32 = cache.attention(0, q.float(), plan)
    for s in range(len(lengths)):
        if lengths[s]:
            k, v = stored(cache, 0, s)
            assert rel(out32[s], attention_f64(q[s].float(), k, v, dim ** -0.5)) < 1e-5


def test_bf16_cache_matches_sdpa_on_a_contiguous_copy(seed):
    cache = make_cache(torch.bfloat16, heads=2, dim=64, pages=32, page_size=16)
    fill(cache, [77])
    k, v = stored(cache, 0, 0)
    q = torch.randn(1, 8, 64, dtype=torch.float32)
    got = cache.attention(0, q, cache.plan([0]))
    want = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0).double(),
                                          k.repeat_interleave(4, 1).transpose(0, 1).unsqueeze(0),
                                          v.repeat_interleave(4, 1).transpose(0, 1).unsqueeze(0))
    assert rel(got, want.squeeze(0).transpose(0, 1)) < 1e-5


def test_sliding_window_and_softcap(seed):
    cache = make_cache(E4M3, heads=2, dim=64, pages=32, page_size=16)
    fill(cache, [50, 10])
    q = torch.randn(2, 4, 64) * 4
    plan = cache.plan([0, 1])
    for window, softcap in ((20, 0.0), (0, 5.0), (20, 5.0)):
        out = cache.attention(0, q, plan, window=window, softcap=softcap)
        for s in range(2):
            k, v = stored(cache, 0, s)
            assert rel(out[s], attention_f64(q[s], k, v, 64 ** -0.5, window, softcap)) < 1e-5
    assert not torch.allclose(cache.attention(0, q, plan, window=20), cache.attention(0, q, plan))


def minus_inf_keys_case(dtype, dim=64, length=40, page_size=16):
    """Pools where every key of KV head 0 holds -inf at element 0 (a 16-bit cache
    keeps -inf) and a query whose heads 0-3 read it with q[0] = 1: each score of
    those heads is -inf. Returns q [1, 8, dim], the pools, block_table, seq_lens."""
    pages = -(-length // page_size)
    k = torch.randn(pages, page_size, 2, dim)
    k[:, :, 0, 0] = float("-inf")
    v = torch.randn(pages, page_size, 2, dim)
    q = torch.randn(1, 8, dim)
    q[0, :4, 0] = 1.0
    table = torch.randperm(pages, dtype=torch.int32).reshape(1, pages)
    return q, k.to(dtype), v.to(dtype), table, torch.tensor([length], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_head_whose_every_score_is_minus_inf_gives_zeros(dtype):
    """It attends to nothing (as a length-0 sequence, and as flash-attention kernels do) where
    torch.softmax gives NaN; the CUDA kernels do the same (test_kv_cache_cuda.py)."""
    q, k, v, table, lens = minus_inf_keys_case(dtype)
    one = torch.ones(())
    out = torch.ops.fp8ext.paged_decode_attention(q, k, v, table, lens, one, one, 0.125, 1, 0, 0.0)
    assert torch.equal(out[0, :4], torch.zeros(4, 64))
    keys = k[table[0].long()].reshape(-1, 2, 64)[:40].double()
    values = v[table[0].long()].reshape(-1, 2, 64)[:40].double()
    assert rel(out[0, 4:], attention_f64(q[0, 4:], keys[:, 1:], values[:, 1:], 0.125)) < 1e-6


def test_fp8_cache_error_e4m3_below_e5m2(seed):
    """Attention-output error of the cache formats against float64 on the
    unquantized K/V: keys with four outlier channels 10x the rest, per-head
    scales from the amax, 512 tokens, 8 KV heads and 8 queries (one query over
    2 heads failed E4M3 < E5M2 for 1 seed in 200: too few draws). Seeds 0-7
    gave E4M3 8.0-10.7%, E5M2 15.9-19.4%, bf16 0.54-0.68% (E4M3 has one more
    mantissa bit than E5M2); over seeds 0-199 E4M3 / E5M2 was at most 0.67."""
    heads, dim, n, queries = 8, 128, 512, 8
    k = torch.randn(n, heads, dim)
    k[..., :4] *= 10
    v = torch.randn(n, heads, dim)
    q = torch.randn(queries, 4 * heads, dim)
    want = torch.stack([attention_f64(q[i], k.double(), v.double(), dim ** -0.5) for i in range(queries)])
    errors = {}
    for dtype in (E4M3, E5M2, torch.bfloat16):
        if dtype == torch.bfloat16:
            scales = [{"k_scale": 1.0, "v_scale": 1.0}]
        else:
            top = torch.finfo(dtype).max
            scales = [{"k_scale": k.abs().amax(dim=(0, 2)) / top, "v_scale": v.abs().amax(dim=(0, 2)) / top}]
        cache = PagedKVCache(1, heads, dim, 64, 16, dtype, scales=scales)
        cache.write(0, k, v, cache.append(0, n))
        plan = cache.plan([0])
        got = torch.stack([cache.attention(0, q[i:i + 1], plan)[0] for i in range(queries)])
        errors[dtype] = rel(got, want)
    print({str(d): round(e, 4) for d, e in errors.items()})
    assert errors[torch.bfloat16] < 0.02 < errors[E4M3] < errors[E5M2], errors
    assert errors[E4M3] < 0.25 and errors[E5M2] < 0.5, errors


def test_uncalibrated_fp8_cache_warns_and_calibrated_scales_are_used():
    with pytest.warns(RuntimeWarning, match="no calibrated k_scale/v_scale"):
        PagedKVCache(1, 2, 64, 4, 16, E4M3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PagedKVCache(1, 2, 64, 4, 16, torch.bfloat16)  # no warning for 16-bit caches
    scales = {"model.layers.0.self_attn": {"k_scale": torch.tensor([2.0, 4.0]), "v_scale": torch.tensor([0.5])}}
    cache = PagedKVCache(1, 2, 64, 4, 16, E4M3, scales=scales)
    assert cache.k_scale[0].tolist() == [2.0, 4.0] and cache.v_scale[0].tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="one entry per layer"):
        PagedKVCache(2, 2, 64, 4, 16, E4M3, scales=scales)
    with pytest.raises(ValueError, match="finite and positive"):
        PagedKVCache(1, 2, 64, 4, 16, E4M3, scales=[{"k_scale": 0.0, "v_scale": 1.0}])
    with pytest.raises(TypeError, match="v_scale'\\] must be a real number or a real tensor, got a torch.complex64"):
        PagedKVCache(1, 2, 64, 4, 16, E4M3, scales=[{"k_scale": 1.0, "v_scale": torch.tensor([1 + 2j, 1 + 0j])}])


def test_scales_by_layer_index_follow_their_keys_not_their_order():
    one, two = {"k_scale": 1.0, "v_scale": 1.0}, {"k_scale": 2.0, "v_scale": 0.5}
    cache = PagedKVCache(2, 2, 64, 4, 16, E4M3, scales={1: two, 0: one})
    assert cache.k_scale[0].tolist() == [1.0, 1.0] and cache.k_scale[1].tolist() == [2.0, 2.0]
    assert cache.v_scale[1].tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match=r"scales by layer index must have the keys 0 \.\. 1, got \[0, 2\]"):
        PagedKVCache(2, 2, 64, 4, 16, E4M3, scales={0: one, 2: two})
    for bad in (2.0, torch.tensor(2.0), "k_scale"):
        with pytest.raises(TypeError, match="scales must be None, a list or a mapping"):
            PagedKVCache(1, 2, 64, 4, 16, E4M3, scales=bad)


def test_scales_by_name_follow_the_layer_numbers_in_the_names():
    """A checkpoint's keys come sorted as strings (layers.10 before layers.2): the layer numbers
    order them. Names that differ otherwise (an encoder and a decoder) keep the order given."""
    scales = {f"model.layers.{i}.self_attn": {"k_scale": float(i + 1), "v_scale": 1.0} for i in range(12)}
    cache = PagedKVCache(12, 2, 64, 4, 16, E4M3, scales=dict(sorted(scales.items())))
    assert [t[0].item() for t in cache.k_scale] == [float(i + 1) for i in range(12)]
    mixed = {"encoder.layers.1.attn": {"k_scale": 1.0, "v_scale": 1.0}, "decoder.layers.0.attn": {"k_scale": 2.0,
                                                                                                  "v_scale": 1.0}}
    cache = PagedKVCache(2, 2, 64, 4, 16, E4M3, scales=mixed)
    assert [t[0].item() for t in cache.k_scale] == [1.0, 2.0]


def test_plan_refills_in_place_for_graph_replay():
    cache = make_cache(pages=16, page_size=4)
    fill(cache, [5, 9])
    plan = cache.plan([0, 1])
    table, lens = plan.block_table, plan.seq_lens
    cache.append(0, 2)
    again = cache.plan([0, 1], out=plan)
    assert again is plan and again.block_table is table and again.seq_lens is lens
    assert plan.seq_lens.tolist() == [7, 9]
    cache.append(0, 20)
    with pytest.raises(ValueError, match="more than the plan's block table"):
        cache.plan([0, 1], out=plan)


def test_a_plan_made_before_an_append_or_free_is_refused():
    """A stale plan would read old lengths (dropping the new tokens) or, after a
    free, pages that another sequence now holds. plan(..., out=plan) refreshes it;
    a plan made by hand (a captured graph's, refilled by its owner) is not checked."""
    cache = make_cache(pages=16, page_size=4)
    fill(cache, [5, 9])
    q = torch.randn(2, 4, 64)
    plan = cache.plan([0, 1])
    before = cache.attention(0, q, plan)
    cache.free(1)
    cache.append(2, 9)  # takes sequence 1's pages
    with pytest.raises(RuntimeError, match="plan is stale"):
        cache.attention(0, q, plan)
    plan = cache.plan([0, 2])
    cache.append(0, 1)
    with pytest.raises(RuntimeError, match="plan is stale"):
        cache.attention(0, q, plan)
    cache.plan([0, 2], out=plan)
    assert plan.seq_lens.tolist() == [6, 9] and cache.attention(0, q, plan).shape == before.shape
    by_hand = fp8ext.DecodePlan([0, 2], plan.block_table.clone(), plan.seq_lens.clone(), plan.num_splits)
    cache.append(0, 1)
    cache.attention(0, q, by_hand)  # not checked: its owner refills it
    with pytest.raises(TypeError, match="plan must be a fp8ext.DecodePlan"):
        cache.attention(0, q, (plan.block_table, plan.seq_lens))


def test_plan_out_and_the_sizing_helpers_refuse_bad_input():
    cache = make_cache(pages=16, page_size=4)
    fill(cache, [5])
    good = cache.plan([0])
    for bad, match in [(dict(block_table=good.block_table[0]), "block_table must be an int32 \\[batch, max_pages\\]"),
                       (dict(block_table=good.block_table.float()), "block_table must be an int32"),
                       (dict(seq_lens=torch.zeros(3, dtype=torch.int32)), "seq_lens must be an int32 \\[1\\]"),
                       (dict(seq_lens=good.seq_lens.long()), "seq_lens must be an int32")]:
        out = fp8ext.DecodePlan(**{**good.__dict__, **bad})
        with pytest.raises(ValueError, match=match):
            cache.plan([0], out=out)
    with pytest.raises(TypeError, match="out must be a fp8ext.DecodePlan"):
        cache.plan([0], out=(good.block_table, good.seq_lens))
    with pytest.raises(ValueError, match="memory_bytes must be an int >= 0"):
        capacity_tokens(-1, 1, 2, 64, E4M3)
    with pytest.raises(ValueError, match="memory_bytes must be an int >= 0"):
        capacity_tokens(1e6, 1, 2, 64, E4M3)
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        bytes_per_token(-1, 2, 64, E4M3)
    with pytest.raises(TypeError, match="dtype must be a KV cache dtype"):
        bytes_per_token(1, 2, 64, torch.int8)
    # CUDA caches take the decode kernels' head dims: refused when built, not at the first decode.
    with pytest.raises(ValueError, match="head_dim must be one of \\(64, 128, 256\\) for a CUDA cache"):
        PagedKVCache(1, 2, 96, 4, 16, torch.bfloat16, device="cuda")


def test_direct_op_calls_refuse_what_the_cache_would():
    """The ops called directly (no PagedKVCache in front): scales that are not
    finite and positive, a slot given twice, one tensor as both pools, and the
    CUDA ops' limits on splits, window and batch, on the CPU too."""
    cache = make_cache(pages=8, page_size=16)
    cache.append(0, 20)
    plan = cache.plan([0])
    k = torch.randn(3, 2, 64)
    ones = cache.k_scale[0]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="k_scale must be finite and positive"):
            torch.ops.fp8ext.kv_cache_write(k, k, cache.k[0], cache.v[0], torch.tensor([0, 1, 2]),
                                            torch.full_like(ones, bad), ones)
    with pytest.raises(ValueError, match="must not give a slot twice"):
        torch.ops.fp8ext.kv_cache_write(k, k, cache.k[0], cache.v[0], torch.tensor([4, -1, 4]), ones, ones)
    torch.ops.fp8ext.kv_cache_write(k, k, cache.k[0], cache.v[0], torch.tensor([4, -1, -1]), ones, ones)  # -1 twice
    with pytest.raises(ValueError, match="separate pools"):
        torch.ops.fp8ext.kv_cache_write(k, k, cache.k[0], cache.k[0], torch.tensor([0, 1, 2]), ones, ones)
    pool = torch.zeros(9, 16, 2, 64)  # two views a page apart: V of page p would land on K of page p + 1
    with pytest.raises(ValueError, match="k_cache and v_cache must not overlap"):
        torch.ops.fp8ext.kv_cache_write(k, k, pool[:-1], pool[1:], torch.tensor([0, 1, 2]), ones, ones)

    def decode(q=torch.randn(1, 4, 64), table=plan.block_table, lens=plan.seq_lens, splits=1, window=0):
        return torch.ops.fp8ext.paged_decode_attention(q, cache.k[0], cache.v[0], table, lens, ones, ones, 0.125,
                                                       splits, window, 0.0)
    with pytest.raises(ValueError, match="num_splits must be in \\[1, 65535\\]"):
        decode(splits=65536)
    with pytest.raises(ValueError, match="window must be in \\[0, 2\\^31\\)"):
        decode(window=2**31)
    batch = 65536
    with pytest.raises(ValueError, match="batch must be at most 65535"):
        decode(torch.zeros(batch, 2, 64), plan.block_table.expand(batch, -1), plan.seq_lens.expand(batch))


# ---- errors, compile (opcheck: tests/test_ops_registration.py) ---------------------------------------------------------
def test_bad_input_raises_clear_errors():
    cache = make_cache(pages=8, page_size=16)
    fill(cache, [20])
    plan = cache.plan([0])
    q = torch.randn(1, 4, 64)
    ops = torch.ops.fp8ext
    args = lambda **kw: {**dict(q=q, k_cache=cache.k[0], v_cache=cache.v[0], block_table=plan.block_table,  # noqa: E731
                                seq_lens=plan.seq_lens, k_scale=cache.k_scale[0], v_scale=cache.v_scale[0],
                                softmax_scale=0.125), **kw}
    with pytest.raises(TypeError, match="q must be bfloat16, float16 or float32"):
        ops.paged_decode_attention(**args(q=q.to(torch.int32)))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ops.paged_decode_attention(**args(q=torch.randn(1, 3, 64)))
    with pytest.raises(ValueError, match="seq_lens must be in"):
        ops.paged_decode_attention(**args(seq_lens=torch.tensor([33], dtype=torch.int32)))
    with pytest.raises(ValueError, match="page ids outside"):
        ops.paged_decode_attention(**args(block_table=torch.tensor([[0, 8]], dtype=torch.int32)))
    with pytest.raises(ValueError, match="k_scale must hold one value or one per KV head"):
        ops.paged_decode_attention(**args(k_scale=torch.ones(3)))
    with pytest.raises(TypeError, match="k_cache must be float8_e4m3fn"):
        ops.paged_decode_attention(**args(k_cache=cache.k[0].double(), v_cache=cache.v[0].double()))
    k = torch.randn(2, 2, 64)
    with pytest.raises(ValueError, match="slots outside"):
        cache.write(0, k, k, torch.tensor([0, 8 * 16]))
    with pytest.raises(ValueError, match="k must be \\[num_tokens, 2, 64\\]"):
        cache.write(0, torch.randn(2, 2, 32), torch.randn(2, 2, 32), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="slot_mapping must be int32/int64"):
        cache.write(0, k, k, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="layer must be an int in"):
        cache.write(1, k, k, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="dtype must be"):
        PagedKVCache(1, 2, 64, 4, 16, torch.float64)
    with pytest.raises(ValueError, match="num_tokens must be a non-negative int"):
        cache.append(0, -1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kw, match", [
    (dict(softcap=float("inf")), "softcap must be finite and >= 0"),
    (dict(softcap=float("nan")), "softcap must be finite and >= 0"),
    (dict(softcap=-1.0), "softcap must be finite and >= 0"),
    (dict(softmax_scale=float("nan")), "softmax_scale must be finite"),
    (dict(softcap=1e39), "softcap must be finite and >= 0"),  # finite as a double, inf in float32
    (dict(softmax_scale=-1e300), "softmax_scale must be finite"),
])
def test_non_finite_attention_settings_are_refused(device, kw, match):
    cache = make_cache(pages=8, page_size=16, device=device)
    cache.append(0, 20)
    plan = cache.plan([0])
    args = dict(softmax_scale=0.125, num_splits=plan.num_splits, window=0, softcap=0.0) | kw
    with pytest.raises(ValueError, match=match):
        torch.ops.fp8ext.paged_decode_attention(torch.randn(1, 4, 64, device=device), cache.k[0], cache.v[0],
                                                plan.block_table, plan.seq_lens, cache.k_scale[0],
                                                cache.v_scale[0], **args)


@pytest.mark.parametrize("kw, match", [
    (dict(window=True), "window must be an int"),  # the op would take it as window=1
    (dict(window=2.0), "window must be an int"),
    (dict(softcap=True), "softcap must be a finite int or float"),
    (dict(softcap="2"), "softcap must be a finite int or float"),  # float() would take it
    (dict(softmax_scale="0.5"), "softmax_scale must be a finite int or float"),
    (dict(softmax_scale=False), "softmax_scale must be a finite int or float"),
])
def test_attention_refuses_bools_and_strings_for_numbers(kw, match):
    """PagedKVCache.attention checks its numbers' types before the op sees them (helper-60)."""
    cache = make_cache(pages=8, page_size=16)
    cache.append(0, 20)
    plan = cache.plan([0])
    with pytest.raises(ValueError, match=match):
        cache.attention(0, torch.randn(1, 4, 64), plan, **kw)
    hand_made = fp8ext.DecodePlan(plan.seq_ids, plan.block_table, plan.seq_lens, True)
    with pytest.raises(ValueError, match="plan.num_splits must be an int, got True"):
        cache.attention(0, torch.randn(1, 4, 64), hand_made)
    assert cache.attention(0, torch.randn(1, 4, 64), plan, softmax_scale=1, softcap=30, window=5).shape == (1, 4, 64)


def test_compiles_fullgraph(seed):
    cache = make_cache(pages=8, page_size=16)
    data = fill(cache, [20, 3])
    plan = cache.plan([0, 1])
    q = torch.randn(2, 4, 64)
    k, v = data[1]

    def step(q, k, v, slots):
        torch.ops.fp8ext.kv_cache_write(k, v, cache.k[0], cache.v[0], slots, cache.k_scale[0], cache.v_scale[0])
        return torch.ops.fp8ext.paged_decode_attention(q, cache.k[0], cache.v[0], plan.block_table, plan.seq_lens,
                                                       cache.k_scale[0], cache.v_scale[0], 0.125, plan.num_splits)

    slots = torch.tensor([-1, -1, -1], dtype=torch.int64)  # rewrite nothing: the result must not change
    eager = step(q, k, v, slots)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, slots)
    assert torch.equal(compiled, eager)


# ---- the reference's properties the GPU tests hold the kernels to (tests/test_kv_cache_cuda.py) ----------------------
# There they are checked only where a GPU runs; here CI pins them on the reference itself.
def test_reference_with_very_negative_scores_gives_the_mean_of_v():
    """Every score -128 (a log-sum-exp near -180): softmax is shift-invariant, so each
    output is the mean of its sequence's V, not 0. The reference has no splits (num_splits
    is only range-checked): the kernels' split merge of such scores (session 7's bug) is
    tested on the GPU by test_split_merge_with_very_negative_scores."""
    page_size, heads, dim, lengths = 16, 2, 128, [200, 37]
    table, lens = scattered_tables(lengths, page_size, 40)
    k_pool = torch.ones(40, page_size, heads, dim).to(E4M3)
    v_pool = random_pool(40, page_size, heads, dim, E4M3)
    got = ref.paged_decode_attention(-torch.ones(2, 8, dim), k_pool, v_pool, table, lens, torch.tensor(1.0),
                                     torch.tensor(1.0), 1.0, 1, 0, 0.0)
    for b, n in enumerate(lengths):
        v = torch.stack([v_pool[table[b, t // page_size], t % page_size] for t in range(n)]).double()
        want = v.mean(0).repeat_interleave(4, dim=0)  # [heads * 4 query heads, dim]
        assert torch.allclose(got[b].double(), want, rtol=1e-5, atol=1e-6), b


@pytest.mark.parametrize("dtype,dim", [(torch.bfloat16, 64), (E4M3, 128), (E5M2, 128)], ids=str)
def test_reference_puts_nan_only_where_a_nan_is_attended(dtype, dim, seed):
    """A NaN key reaches its KV head's query heads of its sequence only; a NaN query only
    its own head; the others stay finite."""
    page_size, heads = 16, 2
    table, lens = scattered_tables([40, 40, 40, 40], page_size, 16)
    k_pool, v_pool = (random_pool(16, page_size, heads, dim, dtype) for _ in range(2))
    k_pool[table[1, 1], 3, 0, 5] = float("nan")  # sequence 1, token 19, KV head 0
    q = torch.randn(4, 4, dim)
    q[3, 2, 0] = float("nan")  # sequence 3, query head 2
    one = torch.ones(())
    got = ref.paged_decode_attention(q, k_pool, v_pool, table, lens, one, one, 0.125, 1, 0, 0.0)
    nan = torch.zeros(4, 4, dtype=torch.bool)
    nan[1, :2] = nan[3, 2] = True
    assert torch.equal(torch.isnan(got).any(-1), nan)
    assert torch.isnan(got[nan]).all() and torch.isfinite(got[~nan]).all()


@pytest.mark.parametrize("dtype,dim", [(E4M3, 128), (torch.bfloat16, 64), (torch.float16, 256)], ids=str)
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (100, 0.0), (45, 30.0)])
def test_reference_never_reads_where_a_sequence_does_not_attend(dtype, dim, window, softcap, seed):
    """NaN past each length and before the window's start changes nothing, bit for bit."""
    page_size, heads, lengths = 16, 2, [37, 300, 5]
    table, lens = scattered_tables(lengths, page_size, 32)
    k_pool, v_pool = (random_pool(32, page_size, heads, dim, dtype) for _ in range(2))
    q = torch.randn(len(lengths), 4, dim)
    args = (table, lens, torch.rand(heads) + 0.2, torch.tensor(0.7), dim ** -0.5, 3, window, softcap)
    want = ref.paged_decode_attention(q, k_pool, v_pool, *args)
    k_bad, v_bad = (poison_unattended(p, table, lengths, window, page_size) for p in (k_pool, v_pool))
    assert torch.equal(ref.paged_decode_attention(q, k_bad, v_bad, *args), want)
    assert torch.isfinite(want).all()
