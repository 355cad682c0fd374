"""How calibrate, GPTQ's Hessians and recipe="auto" run calibration batches:
tensors, tuples of positional arguments or dicts of keyword arguments, always in
eval mode (dropout off), each module's own mode restored afterwards."""
import copy
from collections import UserDict

import pytest
import torch
from torch import nn

import fp8ext
from fp8ext import PerTensorStatic
from fp8ext.nn.auto import measure_errors
from fp8ext.nn.batches import batch_tokens, eval_mode, run_model
from fp8ext.nn.gptq import input_hessians


class DropoutLM(nn.Module):
    """A token model whose forward takes a second, optional argument and has dropout."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.up = nn.Linear(32, 64)
        self.drop = nn.Dropout(0.5)
        self.down = nn.Linear(64, 32)
        self.lm_head = nn.Linear(32, 64)

    def forward(self, input_ids, gain=1.0):
        h = self.embed(input_ids) * gain
        return self.lm_head(h + self.down(self.drop(torch.relu(self.up(h)))))


def model_and_ids():
    torch.manual_seed(0)
    return DropoutLM(), [torch.randint(0, 64, (2, 12)) for _ in range(2)]


def test_run_model_and_batch_tokens():
    ids = torch.randint(0, 64, (1, 4))
    seen = []
    probe = type("Probe", (nn.Module,), {"forward": lambda self, *a, **k: seen.append((a, k))})()
    encoding = UserDict(input_ids=ids)  # a Hugging Face BatchEncoding is a UserDict, not a dict
    run_model(probe, ids), run_model(probe, (ids, 2.0)), run_model(probe, [ids]), run_model(probe, {"input_ids": ids})
    run_model(probe, encoding)
    assert [len(a) for a, _ in seen] == [1, 2, 1, 0, 0] and list(seen[3][1]) == list(seen[4][1]) == ["input_ids"]
    assert all(batch_tokens(b) is ids for b in (ids, (ids, 2.0), [ids], {"input_ids": ids}, encoding))


def test_eval_mode_restores_each_modules_own_mode():
    model, _ = model_and_ids()
    model.train()
    model.up.eval()
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert model.training and model.drop.training and not model.up.training


def test_hessians_from_tuple_batches_in_eval_mode():
    model, ids = model_and_ids()
    model.train()
    batches = [(i, 2.0) for i in ids]
    h1 = input_hessians(model, ["up", "down"], batches)
    h2 = input_hessians(model, ["up", "down"], batches)
    assert model.training and model.drop.training
    torch.testing.assert_close(h1["down"], h2["down"], rtol=0, atol=0)  # no dropout: the same H twice
    x = torch.cat([model.embed(i).detach() * 2.0 for i in ids]).reshape(-1, 32).double()
    torch.testing.assert_close(h1["up"], x.T @ x)


def test_calibrate_with_tuple_batches_in_eval_mode():
    model, ids = model_and_ids()
    model.train()
    with pytest.warns(UserWarning):
        fp8ext.convert(model, PerTensorStatic(), exclude=["lm_head"])
    twin = copy.deepcopy(model)
    r1 = fp8ext.calibrate(model, [(i, 2.0) for i in ids], progress=False)
    r2 = fp8ext.calibrate(twin, [{"input_ids": i, "gain": 2.0} for i in ids], progress=False)
    assert model.training and model.drop.training
    assert set(r1.input_amax) == {"up", "down"}
    for name in r1.input_amax:  # dropout off: tuple and dict batches see the same activations
        assert torch.equal(r1.input_amax[name], r2.input_amax[name]), name
    want = (model.embed.weight.detach() * 2.0)[torch.cat(ids)].abs().max()
    assert torch.equal(r1.input_amax["up"], want)


def test_auto_measures_tuple_and_dict_batches_alike_in_eval_mode():
    model, ids = model_and_ids()
    model.train()
    e_tuple = measure_errors(model, ["up", "down"], [(i, 2.0) for i in ids], None)
    e_dict = measure_errors(model, ["up", "down"], [{"input_ids": i, "gain": 2.0} for i in ids], None)
    assert model.training and e_tuple == e_dict
    s = fp8ext.convert(model, "auto", calibration=[(i, 2.0) for i in ids], max_error=1.0)
    assert [n for n, _ in s.converted] == ["up", "down"] and s.weight_rounding == "gptq"


def test_one_batch_given_instead_of_a_collection_is_refused():
    """Iterating a tensor would feed its rows as batches, and a dict (a
    tokenizer's BatchEncoding) its key names: each pass refuses them by name."""
    model, ids = model_and_ids()
    fp8ext.convert(model, PerTensorStatic())
    for one in (ids[0], {"input_ids": ids[0]}, UserDict(input_ids=ids[0])):
        with pytest.raises(TypeError, match=r"batches must be an iterable of batches .*pass \[batch\]"):
            fp8ext.calibrate(model, one, progress=False)
        with pytest.raises(TypeError, match="batches must be an iterable"):
            input_hessians(model, ["up"], one)
        with pytest.raises(TypeError, match="calibration must be an iterable"):
            fp8ext.convert(copy.deepcopy(model_and_ids()[0]), "auto", calibration=one)
    fp8ext.calibrate(model, [ids[0]], progress=False)  # the same batch in a list is fine
    assert model.up.input_scale.item() != 1.0
