"""Argument checks shared across the package, so that every public function
names a bad argument the same way."""
from __future__ import annotations

import math

import torch


def is_int(value) -> bool:
    """An int, not a bool (True would pass as 1 wherever an int is taken)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(name: str, value, note: str = "") -> int:
    """Returns value if it is an int >= 1 (a bool is refused); raises ValueError naming `name` otherwise.
    `note` follows the expectation in the message, e.g. " (processes, one per GPU)"."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int{note}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    """Returns value if it is a bool; raises TypeError naming `name` otherwise (a
    string such as "False" is truthy, and an op's schema would take None as False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_real_tensor(name: str, value) -> None:
    """Refuses a complex or bool tensor where a number is taken (a float32 copy would drop the
    imaginary part with only a warning, and take True as 1.0); anything else passes."""
    if isinstance(value, torch.Tensor) and (value.is_complex() or value.dtype == torch.bool):
        raise TypeError(f"{name} must be a real number or a real tensor, got a {value.dtype} tensor")


def is_finite_number(value) -> bool:
    """An int or float (not a bool) that is finite."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def refuse_grad(what: str, *tensors) -> None:
    """Raises RuntimeError when grad mode is on and one of `tensors` requires
    grad: the FP8 ops have no backward, so their outputs would silently give no
    gradient (FP8Linear has its own straight-through backward and calls them
    under no_grad)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(f"{what} has no backward (FP8 codes are not differentiable): call it under "
                           "torch.no_grad() or torch.inference_mode(), or with tensors that do not require grad")
