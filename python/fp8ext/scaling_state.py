"""Device-side state of delayed and static scaling, kept apart from recipes."""
from __future__ import annotations

import math

import torch

from fp8ext.checks import check_positive_int, check_real_tensor
from fp8ext.recipes import Recipe


def _check_scale_value(value: float) -> None:
    """A dequantization scale read on the host: finite and > 0 (0 turns zeros
    into NaN (0/0) and everything else into +-max; inf quantizes to 0)."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"scale must be finite and > 0, got {value}")


class ScalingState:
    """The tensors delayed and static scaling read and update on the device.

    Attributes:
        amax_history: float32 [history_len], newest amax first (delayed scaling
            writes it; static scaling leaves it alone).
        scale: float32 0-d dequantization scale used by the next quantization
            (q = x / scale). Delayed scaling recomputes it from the history after
            each call; static scaling uses it as calibrated.

    No method reads these values on the host, so nothing here synchronises.
    The owner (a module's buffers, say) can pass its own tensors in.
    """

    def __init__(self, amax_history: torch.Tensor, scale: torch.Tensor):
        if not isinstance(amax_history, torch.Tensor) or not isinstance(scale, torch.Tensor):
            raise TypeError("amax_history and scale must be torch.Tensors")
        if amax_history.dtype != torch.float32 or amax_history.dim() != 1 or amax_history.numel() < 1:
            raise ValueError(f"amax_history must be a float32 1-D tensor of length >= 1, got "
                             f"{amax_history.dtype} {tuple(amax_history.shape)}")
        if scale.dtype != torch.float32 or scale.numel() != 1:
            raise ValueError(f"scale must be a float32 tensor holding one value, got {scale.dtype} "
                             f"{tuple(scale.shape)}")
        if scale.device != amax_history.device:
            raise ValueError(f"scale ({scale.device}) and amax_history ({amax_history.device}) must share a device")
        if scale.device.type == "cpu" and not torch.compiler.is_compiling():
            _check_scale_value(float(scale.reshape(())))  # a GPU scale is not read back (no sync)
        self.amax_history = amax_history
        self.scale = scale

    @classmethod
    def create(cls, recipe: Recipe | None = None, history_len: int | None = None, device=None) -> "ScalingState":
        """A fresh state: zero history (length from the recipe unless given), scale 1."""
        if recipe is not None and not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a fp8ext.recipes.Recipe or None, got {type(recipe).__name__}")
        n = history_len if history_len is not None else (recipe.amax_history_len if recipe else 1)
        check_positive_int("history_len", n)
        return cls(torch.zeros(n, dtype=torch.float32, device=device),
                   torch.ones((), dtype=torch.float32, device=device))

    @classmethod
    def from_scale(cls, scale, device=None) -> "ScalingState":
        """A static state holding a calibrated dequantization scale (float or tensor).
        A scale given on the host must be finite and > 0 (0 would quantize
        everything to +-max and dequantize it to 0); one already on a GPU is
        not read back (no synchronisation)."""
        if isinstance(scale, (bool, str)) or scale is None:
            raise TypeError(f"scale must be a float or a tensor holding one value, got {type(scale).__name__}")
        check_real_tensor("scale", scale)
        if isinstance(scale, torch.Tensor) and scale.device.type != "cpu":
            s = scale.to(torch.float32)  # not read back: no synchronisation
        else:
            try:  # on the host, in float32 first: 1e39 or 1e-46 would become inf or 0 there
                s = torch.as_tensor(scale, dtype=torch.float32, device="cpu")
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"scale must be a float or a tensor holding one value, got "
                                f"{type(scale).__name__}") from None
        if s.numel() != 1:
            raise ValueError(f"scale must hold one value, got shape {tuple(s.shape)}")
        if s.device.type == "cpu":
            _check_scale_value(float(s.reshape(())))
        s = s.to(device if device is not None else s.device).reshape(()).clone()
        return cls(torch.zeros(1, dtype=torch.float32, device=s.device), s)

    @property
    def device(self) -> torch.device:
        return self.scale.device

    def to(self, device) -> "ScalingState":
        return ScalingState(self.amax_history.to(device), self.scale.to(device))

    def __repr__(self) -> str:
        return f"ScalingState(history_len={self.amax_history.numel()}, device={self.device})"
