"""convert(recipe="auto"): a recipe per layer from its measured output error."""
import pytest
import torch
from torch import nn

import fp8ext
from fp8ext import BlockWise, CurrentScaling, RowWise
from fp8ext.nn import FP8Linear


def model_and_batches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 128))
    batches = []
    for _ in range(3):
        x = torch.randn(16, 256)
        x[3] *= 1e5  # one loud token: per-tensor scaling flushes the others to zero, per-token does not
        batches.append(x)
    return model, batches


def test_each_layer_gets_the_cheapest_recipe_within_budget():
    model, batches = model_and_batches()
    errors = fp8ext.nn.auto.measure_errors(model, ["0", "1"], batches, None)
    assert errors["0"]["per-tensor"] > 10 * errors["0"]["row-wise"]
    budget = (errors["0"]["per-tensor"] + errors["0"]["row-wise"]) / 2
    summary = fp8ext.convert(model, "auto", calibration=batches, max_error=budget)
    assert summary.errors["0"] == pytest.approx(errors["0"])
    chosen = dict(summary.converted)
    assert chosen["0"] == RowWise()
    assert isinstance(model[0], FP8Linear) and model[0].recipe == RowWise()
    flops = {"0": 256 * 256, "1": 256 * 128}
    assert summary.fp8_flop_fraction == pytest.approx(sum(flops[n] for n in chosen) / sum(flops.values()))
    assert "eligible FLOPs in FP8" in str(summary)


def test_budget_extremes():
    model, batches = model_and_batches()
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=1e-12)
    assert s.converted == [] and s.fp8_flop_fraction == 0.0
    assert ("0", "no candidate within max_error=1e-12") in s.skipped
    model, batches = model_and_batches()
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=10.0)
    assert [r for _, r in s.converted] == [CurrentScaling(), CurrentScaling()] and s.fp8_flop_fraction == 1.0


def test_custom_candidates_and_errors():
    model, batches = model_and_batches()
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=10.0, candidates=[("blocks", BlockWise())])
    assert all(r == BlockWise() for _, r in s.converted)
    with pytest.raises(ValueError, match="needs calibration batches"):
        fp8ext.convert(model_and_batches()[0], "auto")
    with pytest.raises(ValueError, match="max_error must be a positive number"):
        fp8ext.convert(model_and_batches()[0], "auto", calibration=batches, max_error=0)
    with pytest.raises(ValueError, match="current-scaling Recipes"):
        fp8ext.convert(model_and_batches()[0], "auto", calibration=batches, candidates=[fp8ext.PerTensorStatic()])
    with pytest.raises(TypeError, match="recipe must be a fp8ext.recipes.Recipe or 'auto'"):
        fp8ext.convert(model_and_batches()[0], "fast")


def test_a_layer_calibration_never_runs_is_kept():
    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            return self.used(x)

    model = WithUnused()
    s = fp8ext.convert(model, "auto", calibration=[torch.randn(4, 32)], max_error=10.0)
    assert [n for n, _ in s.converted] == ["used"]
    assert ("unused", "not exercised by the calibration batches") in s.skipped
