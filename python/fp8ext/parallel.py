"""Tensor parallelism for FP8Linear with torch.distributed (gloo on CPUs,
NCCL on GPUs), as Megatron-style column and row shards.

PyTorch's ``ColwiseParallel``/``RowwiseParallel`` only take ``nn.Linear`` and
``nn.Embedding``, so FP8 layers are sharded here, the same way, after
quantizing: the weight codes and scales are sliced, never re-quantized.

- Column parallel (``style="column"``): rank r keeps output rows
  [r N/w, (r+1) N/w) of the weight with their per-channel or 128x128 block
  scales (block: N/w a multiple of 128 when w > 1); a per-tensor weight scale
  is shared.
  The input is replicated, so every rank computes the activation scales of the
  unsharded layer (delayed scaling: each rank's history sees the same amax),
  and the output is exactly the unsharded layer's local slice of N
  (``gather_output=True`` all-gathers it).
- Row parallel (``style="row"``): rank r keeps columns [r K/w, (r+1) K/w) and
  gets its slice of the input (a column-parallel layer's output). The shard is
  an ordinary FP8Linear on that slice with its own activation scales (current
  per-tensor, per-token or 1x128 groups, static with the shared calibrated
  ``input_scale``, or delayed with its own amax history); the partial outputs,
  in the input's dtype, are summed with an all-reduce and the bias is added
  once. We chose per-shard scales applied before the sum (as vLLM does) over
  all-reducing the amax first: no collective runs before the GEMM, the fused
  quantize kernel does the work instead of reference ops, and each scale
  covers a subset of the values, so it is at least as fine as the unsharded
  one. The amax all-reduce design made the FP8 model slower at TP = 2 than at
  TP = 1 on 2 H200s (Llama-8B shape, W8A8 row-wise + FP8 KV: step 10.03 vs
  6.25 ms at batch 1, 15.18 vs 12.98 ms at batch 64, while bf16 went from 7.31
  to 6.40 and 16.62 to 11.63 ms). The cost: the activation codes differ from
  the unsharded layer's, so TP = 2 equals TP = 1 within FP8 tolerance, not bit
  for bit. Block and group scales need K/w to be a multiple of 128 (then a
  shard's 1x128 groups are the unsharded layer's). At w = 1 every layer
  shards, whatever its sizes: the shard is the whole layer.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from fp8ext.checks import check_bool, is_int
from fp8ext.nn.linear import K_ALIGN, FP8Linear
from fp8ext.ops.reference import GROUP, pad_cols

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
            raise TypeError(f"layer must be an FP8Linear (fp8ext.parallel.shard takes an nn.Linear too), "
                            f"got {type(layer).__name__}")
        world, rank = _world_and_rank(style, group, gather_output)
        self.group, self.style, self.gather_output = group, style, gather_output
        self.world_size, self.rank = world, rank
        n, k = layer.out_features, layer.in_features
        self.parts = _checked_parts(parts, n)
        blocks = layer.recipe.weight_granularity == "block"
        codes = layer.weight[:, :k]
        full_bias = None if layer.bias is None else layer.bias.detach()
        if style == "column":
            rows = _rank_rows(self.parts, world, rank, blocks)
            bias = None if full_bias is None else torch.cat([full_bias[lo:hi] for lo, hi in rows])
            self.local = _local_layer(layer, torch.cat([codes[lo:hi] for lo, hi in rows]),
                                      _column_scale(layer, rows), bias, k, sum(hi - lo for lo, hi in rows))
        else:
            lo, hi = _rank_cols(k, world, rank, blocks)
            scale = layer.weight_scale[:, lo // GROUP: _blocks_to(hi)] if blocks else layer.weight_scale
            self.local = _local_layer(layer, codes[:, lo:hi], scale, None, hi - lo, n)
            self.register_buffer("bias", full_bias)  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)  # the fused quantize + GEMM with this shard's own activation scales
        if self.style == "column":
            return _gather(y, self.parts, self.world_size, self.group) if self.gather_output else y
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def _column_scale(layer: FP8Linear, rows: list) -> torch.Tensor:
    """The weight scales of a column shard's rows (a per-tensor scale is shared)."""
    scale = layer.weight_scale
    if layer.recipe.weight_granularity == "per_channel" or scale.dim() == 1 and scale.numel() == layer.out_features:
        return torch.cat([scale[lo:hi] for lo, hi in rows])
    if layer.recipe.weight_granularity == "block":
        return torch.cat([scale[lo // GROUP: _blocks_to(hi)] for lo, hi in rows])
    return scale


def _blocks_to(hi: int) -> int:
    """The end of the 128-blocks covering rows or columns [.., hi): a shard's end
    is a block edge, but at world 1 it is the layer's, whose last block may be partial."""
    return -(-hi // GROUP)


def _rank_cols(k: int, world: int, rank: int, blocks: bool) -> tuple:
    """The input columns [lo, hi) a row shard keeps (at world 1: all of them, any K)."""
    if world == 1:
        return 0, k
    if k % world or (blocks and (k // world) % GROUP):
        raise ValueError(f"in_features ({k}) must split into {world} equal shards"
                         + (f" that are multiples of {GROUP} (block and group scales)" if blocks else ""))
    return rank * k // world, (rank + 1) * k // world


def _world_and_rank(style: str, group, gather_output) -> tuple:
    """(world size, rank) of `group`, after the arguments every shard takes are checked."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    check_bool("gather_output", gather_output)
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialized (dist.init_process_group) first")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    return dist.get_world_size(group), dist.get_rank(group)


def _gather(y: torch.Tensor, parts: tuple, world: int, group) -> torch.Tensor:
    """The full output from every rank's column shard, part by part: ranks hold
    [q_r, k_r, v_r], the unsharded layer gives [q_0 .. q_w, k_0 .., v_0 ..]."""
    pieces = [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(pieces, y.contiguous(), group=group)
    local = [p // world for p in parts]
    split = [piece.split(local, dim=-1) for piece in pieces]
    return torch.cat([split[r][j] for j in range(len(parts)) for r in range(world)], dim=-1)


def _checked_parts(parts, out_features: int) -> tuple:
    """A fused layer's part sizes: positive ints that add up to out_features (None: one part)."""
    if parts is None:
        return (out_features,)
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Iterable):
        raise ValueError(f"parts must be positive ints adding up to out_features ({out_features}), got {parts!r}")
    parts = tuple(parts)
    if not parts or any(not is_int(p) or p < 1 for p in parts) or \
            sum(parts) != out_features:
        raise ValueError(f"parts must be positive ints adding up to out_features ({out_features}), got {parts}")
    return parts


def _rank_rows(parts, world: int, rank: int, blocks: bool) -> list:
    """The output rows a rank keeps: its 1/world of each part of a fused layer
    (q, k, v or gate, up), as [(lo, hi)] in the fused layer's rows. At world 1
    that is the whole layer, whatever its sizes."""
    if world == 1:
        return [(0, sum(parts))]
    rows, start = [], 0
    for size in parts:
        if size % world or (blocks and (size // world) % GROUP):
            raise ValueError(f"out_features part of {size} rows must split into {world} equal shards"
                             + (f" that are multiples of {GROUP} (block scales)" if blocks else ""))
        step = size // world
        rows.append((start + rank * step, start + (rank + 1) * step))
        start += size
    return rows


def shard(layer, style: str, group=None, gather_output: bool = False, parts=None) -> nn.Module:
    """This rank's column or row shard of an FP8Linear or an nn.Linear (see the
    module docstring). ``parts``: the output sizes of a fused layer's pieces
    (q, k, v), each of which a column shard splits on its own."""
    if type(layer) is not nn.Linear and not isinstance(layer, FP8Linear):
        raise TypeError(f"layer must be an FP8Linear or a plain nn.Linear (not a subclass, whose forward may "
                        f"differ), got {type(layer).__name__}")
    _checked_parts(parts, layer.out_features)  # before torch.distributed is asked for the world
    if type(layer) is nn.Linear:
        return TensorParallelLinear(layer, style, group, gather_output, parts)
    return TensorParallelFP8Linear(layer, style, group, gather_output, parts)


class TensorParallelLinear(nn.Module):
    """The same sharding for a high-precision nn.Linear (the bf16 baseline)."""

    def __init__(self, layer: nn.Linear, style: str, group=None, gather_output: bool = False, parts=None):
        super().__init__()
        if type(layer) is not nn.Linear:  # an FP8Linear's codes would be taken as its weight
            raise TypeError(f"layer must be a plain nn.Linear (TensorParallelFP8Linear takes an FP8Linear), "
                            f"got {type(layer).__name__}")
        world, rank = _world_and_rank(style, group, gather_output)
        self.group, self.style, self.gather_output = group, style, gather_output
        self.world_size = world
        w = layer.weight.detach()
        self.parts = _checked_parts(parts, w.shape[0])
        b = None if layer.bias is None else layer.bias.detach()
        if style == "column":
            rows = _rank_rows(self.parts, world, rank, False)
            self.weight = nn.Parameter(torch.cat([w[lo:hi] for lo, hi in rows]), requires_grad=False)
            self.bias = None if b is None else nn.Parameter(torch.cat([b[lo:hi] for lo, hi in rows]),
                                                            requires_grad=False)
        else:
            lo, hi = _rank_cols(w.shape[1], world, rank, False)
            self.weight = nn.Parameter(w[:, lo:hi].contiguous(), requires_grad=False)
            self.bias = None if b is None else nn.Parameter(b, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.weight.shape[1]:
            want = "the whole input" if self.style == "column" else \
                "this rank's shard of the input (in_features / world size)"
            raise ValueError(f"x must be {want}, [..., {self.weight.shape[1]}], got {tuple(x.shape)}")
        if self.style == "column":
            y = torch.nn.functional.linear(x, self.weight, self.bias)
            return _gather(y, self.parts, self.world_size, self.group) if self.gather_output else y
        y = torch.nn.functional.linear(x, self.weight)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y if self.bias is None else y + self.bias
