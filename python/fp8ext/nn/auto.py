"""recipe="auto": a recipe per layer, from what its FP8 error costs the loss.

A layer's own output error hardly ranks layers: under E4M3 every linear of
SmolLM2 has 3-4.4% relative output error whatever the scale granularity (the
3-bit mantissa dominates), yet some layers' errors cost the model far more
than others'. So each candidate's error dy = y_fp8 - y is weighed by the
gradient g = dL/dy of the calibration loss (next-token cross-entropy, summed
over tokens): to second order, with the empirical Fisher for the Hessian,
quantizing the layer raises the loss by about 1/2 * sum over tokens of
(g . dy)^2. Divided by the number of tokens, that is the layer's estimated
relative perplexity increase.

Each layer takes its candidate with the lowest estimate (the cheapest GEMM
among those within 5% of it); then, most costly per FLOP first, layers go back
to high precision until the estimated total is within ``max_error``. FLOPs per
token of a linear are in x out features, so the FP8 share is weighed that way.
With GPTQ weight rounding (convert's default for auto) each candidate is
measured with the weights it will really have.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from fp8ext.nn.batches import batch_tokens, check_batches, eval_mode, is_token_batch, linear_input, run_model
from fp8ext.nn.gptq import fp8_layer
from fp8ext.recipes import BlockWise, CurrentScaling, Recipe, RowWise

DEFAULT_CANDIDATES = (("per-tensor", CurrentScaling()), ("row-wise", RowWise()), ("block-wise", BlockWise()))
CHEAPER_WITHIN = 1.05  # a cheaper candidate wins when its estimate is within 5% of the best


@dataclass
class AutoChoice:
    recipes: dict            # name -> Recipe or None (high precision)
    labels: dict             # name -> the chosen candidate's label or None
    errors: dict             # name -> {candidate label: estimated relative perplexity increase}
    fp8_flop_fraction: float
    estimated_increase: float  # sum of the chosen layers' estimates


def _candidates(candidates):
    def malformed(what):
        return TypeError(f"candidates must be a list of Recipes or (label, Recipe) pairs, got {what!r}")
    if isinstance(candidates, (Recipe, str)):
        raise malformed(candidates)
    cands = DEFAULT_CANDIDATES if candidates is None else tuple(candidates)
    out = []
    for c in cands:
        if isinstance(c, tuple) and len(c) != 2:
            raise malformed(c)
        label, recipe = c if isinstance(c, tuple) else (repr(c), c)
        if not isinstance(label, str):  # (None is the choice's mark for "kept in high precision")
            raise TypeError(f"an auto candidate's label must be a str, got {label!r}")
        if not isinstance(recipe, Recipe) or recipe.activation_mode != "current":
            raise ValueError(f"auto candidates must be current-scaling Recipes, got {recipe!r}")
        out.append((label, recipe))
    if not out:
        raise ValueError("candidates is empty")
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"candidates' labels must differ (their estimates would merge), got {labels}")
    return out


IGNORE_INDEX = -100  # Hugging Face's label for "no loss here"


def lm_targets(batch) -> torch.Tensor | None:
    """The next-token targets of a batch of [B, T] token ids: ``ids[:, 1:]``, or
    for a mapping its ``labels[:, 1:]`` (Hugging Face's convention: -100 marks
    no loss), with the positions its ``attention_mask`` zeroes set to -100, so
    that padding neither adds to the loss nor counts as a predicted token.
    None when the batch holds no token ids."""
    ids = batch_tokens(batch)
    if not is_token_batch(ids):
        return None
    targets = ids[:, 1:]
    if isinstance(batch, Mapping):
        labels, mask = batch.get("labels"), batch.get("attention_mask")
        for name, t in (("labels", labels), ("attention_mask", mask)):
            if t is not None and not (isinstance(t, torch.Tensor) and t.shape == ids.shape):
                raise ValueError(f"the batch's {name} must be a tensor shaped like its input_ids "
                                 f"{tuple(ids.shape)}, got {type(t).__name__} {tuple(getattr(t, 'shape', ()))}")
        if labels is not None:
            if labels.is_floating_point() or labels.is_complex():
                raise TypeError(f"the batch's labels must be integer token ids, got {labels.dtype}")
            targets = labels[:, 1:]
        if mask is not None:
            targets = targets.masked_fill(mask[:, 1:] == 0, IGNORE_INDEX)
    return targets


def causal_lm_loss(output, batch) -> torch.Tensor:
    """Next-token cross-entropy summed over the targets of :func:`lm_targets`,
    for [B, T] token ids (the batch, its first element, or its ``input_ids``)
    and [B, T, vocab] logits (or an output with ``.logits``, as Hugging Face
    returns)."""
    logits = getattr(output, "logits", output)
    targets = lm_targets(batch)
    if not (isinstance(logits, torch.Tensor) and logits.dim() == 3 and targets is not None
            and targets.shape[0] == logits.shape[0] and targets.shape[1] + 1 == logits.shape[1]):
        raise ValueError("the default loss needs [B, T] token ids and [B, T, vocab] logits: pass loss_fn")
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def measure_errors(model: nn.Module, names: list, batches: Iterable, candidates,
                   loss_fn: Callable | None = None, hessians: dict | None = None,
                   layers: dict | None = None) -> dict:
    """name -> {label: estimated relative perplexity (loss) increase from quantizing that layer alone}.

    Runs forward and backward on every batch (the gradients go only to the layers'
    outputs; no parameter's .grad is touched). Memory: one batch's activations
    (and with ``hessians``, the GPTQ-rounded candidates below).
    With a custom ``loss_fn`` the estimate is that loss's increase per batch.
    A layer called more than once per forward counts every call; one the
    batches never ran (or that does not reach the loss) gets inf.
    With ``hessians`` (:func:`fp8ext.nn.gptq.input_hessians`) the candidates'
    weights are GPTQ-rounded; those layers are made once and kept (one byte per
    weight per candidate) in ``layers`` ((name, label) -> FP8Linear, a dict the
    caller may pass to reuse the chosen ones) instead of once per batch."""
    cands = _candidates(candidates)
    hessians = {} if hessians is None else hessians
    kept = {} if layers is None else layers

    def layer_for(name, label, recipe):
        if name not in hessians:  # FP8 weights made per call: never the whole model at once
            return fp8_layer(model.get_submodule(name), recipe)
        if (name, label) not in kept:
            kept[name, label] = fp8_layer(model.get_submodule(name), recipe, hessians[name])
        return kept[name, label]

    loss_fn = loss_fn if loss_fn is not None else causal_lm_loss
    sums = {name: {label: 0.0 for label, _ in cands} for name in names}
    runs = dict.fromkeys(names, 0)
    tokens = 0
    params = [p for p in model.parameters() if p.is_floating_point()]
    flags = [p.requires_grad for p in params]
    seen = 0
    try:
        for p in params:  # so that the layers' outputs are part of a graph
            p.requires_grad_(True)
        for batch in check_batches(batches):
            captured = {}  # name -> [(input, output)], one pair per call

            # The model goes on with a copy of the output: an in-place op after the layer
            # (ReLU(inplace=True)) changes the copy, so y and dL/dy stay the layer's own.
            def record(name, args, kwargs, out):
                captured.setdefault(name, []).append((linear_input(args, kwargs).detach(), out))
                return out.clone()

            handles = [model.get_submodule(n).register_forward_hook(
                lambda _m, args, kwargs, out, n=n: record(n, args, kwargs, out), with_kwargs=True) for n in names]
            try:
                with torch.enable_grad(), eval_mode(model):
                    output = run_model(model, batch)
                    loss = loss_fn(output, batch)
                    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
                        raise ValueError("loss_fn must return a scalar tensor computed from the model's output, "
                                         f"got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}")
                    if not torch.isfinite(loss.detach()).all():
                        raise ValueError(f"the calibration loss is {loss.item()} on batch {seen}: non-finite "
                                         "inputs or a loss_fn that overflows")
                    calls = [(n, x, y) for n in names for x, y in captured.get(n, ())]
                    grads = torch.autograd.grad(loss, [y for _, _, y in calls], allow_unused=True) if calls else ()
            finally:
                for h in handles:
                    h.remove()
            seen += 1
            tokens += int((lm_targets(batch) != IGNORE_INDEX).sum()) if loss_fn is causal_lm_loss else 1
            with torch.no_grad():
                reached = set()
                for (n, x, y), g in zip(calls, grads):  # a layer called twice counts both calls
                    if g is None:
                        continue
                    reached.add(n)
                    g2 = g.reshape(-1, g.shape[-1]).float()
                    y2 = y.detach().reshape(g2.shape).float()
                    for label, recipe in cands:
                        dy = layer_for(n, label, recipe)(x).float().reshape(g2.shape) - y2
                        sums[n][label] += 0.5 * (g2 * dy).sum(-1).square().sum().item()
                for n in reached:
                    runs[n] += 1
            del captured, calls, grads, output, loss
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    if seen == 0:
        raise ValueError("calibration is empty: recipe='auto' needs at least one batch")
    if tokens == 0:
        raise ValueError("the calibration batches predict no token: the default loss needs sequences of at "
                         "least 2 tokens, with targets the attention_mask and labels keep")
    return {n: {label: (v / tokens if runs[n] else math.inf) for label, v in d.items()} for n, d in sums.items()}


def choose_recipes(model: nn.Module, names: list, calibration, max_error: float, candidates=None,
                   loss_fn: Callable | None = None, hessians: dict | None = None,
                   layers: dict | None = None) -> AutoChoice:
    if calibration is None:
        raise ValueError("recipe='auto' needs calibration batches (calibration=...)")
    if not isinstance(max_error, Real) or isinstance(max_error, bool) or not max_error > 0:
        raise ValueError(f"max_error must be a positive number, got {max_error!r}")
    cands = _candidates(candidates)
    if not names:  # nothing eligible: nothing to measure
        return AutoChoice({}, {}, {}, 0.0, 0.0)
    errors = measure_errors(model, names, calibration, cands, loss_fn, hessians, layers)
    return choose_from_errors(model, names, errors, max_error, cands)


def choose_from_errors(model: nn.Module, names: list, errors: dict, max_error: float, candidates=None) -> AutoChoice:
    """Per layer its best candidate, then the costliest layers per FLOP back to
    high precision until the estimated total is within max_error."""
    cands = _candidates(candidates)
    by_label = dict(cands)
    flops = {n: model.get_submodule(n).in_features * model.get_submodule(n).out_features for n in names}
    labels = {}
    for n in names:
        best = min(errors[n][label] for label, _ in cands)
        labels[n] = (next(label for label, _ in cands if errors[n][label] <= best * CHEAPER_WITHIN)
                     if math.isfinite(best) else None)
    total = sum(errors[n][labels[n]] for n in names if labels[n] is not None)
    for n in sorted((n for n in names if labels[n] is not None), key=lambda n: -errors[n][labels[n]] / flops[n]):
        if total <= max_error:
            break
        total -= errors[n][labels[n]]
        labels[n] = None
    recipes = {n: by_label[labels[n]] if labels[n] is not None else None for n in names}
    all_flops = sum(flops.values())
    fp8 = sum(flops[n] for n in names if recipes[n] is not None)
    return AutoChoice(recipes, labels, errors, fp8 / all_flops if all_flops else 0.0, total)
