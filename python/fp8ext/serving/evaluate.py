"""Perplexity through the engine's own path: each window's first tokens are
prefilled, the rest are fed one decode step at a time (teacher forcing), so
the paged KV cache, FP8 or not, holds every key and value the predictions read."""
from __future__ import annotations

import math

import torch

from fp8ext.checks import check_positive_int, is_int
from fp8ext.kv_cache import PagedKVCache
from fp8ext.serving.model import LlamaModel


@torch.no_grad()
def perplexity(model: LlamaModel, windows: torch.Tensor, cache_dtype=None, prefix: int = 32,
               kv_scales=None, page_size: int = 16) -> float:
    """exp(mean next-token loss) over tokens prefix..W-1 of every window [B, W]
    (cache_dtype: float32 on the CPU, bf16 on CUDA unless given)."""
    if not isinstance(getattr(model, "_orig_mod", model), LlamaModel):  # torch.compile's wrapper forwards
        raise TypeError(f"model must be a fp8ext.serving.LlamaModel, got {type(model).__name__}")
    if cache_dtype is None:
        cache_dtype = torch.float32 if model.device.type == "cpu" else torch.bfloat16
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[0] < 1 or \
            windows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"windows must be an int64/int32 [B >= 1, W] tensor of token ids, got "
                         f"{getattr(windows, 'dtype', type(windows).__name__)} {tuple(getattr(windows, 'shape', ()))}")
    if bool(((windows < 0) | (windows >= model.cfg.vocab_size)).any()):
        raise ValueError(f"windows' token ids must be in [0, {model.cfg.vocab_size})")
    check_positive_int("page_size", page_size)
    windows = windows.long()
    batch, width = windows.shape
    if not is_int(prefix) or not 1 <= prefix < width:
        raise ValueError(f"prefix must be an int in [1, {width}), got {prefix!r}")
    cfg = model.cfg
    pages = batch * -(-width // page_size)
    cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, pages, page_size, cache_dtype,
                         device=model.device, scales=kv_scales)
    windows = windows.to(model.device)
    slots = [cache.append(b, prefix) for b in range(batch)]
    logits = [model.prefill(list(windows[:, :prefix]), slots, cache).float()]
    for t in range(prefix, width - 1):
        slots = torch.cat([cache.append(b, 1) for b in range(batch)])
        plan = cache.plan(range(batch))
        positions = torch.full((batch,), t, device=model.device)
        logits.append(model.decode(windows[:, t], positions, slots, plan, cache).float())
    logits = torch.stack(logits, dim=1)  # [B, W - prefix, vocab]: predictions of tokens prefix..W-1
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             windows[:, prefix:].reshape(-1), reduction="mean")
    return math.exp(loss.item())
