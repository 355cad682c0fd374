"""FP8Linear: a drop-in ``nn.Linear`` whose weight is stored in FP8 and whose
matmul runs as an FP8 GEMM (:func:`fp8ext.scaled_mm`)."""
from __future__ import annotations

import contextlib
import math
import warnings
from typing import NamedTuple

import torch
from torch import nn

from fp8ext import _native, gemm, quantize as quantize_api
from fp8ext.formats import non_finite_codes
from fp8ext.ops.reference import pad_cols
from fp8ext.recipes import CurrentScaling, Recipe
from fp8ext.scaling_state import ScalingState

# K is stored padded to this multiple (zeros), so the GEMM never takes its padded path for K.
K_ALIGN = 16
# What from_linear and convert say of a static layer whose input_scale no calibration has set.
STATIC_UNCALIBRATED = "static recipe: every input_scale is 1.0 until calibrated (fp8ext.calibrate)"
# Tensors that keep their dtype when the module is cast (.to(dtype), .half(), ...).
_FP8_STATE = ("weight", "weight_scale", "input_scale", "amax_history")


class FP8Linear(nn.Module):
    """``y = x @ W^T + b`` with W in FP8 and x quantized on the fly, as ``recipe`` says.

    Same constructor and forward contract as :class:`torch.nn.Linear`: any
    leading batch dims; bf16, fp16 or fp32 input, output in the input's dtype
    (under ``torch.autocast``, in autocast's dtype, as nn.Linear's).
    The weight is quantized once (per-tensor, per-channel or 128x128 blocks) and
    kept as an FP8 buffer ``weight`` [out_features, K padded to 16] with its
    float32 ``weight_scale``. Activation scaling follows the recipe: current
    (per-tensor, per-token or 1x128 groups), static (``input_scale``, set by
    calibration or by hand) or delayed (``amax_history`` and ``input_scale``
    updated on the device at every call; no host synchronisation).

    ``.to(dtype)``, ``.half()``, ``.bfloat16()`` cast the bias only: the FP8
    weight and the float32 scales keep their dtypes (device moves apply to all).

    Without a GPU the same module runs through the exact CPU reference. The
    block-wise recipe runs the block-wise GEMM with E4M3 operands; with E5M2 it
    computes through a dequantizing reference path.

    Backward (when grad is enabled and x requires it, e.g. adapters trained
    on a frozen FP8 base): the gradient of x is ``grad @ W`` with the
    dequantized weight in float32, the input's quantization passed straight
    through; the FP8 weight is a buffer and gets none (a bias that requires
    grad gets its sum).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 recipe: Recipe | None = None):
        super().__init__()
        linear = nn.Linear(in_features, out_features, bias, device=device, dtype=torch.float32)
        self._init_from(linear.weight.detach(), linear.bias.detach() if bias else None,
                        recipe if recipe is not None else CurrentScaling(),
                        dtype if dtype is not None else torch.get_default_dtype())

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe | None = None) -> "FP8Linear":
        """Quantizes an existing ``nn.Linear`` (its weight's dtype becomes the bias/compute dtype).
        A static recipe's ``input_scale`` is 1.0 until :func:`fp8ext.calibrate`
        (or a checkpoint) sets it, and this warns so."""
        layer = cls.quantized_from(linear, recipe)
        if layer.recipe.activation_mode == "static":
            warnings.warn(STATIC_UNCALIBRATED, stacklevel=2)
        return layer

    @classmethod
    def quantized_from(cls, linear: nn.Linear, recipe: Recipe | None = None) -> "FP8Linear":
        """:meth:`from_linear` without its warning, for callers that calibrate
        or warn once for a whole model (:func:`fp8ext.convert`)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        w = linear.weight.detach()
        _native.check_input(w, "linear.weight")
        module._init_from(w, None if linear.bias is None else linear.bias.detach(),
                          recipe if recipe is not None else CurrentScaling(), w.dtype)
        return module

    def _init_from(self, weight: torch.Tensor, bias, recipe: Recipe, dtype: torch.dtype) -> None:
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a fp8ext.recipes.Recipe, got {type(recipe).__name__}")
        if dtype not in _native.INPUT_DTYPES:
            raise TypeError(f"dtype (the bias and compute dtype) must be float32, float16 or bfloat16, got {dtype}")
        if weight.device.type != "meta" and not bool(torch.isfinite(weight).all()):
            # Quantizing would saturate them to +-448 * scale: a different layer, silently.
            raise ValueError(f"the weight holds non-finite values ({int((~torch.isfinite(weight)).sum())} of "
                             f"{weight.numel()}): a checkpoint or training problem to fix before quantizing")
        self.out_features, self.in_features = weight.shape
        self.recipe = recipe
        self._high_precision = False
        q, s = quantize_api.quantize(weight, recipe, "weight", pad_k_to=K_ALIGN)
        self.register_buffer("weight", q)
        self.register_buffer("weight_scale", s)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype).clone(), requires_grad=False)
        if recipe.needs_state:  # static and delayed
            self.register_buffer("input_scale", torch.ones((), dtype=torch.float32, device=q.device))
        if recipe.activation_mode == "delayed":
            self.register_buffer("amax_history", torch.zeros(recipe.amax_history_len, dtype=torch.float32,
                                                             device=q.device))

    def _activation_state(self) -> ScalingState | None:
        if self.recipe.activation_mode == "static":  # static scaling never reads the history
            return ScalingState(self.input_scale.reshape(1), self.input_scale)
        if self.recipe.activation_mode == "delayed":
            return ScalingState(self.amax_history, self.input_scale)
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 nn.Linear's name: layer(input=h) works
        x = input
        _native.check_input(x, "input")
        if torch.is_autocast_enabled(x.device.type):
            # As nn.Linear: compute and return in autocast's dtype. The FP8 path
            # itself (the CPU reference's float32 matmuls too) must not be autocast.
            with torch.autocast(x.device.type, enabled=False):
                return self._forward(x.to(torch.get_autocast_dtype(x.device.type)))
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input must be [..., {self.in_features}], got shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(math.prod(lead), self.in_features)
        if x2.shape[0] == 0 and self.recipe.activation_mode == "delayed":
            # No tokens (an MoE expert that got none): nothing to quantize, and an
            # amax of 0 must not enter the history (it would reset the scale).
            return x.new_zeros((*lead, self.out_features))
        if self._high_precision:
            return self._float_matmul(x2, self.bias, x.dtype).reshape(*lead, self.out_features)
        if torch.is_grad_enabled() and (x2.requires_grad or (self.bias is not None and self.bias.requires_grad)):
            y = _StraightThroughFP8Linear.apply(x2, self.bias, self)
        else:
            y = self._forward_2d(x2)
        return y.reshape(*lead, self.out_features)

    def _forward_2d(self, x2: torch.Tensor) -> torch.Tensor:
        q, s = quantize_api.quantize(x2, self.recipe, "activation", state=self._activation_state(),
                                     pad_k_to=K_ALIGN)
        return self._matmul_quantized(q, s, x2.dtype)

    def forward_quantized(self, q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The layer for an input already quantized as its recipe quantizes activations
        with current scaling, e.g. fused with the norm before it
        (:func:`fp8ext.rms_norm_quantize`): q ``[M, K]`` (K may be padded to a
        multiple of 16 with zeros) and its float32 scale: 0-d or per-token ``[M]``,
        or, for block-wise layers, 1x128 group scales ``[M, ceil(K/128)]`` as
        :func:`fp8ext.quantize` returns them. Returns ``[M, out_features]`` in
        out_dtype. Not a module call: forward hooks do not run."""
        if self._high_precision:
            raise RuntimeError("forward_quantized inside high_precision(): the layer must see its unquantized input")
        if self.recipe.activation_mode != "current":
            raise ValueError(f"forward_quantized needs current scaling of activations, got "
                             f"activation_mode={self.recipe.activation_mode!r} (the layer owns its scale)")
        if out_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
        width = -(-self.in_features // K_ALIGN) * K_ALIGN
        if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.shape[1] not in (self.in_features, width):
            raise ValueError(f"q must be [M, {self.in_features}] (or K padded to {width}), got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        if q.dtype != self.recipe.activation_format.torch_dtype:
            raise TypeError(f"q must be {self.recipe.activation_format.torch_dtype} (the recipe's activation "
                            f"format), got {q.dtype}")
        blocks = self.recipe.weight_granularity == "block"
        shapes = ((q.shape[0], -(-self.in_features // 128)),) if blocks else ((), (q.shape[0],))
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or scale.device != q.device or \
                tuple(scale.shape) not in shapes:
            want = f"[{q.shape[0]}, {shapes[0][1]}] (1x128 groups)" if blocks else f"() or [{q.shape[0]}]"
            raise ValueError(f"scale must be a float32 tensor of shape {want} on {q.device}, got "
                             f"{(scale.dtype, tuple(scale.shape), scale.device) if isinstance(scale, torch.Tensor) else scale}")
        if torch.is_grad_enabled() and self.bias is not None and self.bias.requires_grad:
            raise RuntimeError("forward_quantized has no backward (its input is FP8 already): the bias requires "
                               "grad; call it under torch.no_grad(), or use forward() for the straight-through path")
        if q.shape[1] != width:
            q = pad_cols(q, K_ALIGN)
        return self._matmul_quantized(q, scale, out_dtype)

    def _matmul_quantized(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(out_dtype)
        if self.recipe.weight_granularity == "block" and not self._blockwise_gemm_takes_it:
            # E5M2 blocks: exact FP8 emulation (the block-wise kernels take E4M3 only)
            return self._float_matmul(quantize_api.dequantize(q, s, "group", cols=self.in_features), bias, out_dtype)
        return gemm.scaled_mm(q, self.weight, s, self.weight_scale, out_dtype=out_dtype, bias=bias,
                              use_fast_accum=self.recipe.fast_accum)

    @property
    def computes_in_high_precision(self) -> bool:
        """True inside :meth:`high_precision` (the input is not quantized then)."""
        return self._high_precision

    @property
    def _blockwise_gemm_takes_it(self) -> bool:
        return self.recipe.weight_format.torch_dtype == self.recipe.activation_format.torch_dtype == \
            torch.float8_e4m3fn

    @contextlib.contextmanager
    def high_precision(self):
        """Within this context the layer computes with its dequantized weight and
        an unquantized input (calibration measures activations this way)."""
        previous, self._high_precision = self._high_precision, True
        try:
            yield self
        finally:
            self._high_precision = previous

    def dequantized_weight(self) -> torch.Tensor:
        """The weight the layer computes with, as float32 [out_features, in_features]."""
        granularity = "block" if self.recipe.weight_granularity == "block" else None  # else read off the scale
        return quantize_api.dequantize(self.weight, self.weight_scale, granularity, cols=self.in_features)

    def _float_matmul(self, a: torch.Tensor, bias, out_dtype: torch.dtype) -> torch.Tensor:
        """a @ W^T + bias in float32 with the dequantized weight, rounded once to out_dtype."""
        y = a.float() @ self.dequantized_weight().t()
        if bias is not None:
            y = y + bias.float()
        return y.to(out_dtype)

    # Checkpoints hold the weight unpadded [N, K], like vLLM's and compressed-tensors'
    # FP8 files (weight, weight_scale, input_scale); loading also takes their
    # [N, 1] / [1] scale shapes and DeepSeek-V3's block scales (weight_scale_inv).
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        w = destination[prefix + "weight"]
        if w.shape[1] != self.in_features:
            destination[prefix + "weight"] = w[:, :self.in_features].contiguous()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _adapt_checkpoint(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, recurse=True):
        # Casts (.to(dtype), .half(), ...) must not touch the FP8 weight or its
        # float32 scales: they are hidden from nn.Module._apply, then get fn
        # itself when it keeps their dtype (device moves, share_memory_,
        # to_empty), else only the device fn moves to (read off an empty probe).
        cast = fn(torch.empty(0)).dtype  # what fn makes of a float32 tensor (the bias)
        if cast not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise TypeError(f"FP8Linear computes in float32, float16 or bfloat16 (its FP8 weight stays FP8): "
                            f"cannot cast it to {cast}")
        hidden = {name: self._buffers[name] for name in _FP8_STATE if self._buffers.get(name) is not None}
        for name in hidden:
            self._buffers[name] = None
        try:
            super()._apply(fn, recurse)
        except BaseException:
            self._buffers.update(hidden)
            raise
        for name, t in hidden.items():
            probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            self._buffers[name] = fn(t) if probe.dtype == t.dtype else t.to(probe.device)
        return self

    # torch 2.14 cannot pickle float8 tensors (UntypedStorage has no dtype), and
    # multiprocessing, Ray and friends pickle modules: the FP8 buffers travel as
    # their uint8 bits and are viewed back on arrival.
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_buffers"] = {name: _Fp8Bits(t.view(torch.uint8), t.dtype) if _is_fp8(t) else t
                             for name, t in state["_buffers"].items()}
        return state

    def __setstate__(self, state):
        state = dict(state)
        state["_buffers"] = {name: t.bits.view(t.dtype) if isinstance(t, _Fp8Bits) else t
                             for name, t in state["_buffers"].items()}
        super().__setstate__(state)

    def extra_repr(self) -> str:
        r = self.recipe
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weight={r.weight_format.name}/{r.weight_granularity}, activation={r.activation_format.name}/"
                f"{r.activation_mode}/{r.activation_granularity}" + (", fast_accum" if r.fast_accum else ""))


class _Fp8Bits(NamedTuple):
    bits: torch.Tensor  # uint8 view of an FP8 buffer
    dtype: torch.dtype


def _is_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


class _StraightThroughFP8Linear(torch.autograd.Function):
    """The FP8 forward, and the backward of x @ W^T + b with W dequantized (the
    custom ops have no autograd formula: without this the graph would end at
    the layer and the layers before it would silently get no gradient)."""

    @staticmethod
    def forward(ctx, x2, bias, layer):
        ctx.layer = layer
        ctx.x_dtype = x2.dtype
        with torch.no_grad():
            return layer._forward_2d(x2)

    @staticmethod
    def backward(ctx, grad):
        layer = ctx.layer
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad.float() @ layer.dequantized_weight()).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            grad_bias = grad.float().sum(0).to(layer.bias.dtype)
        return grad_x, grad_bias, None


def _readable(t: torch.Tensor) -> bool:
    """Whether a checkpoint tensor's values can be checked (a meta tensor's cannot)."""
    return t.device.type != "meta"


def _adapt_checkpoint(layer: FP8Linear, sd: dict, prefix: str) -> None:
    """Rewrites a layer's checkpoint entries in place into this module's layout."""
    if prefix + "weight_scale_inv" in sd and prefix + "weight_scale" not in sd:
        sd[prefix + "weight_scale"] = sd.pop(prefix + "weight_scale_inv")  # DeepSeek-V3: w = q * scale_inv
    for name in ("weight", "weight_scale", "input_scale", "amax_history"):
        if prefix + name in sd and not isinstance(sd[prefix + name], torch.Tensor):
            raise TypeError(f"{prefix}{name}: the checkpoint holds a {type(sd[prefix + name]).__name__}, "
                            "not a tensor")
    w = sd.get(prefix + "weight")
    if w is not None:
        if w.dtype != layer.weight.dtype:
            raise TypeError(f"{prefix}weight: the checkpoint holds {w.dtype}, this layer's recipe stores "
                            f"{layer.weight.dtype} (recipe {layer.recipe})")
        if w.dim() == 2 and w.shape[1] == layer.in_features and w.shape[1] != layer.weight.shape[1]:
            sd[prefix + "weight"] = pad_cols(w, K_ALIGN)
        elif w.dim() == 2 and w.shape[1] == layer.weight.shape[1] > layer.in_features and _readable(w):
            # Stored already padded (this module's own layout): the padding columns
            # meet the activations' zero padding, so they must be zero (NaN would
            # turn every output NaN, anything else a silent error).
            if bool((w[:, layer.in_features:].view(torch.uint8) & 0x7F).any()):
                raise ValueError(f"{prefix}weight: the columns past in_features={layer.in_features} (K padding) "
                                 "must be zero")
        if _readable(w) and bool(non_finite_codes(w).any()):  # from_linear refuses them too
            raise ValueError(f"{prefix}weight: the checkpoint holds NaN or Inf codes (their output columns would "
                             "be NaN or Inf)")
    history = sd.get(prefix + "amax_history")
    if isinstance(history, torch.Tensor) and layer._buffers.get("amax_history") is not None:
        if not history.is_floating_point():
            raise TypeError(f"{prefix}amax_history: amaxes must be floating point, the checkpoint holds "
                            f"{history.dtype}")
        ok = torch.isfinite(history) & (history >= 0)
        if _readable(history) and not bool(ok.all()):  # an inf amax would quantize inputs to 0 for a history's length
            raise ValueError(f"{prefix}amax_history: every amax must be finite and >= 0 (the checkpoint holds "
                             f"{history[~ok].flatten()[:4].tolist()})")
    for name in ("weight_scale", "input_scale"):
        t = sd.get(prefix + name)
        mine = layer._buffers.get(name)
        if t is None or mine is None:
            continue
        if not t.is_floating_point():
            raise TypeError(f"{prefix}{name}: scales must be floating point, the checkpoint holds {t.dtype}")
        if t.dtype != torch.float32:
            t = sd[prefix + name] = t.float()  # compressed-tensors may store bf16 scales
        ok = torch.isfinite(t) & (t > 0)
        if _readable(t) and not bool(ok.all()):  # load time: reading the values is fine
            raise ValueError(f"{prefix}{name}: every scale must be finite and > 0 (the checkpoint holds "
                             f"{t[~ok].flatten()[:4].tolist()})")
        # Only the other libraries' spellings of the same layout: [N, 1] -> [N], [1] -> [].
        # Any other shape (another granularity with as many values) is left for
        # load_state_dict to refuse as a size mismatch.
        if t.shape != mine.shape and (tuple(t.shape) == (*mine.shape, 1) or t.numel() == mine.numel() == 1):
            sd[prefix + name] = t.reshape(mine.shape)

