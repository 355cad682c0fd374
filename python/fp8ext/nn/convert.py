"""fp8ext.convert: swaps a model's eligible nn.Linear layers for FP8Linear in place."""
from __future__ import annotations

import fnmatch
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Union

from torch import nn

from fp8ext import _native
from fp8ext.checks import check_bool
from fp8ext.nn.batches import check_batches
from fp8ext.nn.gptq import fp8_layer, input_hessians
from fp8ext.nn.linear import STATIC_UNCALIBRATED, FP8Linear
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
    errors: dict = field(default_factory=dict)     # recipe="auto": name -> {candidate: estimated increase}
    fp8_flop_fraction: float | None = None         # recipe="auto": share of the eligible layers' FLOPs in FP8
    estimated_increase: float | None = None        # recipe="auto": estimated relative perplexity increase
    weight_rounding: str = "nearest"               # "nearest" or "gptq"

    @property
    def recipes(self) -> dict:
        """name -> recipe of every converted layer: ``convert(fresh_model, summary.recipes)``
        rebuilds the same layers (then load the state_dict), e.g. after ``recipe="auto"``.
        ``{n: r.to_dict() ...}`` is JSON for a checkpoint's metadata (``Recipe.from_dict``)."""
        return dict(self.converted)

    def __str__(self) -> str:
        before = sum(reason.startswith("already FP8Linear") for _, reason in self.skipped)
        lines = [f"converted {len(self.converted)} linear layers to FP8 (weights rounded: {self.weight_rounding}), "
                 f"kept {len(self.skipped) - before} in high precision"
                 + (f", {before} already FP8Linear" if before else "")]
        if self.fp8_flop_fraction is not None:
            lines[0] += (f"; {100 * self.fp8_flop_fraction:.1f}% of the eligible FLOPs in FP8, estimated "
                         f"perplexity increase {100 * self.estimated_increase:.2f}%")
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


def _as_list(sel, what: str) -> list:
    if sel is None:
        return []
    one = isinstance(sel, str) or callable(sel) or not isinstance(sel, Iterable)
    items = [sel] if one else list(sel)
    for item in items:
        if not (isinstance(item, str) or callable(item)):
            raise TypeError(f"{what} must be a name pattern (str), a callable (name, module) -> bool, or a list "
                            f"of them, got {item!r}")
    return items


def _tied_to_embedding(model: nn.Module) -> set:
    """ids of the weights that embeddings own (a linear sharing one stays high precision)."""
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def _output_embeddings(model: nn.Module):
    get = getattr(model, "get_output_embeddings", None)
    try:
        return get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        return None


def _kept_for_its_surroundings(module: nn.Module, parent: nn.Module | None) -> str | None:
    """Why a plain nn.Linear must stay as it is, or None: swapping it would drop
    its hooks or patched forward (adapters, accelerate's offload hooks), or its
    parent reads its weight itself (nn.TransformerEncoderLayer's inference fast
    path multiplies by linear1.weight directly, which would then be FP8 codes)."""
    if module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module):
        return "has forward hooks or a patched forward (an FP8Linear in its place would drop them)"
    if isinstance(parent, nn.TransformerEncoderLayer):
        return "in an nn.TransformerEncoderLayer, whose inference fast path reads the weight itself"
    return None


def select_linears(model: nn.Module, include=None, exclude=None, keep_lm_head: bool = True):
    """(targets, skipped): the names of the nn.Linear modules convert() would replace,
    and (name, reason) for the ones it keeps in high precision."""
    include_l, exclude_l = _as_list(include, "include"), _as_list(exclude, "exclude")
    check_bool("keep_lm_head", keep_lm_head)  # "False" would keep the head, None and 0 convert it
    limited = include is not None  # include=[] converts nothing, as an empty allow-list says
    tied = _tied_to_embedding(model)
    head = _output_embeddings(model)
    targets, skipped = [], []
    if isinstance(model, FP8Linear):
        raise ValueError("model is itself an FP8Linear (converted already): convert replaces submodules")
    parents = dict(model.named_modules())
    for name, module in model.named_modules():
        if isinstance(module, FP8Linear):  # converted by an earlier call: listed, so that a second call says why
            skipped.append((name, f"already FP8Linear ({type(module.recipe).__name__})"))
            continue
        if not isinstance(module, nn.Linear):
            continue
        if type(module) is not nn.Linear:  # a subclass may carry its own forward: kept, and said so
            skipped.append((name, f"{type(module).__name__} subclasses nn.Linear (its forward may differ)"))
            continue
        if name == "":
            raise ValueError("model is itself an nn.Linear: convert replaces submodules; use "
                             "fp8ext.FP8Linear.from_linear(model, recipe) for a single layer")
        why_kept = _kept_for_its_surroundings(module, parents.get(name.rpartition(".")[0]))
        if why_kept:
            skipped.append((name, why_kept))
            continue
        if keep_lm_head and (module is head or _matches(LM_HEAD_NAMES, name, module)):
            skipped.append((name, "LM head (high precision by default)"))
        elif id(module.weight) in tied:
            skipped.append((name, "weight tied to an embedding"))
        elif limited and not _matches(include_l, name, module):
            skipped.append((name, "not included"))
        elif _matches(exclude_l, name, module):
            skipped.append((name, "excluded"))
        elif module.weight.dtype not in _native.INPUT_DTYPES:
            skipped.append((name, f"weight is {module.weight.dtype} (FP8Linear takes float32, float16, bfloat16)"))
        else:
            targets.append(name)
    if limited and not any(_matches(include_l, n, m) for n, m in model.named_modules() if type(m) is nn.Linear):
        converted = sum(_matches(include_l, n, m) for n, m in model.named_modules() if isinstance(m, FP8Linear))
        already = f" ({converted} matching layers are already FP8Linear)" if converted else ""
        warnings.warn(f"include={include!r} matches no nn.Linear of the model{already}: nothing is converted",
                      stacklevel=3)
    return targets, skipped


