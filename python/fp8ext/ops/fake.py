"""Fake (meta) implementations: output shapes, dtypes and strides of every op,
so torch.compile(fullgraph=True) can trace them. They mirror
csrc/torch/quantize_outputs.h, refuse tensors on mixed devices as the real
ops do (see _fake), and make the real ops' argument checks that read no
values (a bad page id or slot is found only when the op runs): those that read
sizes where every size is known, the others (dtypes, ranks, margin, pad_k_to)
always."""
from __future__ import annotations

import functools
import inspect

import torch

from fp8ext.ops import fused, kv_cache_reference as kv
from fp8ext.ops import quantize_checks as qc
from fp8ext.ops.gemm_reference import check_blockwise_args, check_scaled_mm_args
from fp8ext.ops.reference import GROUP, GROUP_SCALE_ROW_ALIGN


MAX_CUDA_BLOCK_ROWS = 65535 * 128  # the 128x128 quantize kernel's grid.y (quantize_ops_cuda.cpp)

# op name -> its fake with the device check, which ops/cuda_fallback.py also
# runs before the reference path, so the fallback refuses what the fakes refuse.
CHECKED = {}


def _fake(op: str):
    """torch.library.register_fake for `op`, after checking that every tensor
    argument is on the first one's device, as the real ops require. Without
    it, one input on the meta device among real ones (a weight built there and
    never loaded) sends the call here, since Meta outranks CPU and CUDA in
    dispatch, and the caller gets uninitialised memory instead of an error."""
    def register(fn):
        names = list(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            tensors = [(n, a) for n, a in [*zip(names, args), *kwargs.items()] if isinstance(a, torch.Tensor)]
            for name, t in tensors[1:]:
                if t.device != tensors[0][1].device:
                    raise ValueError(f"{op}: {name} must be on {tensors[0][0]}'s device {tensors[0][1].device}, "
                                     f"got {t.device}")
            return fn(*args, **kwargs)

        torch.library.register_fake(op)(checked)
        CHECKED[op] = checked
        return fn
    return register


def _concrete(*tensors) -> bool:
    """Whether every size is a plain int. The fakes check their arguments only
    then (meta tensors, or torch.compile with static shapes): a symbolic size
    would turn the checks into guards, and a data-dependent one (rows picked by
    a mask) cannot be decided at all; the real op checks at run time there."""
    return all(isinstance(d, int) for t in tensors if isinstance(t, torch.Tensor) for d in t.shape)


def _check_input(x: torch.Tensor) -> None:
    """check_input_matrix where x's sizes are known; with symbolic sizes only
    its rank and dtype checks, which read none."""
    if _concrete(x):
        qc.check_input_matrix(x)
    else:
        qc.check_input_rank_and_dtype(x)


def _check_quantize(x, dtype, margin: int, pad_k_to: int) -> None:
    """qc.check_quantize, its size checks only where x's sizes are known."""
    _check_input(x)
    qc.check_scale_rule(dtype, margin)
    qc.check_pad_k_to(pad_k_to)


def _k_padded(k: int, pad_k_to: int) -> int:
    return -(-k // pad_k_to) * pad_k_to if pad_k_to > 1 else k


def _q(x, dtype, pad_k_to):
    return x.new_empty((x.shape[0], _k_padded(x.shape[1], pad_k_to)), dtype=dtype)


def _f32(x, shape):
    return x.new_empty(shape, dtype=torch.float32)


@_fake("fp8ext::cast_to_fp8")
def _cast_to_fp8(x, dtype, saturate):
    _check_input(x)
    qc.check_fp8_dtype(dtype)
    return x.new_empty(x.shape, dtype=dtype)


@_fake("fp8ext::quantize_with_scale")
def _quantize_with_scale(x, scale, dtype, pad_k_to):
    _check_input(x)
    if _concrete(scale):
        qc.check_scalar_fp32(scale, "scale")
    qc.check_fp8_dtype(dtype)
    qc.check_pad_k_to(pad_k_to)
    return _q(x, dtype, pad_k_to)


@_fake("fp8ext::quantize_per_tensor")
def _quantize_per_tensor(x, dtype, margin, power_of_two, pad_k_to):
    _check_quantize(x, dtype, margin, pad_k_to)
    return _q(x, dtype, pad_k_to), _f32(x, ())


@_fake("fp8ext::quantize_delayed")
def _quantize_delayed(x, amax_history, scale, dtype, margin, power_of_two, use_history_max, pad_k_to):
    _check_input(x)
    qc.check_scale_rule(dtype, margin)
    if _concrete(amax_history, scale):
        qc.check_scalar_fp32(scale, "scale")
        qc.check_amax_history(amax_history)
    qc.check_pad_k_to(pad_k_to)
    return _q(x, dtype, pad_k_to), _f32(x, ())


@_fake("fp8ext::quantize_per_row")
def _quantize_per_row(x, dtype, margin, power_of_two, pad_k_to):
    _check_quantize(x, dtype, margin, pad_k_to)
    return _q(x, dtype, pad_k_to), _f32(x, (x.shape[0],))


@_fake("fp8ext::rms_norm_quantize_per_row")
def _rms_norm_quantize_per_row(x, weight, eps, dtype, margin, power_of_two, pad_k_to):
    _check_input(x)
    if _concrete(x, weight):
        fused.check_norm_weight(x, weight, eps)
    qc.check_scale_rule(dtype, margin)
    qc.check_pad_k_to(pad_k_to)
    return _q(x, dtype, pad_k_to), _f32(x, (x.shape[0],))


@_fake("fp8ext::add_rms_norm_quantize_per_row")
def _add_rms_norm_quantize_per_row(x, residual, weight, eps, dtype, margin, power_of_two, pad_k_to):
    _check_input(x)
    if _concrete(x, residual, weight):
        fused.check_residual(x, residual)
        fused.check_norm_weight(x, weight, eps)
    qc.check_scale_rule(dtype, margin)
    qc.check_pad_k_to(pad_k_to)
    return _q(x, dtype, pad_k_to), _f32(x, (x.shape[0],)), x.new_empty(x.shape)


@_fake("fp8ext::silu_mul_quantize_per_row")
def _silu_mul_quantize_per_row(x, dtype, margin, power_of_two, pad_k_to):
    _check_input(x)
    fused.check_gate_up(x)  # symbolic widths too: the output's width depends on it
    qc.check_scale_rule(dtype, margin)  # after the width, as the CUDA op and the CPU composition check them
    qc.check_pad_k_to(pad_k_to)
    return x.new_empty((x.shape[0], _k_padded(x.shape[1] // 2, pad_k_to)), dtype=dtype), _f32(x, (x.shape[0],))


@_fake("fp8ext::quantize_per_group")
def _quantize_per_group(x, dtype, margin, power_of_two, pad_k_to):
    _check_quantize(x, dtype, margin, pad_k_to)
    m, k = x.shape
    groups = -(-k // GROUP)
    m_pad = -(-m // GROUP_SCALE_ROW_ALIGN) * GROUP_SCALE_ROW_ALIGN
    storage = _f32(x, (groups, m_pad))
    return _q(x, dtype, pad_k_to), storage.as_strided((m, groups), (1, m_pad))


@_fake("fp8ext::quantize_per_block")
def _quantize_per_block(x, dtype, margin, power_of_two, pad_k_to):
    _check_quantize(x, dtype, margin, pad_k_to)
    if x.device.type == "cuda" and _concrete(x) and x.shape[0] > MAX_CUDA_BLOCK_ROWS:
        raise ValueError(f"quantize_per_block: x must have at most {MAX_CUDA_BLOCK_ROWS} rows (65535 blocks of 128) "
                         f"on CUDA, got {x.shape[0]}")
    m, k = x.shape
    return _q(x, dtype, pad_k_to), _f32(x, (-(-m // GROUP), -(-k // GROUP)))


@_fake("fp8ext::scaled_mm")
def _scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, config, use_fast_accum=False):
    if _concrete(a, b, scale_a, scale_b, bias):  # meta tensors: the op's own checks (metadata only)
        check_scaled_mm_args(a, b, scale_a, scale_b, bias, out_dtype, config)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@_fake("fp8ext::kv_cache_write")
def _kv_cache_write(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    if _concrete(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
        kv.check_write(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, read_values=False)
    return None


@_fake("fp8ext::kv_cache_write_rotary")
def _kv_cache_write_rotary(qkv, cos, sin, k_cache, v_cache, slot_mapping, k_scale, v_scale, num_q_heads):
    if _concrete(qkv, cos, sin, k_cache, v_cache, slot_mapping, k_scale, v_scale):
        fused.check_rotary(qkv, cos, sin, k_cache, v_cache, num_q_heads, read_memory=False)
        k = qkv.new_empty((qkv.shape[0], *k_cache.shape[2:]))  # what the op hands kv_cache_write
        kv.check_write(k, k, k_cache, v_cache, slot_mapping, k_scale, v_scale, read_values=False)
    return qkv.new_empty((qkv.shape[0], num_q_heads, k_cache.shape[3]))


@_fake("fp8ext::paged_decode_attention")
def _paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, softmax_scale,
                            num_splits=1, window=0, softcap=0.0):
    if _concrete(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale):
        kv.check_attention(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, num_splits, window,
                           softcap, read_values=False)
        kv.check_softmax_scale(softmax_scale)
    return q.new_empty(q.shape)


@_fake("fp8ext::scaled_mm_blockwise")
def _scaled_mm_blockwise(a, b, scale_a, scale_b, bias, out_dtype, config):
    if _concrete(a, b, scale_a, scale_b, bias):
        check_blockwise_args(a, b, scale_a, scale_b, bias, out_dtype, config)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)
