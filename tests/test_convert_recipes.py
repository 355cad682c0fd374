"""convert with a recipe per layer (a mapping, e.g. an earlier summary's recipes),
and recipes written to and read from plain dicts: how a model converted with
recipe="auto" is rebuilt before its checkpoint is loaded."""
import json

import pytest
import torch

import fp8ext
from fp8ext import BlockWise, CurrentScaling, DelayedScaling, PerTensorStatic, Recipe, RowWise
from fp8ext.nn import FP8Linear
from test_auto_recipe import TinyLM, lm_and_batches


def test_each_named_layer_takes_its_recipe_and_the_others_are_kept():
    model = TinyLM()
    summary = fp8ext.convert(model, {"up": RowWise(), "mix": BlockWise(fast_accum=True)})
    assert summary.recipes == {"up": RowWise(), "mix": BlockWise(fast_accum=True)}
    assert isinstance(model.up, FP8Linear) and model.up.recipe == RowWise() and model.mix.recipe == BlockWise(
        fast_accum=True)
    assert type(model.down) is torch.nn.Linear and ("down", "not in the recipe mapping") in summary.skipped
    assert ("lm_head", "LM head (high precision by default)") in summary.skipped


def test_names_that_are_not_eligible_layers_are_refused_with_the_reason():
    model = TinyLM()
    with pytest.raises(ValueError, match=r"'lm_head' \(LM head \(high precision by default\)\), 'upp' \(no nn.Linear"):
        fp8ext.convert(model, {"up": RowWise(), "lm_head": RowWise(), "upp": RowWise()})
    assert type(model.up) is torch.nn.Linear  # nothing converted
    with pytest.raises(TypeError, match=r"recipe\['up'\] must be a fp8ext.recipes.Recipe \(Recipe.from_dict"):
        fp8ext.convert(model, {"up": RowWise().to_dict()})
    with pytest.warns(UserWarning, match="static recipe"):
        fp8ext.convert(model, {"down": PerTensorStatic()})


@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling(amax_history_len=16, amax_compute_algo="most_recent"),
                                    PerTensorStatic(margin=-2), RowWise(fast_accum=True, power_of_two_scales=True),
                                    BlockWise(), Recipe(weight_format="e5m2", activation_format="e5m2")],
                         ids=lambda r: type(r).__name__)
def test_recipes_survive_json(recipe):
    back = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
    assert back == recipe and type(back) is type(recipe)


def test_from_dict_refuses_what_to_dict_never_writes():
    good = RowWise().to_dict()
    with pytest.raises(ValueError, match="unknown recipe preset 'Fancy'"):
        Recipe.from_dict({**good, "preset": "Fancy"})
    with pytest.raises(ValueError, match=r"unknown recipe fields \['colour'\]"):
        Recipe.from_dict({**good, "colour": 1})
    with pytest.raises(ValueError, match="margin must be in"):
        Recipe.from_dict({**good, "margin": 500})
    with pytest.raises(TypeError, match="written by Recipe.to_dict"):
        Recipe.from_dict({"margin": 0})


def test_an_auto_model_reloads_bit_identically_into_a_fresh_model(tmp_path):
    model, batches = lm_and_batches()
    fresh = TinyLM()  # another initialisation: everything must come from the checkpoint
    fresh.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith(("up", "down", "mix"))},
                          strict=False)
    summary = fp8ext.convert(model, "auto", calibration=batches, max_error=0.002)  # GPTQ-rounded weights
    assert summary.converted and summary.skipped  # some layers FP8, some kept for the budget
    saved = json.dumps({name: r.to_dict() for name, r in summary.recipes.items()})
    torch.save(model.state_dict(), tmp_path / "model.pt")
    kept = [n for n, reason in summary.skipped if reason.startswith("kept to stay")]
    for name in kept:  # the layers auto kept hold their original weights in the checkpoint
        assert torch.equal(getattr(fresh, name).weight, getattr(model, name).weight) is False
    fp8ext.convert(fresh, {name: Recipe.from_dict(d) for name, d in json.loads(saved).items()})
    fresh.load_state_dict(torch.load(tmp_path / "model.pt"))
    x = batches[0]
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
