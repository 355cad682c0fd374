"""A paged KV cache in FP8 (or bf16/fp16, the baseline) for decoding.

Per layer, K and V live in page pools [num_pages, page_size, num_kv_heads,
head_dim]; a sequence owns a list of pages, and its tokens go to consecutive
slots (slot = page * page_size + offset). The manager is host-side
bookkeeping; the ops `kv_cache_write` (quantize and scatter new K/V in one
launch) and `paged_decode_attention` do the device work.

    cache = fp8ext.PagedKVCache(num_layers=32, num_kv_heads=8, head_dim=128, num_pages=4096,
                                page_size=16, dtype=torch.float8_e4m3fn, device="cuda",
                                scales=calibration.kv_scales("e4m3"))
    slots = cache.append(seq_id, num_new_tokens)        # allocates pages as needed
    cache.write(layer, k, v, slots)                     # k, v [num_new_tokens, H_kv, D]
    plan = cache.plan([seq_a, seq_b])                   # block table, lengths (host-side, once per step)
    out = cache.attention(layer, q, plan)               # q [batch, H_q, D]
    cache.free(seq_id)

Scales: stored codes are x / scale (per layer, one value or one per KV head);
attention multiplies them back. FP8 caches without calibrated scales use 1.0
and warn: values past the format's range (448 for E4M3) saturate.
"""
from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Mapping, Sequence

import torch

from fp8ext.checks import check_positive_int, check_real_tensor, is_finite_number, is_int
from fp8ext.kv_scales import by_layer_number
from fp8ext.ops.fused import check_rotary_tables_are_tensors
from fp8ext.ops.kv_cache_reference import CACHE_DTYPES, CPU_CACHE_DTYPES, CUDA_HEAD_DIMS, check_scale_values

FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# At most ceil(max_len / this) splits: the kernel divides the tokens evenly,
# so a split may hold fewer (down to about half of it; one round of the
# kernel's four warps is 128 tokens).
MIN_TOKENS_PER_SPLIT = 256
# A block's fixed cost (its start, the Q load, its partial output and share of
# the merge) in tokens of work: fitted to the H200 runs of 2026-11-29 (256 x
# 1024: one split 2.84 TB/s, two 2.4; 64 x 4096: three splits best; 1 x 32768:
# 48 splits 1.84 TB/s, 31 splits 1.75).
SPLIT_OVERHEAD_TOKENS = 256


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V of one token across all layers."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        check_positive_int(name, value)
    if dtype not in CPU_CACHE_DTYPES:
        raise TypeError(f"dtype must be a KV cache dtype {CPU_CACHE_DTYPES}, got {dtype}")
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def capacity_tokens(memory_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                    page_size: int = 16) -> int:
    """Tokens a cache of `memory_bytes` holds, in whole pages (FP8: twice bf16's)."""
    check_positive_int("page_size", page_size)
    if not is_int(memory_bytes) or memory_bytes < 0:
        raise ValueError(f"memory_bytes must be an int >= 0, got {memory_bytes!r}")
    page_bytes = page_size * bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
    return (memory_bytes // page_bytes) * page_size


# Decode blocks resident per SM (four warps each; the FP8 kernel's registers are cut for three).
BLOCKS_PER_SM = 3
# The pipelined FP8 kernel (an FP8 cache at head_dim 128) with at most this many
# (sequence, KV head) pairs per SM plans for two blocks per SM (8.25 pairs on
# 132 SMs): one sequence of 8 KV heads then takes 33 longer splits instead of
# 49. Measured on the H200 past L2 (scripts/device/tune_decode_splits.py,
# bench/results/decode_splits_2026-12-01_h200_3c13eb8.json), 33 vs 49 splits:
# 1 x 16384 16.5 vs 18.3 us, 1 x 32768 25.6 vs 26.7, 1 x 131072 72.4 vs 75.4;
# 1 x 4096 plans 16 either way. Batch 8 was faster at three per SM (8 x 32768
# at two per SM: 161 vs 143 us), and so was the bf16 cache at 32k and 131k (at
# 16k, 33 and 49 splits were within 1%). Only 1 x 8 heads was measured; the
# rule also takes in other layouts with as few pairs (1 x 4 heads: 66 splits
# instead of 99; 8 sequences x 1 head, MQA: 33 instead of 49).
# The register kernel (other head dims, or FP8EXT_DECODE_PIPELINE=0) keeps three
# per SM: given 33 splits by the bench, it read 2.71 TB/s on 1 x 131072 (H200,
# decode_2026-12-02_h200_session14_04748b2.json), where an earlier run at 49 read
# 3.27 (2026-11-30; two runs, not an A/B).
FP8_FEW_ITEMS_PER_SM = 1 / 16


def decode_pipeline_enabled() -> bool:
    """Whether FP8 caches at head_dim 128 take the pipelined decode kernel: as
    the C++ launcher decides, from FP8EXT_DECODE_PIPELINE (read at each call)."""
    return os.environ.get("FP8EXT_DECODE_PIPELINE") != "0"


def plan_splits(batch: int, num_kv_heads: int, max_len: int, num_sms: int = 132,
                blocks_per_sm: int | None = None, pipelined: bool = False) -> int:
    """KV splits per sequence for the decode kernel. The (batch x heads x
    splits) blocks run in waves of blocks_per_sm x num_sms, each block costing
    its share of the tokens plus a fixed SPLIT_OVERHEAD_TOKENS; this takes the
    split count with the least waves x cost, at most
    ceil(max_len / MIN_TOKENS_PER_SPLIT) of them. blocks_per_sm defaults to BLOCKS_PER_SM, or 2
    for the pipelined FP8 kernel (pipelined=True) with at most
    FP8_FEW_ITEMS_PER_SM (sequence, KV head) pairs per SM."""
    check_positive_int("num_sms", num_sms)
    if blocks_per_sm is not None:
        check_positive_int("blocks_per_sm", blocks_per_sm)
    items = max(1, batch * num_kv_heads)
    if blocks_per_sm is None:
        blocks_per_sm = 2 if pipelined and items <= FP8_FEW_ITEMS_PER_SM * num_sms else BLOCKS_PER_SM
    slots = blocks_per_sm * num_sms
    most = max(1, math.ceil(max_len / MIN_TOKENS_PER_SPLIT))

    def cost(s: int) -> float:
        return math.ceil(items * s / slots) * (max_len / s + SPLIT_OVERHEAD_TOKENS)

    return min(range(1, most + 1), key=cost)  # the first (fewest splits) of equal costs


@dataclasses.dataclass
class DecodePlan:
    """What one decode step needs on the device, built on the host: capture
    the attention with a plan and replay it after refilling these tensors
    in place (`PagedKVCache.plan(..., out=plan)`)."""
    seq_ids: list
    block_table: torch.Tensor  # [batch, max_pages] int32; unused entries 0
    seq_lens: torch.Tensor  # [batch] int32
    num_splits: int
    # The cache's page bookkeeping when `plan` filled it (None: a plan made by
    # hand, e.g. a captured graph's, whose owner refills it): attention refuses
    # a plan made before an append or free, which would read stale lengths or
    # pages that another sequence now holds.
    generation: int | None = None


class UnknownSequenceError(KeyError, ValueError):
    """A seq_id the cache does not hold (never appended, or freed): a KeyError,
    as a mapping's lookup raises, and a ValueError, as the rest of the API's
    bad arguments."""

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0]) if self.args else ""


