"""recipe="auto": a recipe per layer from its measured output error.

Each eligible layer runs the calibration batches in high precision; a forward
hook feeds the same input to an FP8Linear of every candidate recipe and
accumulates each token's squared relative error ||y_fp8 - y||^2 / ||y||^2. A layer gets the first candidate (in
order of GEMM cost) whose relative error is within the budget, or stays in high
precision. FLOPs per token of a linear are proportional to in x out features,
so the FP8 share of FLOPs is weighed that way.
"""
from __future__ import annotations

import math
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
    labels: dict             # name -> the chosen candidate's label or None
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
    """name -> {label: the layer's relative output error}: the root mean square over
    tokens of ||y_fp8 - y|| / ||y|| per token (every token weighs the same, so a
    few loud tokens cannot hide the others' error)."""
    cands = _candidates(candidates)
    sums = {name: {label: [0.0, 0.0] for label, _ in cands} for name in names}
    handles = []
    for name in names:
        # The candidates' FP8 weights are made per call (not kept for every
        # layer at once: that would hold the model ~1.5 times over).
        def hook(module, args, out, name=name):
            y = out.float().reshape(-1, out.shape[-1])
            ref = y.square().sum(-1)
            live = ref > 0
            for label, recipe in cands:
                layer = FP8Linear.from_linear(module, recipe)
                err = (layer(args[0]).float().reshape(y.shape) - y).square().sum(-1)
                sums[name][label][0] += (err[live] / ref[live]).sum().item()
                sums[name][label][1] += int(live.sum())
        handles.append(model.get_submodule(name).register_forward_hook(hook))
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
    # A layer the batches never ran (an unrouted expert, an unused branch) has no error to go by: inf.
    return {name: {label: (e / n) ** 0.5 if n > 0 else math.inf for label, (e, n) in d.items()}
            for name, d in sums.items()}


def choose_recipes(model: nn.Module, names: list, calibration, max_error: float, candidates=None) -> AutoChoice:
    if calibration is None:
        raise ValueError("recipe='auto' needs calibration batches (calibration=...)")
    if not isinstance(max_error, (int, float)) or isinstance(max_error, bool) or not max_error > 0:
        raise ValueError(f"max_error must be a positive number, got {max_error!r}")
    cands = _candidates(candidates)
    return choose_from_errors(model, names, measure_errors(model, names, calibration, cands), max_error, cands)


def choose_from_errors(model: nn.Module, names: list, errors: dict, max_error: float, candidates=None) -> AutoChoice:
    """Per layer the first candidate within max_error (or None), from measured errors."""
    cands = _candidates(candidates)
    recipes, labels, fp8_flops, all_flops = {}, {}, 0, 0
    for name in names:
        linear = model.get_submodule(name)
        flops = linear.in_features * linear.out_features
        all_flops += flops
        labels[name] = next((label for label, _ in cands if errors[name][label] <= max_error), None)
        recipes[name] = dict(cands)[labels[name]] if labels[name] is not None else None
        fp8_flops += flops if recipes[name] is not None else 0
    return AutoChoice(recipes, labels, errors, fp8_flops / all_flops if all_flops else 0.0)
