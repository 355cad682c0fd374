"""Reference of the paged KV-cache ops, in PyTorch: the CPU implementation,
and the CUDA path of builds without the kernels (csrc/attention). Argument
checks raise what the CUDA ops raise, but for head_dim: the CUDA writes take
multiples of 16 and decode 64, 128 or 256 (CUDA_HEAD_DIMS), the CPU any. The
value checks (page ids, lengths, slots, scales) read the tensors, a host sync
the CUDA ops do not pay: there a bad page id or length gives NaN for its
sequence, a bad slot is skipped, a slot given twice holds undefined contents
(threads store 16-element pieces of each token: the pieces may mix), and a
scale of 0, < 0 or not finite is used as it is (PagedKVCache refuses such
scales when it is built).

Numerics, which the CUDA kernels must match:
- write: code = cast(x / scale) with the scale of the token's KV head, the
  division in float32 and the cast saturating for FP8 (a finite value never
  becomes NaN; NaN stays NaN), plain for bf16/fp16 caches.
- attention: K and V dequantized as code * scale, scores q.k * softmax_scale
  in float32 (capped as softcap * tanh(s / softcap) when softcap > 0), softmax
  in float32, output in q's dtype; a sequence of length 0 gives zeros, and so
  does a query head whose every score is -inf (a 16-bit cache can hold -inf):
  it attends to nothing, as in flash-attention kernels, where torch.softmax
  would give NaN.
"""
from __future__ import annotations

import torch

from fp8ext._native import INPUT_DTYPES
from fp8ext.ops.reference import div_f32, saturating_cast

