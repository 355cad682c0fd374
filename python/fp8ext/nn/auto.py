"""recipe="auto": a recipe per layer from its measured output error.

Each eligible layer runs the calibration batches in high precision; a forward
hook feeds the same input to an FP8Linear of every candidate recipe and
accumulates ||y_fp8 - y||^2 and ||y||^2. A layer gets the first candidate (in
order of GEMM cost) whose relative error is within the budget, or stays in high
precision. FLOPs per token of a linear are proportional to in x out features,
so the FP8 share of FLOPs is weighed that way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from fp8ext.nn.linear import FP8Linear
from fp8ext.recipes import BlockWise, CurrentScaling, Recipe, RowWise

DEFAULT_CANDIDATES = (("per-tensor", CurrentScaling()), ("row-wise", RowWise()), ("block-wise", BlockWise()))


@dataclass
class AutoChoice:
    recipes: dict            # name -> Recipe or None (high precision)
    errors: dict             # name -> {candidate label: relative output error}
    fp8_flop_fraction: float


def _candidates(candidates):
    cands = DEFAULT_CANDIDATES if candidates is None else tuple(candidates)
    out = []
    for c in cands:
        label, recipe = c if isinstance(c, tuple) else (repr(c), c)
        if not isinstance(recipe, Recipe) or recipe.activation_mode != "current":
            raise ValueError(f"auto candidates must be current-scaling Recipes, got {recipe!r}")
        out.append((label, recipe))
    if not out:
        raise ValueError("candidates is empty")
    return out


@torch.no_grad()
def measure_errors(model: nn.Module, names: list, batches: Iterable, candidates) -> dict:
    """name -> {label: relative Frobenius error of the layer's output} over the batches."""
    cands = _candidates(candidates)
    sums = {name: {label: [0.0, 0.0] for label, _ in cands} for name in names}
    handles = []
    for name in names:
        linear = model.get_submodule(name)
        fp8 = {label: FP8Linear.from_linear(linear, r) for label, r in cands}

        def hook(_m, args, out, name=name, fp8=fp8):
            y = out.float()
            ref = y.square().sum().item()
            for label, layer in fp8.items():
                err = (layer(args[0]).float() - y).square().sum().item()
                sums[name][label][0] += err
                sums[name][label][1] += ref
        handles.append(linear.register_forward_hook(hook))
    seen = 0
    try:
        for batch in batches:
            model(**batch) if isinstance(batch, dict) else model(batch)
            seen += 1
    finally:
        for h in handles:
            h.remove()
    if seen == 0:
        raise ValueError("calibration is empty: recipe='auto' needs at least one batch")
    return {name: {label: (e / r) ** 0.5 if r > 0 else 0.0 for label, (e, r) in d.items()}
            for name, d in sums.items()}


def choose_recipes(model: nn.Module, names: list, calibration, max_error: float, candidates=None) -> AutoChoice:
    if calibration is None:
        raise ValueError("recipe='auto' needs calibration batches (calibration=...)")
    if not isinstance(max_error, (int, float)) or isinstance(max_error, bool) or not max_error > 0:
        raise ValueError(f"max_error must be a positive number, got {max_error!r}")
    cands = _candidates(candidates)
    errors = measure_errors(model, names, calibration, cands)
    recipes, fp8_flops, all_flops = {}, 0, 0
    for name in names:
        linear = model.get_submodule(name)
        flops = linear.in_features * linear.out_features
        all_flops += flops
        recipes[name] = next((r for label, r in cands if errors[name][label] <= max_error), None)
        fp8_flops += flops if recipes[name] is not None else 0
    return AutoChoice(recipes, errors, fp8_flops / all_flops if all_flops else 0.0)