class PagedKVCache:
    """K and V page pools for ``num_layers`` layers, each [num_pages, page_size,
    num_kv_heads, head_dim] of ``dtype`` (float8_e4m3fn, float8_e5m2, bfloat16,
    float16; float32 on the CPU) on ``device``, and the pages each sequence owns
    (usage: this module's docstring).

    ``scales``: per layer ``{"k_scale": s, "v_scale": s}`` with s a float or a
    tensor of one value or ``num_kv_heads``: a list in layer order, a mapping
    by layer index (keys 0 .. num_layers - 1), or a mapping by attention name
    (what ``fp8ext.calibrate(...).kv_scales(fmt)`` returns, and
    ``fp8ext.kv_scales_from_state_dict`` reads from a checkpoint; names that differ only in
    their layer numbers are ordered by them, so a checkpoint's sorted keys work too);
    None gives 1.0 (an FP8 cache then warns).
    ``max_pages_per_seq`` bounds one sequence's pages (default: the pool's);
    it is the width of a plan's block table. A CUDA cache takes head_dim 64,
    128 or 256 (the decode kernels')."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int, page_size: int = 16,
                 dtype: torch.dtype = torch.float8_e4m3fn, device="cpu", scales=None,
                 max_pages_per_seq: int | None = None):
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("num_pages", num_pages), ("page_size", page_size)):
            check_positive_int(name, value)
        if max_pages_per_seq is not None:
            check_positive_int("max_pages_per_seq", max_pages_per_seq)
        self.device = torch.device(device)
        if dtype not in (CPU_CACHE_DTYPES if self.device.type == "cpu" else CACHE_DTYPES):
            raise TypeError(f"dtype must be float8_e4m3fn, float8_e5m2, bfloat16 or float16 (float32 on the CPU), "
                            f"got {dtype} on {self.device.type}")
        if self.device.type == "cuda" and head_dim not in CUDA_HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {CUDA_HEAD_DIMS} for a CUDA cache (the decode kernels'), "
                             f"got {head_dim}")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_pages, self.page_size, self.dtype = num_pages, page_size, dtype
        self.max_pages_per_seq = num_pages if max_pages_per_seq is None else max_pages_per_seq
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.device = self.k[0].device  # "cuda" as the pools got it (cuda:N), so device checks compare equal
        self.k_scale, self.v_scale = self._scales(scales)
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pop() hands out low ids first
        self._pages: dict = {}
        self._lens: dict = {}
        self._generation = 0  # bumped by every append and free (see DecodePlan.generation)

    # ---- scales -------------------------------------------------------------
    def _scales(self, scales):
        """Per layer float32 [H_kv] tensors from `scales`: None (1.0), or per
        layer a {"k_scale", "v_scale"} mapping (calibrate(...).kv_scales(fmt)
        gives one per attention layer, in model order), as a sequence, a
        mapping by layer index, or a mapping by name (ordered by kv_scales.by_layer_number)."""
        ones = [torch.ones(self.num_kv_heads, device=self.device) for _ in range(self.num_layers)]
        if scales is None:
            if self.dtype in FP8_CACHE_DTYPES:
                warnings.warn("PagedKVCache: no calibrated k_scale/v_scale, using 1.0 (values beyond the FP8 "
                              "range saturate); pass scales=calibrate(model, batches).kv_scales(fmt)",
                              RuntimeWarning, stacklevel=3)
            return ones, [t.clone() for t in ones]
        per_layer = self._per_layer_entries(scales)
        if len(per_layer) != self.num_layers:
            raise ValueError(f"scales must give one entry per layer ({self.num_layers}), got {len(per_layer)}")
        k, v = [], []
        for i, entry in enumerate(per_layer):
            if not isinstance(entry, Mapping) or not {"k_scale", "v_scale"} <= set(entry):
                raise ValueError(f"scales[{i}] must be a mapping with 'k_scale' and 'v_scale', got {entry!r}")
            k.append(self._scale_tensor(entry["k_scale"], f"scales[{i}]['k_scale']"))
            v.append(self._scale_tensor(entry["v_scale"], f"scales[{i}]['v_scale']"))
        return k, v

    def _per_layer_entries(self, scales) -> list:
        if isinstance(scales, Mapping):
            keys = list(scales)
            if not all(is_int(key) for key in keys):
                return [scales[key] for key in by_layer_number(keys)]
            if sorted(keys) != list(range(self.num_layers)):
                raise ValueError(f"scales by layer index must have the keys 0 .. {self.num_layers - 1}, "
                                 f"got {sorted(keys)}")
            return [scales[i] for i in range(self.num_layers)]
        if isinstance(scales, (str, bytes, torch.Tensor)) or not isinstance(scales, Sequence):
            raise TypeError("scales must be None, a list or a mapping of per-layer {'k_scale', 'v_scale'} "
                            f"mappings, got {type(scales).__name__}")
        return list(scales)

    def _scale_tensor(self, value, name: str) -> torch.Tensor:
        check_real_tensor(name, value)
        try:
            t = torch.as_tensor(value, dtype=torch.float32).to(self.device).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be a float or a float tensor, got {value!r}") from e
        if t.numel() == 1:
            t = t.expand(self.num_kv_heads).clone()
        if t.numel() != self.num_kv_heads:
            raise ValueError(f"{name} must hold one value or {self.num_kv_heads} (one per KV head), got {t.numel()}")
        check_scale_values(t, name)
        return t

    # ---- pages ----------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self._free)

    def length(self, seq_id) -> int:
        return self._lens.get(seq_id, 0)

    def append(self, seq_id, num_tokens: int) -> torch.Tensor:
        """Reserves `num_tokens` slots after the sequence's current end (a new
        seq_id starts empty) and returns them as an int64 slot mapping on the
        cache's device. Raises RuntimeError, changing nothing, when the free
        pages or the sequence's page limit do not suffice."""
        if not is_int(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        pages = self._pages.get(seq_id, [])
        start = self._lens.get(seq_id, 0)
        end = start + num_tokens
        needed = -(-end // self.page_size) - len(pages)
        if -(-end // self.page_size) > self.max_pages_per_seq:
            raise RuntimeError(f"sequence {seq_id!r} would need {-(-end // self.page_size)} pages, more than "
                               f"max_pages_per_seq = {self.max_pages_per_seq}")
        if needed > len(self._free):
            raise RuntimeError(f"out of KV-cache pages: sequence {seq_id!r} needs {needed} more, {len(self._free)} "
                               f"of {self.num_pages} are free (free finished sequences or make the cache larger)")
        pages = pages + [self._free.pop() for _ in range(needed)]
        self._pages[seq_id], self._lens[seq_id] = pages, end
        self._generation += 1
        positions = torch.arange(start, end)
        page_ids = torch.tensor(pages, dtype=torch.int64)[positions // self.page_size]
        return (page_ids * self.page_size + positions % self.page_size).to(self.device)

    def free(self, seq_id) -> None:
        """Returns the sequence's pages to the pool at once."""
        if seq_id not in self._pages:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r} (seq_id was never appended, or was freed)")
        self._free.extend(reversed(self._pages.pop(seq_id)))
        del self._lens[seq_id]
        self._generation += 1

    # ---- device work ------------------------------------------------------------
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Quantizes k, v [num_tokens, H_kv, D] with the layer's scales into their slots (-1: skipped)."""
        self._check_layer(layer)
        torch.ops.fp8ext.kv_cache_write(k, v, self.k[layer], self.v[layer], slot_mapping,
                                        self.k_scale[layer], self.v_scale[layer])

    def write_rotary(self, layer: int, qkv: torch.Tensor, num_q_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     slot_mapping: torch.Tensor) -> torch.Tensor:
        """`write` fused with RoPE, for a fused QKV projection's output qkv
        [num_tokens, (num_q_heads + 2 H_kv) * D]: q and K are rotated in the
        rotate-half layout with cos, sin [num_tokens, D] as Hugging Face's rotary
        embedding returns them (``position_embeddings``, its batch axis dropped),
        bit for bit as ``apply_rotary_pos_emb``; K and V go into their slots, and
        the rotated q [num_tokens, num_q_heads, D] is returned. One launch on the
        GPU; D must be a multiple of 32."""
        self._check_layer(layer)
        if not is_int(num_q_heads):  # the op's int argument would take True as 1
            raise TypeError(f"num_q_heads must be an int, got {num_q_heads!r}")
        check_rotary_tables_are_tensors(cos, sin)
        return torch.ops.fp8ext.kv_cache_write_rotary(qkv, cos, sin, self.k[layer], self.v[layer], slot_mapping,
                                                      self.k_scale[layer], self.v_scale[layer], num_q_heads)

    def plan_splits(self, batch: int, max_len: int, num_sms: int) -> int:
        """:func:`plan_splits` for this cache: its KV heads, and the rule of the
        decode kernel it takes (the pipelined one for FP8 at head_dim 128)."""
        return plan_splits(batch, self.num_kv_heads, max_len, num_sms, pipelined=self.takes_pipelined_decode())

    def takes_pipelined_decode(self) -> bool:
        """Whether decode attention over this cache runs the pipelined FP8 kernel."""
        return self.dtype in FP8_CACHE_DTYPES and self.head_dim == 128 and decode_pipeline_enabled()

    def plan(self, seq_ids: Sequence, num_sms: int | None = None, out: DecodePlan | None = None) -> DecodePlan:
        """Block table and lengths of these sequences for one decode step (host-side).
        With `out`, refills its tensors in place (same batch size), so a CUDA
        graph captured with it replays on the new step."""
        seq_ids = list(seq_ids)
        for s in seq_ids:
            if s not in self._pages:
                raise UnknownSequenceError(f"unknown sequence {s!r} in seq_ids (never appended, or freed)")
        if out is not None:
            self._check_plan_tensors(out, "out")
        width = out.block_table.shape[1] if out is not None else max(
            [1] + [len(self._pages[s]) for s in seq_ids])
        table = torch.zeros(len(seq_ids), width, dtype=torch.int32)
        for row, s in enumerate(seq_ids):
            pages = self._pages[s]
            if len(pages) > width:
                raise ValueError(f"sequence {s!r} has {len(pages)} pages, more than the plan's block table ({width})")
            table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        lens = torch.tensor([self._lens[s] for s in seq_ids], dtype=torch.int32)
        if out is None:
            if num_sms is None:
                num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                           if self.device.type == "cuda" else 132)
            splits = self.plan_splits(len(seq_ids), int(lens.max()) if len(seq_ids) else 0, num_sms)
            return DecodePlan(seq_ids, table.to(self.device), lens.to(self.device), splits, self._generation)
        if out.block_table.shape[0] != len(seq_ids):
            raise ValueError(f"out holds a plan for {out.block_table.shape[0]} sequences, got {len(seq_ids)}")
        out.block_table.copy_(table)
        out.seq_lens.copy_(lens)
        out.seq_ids = seq_ids
        out.generation = self._generation
        return out

    def _check_plan_tensors(self, plan, name: str) -> None:
        if not isinstance(plan, DecodePlan):
            raise TypeError(f"{name} must be a fp8ext.DecodePlan, got {type(plan).__name__}")
        table, lens = plan.block_table, plan.seq_lens
        if not (isinstance(table, torch.Tensor) and table.dtype == torch.int32 and table.dim() == 2):
            raise ValueError(f"{name}.block_table must be an int32 [batch, max_pages] tensor, got "
                             f"{getattr(table, 'dtype', type(table).__name__)} {tuple(getattr(table, 'shape', ()))}")
        if not (isinstance(lens, torch.Tensor) and lens.dtype == torch.int32 and lens.shape == table.shape[:1]):
            raise ValueError(f"{name}.seq_lens must be an int32 [{table.shape[0]}] tensor, got "
                             f"{getattr(lens, 'dtype', type(lens).__name__)} {tuple(getattr(lens, 'shape', ()))}")
        if table.device != self.device or lens.device != self.device:
            raise ValueError(f"{name}'s tensors must be on the cache's device {self.device}, got {table.device} and "
                             f"{lens.device}")

    def attention(self, layer: int, q: torch.Tensor, plan: DecodePlan, softmax_scale: float | None = None,
                  window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        """Decode attention of q [batch, H_q, D] (one token per sequence of the plan) over the cache.

        ``softmax_scale`` defaults to 1/sqrt(head_dim). ``window`` > 0 attends
        to each sequence's last ``window`` tokens only (sliding window; 0: all).
        ``softcap`` > 0 caps the logits as ``softcap * tanh(logit / softcap)``
        (Gemma 2's soft-cap; 0: off). Returns [batch, H_q, D] in q's dtype.

        On the GPU, FP8 and fp16 caches multiply q by softmax_scale and round it
        to fp16 for the tensor cores: |q * softmax_scale| must stay below 65504,
        or that head's output is NaN (the CPU reference computes it in fp32).
        """
        self._check_layer(layer)
        if not isinstance(plan, DecodePlan):
            raise TypeError(f"plan must be a fp8ext.DecodePlan, got {type(plan).__name__}")
        if plan.generation is not None and plan.generation != self._generation:
            raise RuntimeError("plan is stale: sequences were appended to or freed since it was made (it would read "
                               "old lengths, or pages another sequence now holds); make it after the step's "
                               "appends, or refill it with plan(seq_ids, out=plan)")
        # The op's int and float arguments would take True as 1 and float() a string.
        if not is_int(plan.num_splits):
            raise ValueError(f"plan.num_splits must be an int, got {plan.num_splits!r}")
        if not is_int(window):
            raise ValueError(f"window must be an int >= 0 (0: no sliding window), got {window!r}")
        for name, value in (("softmax_scale", softmax_scale), ("softcap", softcap)):
            if value is not None and not is_finite_number(value):
                raise ValueError(f"{name} must be a finite int or float, got {value!r}")
        scale = softmax_scale if softmax_scale is not None else self.head_dim ** -0.5
        return torch.ops.fp8ext.paged_decode_attention(q, self.k[layer], self.v[layer], plan.block_table,
                                                       plan.seq_lens, self.k_scale[layer], self.v_scale[layer],
                                                       float(scale), plan.num_splits, window, float(softcap))

    def _check_layer(self, layer) -> None:
        if not is_int(layer) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")

    def memory_bytes(self) -> int:
        return self.num_pages * self.page_size * bytes_per_token(self.num_layers, self.num_kv_heads,
                                                                 self.head_dim, self.dtype)
