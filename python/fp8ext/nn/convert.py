"""fp8ext.convert: swaps a model's eligible nn.Linear layers for FP8Linear in place."""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Union

from torch import nn

from fp8ext.nn.linear import FP8Linear
from fp8ext.recipes import CurrentScaling, Recipe

# A name pattern (fnmatch, on the module's qualified name) or a predicate (name, module) -> bool.
Selector = Union[str, Callable[[str, nn.Module], bool]]
# Names of LM heads (Hugging Face, Meta's Llama): kept in high precision by
# default, since their logits feed the sampler directly.
LM_HEAD_NAMES = ("lm_head", "*.lm_head", "output")


@dataclass
class ConversionSummary:
    """What :func:`convert` did: converted layers with their recipe, skipped ones with the reason."""

    converted: list = field(default_factory=list)  # (name, recipe)
    skipped: list = field(default_factory=list)    # (name, reason)

    def __str__(self) -> str:
        lines = [f"converted {len(self.converted)} linear layers to FP8, kept {len(self.skipped)} in high precision"]
        lines += [f"  fp8   {name}: {recipe}" for name, recipe in self.converted]
        lines += [f"  kept  {name}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)


def _matches(selectors: Iterable[Selector], name: str, module: nn.Module) -> bool:
    for sel in selectors:
        if callable(sel):
            if sel(name, module):
                return True
        elif fnmatch.fnmatchcase(name, sel):
            return True
    return False


def _as_list(sel) -> list:
    if sel is None:
        return []
    if isinstance(sel, str) or callable(sel):
        return [sel]
    return list(sel)


def _tied_to_embedding(model: nn.Module) -> set:
    """ids of the weights that embeddings own (a linear sharing one stays high precision)."""
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def _output_embeddings(model: nn.Module):
    get = getattr(model, "get_output_embeddings", None)
    try:
        return get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        return None


def convert(model: nn.Module, recipe: Recipe | None = None, *, include: Selector | Iterable[Selector] | None = None,
            exclude: Selector | Iterable[Selector] | None = None, keep_lm_head: bool = True) -> ConversionSummary:
    """Replaces eligible ``nn.Linear`` modules of ``model`` with :class:`FP8Linear`, in place.

    Selective precision by default: embeddings and normalization layers are not
    linears and stay as they are; the LM head (names matching
    ``LM_HEAD_NAMES`` or returned by a Hugging Face model's
    ``get_output_embeddings()``) and any linear tied to an embedding's weight are kept
    too. ``include`` (if given) limits conversion to matching layers;
    ``exclude`` keeps matching layers. Each is a name pattern (fnmatch on the
    qualified module name, e.g. ``"model.layers.0.*"``), a predicate
    ``(name, module) -> bool``, or a list of them.

    Static recipes start with ``input_scale = 1`` in every converted layer: run
    :func:`fp8ext.calibrate` (or set the ``input_scale`` buffers) before use.

    Returns a :class:`ConversionSummary`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    recipe = recipe if recipe is not None else CurrentScaling()
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a fp8ext.recipes.Recipe, got {type(recipe).__name__}")
    include_l, exclude_l = _as_list(include), _as_list(exclude)
    tied = _tied_to_embedding(model)
    head = _output_embeddings(model)
    summary = ConversionSummary()
    targets = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:  # subclasses may carry their own forward
            continue
        if keep_lm_head and (module is head or _matches(LM_HEAD_NAMES, name, module)):
            summary.skipped.append((name, "LM head (high precision by default)"))
        elif id(module.weight) in tied:
            summary.skipped.append((name, "weight tied to an embedding"))
        elif include_l and not _matches(include_l, name, module):
            summary.skipped.append((name, "not included"))
        elif _matches(exclude_l, name, module):
            summary.skipped.append((name, "excluded"))
        else:
            targets.append(name)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, FP8Linear.from_linear(getattr(parent, child), recipe))
        summary.converted.append((name, recipe))
    if recipe.activation_mode == "static" and targets:
        warnings.warn("static recipe: every input_scale is 1.0 until calibrated (fp8ext.calibrate)", stacklevel=2)
    return summary
