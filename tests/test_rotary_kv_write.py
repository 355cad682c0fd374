"""The KV-cache write fused with RoPE (op kv_cache_write_rotary,
PagedKVCache.write_rotary): q and K of a fused QKV output rotated, K and V
written. Against Hugging Face Llama's RoPE written out and the plain write, bit
for bit, on the CPU and (marked tests) on the GPU; and through the serving
engine's decode step, which uses it unless FP8EXT_FUSED_ROPE=0."""
import dataclasses

import pytest
import torch

from fp8ext.cuda_graphs import capture
from fp8ext.kv_cache import PagedKVCache
from fp8ext.serving.layers import Rotary
from quant_cases import same_bits

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
each_device = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def hf_rope(x, positions, theta=10000.0):
    """transformers' apply_rotary_pos_emb for one tensor [T, H, D], in x's dtype: tables from
    float32 angles cast to x's dtype, then q * cos + rotate_half(q) * sin."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    emb = torch.cat([positions.float()[:, None] * inv_freq[None, :]] * 2, dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]
    half = dim // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def case(tokens, q_heads, kv_heads, dim, dtype, cache_dtype, seed, device):
    """qkv, tables, a cache with random slots (some -1) and per-head scales."""
    g = torch.Generator().manual_seed(seed)
    cols = (q_heads + 2 * kv_heads) * dim
    qkv = (torch.randn(tokens, cols, generator=g) * 3).to(dtype)
    positions = torch.randint(0, 40000, (tokens,), generator=g)
    cos, sin = (t.reshape(tokens, dim) for t in Rotary(dim, 10000.0).tables(positions, dtype))
    page_size, pages = 16, -(-tokens // 16) + 2
    cache = PagedKVCache(1, kv_heads, dim, pages, page_size, cache_dtype,
                         scales=[{"k_scale": torch.rand(kv_heads, generator=g) * 0.02 + 0.01,
                                  "v_scale": torch.rand(kv_heads, generator=g) * 0.02 + 0.01}])
    slots = torch.randperm(pages * page_size, generator=g)[:tokens]
    slots[torch.rand(tokens, generator=g) < 0.2] = -1
    return qkv, positions, cos, sin, cache, slots


def padded_rows(qkv, row_pad, device):
    """qkv on `device` as a view whose rows are row_pad elements further apart than its width
    (Tensor.to would make a strided view contiguous)."""
    base = torch.zeros(qkv.shape[0], qkv.shape[1] + row_pad, dtype=qkv.dtype, device=device)
    base[:, :qkv.shape[1]] = qkv.to(device)
    return base[:, :qkv.shape[1]]


def expected(qkv, positions, q_heads, cache, slots):
    """HF's RoPE on q and K, then the plain write (on the CPU)."""
    kv_heads, dim = cache.num_kv_heads, cache.head_dim
    q, k, v = qkv.split((q_heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q = hf_rope(q.reshape(-1, q_heads, dim), positions)
    cache.write(0, hf_rope(k.reshape(-1, kv_heads, dim), positions), v.reshape(-1, kv_heads, dim), slots)
    return q


def to(cache, device):
    moved = PagedKVCache(1, cache.num_kv_heads, cache.head_dim, cache.num_pages, cache.page_size, cache.dtype,
                         device=device, scales=[{"k_scale": cache.k_scale[0], "v_scale": cache.v_scale[0]}])
    moved.k[0].copy_(cache.k[0])
    moved.v[0].copy_(cache.v[0])
    return moved


@each_device
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("cache_dtype", [E4M3, E5M2, torch.bfloat16], ids=str)
def test_matches_hf_rope_then_write_bit_for_bit(device, dtype, cache_dtype, seed):
    # qkv rows: contiguous, 16 elements apart (a view of a wider output), 1 element apart (unaligned:
    # the kernel's element-wise loads); int32 or int64 slots.
    for tokens, q_heads, kv_heads, dim, row_pad, slot_dtype in [
            (1, 8, 2, 128, 0, torch.int64), (37, 4, 4, 64, 16, torch.int32), (5, 6, 1, 256, 1, torch.int64),
            (19, 32, 8, 128, 0, torch.int32), (7, 4, 2, 64, 1, torch.int32)]:
        qkv, positions, cos, sin, cache, slots = case(tokens, q_heads, kv_heads, dim, dtype, cache_dtype, seed, "cpu")
        fused = to(cache, device)
        want_q = expected(qkv, positions, q_heads, cache, slots)
        rows = padded_rows(qkv, row_pad, device)
        q = fused.write_rotary(0, rows, q_heads, cos.to(device), sin.to(device), slots.to(device, slot_dtype))
        where = (tokens, q_heads, kv_heads, dim)
        assert q.shape == (tokens, q_heads, dim) and q.dtype == dtype, where
        assert same_bits(q.cpu(), want_q), where
        assert same_bits(fused.k[0].cpu(), cache.k[0]) and same_bits(fused.v[0].cpu(), cache.v[0]), where


@each_device
def test_takes_hugging_face_position_embeddings_as_they_come(device, seed):
    """cos and sin straight from transformers' LlamaRotaryEmbedding (batch axis dropped) rotate q
    and K bit for bit as its apply_rotary_pos_emb does."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig
    config = LlamaConfig(hidden_size=4 * 64, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         rope_theta=500000.0, max_position_embeddings=8192)
    qkv, positions, _, _, cache, slots = case(11, 4, 2, 64, torch.bfloat16, torch.bfloat16, seed, "cpu")
    cos, sin = llama.LlamaRotaryEmbedding(config)(qkv, positions[None])  # [1, T, D] each, in qkv's dtype
    q, k, v = qkv.split((4 * 64, 2 * 64, 2 * 64), dim=-1)
    want_q, want_k = llama.apply_rotary_pos_emb(q.reshape(1, -1, 4, 64).transpose(1, 2),
                                                k.reshape(1, -1, 2, 64).transpose(1, 2), cos, sin)
    fused = to(cache, device)
    got_q = fused.write_rotary(0, qkv.to(device), 4, cos[0].to(device), sin[0].to(device), slots.to(device))
    assert same_bits(got_q.cpu(), want_q[0].transpose(0, 1))
    cache.write(0, want_k[0].transpose(0, 1), v.reshape(-1, 2, 64), slots)  # the plain write of HF's K
    assert same_bits(fused.k[0].cpu(), cache.k[0]) and same_bits(fused.v[0].cpu(), cache.v[0])


@each_device
def test_non_finite_values_are_written_as_the_plain_write_writes_them(device, seed):
    qkv, positions, cos, sin, cache, slots = case(9, 4, 2, 64, torch.bfloat16, E4M3, seed, "cpu")
    qkv[0, 5], qkv[1, 4 * 64 + 3], qkv[2, 6 * 64 + 7] = float("nan"), float("inf"), float("-inf")  # q, K, V
    slots[:3] = torch.tensor([0, 1, 2])  # the non-finite tokens land
    slots[3:][torch.isin(slots[3:], slots[:3])] = -1  # and no slot is given twice (which token lands is undefined)
    fused = to(cache, device)
    want_q = expected(qkv, positions, 4, cache, slots)
    q = fused.write_rotary(0, qkv.to(device), 4, cos.to(device), sin.to(device), slots.to(device))
    assert torch.isnan(want_q).any() and same_bits(q.cpu(), want_q)
    # NaN codes may differ in sign where the rotation's arithmetic made the NaN (CUDA returns a positive
    # canonical NaN, x86 passes the operand's sign through): same_bits allows it
    assert same_bits(fused.k[0].cpu(), cache.k[0]) and same_bits(fused.v[0].cpu(), cache.v[0])


@each_device
def test_rows_the_kernel_cannot_read_directly_are_copied(device, seed):
    """Overlapping rows (an expanded qkv) and a transposed one give the results of their contiguous copies."""
    qkv, positions, cos, sin, cache, slots = case(4, 4, 2, 64, torch.bfloat16, E4M3, seed, "cpu")
    slots[:] = torch.tensor([3, 9, 20, 33])
    # The views are made on the device (Tensor.to would hand over contiguous copies).
    for odd in (qkv[:1].to(device).expand(4, -1), qkv.t().contiguous().to(device).t()):
        plain, fused = to(cache, device), to(cache, device)
        args = (4, cos.to(device), sin.to(device), slots.to(device))
        want_q = plain.write_rotary(0, odd.contiguous(), *args)
        got_q = fused.write_rotary(0, odd, *args)
        assert same_bits(got_q.cpu(), want_q.cpu()) and same_bits(fused.k[0].cpu(), plain.k[0].cpu())
        assert same_bits(fused.v[0].cpu(), plain.v[0].cpu())


@each_device
def test_bad_arguments_raise_clear_errors(device):
    qkv, positions, cos, sin, cache, slots = case(3, 4, 2, 64, torch.bfloat16, E4M3, 0, "cpu")
    cache = to(cache, device)
    qkv, cos, sin, slots = qkv.to(device), cos.to(device), sin.to(device), slots.to(device)
    with pytest.raises(ValueError, match="qkv must be"):
        cache.write_rotary(0, qkv[:, :-64], 4, cos, sin, slots)
    with pytest.raises(ValueError, match="qkv must be"):
        cache.write_rotary(0, qkv, 5, cos, sin, slots)
    with pytest.raises(ValueError, match=r"num_q_heads must be in \[1, 65535\]"):
        cache.write_rotary(0, qkv[:, :4 * 64], 0, cos, sin, slots)
    with pytest.raises(TypeError, match="num_q_heads must be an int, got True"):
        cache.write_rotary(0, qkv[:, :64 * 5], True, cos, sin, slots)
    # (2^59 + 4 + 2 * 2) * 32 wraps to 256 in int64: the width check passed and an allocation failed.
    huge = 2**59 + 4
    one = torch.ones((), device=device)
    with pytest.raises(ValueError, match=r"num_q_heads must be in \[1, 65535\]"):
        torch.ops.fp8ext.kv_cache_write_rotary(torch.zeros(3, 256, device=device, dtype=torch.bfloat16),
                                               cos[:, :32], sin[:, :32],
                                               *(torch.zeros(4, 16, 2, 32, device=device, dtype=torch.bfloat16)
                                                 for _ in range(2)), slots, one, one, huge)
    with pytest.raises(ValueError, match="cos must be"):
        cache.write_rotary(0, qkv, 4, cos[:, :32], sin, slots)
    with pytest.raises(TypeError, match="cos must be a tensor, got NoneType"):
        cache.write_rotary(0, qkv, 4, None, sin, slots)
    with pytest.raises(TypeError, match="sin must have qkv's dtype"):
        cache.write_rotary(0, qkv, 4, cos, sin.float(), slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        cache.write_rotary(0, qkv, 4, cos, sin, slots[:2])
    odd_qkv = torch.zeros(3, 8 * 48, device=device, dtype=torch.bfloat16)
    odd_cos, odd_sin = cos[:, :48].contiguous(), sin[:, :48].contiguous()
    if device == "cuda":  # a CUDA cache takes the decode kernels' head_dims only; the op itself is checked too
        with pytest.raises(ValueError, match="head_dim must be one of"):
            PagedKVCache(1, 2, 48, 4, 16, E4M3, device=device)
        pools = [torch.zeros(4, 16, 2, 48, dtype=E4M3, device=device) for _ in range(2)]
        one = torch.ones((), device=device)
        with pytest.raises(ValueError, match="multiple of 32"):
            torch.ops.fp8ext.kv_cache_write_rotary(odd_qkv, odd_cos, odd_sin, *pools, slots, one, one, 4)
        return
    odd = PagedKVCache(1, 2, 48, 4, 16, E4M3, device=device, scales=[{"k_scale": 1.0, "v_scale": 1.0}])
    with pytest.raises(ValueError, match="multiple of 32"):
        odd.write_rotary(0, odd_qkv, 4, odd_cos, odd_sin, slots)


@each_device
def test_writes_refuse_inputs_inside_the_pools(device):
    """Tokens taken from the cache itself (moving slots within a 16-bit pool):
    the CUDA kernels read them while they store, unordered, so the result was a
    race where the CPU's copy gave the swap. Both refuse them now."""
    one = torch.ones((), device=device)
    k_pool, v_pool = (torch.randn(4, 16, 2, 64, device=device).to(torch.bfloat16) for _ in range(2))
    slots = torch.tensor([1, 0], device=device)
    inside_k = k_pool.view(-1, 2, 64)[:2]
    inside_v = v_pool.view(-1, 2, 64)[2:4]
    elsewhere = inside_k.clone()
    with pytest.raises(ValueError, match="k and k_cache must not overlap"):
        torch.ops.fp8ext.kv_cache_write(inside_k, elsewhere, k_pool, v_pool, slots, one, one)
    with pytest.raises(ValueError, match="v and v_cache must not overlap"):
        torch.ops.fp8ext.kv_cache_write(elsewhere, inside_v, k_pool, v_pool, slots, one, one)
    with pytest.raises(ValueError, match="k and v_cache must not overlap"):
        torch.ops.fp8ext.kv_cache_write(inside_v, elsewhere, k_pool, v_pool, slots, one, one)
    qkv = v_pool.view(-1)[:2 * 512].view(2, 512)  # 4 query heads + K and V of 2 heads, 64 wide
    cos, sin = torch.ones(2, 64, device=device, dtype=torch.bfloat16), torch.zeros(2, 64, device=device,
                                                                                    dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="qkv and v_cache must not overlap"):
        torch.ops.fp8ext.kv_cache_write_rotary(qkv, cos, sin, k_pool, v_pool, slots, one, one, 4)
    before = k_pool.clone()
    torch.ops.fp8ext.kv_cache_write(elsewhere, elsewhere, k_pool, v_pool, slots, one, one)  # apart: written
    assert torch.equal(k_pool[0, 1], elsewhere[0]) and torch.equal(k_pool[0, 0], elsewhere[1])
    assert torch.equal(k_pool[1:], before[1:])


def test_engine_decode_with_the_fused_write_is_bit_identical_on_cpu(monkeypatch, seed):
    """The decode step with the fused write (the default) gives the logits of the unfused path
    (FP8EXT_FUSED_ROPE=0), and really calls it (head_dim 32: the fused write's smallest)."""
    from test_serving import TINY, make_cache, prompts, tiny_model
    model = tiny_model(cfg=dataclasses.replace(TINY, head_dim=32), seed=seed)
    ps = prompts(3, seed)

    def step():
        cache = make_cache(model, dtype=E4M3)
        slots = [cache.append(i, len(p)) for i, p in enumerate(ps)]
        tokens = model.prefill([torch.tensor(p) for p in ps], slots, cache).argmax(-1)
        step_slots = torch.cat([cache.append(i, 1) for i in range(3)])
        return model.decode(tokens, torch.tensor([len(p) for p in ps]), step_slots, cache.plan(range(3)), cache)

    monkeypatch.setenv("FP8EXT_FUSED_ROPE", "0")
    want = step()
    monkeypatch.delenv("FP8EXT_FUSED_ROPE")
    calls = []
    fused = PagedKVCache.write_rotary
    monkeypatch.setattr(PagedKVCache, "write_rotary", lambda *a, **k: calls.append(1) or fused(*a, **k))
    assert torch.equal(step(), want)
    assert len(calls) == model.cfg.num_layers


# ---- GPU (run on the device) -----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_graph_capture_and_compile(seed):
    qkv, positions, cos, sin, cache, slots = case(64, 32, 8, 128, torch.bfloat16, E4M3, seed, "cpu")
    want_q = expected(qkv, positions, 32, cache, slots)
    fused = to(cache, "cuda")
    args = (qkv.cuda(), 32, cos.cuda(), sin.cuda(), slots.cuda())
    graph, q = capture(lambda: fused.write_rotary(0, *args))
    q.fill_(float("nan"))  # poison: the replay must write everything
    fused.k[0].view(torch.uint8).fill_(0)
    fused.v[0].view(torch.uint8).fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(q.cpu(), want_q) and same_bits(fused.k[0].cpu(), cache.k[0]) and \
        same_bits(fused.v[0].cpu(), cache.v[0])
    compiled = torch.compile(lambda: fused.write_rotary(0, *args), fullgraph=True)
    assert same_bits(compiled().cpu(), want_q)