WEIGHT_ROUNDINGS = ("nearest", "gptq")


def replace_linear(model: nn.Module, name: str, recipe: Recipe, hessian=None) -> None:
    """Swaps the nn.Linear ``name`` for an FP8Linear (its weight GPTQ-rounded when a
    Hessian is given) at once: the eval scripts' layer-by-layer swap, where convert
    builds every layer first."""
    set_layer(model, name, fp8_layer(model.get_submodule(name), recipe, hessian))


def set_layer(model: nn.Module, name: str, layer: nn.Module) -> None:
    """Puts `layer` wherever the module at `name` is (a linear shared by two
    parents, e.g. nn.Sequential(lin, act, lin), appears under both names), so
    they stay one module."""
    old = model.get_submodule(name)
    for path, module in list(model.named_modules(remove_duplicate=False)):
        if module is old:
            model.set_submodule(path, layer)


def build_layer(name: str, make):
    """make() (an FP8Linear for the linear `name`), its errors naming the layer."""
    try:
        return make()
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from e


def swap_all(model: nn.Module, layers: dict) -> None:
    """set_layer for every (name, layer), once all of them are built: a layer
    that fails to build (a non-finite weight, GPTQ's checks) leaves the model
    untouched rather than half converted."""
    for name, layer in layers.items():
        set_layer(model, name, layer)


def _weight_rounding(weight_rounding, recipe, calibration) -> str:
    rounding = weight_rounding if weight_rounding is not None else ("gptq" if recipe == "auto" else "nearest")
    if rounding not in WEIGHT_ROUNDINGS:
        raise ValueError(f"weight_rounding must be one of {WEIGHT_ROUNDINGS} or None, got {weight_rounding!r}")
    if calibration is not None:
        check_batches(calibration, "calibration")
    if rounding == "gptq" and calibration is None:
        raise ValueError("recipe='auto' needs calibration batches (calibration=...)" if recipe == "auto" else
                         "weight_rounding='gptq' needs calibration batches (calibration=...)")
    return rounding


