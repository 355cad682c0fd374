"""Tensor parallelism for FP8Linear with torch.distributed (gloo on CPUs,
NCCL on GPUs), as Megatron-style column and row shards.

PyTorch's ``ColwiseParallel``/``RowwiseParallel`` only take ``nn.Linear`` and
``nn.Embedding``, so FP8 layers are sharded here, the same way: shard after
quantizing, so every rank computes with exactly the codes and scales of the
unsharded layer.

- Column parallel (``style="column"``): rank r keeps output rows
  [r N/w, (r+1) N/w) of the weight with their per-channel or 128x128 block
  scales (block: N/w a multiple of 128); a per-tensor weight scale is shared.
  The input is replicated, so activation scales agree without communication.
  The output is the local slice of N (``gather_output=True`` all-gathers it).
- Row parallel (``style="row"``): rank r keeps columns [r K/w, (r+1) K/w) and
  gets its slice of the input (a column-parallel layer's output). Current
  per-tensor and per-token scaling all-reduce the amax (MAX) before
  quantizing, and each rank uses the scale the unsharded layer would have
  used; the partial products are summed with an all-reduce and the bias is
  added once. We chose the amax all-reduce over per-shard scales applied
  before the sum because it reproduces the unsharded codes exactly and costs
  one all-reduce of one float (per-tensor) or M floats (per-token), next to
  the output's all-reduce of M x N. 1x128 groups stay inside a shard when K/w
  is a multiple of 128 (no communication); static scales are shared. Delayed
  scaling is refused (its amax history would need the same all-reduce inside
  the fused quantize op).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from fp8ext import gemm
from fp8ext.nn.linear import K_ALIGN, FP8Linear
from fp8ext.ops.reference import amax_finite, div_f32, pad_cols, saturating_cast, scale_from_amax

BLOCK = 128
STYLES = ("column", "row")


def _local_layer(src: FP8Linear, codes, scale, bias, in_features: int, out_features: int) -> FP8Linear:
    layer = FP8Linear.__new__(FP8Linear)
    nn.Module.__init__(layer)
    layer.in_features, layer.out_features, layer.recipe, layer._high_precision = \
        in_features, out_features, src.recipe, False
    layer.register_buffer("weight", pad_cols(codes, K_ALIGN))
    layer.register_buffer("weight_scale", scale.contiguous())
    layer.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)
    for name in ("input_scale", "amax_history"):
        if getattr(src, name, None) is not None:
            layer.register_buffer(name, getattr(src, name).clone())
    return layer


class TensorParallelFP8Linear(nn.Module):
    """One rank's shard of an FP8Linear; see the module docstring."""

    def __init__(self, layer: FP8Linear, style: str, group=None, gather_output: bool = False, parts=None):
        super().__init__()
        if not isinstance(layer, FP8Linear):
            raise TypeError(f"layer must be an FP8Linear or an nn.Linear, got {type(layer).__name__}")
        if layer.recipe.activation_mode == "delayed":
            raise ValueError("delayed scaling is not supported under tensor parallelism (the amax history would "
                             "need an all-reduce inside the quantize op); use current or static scaling")
        world, rank = _world_and_rank(style, group)
        self.group, self.style, self.gather_output = group, style, gather_output
        self.world_size, self.rank = world, rank
        n, k = layer.out_features, layer.in_features
        self.parts = tuple(parts or (n,))
        granularity = layer.recipe.weight_granularity
        codes = layer.weight[:, :k]
        full_bias = None if layer.bias is None else layer.bias.detach()
        if style == "column":
            rows = _rank_rows(self.parts, world, rank, granularity == "block")
            scale = layer.weight_scale
            if granularity == "per_channel" or scale.dim() == 1 and scale.numel() == n:
                scale = torch.cat([scale[lo:hi] for lo, hi in rows])
            elif granularity == "block":
                scale = torch.cat([scale[lo // BLOCK: hi // BLOCK] for lo, hi in rows])
            bias = None if full_bias is None else torch.cat([full_bias[lo:hi] for lo, hi in rows])
            self.local = _local_layer(layer, torch.cat([codes[lo:hi] for lo, hi in rows]), scale, bias, k,
                                      sum(hi - lo for lo, hi in rows))
        else:
            if k % world or (granularity == "block" and (k // world) % BLOCK):
                raise ValueError(f"in_features ({k}) must split into {world} equal shards"
                                 + (f" that are multiples of {BLOCK} (block and group scales)"
                                    if granularity == "block" else ""))
            lo, hi = rank * k // world, (rank + 1) * k // world
            scale = layer.weight_scale
            if granularity == "block":
                scale = scale[:, lo // BLOCK: hi // BLOCK]
            self.local = _local_layer(layer, codes[:, lo:hi], scale, None, hi - lo, n)
            self.register_buffer("bias", full_bias)  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "column":
            y = self.local(x)
            return _gather(y, self.parts, self.world_size, self.group) if self.gather_output else y
        y = self._row_partial(x)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype)

    def _row_partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's x_r @ W_r^T in float32, with the activation scales of the unsharded layer."""
        layer, recipe = self.local, self.local.recipe
        if x.shape[-1] != layer.in_features:
            raise ValueError(f"x must be [..., {layer.in_features}] (this rank's slice of K), got {tuple(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(math.prod(lead), layer.in_features)
        dtype = recipe.activation_format.torch_dtype
        granularity = recipe.activation_granularity
        if recipe.activation_mode == "current" and granularity in ("per_tensor", "per_token"):
            amax = amax_finite(x2, dim=1 if granularity == "per_token" else None)  # as the quantize ops
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
            s = scale_from_amax(amax, dtype, recipe.margin, recipe.power_of_two_scales)
            codes = saturating_cast(div_f32(x2.float(), s.reshape(-1, 1) if s.dim() else s), dtype)
            y = gemm.scaled_mm(pad_cols(codes, K_ALIGN), layer.weight, s, layer.weight_scale, out_dtype=torch.float32)
        else:  # static (shared scale) or 1x128 groups (local to the shard): the layer's own path
            with_bias, layer.bias = layer.bias, None
            y = layer(x2.float() if x2.dtype != torch.float32 else x2).float()
            layer.bias = with_bias
        return y.reshape(*lead, layer.out_features)


def _world_and_rank(style: str, group) -> tuple:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialized (dist.init_process_group) first")
    return dist.get_world_size(group), dist.get_rank(group)


def _gather(y: torch.Tensor, parts: tuple, world: int, group) -> torch.Tensor:
    """The full output from every rank's column shard, part by part: ranks hold
    [q_r, k_r, v_r], the unsharded layer gives [q_0 .. q_w, k_0 .., v_0 ..]."""
    pieces = [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(pieces, y.contiguous(), group=group)
    local = [p // world for p in parts]
    split = [piece.split(local, dim=-1) for piece in pieces]
    return torch.cat([split[r][j] for j in range(len(parts)) for r in range(world)], dim=-1)


def _rank_rows(parts, world: int, rank: int, blocks: bool) -> list:
    """The output rows a rank keeps: its 1/world of each part of a fused layer
    (q, k, v or gate, up), as [(lo, hi)] in the fused layer's rows."""
    rows, start = [], 0
    for size in parts:
        if size % world or (blocks and (size // world) % BLOCK):
            raise ValueError(f"out_features part of {size} rows must split into {world} equal shards"
                             + (f" that are multiples of {BLOCK} (block scales)" if blocks else ""))
        step = size // world
        rows.append((start + rank * step, start + (rank + 1) * step))
        start += size
    return rows


def shard(layer, style: str, group=None, gather_output: bool = False, parts=None) -> nn.Module:
    """This rank's column or row shard of an FP8Linear or an nn.Linear (see the
    module docstring). ``parts``: the output sizes of a fused layer's pieces
    (q, k, v), each of which a column shard splits on its own."""
    if type(layer) is nn.Linear:
        return TensorParallelLinear(layer, style, group, gather_output, parts)
    return TensorParallelFP8Linear(layer, style, group, gather_output, parts)


class TensorParallelLinear(nn.Module):
    """The same sharding for a high-precision nn.Linear (the bf16 baseline)."""

    def __init__(self, layer: nn.Linear, style: str, group=None, gather_output: bool = False, parts=None):
        super().__init__()
        world, rank = _world_and_rank(style, group)
        self.group, self.style, self.gather_output = group, style, gather_output
        self.world_size = world
        w = layer.weight.detach()
        self.parts = tuple(parts or (w.shape[0],))
        b = None if layer.bias is None else layer.bias.detach()
        if style == "column":
            rows = _rank_rows(self.parts, world, rank, False)
            self.weight = nn.Parameter(torch.cat([w[lo:hi] for lo, hi in rows]), requires_grad=False)
            self.bias = None if b is None else nn.Parameter(torch.cat([b[lo:hi] for lo, hi in rows]),
                                                            requires_grad=False)
        else:
            k = w.shape[1]
            if k % world:
                raise ValueError(f"in_features ({k}) must split into {world} equal shards")
            self.weight = nn.Parameter(w[:, rank * k // world: (rank + 1) * k // world].contiguous(),
                                       requires_grad=False)
            self.bias = None if b is None else nn.Parameter(b, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "column":
            y = torch.nn.functional.linear(x, self.weight, self.bias)
            return _gather(y, self.parts, self.world_size, self.group) if self.gather_output else y
        y = torch.nn.functional.linear(x, self.weight)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y if self.bias is None else y + self.bias
