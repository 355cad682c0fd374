"""The quantize / dequantize API: picks the op for a recipe and a role."""
from __future__ import annotations

import math
import numbers

import torch

from fp8ext import _native
from fp8ext.checks import check_positive_int, is_int, refuse_grad
from fp8ext.ops.quantize_checks import MAX_PAD_K_TO
from fp8ext.ops.reference import GROUP
from fp8ext.recipes import Recipe
from fp8ext.scaling_state import ScalingState

ROLES = ("activation", "weight")
GRANULARITIES = ("per_tensor", "per_row", "group", "block")


def _check_pad(pad_k_to) -> int:
    # pad_k_to is an alignment (16 for the GEMMs, 128 for groups): MAX_PAD_K_TO
    # keeps K rounded up to it far from int64 overflow (2**63 - 1 made 0 columns).
    if pad_k_to is None:
        return 0
    check_positive_int("pad_k_to", pad_k_to, " or None")
    if pad_k_to > MAX_PAD_K_TO:
        raise ValueError(f"pad_k_to must be at most {MAX_PAD_K_TO} (an alignment, like 16 or 128), got {pad_k_to}")
    return pad_k_to


def _check_state(state, recipe: Recipe, x: torch.Tensor) -> ScalingState:
    if state is None:
        raise ValueError(f"state is required for activation_mode={recipe.activation_mode!r}: "
                         "pass a fp8ext.ScalingState (ScalingState.create(recipe) / from_scale(s))")
    if not isinstance(state, ScalingState):
        raise TypeError(f"state must be a fp8ext.ScalingState, got {type(state).__name__}")
    if state.device != x.device:
        raise ValueError(f"state is on {state.device} but x is on {x.device}")
    history = state.amax_history.numel()
    if recipe.activation_mode == "delayed" and history != recipe.amax_history_len:
        raise ValueError(f"state's amax_history holds {history} values but the recipe's amax_history_len is "
                         f"{recipe.amax_history_len}: create it with ScalingState.create(recipe)")
    return state