CACHE_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16)
# A float32 cache exists for exact CPU runs (the serving engine's float32 mode
# is checked token for token against Hugging Face); the CUDA kernels refuse it.
CPU_CACHE_DTYPES = CACHE_DTYPES + (torch.float32,)
INDEX_DTYPES = (torch.int32, torch.int64)
CUDA_HEAD_DIMS = (64, 128, 256)  # what the CUDA decode kernels are built for
F32_MAX = torch.finfo(torch.float32).max


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes two views of one buffer span intersect (exact for
    contiguous tensors; tensor_checks.h's spans_intersect for strided ones)."""
    if not a.numel() or not b.numel() or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_apart_from_pools(t: torch.Tensor, name: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """The CUDA write reads its input while it stores into the pools, unordered:
    an input inside a pool (tokens moved within the cache) would race."""
    for pool_name, pool in (("k_cache", k_cache), ("v_cache", v_cache)):
        if _overlap(t, pool):
            raise ValueError(f"{name} and {pool_name} must not overlap in memory")


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_cache(k_cache, v_cache, read_memory: bool = True) -> None:
    """read_memory=False (the fakes) leaves out the overlap checks, which compare
    data pointers."""
    _check_tensor(k_cache, "k_cache")
    _check_tensor(v_cache, "v_cache")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [num_pages, page_size, num_kv_heads, head_dim], got {k_cache.dim()}-D")
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype or v_cache.device != k_cache.device:
        raise ValueError(f"v_cache must match k_cache ({tuple(k_cache.shape)}, {k_cache.dtype}, {k_cache.device}), "
                         f"got {tuple(v_cache.shape)}, {v_cache.dtype}, {v_cache.device}")
    if min(k_cache.shape[1:]) < 1:
        raise ValueError(f"page_size, num_kv_heads and head_dim must be >= 1, got {tuple(k_cache.shape)}")
    allowed = CACHE_DTYPES if k_cache.device.type == "cuda" else CPU_CACHE_DTYPES  # (meta: the fakes)
    if k_cache.dtype not in allowed:
        raise TypeError(f"k_cache must be float8_e4m3fn, float8_e5m2, bfloat16 or float16 (float32 on the CPU), "
                        f"got {k_cache.dtype} on {k_cache.device.type}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if k_cache.device.type == "cuda" and k_cache.shape[3] % 16:  # the kernels' 16-element pieces
        raise ValueError(f"head_dim must be a positive multiple of 16, got {k_cache.shape[3]}")
    if not read_memory:
        return
    if k_cache.numel() and k_cache.data_ptr() == v_cache.data_ptr():
        raise ValueError("k_cache and v_cache must be separate pools (the same tensor was given for both)")
    if _overlap(k_cache, v_cache):
        raise ValueError("k_cache and v_cache must not overlap in memory")


def check_scale(s, name: str, num_kv_heads: int, device, read_values: bool = True) -> None:
    _check_tensor(s, name)
    if s.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {s.dtype}")
    if s.numel() not in (1, num_kv_heads) or s.dim() > 1:
        raise ValueError(f"{name} must hold one value or one per KV head ([{num_kv_heads}]), got {tuple(s.shape)}")
    if s.device != device:
        raise ValueError(f"{name} must be on {device}, got {s.device}")
    if read_values:
        check_scale_values(s, name)


def check_scale_values(s: torch.Tensor, name: str) -> None:
    """Scales must be finite and > 0 (reads them: a host sync on a GPU)."""
    if not bool((torch.isfinite(s) & (s > 0)).all()):
        raise ValueError(f"{name} must be finite and positive, got {s.tolist()}")


def _per_head(s: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    return s.reshape(-1).float().expand(num_kv_heads)


def check_write(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, read_values: bool = True) -> None:
    """read_values=False (the fakes) checks metadata only: no scale values, no
    slot uniqueness, no overlap of the pools."""
    check_cache(k_cache, v_cache, read_values)
    _check_tensor(k, "k")
    _check_tensor(v, "v")
    _check_tensor(slot_mapping, "slot_mapping")
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    if k.dim() != 3 or k.shape[1:] != (heads, dim):
        raise ValueError(f"k must be [num_tokens, {heads}, {dim}] (the cache's heads and head_dim), got {tuple(k.shape)}")
    if v.shape != k.shape or v.dtype != k.dtype:
        raise ValueError(f"v must match k ({tuple(k.shape)}, {k.dtype}), got {tuple(v.shape)}, {v.dtype}")
    if k.dtype not in INPUT_DTYPES:
        raise TypeError(f"k and v must be bfloat16, float16 or float32, got {k.dtype}")
    if slot_mapping.dtype not in INDEX_DTYPES or slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be int32/int64 [{k.shape[0]}] (one slot per token), "
                         f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    for name, t in (("k", k), ("v", v), ("slot_mapping", slot_mapping)):
        if t.device != k_cache.device:
            raise ValueError(f"{name} must be on the cache's device {k_cache.device}, got {t.device}")
    check_scale(k_scale, "k_scale", heads, k_cache.device, read_values)
    check_scale(v_scale, "v_scale", heads, k_cache.device, read_values)
    if not read_values:
        return
    check_apart_from_pools(k, "k", k_cache, v_cache)
    check_apart_from_pools(v, "v", k_cache, v_cache)
    kept = slot_mapping[slot_mapping >= 0]
    if kept.numel() != kept.unique().numel():
        raise ValueError("slot_mapping must not give a slot twice (-1 excepted): which token would land is not defined")


def encode(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., H, D] / scale [H] -> cache codes."""
    v = div_f32(x.float(), scale[:, None])
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return saturating_cast(v, dtype)
    return v.to(dtype)


def kv_cache_write(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    check_write(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    pages, page_size, heads, _ = k_cache.shape
    slots = slot_mapping.long()
    keep = slots >= 0
    if bool(((slots >= pages * page_size) | (slots < -1)).any()):
        raise ValueError(f"slot_mapping holds slots outside [-1, {pages * page_size}) (num_pages x page_size)")
    if not bool(keep.any()):
        return
    slots = slots[keep]
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        codes = encode(x[keep], _per_head(s, heads), cache.dtype)
        cache.view(pages * page_size, heads, -1)[slots] = codes


def check_attention(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, num_splits, window, softcap,
                    read_values: bool = True):
    """read_values=False: metadata only, as check_write."""
    check_cache(k_cache, v_cache, read_values)
    for name, t in (("q", q), ("block_table", block_table), ("seq_lens", seq_lens)):
        _check_tensor(t, name)
        if t.device != k_cache.device:
            raise ValueError(f"{name} must be on the cache's device {k_cache.device}, got {t.device}")
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    if q.dim() != 3 or q.shape[2] != dim:
        raise ValueError(f"q must be [batch, num_q_heads, {dim}] (one token per sequence), got {tuple(q.shape)}")
    if q.dtype not in INPUT_DTYPES:
        raise TypeError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    if q.shape[1] % heads != 0:
        raise ValueError(f"num_q_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({heads})")
    if block_table.dtype not in INDEX_DTYPES or block_table.dim() != 2 or block_table.shape[0] != q.shape[0]:
        raise ValueError(f"block_table must be int32/int64 [batch = {q.shape[0]}, max_pages], "
                         f"got {block_table.dtype} {tuple(block_table.shape)}")
    if seq_lens.dtype not in INDEX_DTYPES or seq_lens.shape != (q.shape[0],):
        raise ValueError(f"seq_lens must be int32/int64 [batch = {q.shape[0]}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    check_scale(k_scale, "k_scale", heads, k_cache.device, read_values)
    check_scale(v_scale, "v_scale", heads, k_cache.device, read_values)
    if not 1 <= num_splits <= 65535:
        raise ValueError(f"num_splits must be in [1, 65535], got {num_splits}")
    if not 0 <= window <= 2**31 - 1:
        raise ValueError(f"window must be in [0, 2^31) (0: no sliding window), got {window}")
    if not 0 <= softcap <= F32_MAX:  # used in float32: past its max it would be inf
        raise ValueError(f"softcap must be finite and >= 0 (0: none; finite in float32), got {softcap}")
    if q.shape[0] > 65535:
        raise ValueError(f"batch must be at most 65535, got {q.shape[0]}")
    if k_cache.device.type == "cuda":
        _check_cuda_attention(q, k_cache)


def _check_cuda_attention(q, k_cache) -> None:
    """The CUDA kernel's own limits (csrc/torch/cuda/kv_cache_cuda.cpp), so a fake
    of a CUDA call (torch.compile) refuses what the kernel will."""
    pages, page_size, _, dim = k_cache.shape
    if dim not in (64, 128, 256):
        raise ValueError(f"head_dim must be 64, 128 or 256 on CUDA, got {dim}")
    if q.shape[1] > 65535:
        raise ValueError(f"q must have at most 65535 heads on CUDA, got {q.shape[1]}")
    if page_size > 2**31 - 1:
        raise ValueError(f"k_cache's page_size must be below 2^31 on CUDA, got {page_size}")
    if pages * page_size > 2**31 - 1:
        raise ValueError(f"k_cache must hold fewer than 2^31 tokens (num_pages x page_size) on CUDA, got "
                         f"{pages * page_size}")


def check_softmax_scale(softmax_scale) -> None:
    if not abs(softmax_scale) <= F32_MAX:  # used in float32: past its max it would be inf
        raise ValueError(f"softmax_scale must be finite (in float32), got {softmax_scale}")


def _check_pages(block_table, seq_lens, num_pages: int, page_size: int) -> None:
    capacity = block_table.shape[1] * page_size
    if bool(((seq_lens < 0) | (seq_lens > capacity)).any()):
        raise ValueError(f"seq_lens must be in [0, {capacity}] (block_table's {block_table.shape[1]} pages x "
                         f"page_size {page_size})")
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size < seq_lens[:, None]
    pages = block_table[used]
    if bool(((pages < 0) | (pages >= num_pages)).any()):
        raise ValueError(f"block_table holds page ids outside [0, {num_pages}) for tokens within seq_lens")


def gather(cache: torch.Tensor, scale: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's first `length` tokens, dequantized: [length, H, D] float32."""
    page_size, heads = cache.shape[1], cache.shape[2]
    tokens = cache[pages].reshape(-1, heads, cache.shape[3])[:length]
    return tokens.float() * _per_head(scale, heads)[:, None]


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, softmax_scale,
                           num_splits=1, window=0, softcap=0.0):
    check_attention(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, num_splits, window, softcap)
    check_softmax_scale(softmax_scale)
    num_pages, page_size, heads, dim = k_cache.shape
    _check_pages(block_table, seq_lens, num_pages, page_size)
    group = q.shape[1] // heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b, length in enumerate(seq_lens.tolist()):
        start = max(0, length - window) if window > 0 else 0
        if length == start:
            continue
        pages = block_table[b, : -(-length // page_size)].long()
        k = gather(k_cache, k_scale, pages, length)[start:].repeat_interleave(group, dim=1)  # [T, H_q, D]
        v = gather(v_cache, v_scale, pages, length)[start:].repeat_interleave(group, dim=1)
        s = torch.einsum("hd,thd->ht", q[b].float(), k) * softmax_scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        p = torch.softmax(s, dim=-1).masked_fill((s == float("-inf")).all(dim=-1, keepdim=True), 0.0)
        out[b] = torch.einsum("ht,thd->hd", p, v)
    return out.to(q.dtype)


torch.library.impl("fp8ext::kv_cache_write", "CPU")(kv_cache_write)
torch.library.impl("fp8ext::paged_decode_attention", "CPU")(paged_decode_attention)