def convert(model: nn.Module, recipe: Recipe | str | Mapping[str, Recipe] | None = None, *,
            include: Selector | Iterable[Selector] | None = None,
            exclude: Selector | Iterable[Selector] | None = None, keep_lm_head: bool = True,
            calibration: Iterable | None = None, max_error: float = 0.01, candidates=None,
            loss_fn=None, weight_rounding: str | None = None, hessian_device=None) -> ConversionSummary:
    """Replaces eligible ``nn.Linear`` modules of ``model`` with :class:`FP8Linear`, in place.

    Selective precision by default: embeddings and normalization layers are not
    linears and stay as they are; the LM head (names matching
    ``LM_HEAD_NAMES`` or returned by a Hugging Face model's
    ``get_output_embeddings()``) and any linear tied to an embedding's weight are kept
    too, and so are subclasses of ``nn.Linear`` (their forward may differ, e.g. an
    adapter), each listed in the summary. ``include`` (if given) limits conversion
    to matching layers (an empty list converts none); ``exclude`` keeps matching layers. Each is a name pattern (fnmatch on the
    qualified module name, e.g. ``"model.layers.0.*"``), a predicate
    ``(name, module) -> bool``, or a list of them.

    ``recipe="auto"`` runs forward and backward over the ``calibration``
    batches (token ids of a causal LM, or mappings with ``input_ids`` whose
    ``attention_mask`` zeroes and ``labels`` of -100 are left out of the loss;
    other models pass ``loss_fn(output, batch)``) and estimates, for each eligible layer and each of
    ``candidates`` (default: per-tensor current, row-wise, block-wise, in order
    of GEMM cost), the relative perplexity increase that quantizing it would
    cause (its output error weighed by the loss gradient: see
    :mod:`fp8ext.nn.auto`). Each layer takes its best candidate; the layers
    costing most per FLOP stay in high precision until the estimated total
    increase is within ``max_error`` (0.01: about 1% perplexity).

    ``weight_rounding``: "nearest" rounds each weight to its nearest FP8 value;
    "gptq" (the default for ``recipe="auto"``, and needs ``calibration``) picks
    the FP8 codes that keep each layer's output on the calibration inputs
    closest to the original (:mod:`fp8ext.nn.gptq`; same scales, formats and
    kernels, an offline cost of one forward pass plus a few seconds per layer
    on a CPU; memory: one float64 K x K matrix per layer, and with auto one
    FP8 weight per candidate per layer). On SmolLM2-135M it cuts the
    perplexity cost of row-wise W8A8 from +2.46% to +1.53%. ``hessian_device``
    (e.g. ``"cpu"``) is where those K x K matrices are kept (default: with the
    activations); each moves to its layer's device only while it is rounded.

    ``recipe`` may also be a mapping of layer name -> Recipe (a summary's
    ``recipes``, e.g. of an earlier ``"auto"`` run, to rebuild that model before
    loading its checkpoint): each named layer takes its recipe, the other
    eligible ones are kept, and a name that is not an eligible layer is refused.

    Static recipes start with ``input_scale = 1`` in every converted layer: run
    :func:`fp8ext.calibrate` (or set the ``input_scale`` buffers) before use.

    Returns a :class:`ConversionSummary`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    recipe = recipe if recipe is not None else CurrentScaling()
    per_layer = isinstance(recipe, Mapping)
    if per_layer:
        for name, r in recipe.items():
            if not isinstance(r, Recipe):
                raise TypeError(f"recipe[{name!r}] must be a fp8ext.recipes.Recipe (Recipe.from_dict reads a saved "
                                f"one), got {r!r}")
    elif not isinstance(recipe, Recipe) and recipe != "auto":
        raise TypeError(f"recipe must be a fp8ext.recipes.Recipe, 'auto' or a mapping of layer name -> Recipe, "
                        f"got {recipe!r}")
    rounding = _weight_rounding(weight_rounding, recipe, calibration)
    if rounding == "gptq":
        calibration = list(calibration)  # read twice below: an iterator would be empty the second time
        if not calibration:
            raise ValueError("calibration is empty: weight_rounding='gptq' needs at least one batch")
    targets, skipped = select_linears(model, include, exclude, keep_lm_head)
    if per_layer:
        unknown = [name for name in recipe if name not in targets]
        if unknown:
            reasons = dict(skipped)
            raise ValueError("recipe names layers convert does not convert: " + ", ".join(
                f"{n!r} ({reasons.get(n, 'no nn.Linear of that name')})" for n in unknown[:5]))
        skipped += [(name, "not in the recipe mapping") for name in targets if name not in recipe]
        targets = [name for name in targets if name in recipe]
    summary = ConversionSummary(skipped=skipped, weight_rounding=rounding)
    hessians = input_hessians(model, targets, calibration, hessian_device) if rounding == "gptq" else {}
    if recipe == "auto":
        from fp8ext.nn.auto import choose_recipes  # noqa: PLC0415 (calibration machinery, only for auto)

        measured = {}  # (name, label) -> the GPTQ-rounded layer auto measured: reused, not rounded again
        choice = choose_recipes(model, targets, calibration, max_error, candidates, loss_fn, hessians, measured)
        summary.errors = choice.errors
        summary.fp8_flop_fraction = choice.fp8_flop_fraction
        summary.estimated_increase = choice.estimated_increase
        layers = {}
        for name in targets:
            if all(math.isinf(e) for e in choice.errors[name].values()):
                summary.skipped.append((name, "not exercised by the calibration batches"))
            elif choice.recipes[name] is None:
                summary.skipped.append((name, f"kept to stay within max_error={max_error}"))
            else:
                layer = measured.get((name, choice.labels[name]))
                layers[name] = layer if layer is not None else build_layer(
                    name, lambda: fp8_layer(model.get_submodule(name), choice.recipes[name]))
                summary.converted.append((name, choice.recipes[name]))
        swap_all(model, layers)
        return summary
    recipe_of = recipe.__getitem__ if per_layer else (lambda _name: recipe)
    swap_all(model, {name: build_layer(name, lambda: fp8_layer(model.get_submodule(name), recipe_of(name),
                                                               hessians.get(name)))
                     for name in targets})
    summary.converted.extend((name, recipe_of(name)) for name in targets)
    unreached = [name for name in targets if rounding == "gptq" and name not in hessians]
    if unreached:
        warnings.warn(f"weight_rounding='gptq': the calibration batches never reached {unreached}; "
                      "their weights are rounded to nearest", stacklevel=2)
    if any(recipe_of(name).activation_mode == "static" for name in targets):
        warnings.warn(STATIC_UNCALIBRATED, stacklevel=2)
    return summary