def quantize(x: torch.Tensor, recipe: Recipe, role: str = "activation", state: ScalingState | None = None,
             pad_k_to: int | None = None):
    """Quantizes ``x`` to FP8 as ``recipe`` says for ``role``.

    Args:
        x: float32 / float16 / bfloat16. Activations: [..., K] (leading dims are
            flattened into M for the scales). Weights: [N, K].
        recipe: a :class:`fp8ext.recipes.Recipe`.
        role: "activation" or "weight".
        state: the :class:`ScalingState` of delayed / static activation scaling
            (delayed scaling updates it in place, on the device); the other
            recipes and role="weight" ignore it, so generic code may pass one always.
        pad_k_to: if set, ``q``'s last dim is rounded up to a multiple of it and
            zero-filled (scales still describe the logical K).

    Returns:
        ``(q, scale)``: ``q`` of the recipe's FP8 dtype with x's shape (last dim
        padded); ``scale`` float32 dequantization scales (x ~= q * scale; with
        static scaling it is a view of ``state.scale`` (same storage, not a
        copy, so no kernel runs for it: clone it to keep it past a change of
        the state):
        per-tensor 0-d; per-token / per-channel [M] / [N]; 1x128 groups logical
        [M, ceil(K/128)] stored M-major (stride (1, round_up(M, 4))); 128x128
        blocks [ceil(N/128), ceil(K/128)] row-major.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a fp8ext.recipes.Recipe, got {type(recipe).__name__}")
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    _native.check_input(x, "x")
    refuse_grad("fp8ext.quantize", x)
    pad = _check_pad(pad_k_to)
    if role == "weight":
        if x.dim() != 2:
            raise ValueError(f"x must be a 2-D [N, K] weight for role='weight', got shape {tuple(x.shape)}")
        x2 = as_kernel_matrix(x)
        dtype = recipe.weight_format.torch_dtype
        op = {"per_tensor": torch.ops.fp8ext.quantize_per_tensor,
              "per_channel": torch.ops.fp8ext.quantize_per_row,
              "block": torch.ops.fp8ext.quantize_per_block}[recipe.weight_granularity]
        return op(x2, dtype, recipe.margin, recipe.power_of_two_scales, pad)

    x2 = _rows(x)
    dtype = recipe.activation_format.torch_dtype
    mode = recipe.activation_mode
    if mode == "delayed":
        st = _check_state(state, recipe, x)
        q, s = torch.ops.fp8ext.quantize_delayed(
            x2, st.amax_history, st.scale, dtype, recipe.margin, recipe.power_of_two_scales,
            recipe.amax_compute_algo == "max", pad)
    elif mode == "static":
        st = _check_state(state, recipe, x)
        q = torch.ops.fp8ext.quantize_with_scale(x2, st.scale.reshape(()), dtype, pad)
        s = st.scale.reshape(())
    else:
        op = {"per_tensor": torch.ops.fp8ext.quantize_per_tensor,
              "per_token": torch.ops.fp8ext.quantize_per_row,
              "group": torch.ops.fp8ext.quantize_per_group}[recipe.activation_granularity]
        q, s = op(x2, dtype, recipe.margin, recipe.power_of_two_scales, pad)
    return q.reshape(*x.shape[:-1], q.shape[-1]), s


def _check_per_token(recipe, what: str) -> None:
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a fp8ext.recipes.Recipe, got {type(recipe).__name__}")
    if recipe.activation_mode != "current" or recipe.activation_granularity != "per_token":
        raise ValueError(f"{what} needs per-token current scaling of activations (RowWise), got "
                         f"activation_mode={recipe.activation_mode!r}, "
                         f"activation_granularity={recipe.activation_granularity!r}")


def _check_fused_inputs(what: str, x: torch.Tensor, **others) -> None:
    """The fused ops' common checks (x already passed _native.check_input): the
    other tensors are tensors on x's device (a weight left on the meta device
    would otherwise take the meta kernel and return uninitialised memory), and
    none requires grad while grad mode is on (FP8 codes have no backward: the
    outputs would silently give no gradient)."""
    for name, t in others.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != x.device:
            raise ValueError(f"{what}: {name} must be on x's device {x.device}, got {t.device}")
    refuse_grad(what, x, *others.values())


def _check_eps(what: str, eps) -> float:
    """RMSNorm's eps: a finite float >= 0 that fp32 holds (1e300 would become inf)."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{what}: eps must be a float, got {type(eps).__name__}")
    if not 0.0 <= eps <= torch.finfo(torch.float32).max:
        raise ValueError(f"{what}: eps must be finite and >= 0 (in float32), got {eps!r}")
    return float(eps)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as a [M, K] matrix with unit column stride (callers have run _native.check_input)."""
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., K], got a 0-d tensor")
    return as_kernel_matrix(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]))


def as_kernel_matrix(x2: torch.Tensor) -> torch.Tensor:
    """A 2-D x2 as the kernels read it: unit column stride and rows that do not
    overlap. Anything else (a transposed view, rows expanded with stride 0) is
    copied first."""
    rows, cols = x2.shape
    if (cols > 1 and x2.stride(1) != 1) or (rows > 1 and x2.stride(0) < cols):
        return x2.contiguous()
    return x2


def rms_norm_quantize(x: torch.Tensor, weight: torch.Tensor, eps: float, recipe: Recipe,
                      pad_k_to: int | None = None):
    """``quantize(weight * rms_norm(x, eps), recipe)`` for recipes with per-token
    current scaling of activations (:class:`fp8ext.recipes.RowWise`), in one
    launch on the GPU, where the unfused path takes three (norm, weight multiply,
    quantize). RMSNorm is rounded as Hugging Face's Llama rounds it (fp32, then
    x's dtype, then the weight multiply); on the CPU the result is bit-identical
    to the unfused path. ``weight`` is ``[x.shape[-1]]`` in x's dtype. Returns
    ``(q, scale)`` as :func:`quantize`."""
    _check_per_token(recipe, "rms_norm_quantize")
    _native.check_input(x, "x")
    _check_fused_inputs("rms_norm_quantize", x, weight=weight)
    eps = _check_eps("rms_norm_quantize", eps)
    pad = _check_pad(pad_k_to)
    q, s = torch.ops.fp8ext.rms_norm_quantize_per_row(_rows(x), weight.contiguous(), eps,
                                                      recipe.activation_format.torch_dtype, recipe.margin,
                                                      recipe.power_of_two_scales, pad)
    return q.reshape(*x.shape[:-1], q.shape[-1]), s


def add_rms_norm_quantize(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                          recipe: Recipe, pad_k_to: int | None = None):
    """``h = x + residual``, then :func:`rms_norm_quantize` of ``h``: a decoder
    layer's residual add fused with the norm after it, one launch on the GPU
    (bit-identical to the unfused path on the CPU). ``residual`` has x's shape
    and dtype. Returns ``(q, scale, h)``; ``h`` is the next residual."""
    _check_per_token(recipe, "add_rms_norm_quantize")
    _native.check_input(x, "x")
    _check_fused_inputs("add_rms_norm_quantize", x, residual=residual, weight=weight)
    eps = _check_eps("add_rms_norm_quantize", eps)
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    pad = _check_pad(pad_k_to)
    q, s, h = torch.ops.fp8ext.add_rms_norm_quantize_per_row(
        _rows(x), _rows(residual), weight.contiguous(), eps, recipe.activation_format.torch_dtype,
        recipe.margin, recipe.power_of_two_scales, pad)
    return q.reshape(*x.shape[:-1], q.shape[-1]), s, h.reshape(x.shape)


def silu_mul_quantize(x: torch.Tensor, recipe: Recipe, pad_k_to: int | None = None):
    """``quantize(silu(gate) * up, recipe)`` for ``x = [gate | up]`` (``[..., 2I]``,
    a SwiGLU gate_up projection's output) and per-token current scaling
    (:class:`fp8ext.recipes.RowWise`): one launch on the GPU instead of three;
    bit-identical to the unfused path on the CPU. On the GPU silu is computed
    with the special-function unit's exp2 and reciprocal (relative error below
    2^-17), so a few codes may sit one FP8 step from the unfused path's and a
    row's scale may differ in its last bits.
    Returns ``(q [..., I], scale)``."""
    _check_per_token(recipe, "silu_mul_quantize")
    _native.check_input(x, "x")
    _check_fused_inputs("silu_mul_quantize", x)
    pad = _check_pad(pad_k_to)
    q, s = torch.ops.fp8ext.silu_mul_quantize_per_row(_rows(x), recipe.activation_format.torch_dtype,
                                                      recipe.margin, recipe.power_of_two_scales, pad)
    return q.reshape(*x.shape[:-1], q.shape[-1]), s


def _infer_granularity(scale: torch.Tensor, granularity, rows: int):
    """The other libraries' spellings count too: one value as [1] or [1, 1] (vLLM) is
    per-tensor, [rows, 1] (compressed-tensors) per-row: the 1x128-group and
    128x128-block scales of those shapes give the same values. ([1, rows] is not
    read as per-row: it is also the block scale of a weight of <= 128 rows.)"""
    if granularity is not None:
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        return granularity
    if scale.numel() == 1 and scale.dim() <= 2:
        return "per_tensor"
    if scale.dim() == 1 or (scale.dim() == 2 and scale.shape[1] == 1 and scale.shape[0] == rows):
        return "per_row"
    raise ValueError("granularity is required for 2-D scales: 'group' (1x128 activations) or 'block' "
                     "(128x128 weights)")


def dequantize(q: torch.Tensor, scale: torch.Tensor, granularity: str | None = None, *, cols: int | None = None,
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: ``q * scale`` computed in float32.

    Args:
        q: FP8 tensor [..., K_padded] (weights and group/block scales: 2-D).
        scale: as returned by :func:`quantize`.
        granularity: "per_tensor" (one value), "per_row" ([M]), "group" or
            "block"; inferred for one value ([], [1], [1, 1]) and per-row scales
            ([M], [M, 1]), required for other 2-D ones.
        cols: logical K (drops the padding columns); default q's last dim.
        out_dtype: float32 (default), bfloat16 or float16.
    Returns:
        [..., cols] tensor of ``out_dtype``.
    """
    if not isinstance(q, torch.Tensor) or q.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"q must be a float8_e4m3fn / float8_e5m2 tensor, got "
                        f"{getattr(q, 'dtype', type(q).__name__)}")
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise TypeError(f"scale must be a float32 tensor, got {getattr(scale, 'dtype', type(scale).__name__)}")
    if out_dtype not in _native.INPUT_DTYPES:
        raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    if scale.device != q.device:
        raise ValueError(f"scale must be on q's device ({q.device}), got {scale.device}")
    if q.dim() < 1:
        raise ValueError("q must have at least one dimension [..., K], got a 0-d tensor")
    g = _infer_granularity(scale, granularity, math.prod(q.shape[:-1]))
    if cols is not None and not is_int(cols):
        raise TypeError(f"cols must be an int or None, got {cols!r}")
    k = q.shape[-1] if cols is None else cols
    if not 0 <= k <= q.shape[-1]:
        raise ValueError(f"cols must be in [0, {q.shape[-1]}], got {k}")
    qf = q[..., :k].float()
    if g == "per_tensor":
        if scale.numel() != 1:
            raise ValueError(f"per_tensor scale must hold one value, got shape {tuple(scale.shape)}")
        out = qf * scale.reshape(())
    elif g == "per_row":
        qf2 = qf.reshape(math.prod(qf.shape[:-1]), k)  # not -1: K may be 0
        if tuple(scale.shape) not in ((qf2.shape[0],), (qf2.shape[0], 1)):
            raise ValueError(f"per_row scale must have shape ({qf2.shape[0]},) (or [{qf2.shape[0]}, 1]), got "
                             f"{tuple(scale.shape)}")
        out = (qf2 * scale.reshape(-1, 1)).reshape(qf.shape)
    else:
        qf2 = qf.reshape(math.prod(qf.shape[:-1]), k)  # not -1: K may be 0
        m = qf2.shape[0]
        rows_per_scale = 1 if g == "group" else GROUP
        want = (-(-m // rows_per_scale), -(-k // GROUP))
        if tuple(scale.shape) != want:
            raise ValueError(f"{g} scale must have shape {want} for q of shape {tuple(q.shape)}, "
                             f"got {tuple(scale.shape)}")
        expanded = scale.repeat_interleave(rows_per_scale, 0)[:m].repeat_interleave(GROUP, 1)[:, :k]
        out = (qf2 * expanded).reshape(qf.shape)
    return out.to(out_dtype)
