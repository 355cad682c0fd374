"""Argument checks shared across the package, so that every public function
names a bad argument the same way."""
from __future__ import annotations


def check_positive_int(name: str, value, note: str = "") -> int:
    """Returns value if it is an int >= 1 (a bool is refused); raises ValueError naming `name` otherwise.
    `note` follows the expectation in the message, e.g. " (processes, one per GPU)"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{note}, got {value!r}")
    return value
