"""Recipes: presets, mixed choices, validation."""
import dataclasses

import pytest

from fp8ext import E4M3, E5M2, recipes
from fp8ext.recipes import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, Recipe, RowWise


def test_presets():
    assert (CurrentScaling().weight_granularity, CurrentScaling().activation_mode,
            CurrentScaling().activation_granularity) == ("per_tensor", "current", "per_tensor")
    d = DelayedScaling()
    assert (d.activation_mode, d.amax_history_len, d.amax_compute_algo, d.margin) == ("delayed", 1024, "max", 0)
    assert PerTensorStatic().activation_mode == "static" and PerTensorStatic().needs_state
    assert (RowWise().weight_granularity, RowWise().activation_granularity) == ("per_channel", "per_token")
    assert (BlockWise().weight_granularity, BlockWise().activation_granularity) == ("block", "group")
    assert not CurrentScaling().needs_state and DelayedScaling().needs_state
    assert DelayedScaling(amax_history_len=16, amax_compute_algo="most_recent", margin=1).amax_history_len == 16


def test_formats_are_normalised_and_e5m2_allowed():
    r = Recipe(weight_format="e4m3", activation_format="e5m2")
    assert r.weight_format is E4M3 and r.activation_format is E5M2


def test_mixed_choices_expressible():
    r = Recipe(weight_granularity="per_channel", activation_mode="static")
    assert r.weight_granularity == "per_channel" and r.needs_state
    r = Recipe(weight_granularity="per_channel", activation_granularity="per_tensor")
    assert r.activation_mode == "current"


def test_recipes_are_frozen_and_replace_validates():
    r = RowWise()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.margin = 3
    r2 = r.replace(margin=2)
    assert isinstance(r2, RowWise) and r2.margin == 2
    with pytest.raises(ValueError, match="margin"):
        r.replace(margin=100)


@pytest.mark.parametrize("kwargs, match", [
    (dict(weight_granularity="per_row"), "weight_granularity"),
    (dict(activation_mode="dynamic"), "activation_mode"),
    (dict(activation_granularity="per_channel"), "activation_granularity"),
    (dict(amax_compute_algo="mean"), "amax_compute_algo"),
    (dict(amax_history_len=0), "amax_history_len"),
    (dict(margin=65), "margin"),
    (dict(activation_mode="delayed", activation_granularity="per_token"), "activation_granularity"),
    (dict(activation_mode="static", activation_granularity="per_token"), "activation_granularity"),
    (dict(weight_granularity="block"), "go together"),
    (dict(activation_granularity="group"), "go together"),
    (dict(weight_format="fp16"), "fmt"),
])
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Recipe(**kwargs)


def test_margin_type():
    with pytest.raises(TypeError, match="margin"):
        Recipe(margin=1.5)


def test_fast_accum():
    assert Recipe().fast_accum is False
    r = RowWise(fast_accum=True)
    assert r.fast_accum and r.replace(margin=1).fast_accum and type(r.replace(margin=1)) is RowWise
    with pytest.raises(TypeError, match="fast_accum"):
        Recipe(fast_accum=1)


def test_presets_listed():
    assert set(recipes.PRESETS) == {CurrentScaling, DelayedScaling, PerTensorStatic, RowWise, BlockWise}
