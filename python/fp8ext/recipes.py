"""Scaling recipes: plain, validated dataclasses (no tensors, no state).

A recipe says how weights are scaled (``weight_granularity``), how activations
are scaled (``activation_mode`` x ``activation_granularity``), and each side's
format. State (amax history, static scales) lives in :class:`fp8ext.ScalingState`.

Numerics (every backend matches these bit for bit):

* dequantization scale ``s = (amax * 2**margin) / fp8_max`` in float32 (IEEE
  division); ``q = saturating_cast(x_fp32 / s)`` with IEEE division, clamp to
  +-fp8_max, then round to nearest even; dequantization is ``q * s``.
* amax is taken over finite values; amax == 0 (or no finite value) gives s = 1.
* +-Inf saturates to +-fp8_max; NaN stays NaN.
* s below 2**-126 becomes 2**-126 and an infinite s becomes FLT_MAX, so x / s
  stays finite for finite x.
* ``power_of_two_scales`` rounds s up to a power of two (exact rescaling).
* Delayed scaling quantizes with the scale derived from the history so far, then
  pushes this tensor's amax to the front of the history (newest first) and
  recomputes the scale from ``max(history)`` ("max") or ``history[0]``
  ("most_recent"). A fresh state has a zero history and s = 1.
* Groups (1x128 activations) and blocks (128x128 weights) that run past the
  tensor's edge take their amax over the elements that exist.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from fp8ext.checks import check_bool, check_positive_int, is_int
from fp8ext.formats import E4M3, FP8Format, get_format

WEIGHT_GRANULARITIES = ("per_tensor", "per_channel", "block")
ACTIVATION_GRANULARITIES = ("per_tensor", "per_token", "group")
ACTIVATION_MODES = ("current", "delayed", "static")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
MAX_MARGIN = 64
GROUP_SIZE = 128  # 1x128 activation groups and 128x128 weight blocks (DeepSeek-V3)


def check_margin(margin, name: str = "margin") -> None:
    """A scale headroom in powers of two: an int in [-MAX_MARGIN, MAX_MARGIN]."""
    if not is_int(margin):
        raise TypeError(f"{name} must be an int, got {type(margin).__name__}")
    if abs(margin) > MAX_MARGIN:
        raise ValueError(f"{name} must be in [-{MAX_MARGIN}, {MAX_MARGIN}], got {margin}")


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class Recipe:
    """How weights and activations are scaled to FP8.

    Attributes:
        weight_granularity: "per_tensor", "per_channel" (one scale per output row
            of the [N, K] weight) or "block" (128x128 blocks).
        activation_mode: "current" (scale from the live tensor), "delayed" (from
            an amax history) or "static" (a calibrated scale).
        activation_granularity: "per_tensor", "per_token" (one scale per row) or
            "group" (1x128 groups along K). Delayed and static are per-tensor.
        weight_format / activation_format: "e4m3" (default) or "e5m2".
        margin: scale headroom in powers of two: s = amax * 2**margin / fp8_max.
        power_of_two_scales: round every scale up to a power of two.
        amax_history_len: history length for delayed scaling.
        amax_compute_algo: "max" over the history or "most_recent".
        fast_accum: let the GEMM skip the periodic fp32 promotion of the tensor
            cores' partial sums where that is faster (:func:`fp8ext.scaled_mm`'s
            ``use_fast_accum``): what torchao's FP8 inference and Transformer
            Engine's forward GEMMs do by default, at an error that grows with K.
            Off by default; the block-wise GEMM always promotes; the CPU path
            computes exactly either way.
    """

    weight_granularity: str = "per_tensor"
    activation_mode: str = "current"
    activation_granularity: str = "per_tensor"
    weight_format: FP8Format = E4M3
    activation_format: FP8Format = E4M3
    margin: int = 0
    power_of_two_scales: bool = False
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fast_accum: bool = False

    def __post_init__(self):
        _choice("weight_granularity", self.weight_granularity, WEIGHT_GRANULARITIES)
        _choice("activation_mode", self.activation_mode, ACTIVATION_MODES)
        _choice("activation_granularity", self.activation_granularity, ACTIVATION_GRANULARITIES)
        _choice("amax_compute_algo", self.amax_compute_algo, AMAX_COMPUTE_ALGOS)
        object.__setattr__(self, "weight_format", get_format(self.weight_format))
        object.__setattr__(self, "activation_format", get_format(self.activation_format))
        check_margin(self.margin)
        check_bool("fast_accum", self.fast_accum)
        check_bool("power_of_two_scales", self.power_of_two_scales)
        check_positive_int("amax_history_len", self.amax_history_len)
        if self.activation_mode != "current" and self.activation_granularity != "per_tensor":
            raise ValueError(
                f"activation_mode={self.activation_mode!r} needs activation_granularity='per_tensor' "
                f"(got {self.activation_granularity!r}): only current scaling is per-token or per-group")
        if (self.weight_granularity == "block") != (self.activation_granularity == "group"):
            raise ValueError(
                "block weights (128x128) and group activations (1x128) go together: the block-wise GEMM "
                f"needs both; got weight_granularity={self.weight_granularity!r}, "
                f"activation_granularity={self.activation_granularity!r}")

    @property
    def needs_state(self) -> bool:
        """True when activations need a ScalingState (delayed or static)."""
        return self.activation_mode in ("delayed", "static")

    def replace(self, **changes) -> "Recipe":
        """A copy with some fields changed (validated again), keeping the preset's class."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return type(self)(**values)

    def to_dict(self) -> dict:
        """Plain JSON-ready values (the preset's name, formats by name): for a
        checkpoint's metadata, so that a converted model's per-layer recipes can
        be rebuilt without pickling classes (:meth:`from_dict`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["weight_format"], values["activation_format"] = self.weight_format.name, self.activation_format.name
        return {"preset": type(self).__name__, **values}

    @staticmethod
    def from_dict(values: dict) -> "Recipe":
        """The recipe :meth:`to_dict` wrote (validated like any other)."""
        if not isinstance(values, dict) or not isinstance(values.get("preset"), str):
            raise TypeError(f"values must be a dict written by Recipe.to_dict (with a 'preset' name), got {values!r}")
        presets = {cls.__name__: cls for cls in (Recipe, *PRESETS)}
        values = dict(values)
        preset = values.pop("preset")
        if preset not in presets:
            raise ValueError(f"unknown recipe preset {preset!r}: one of {sorted(presets)}")
        unknown = set(values) - {f.name for f in fields(Recipe)}
        if unknown:
            raise ValueError(f"unknown recipe fields {sorted(unknown)}")
        return presets[preset](**values)


@dataclass(frozen=True)
class CurrentScaling(Recipe):
    """Per-tensor weights, per-tensor activations scaled from the live tensor (two passes)."""


@dataclass(frozen=True)
class DelayedScaling(Recipe):
    """Per-tensor activations scaled from an amax history (Transformer Engine's default)."""

    activation_mode: str = "delayed"


@dataclass(frozen=True)
class PerTensorStatic(Recipe):
    """Per-tensor activations with a calibrated, fixed scale (no amax pass at run time)."""

    activation_mode: str = "static"


@dataclass(frozen=True)
class RowWise(Recipe):
    """Per-output-channel weights and per-token activations."""

    weight_granularity: str = "per_channel"
    activation_granularity: str = "per_token"


@dataclass(frozen=True)
class BlockWise(Recipe):
    """DeepSeek-V3: 128x128 weight blocks and 1x128 activation groups."""

    weight_granularity: str = "block"
    activation_granularity: str = "group"


PRESETS = (CurrentScaling, DelayedScaling, PerTensorStatic, RowWise, BlockWise)
