"""convert(recipe="auto"): a recipe per layer from what its FP8 error costs the loss."""
import math

import pytest
import torch
from torch import nn

import fp8ext
from fp8ext import BlockWise, RowWise
from fp8ext.nn import FP8Linear
from fp8ext.nn.auto import measure_errors
from fp8ext.nn.gptq import input_hessians


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 48)
        self.up = nn.Linear(48, 96)
        self.down = nn.Linear(96, 48)
        self.mix = nn.Linear(48, 48)
        self.lm_head = nn.Linear(48, 64)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.down(torch.relu(self.up(h)))
        return self.lm_head(h + self.mix(h))


def lm_and_batches():
    torch.manual_seed(0)
    return TinyLM(), [torch.randint(0, 64, (2, 16)) for _ in range(3)]


def test_estimates_are_positive_and_the_summary_reports_them():
    model, batches = lm_and_batches()
    params_before = [p.requires_grad for p in model.parameters()]
    errors = measure_errors(model, ["up", "down", "mix"], batches, None)
    assert all(0 < v < math.inf for d in errors.values() for v in d.values())
    assert [p.requires_grad for p in model.parameters()] == params_before
    assert all(p.grad is None for p in model.parameters())
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=1.0, weight_rounding="nearest")
    assert s.errors == errors
    assert [n for n, _ in s.converted] == ["up", "down", "mix"] and s.fp8_flop_fraction == 1.0
    assert s.estimated_increase == pytest.approx(sum(min(d.values()) for d in errors.values()), rel=0.06)
    assert "estimated perplexity increase" in str(s)
    assert all(isinstance(getattr(model, n), FP8Linear) for n in ("up", "down", "mix"))


def test_costliest_layers_per_flop_go_back_to_high_precision_first():
    model, batches = lm_and_batches()
    names = ["up", "down", "mix"]
    errors = measure_errors(model, names, batches, None, hessians=input_hessians(model, names, batches))
    flops = {"up": 48 * 96, "down": 96 * 48, "mix": 48 * 48}
    costliest = max(names, key=lambda n: min(errors[n].values()) / flops[n])
    budget = sum(min(d.values()) for d in errors.values()) - min(errors[costliest].values()) * 0.5
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=budget)  # GPTQ, as measured above
    assert s.errors == errors
    assert (costliest, f"kept to stay within max_error={budget}") in s.skipped
    assert s.estimated_increase <= budget
    model, batches = lm_and_batches()
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=1e-12)
    assert s.converted == [] and s.fp8_flop_fraction == 0.0


def test_a_loud_token_steers_a_layer_to_per_token_scaling():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 128))
    batches = []
    for _ in range(3):
        x = torch.randn(16, 256)
        x[3] *= 1e5  # per-tensor scaling flushes the other tokens to zero; per-token keeps them
        batches.append(x)
    loss = lambda out, x: (out[torch.arange(16) != 3] ** 2).sum()  # noqa: E731 (the quiet tokens matter)
    errors = measure_errors(model, ["0"], batches, None, loss)
    assert errors["0"]["per-tensor"] > 100 * errors["0"]["row-wise"]
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=1e9, loss_fn=loss)
    assert dict(s.converted)["0"] == RowWise()


def test_custom_candidates_unused_layers_and_errors():
    model, batches = lm_and_batches()
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=1.0, candidates=[("blocks", BlockWise())])
    assert all(r == BlockWise() for _, r in s.converted)

    class WithUnused(TinyLM):
        def __init__(self):
            super().__init__()
            self.unused = nn.Linear(48, 48)

    s = fp8ext.convert(WithUnused(), "auto", calibration=batches, max_error=1.0)
    assert ("unused", "not exercised by the calibration batches") in s.skipped
    with pytest.raises(ValueError, match="needs calibration batches"):
        fp8ext.convert(TinyLM(), "auto")
    with pytest.raises(ValueError, match="max_error must be a positive number"):
        fp8ext.convert(TinyLM(), "auto", calibration=batches, max_error=0)
    with pytest.raises(ValueError, match="current-scaling Recipes"):
        fp8ext.convert(TinyLM(), "auto", calibration=batches, candidates=[fp8ext.PerTensorStatic()])
    with pytest.raises(ValueError, match="pass loss_fn"):
        fp8ext.convert(nn.Sequential(nn.Linear(8, 8)), "auto", calibration=[torch.randn(2, 8)])
    with pytest.raises(TypeError, match="recipe must be a fp8ext.recipes.Recipe, 'auto' or a mapping"):
        fp8ext.convert(TinyLM(), "fast")


def test_auto_checks_loss_fn_candidates_and_empty_selections():
    from fp8ext import CurrentScaling, convert
    mlp = lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))  # noqa: E731
    batches = [torch.randn(4, 16) for _ in range(3)]
    mse = lambda o, b: o.pow(2).sum()  # noqa: E731
    run = lambda **kw: convert(mlp(), "auto", calibration=batches, max_error=1.0,  # noqa: E731
                               weight_rounding="nearest", **{"loss_fn": mse, **kw})
    with pytest.raises(ValueError, match="the calibration loss is nan"):
        run(loss_fn=lambda o, b: o.sum() * math.nan)
    for bad in (lambda o, b: o, lambda o, b: 1.0, lambda o, b: o.detach().sum()):
        with pytest.raises(ValueError, match="loss_fn must return a scalar tensor"):
            run(loss_fn=bad)
    with pytest.raises(ValueError, match="labels must differ"):
        run(candidates=[("x", CurrentScaling()), ("x", RowWise())])
    for bad in (RowWise(), "row-wise", [("a", RowWise(), 1)]):
        with pytest.raises(TypeError, match="candidates must be a list of Recipes"):
            run(candidates=bad)
    for label in (None, 3):  # None would read as "kept in high precision" for every layer (helper-60)
        with pytest.raises(TypeError, match="an auto candidate's label must be a str, got"):
            run(candidates=[(label, RowWise())])
    summary = run(exclude="*")
    assert not summary.converted and summary.fp8_flop_fraction == 0.0


class HookedLM(TinyLM):
    """TinyLM with the ways a model may call its linears: an in-place op on a
    layer's output, one layer called twice, a call by keyword."""
    def __init__(self, inplace=False, twice=False, keyword=False):
        super().__init__()
        self.inplace, self.twice, self.keyword = inplace, twice, keyword

    def forward(self, ids):
        h = self.embed(ids)
        u = self.up(input=h) if self.keyword else self.up(h)
        h = h + self.down(torch.relu_(u) if self.inplace else torch.relu(u))
        m = self.mix(h)
        if self.twice:
            m = m + self.mix(torch.tanh(h))
        return self.lm_head(h + m)


def hooked(**kw):
    torch.manual_seed(0)
    return HookedLM(**kw), [torch.randint(0, 64, (2, 16)) for _ in range(3)]


def test_an_in_place_op_after_a_layer_changes_no_estimate():
    """y and dL/dy are the layer's own, not what an in-place ReLU made of them."""
    names = ["up", "down", "mix"]
    model, batches = hooked()
    want = measure_errors(model, names, batches, None)
    model, batches = hooked(inplace=True)
    got = measure_errors(model, names, batches, None)
    for n in names:
        assert got[n] == pytest.approx(want[n], rel=1e-4), n


def test_a_layer_called_twice_counts_both_calls():
    """A shared layer's estimate is the sum of what its two calls would cost as two copies."""
    model, batches = hooked(twice=True)
    shared = measure_errors(model, ["mix"], batches, None)["mix"]

    class TwoCopies(HookedLM):
        def forward(self, ids):
            h = self.embed(ids)
            h = h + self.down(torch.relu(self.up(h)))
            return self.lm_head(h + self.mix(h) + self.mix2(torch.tanh(h)))

    torch.manual_seed(0)
    copies = TwoCopies()
    copies.mix2 = nn.Linear(48, 48)
    copies.mix2.load_state_dict(copies.mix.state_dict())
    both = measure_errors(copies, ["mix", "mix2"], batches, None)
    for label in shared:
        assert shared[label] == pytest.approx(both["mix"][label] + both["mix2"][label], rel=1e-4), label


def test_layers_called_by_keyword_are_measured_calibrated_and_gptq_rounded():
    """layer(input=h): the hooks read the keyword, as for a positional call."""
    names = ["up", "down", "mix"]
    model, batches = hooked()
    want = measure_errors(model, names, batches, None)
    model, batches = hooked(keyword=True)
    assert measure_errors(model, names, batches, None) == want
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=1.0)  # GPTQ's Hessians, then auto
    assert [n for n, _ in s.converted] == names
    static, kw_static = (hooked(keyword=k)[0] for k in (False, True))
    for m in (static, kw_static):
        fp8ext.convert(m, fp8ext.recipes.PerTensorStatic(), keep_lm_head=True)
        fp8ext.calibrate(m, batches, progress=False)
    assert torch.equal(static.up.input_scale, kw_static.up.input_scale)


class KeywordLM(TinyLM):
    """TinyLM called the Hugging Face way; position-wise, so padding after a
    sequence changes nothing before it."""

    def forward(self, input_ids, attention_mask=None, labels=None):
        return super().forward(input_ids)


def test_padding_the_attention_mask_zeroes_and_ignored_labels_leave_the_estimate_unchanged():
    torch.manual_seed(0)
    model, names = KeywordLM(), ["up", "down", "mix"]
    row_wise = [("row-wise", RowWise())]  # per-token scales: the padding's rows cannot move the others'
    ids = [torch.randint(0, 64, (1, 12)) for _ in range(3)]
    plain = measure_errors(model, names, [{"input_ids": x} for x in ids], row_wise)
    mask = torch.cat([torch.ones(1, 12, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)], 1)
    padded = [{"input_ids": torch.cat([x, torch.randint(0, 64, (1, 5))], 1), "attention_mask": mask} for x in ids]
    masked = measure_errors(model, names, padded, row_wise)
    labelled = [{"input_ids": p["input_ids"], "labels": p["input_ids"].masked_fill(p["attention_mask"] == 0, -100)}
                for p in padded]
    for errors in (masked, measure_errors(model, names, labelled, row_wise)):
        assert errors.keys() == plain.keys()
        for n in names:
            assert errors[n]["row-wise"] == pytest.approx(plain[n]["row-wise"], rel=1e-5)
    # Without the mask the padding's predictions count, and the estimate moves.
    unmasked = measure_errors(model, names, [{"input_ids": p["input_ids"]} for p in padded], row_wise)
    assert any(unmasked[n]["row-wise"] != pytest.approx(plain[n]["row-wise"], rel=1e-3) for n in names)
    with pytest.raises(ValueError, match="attention_mask must be a tensor shaped like its input_ids"):
        measure_errors(model, names, [{"input_ids": ids[0], "attention_mask": torch.ones(1, 3)}], row_wise)
    with pytest.raises(ValueError, match="predict no token"):
        measure_errors(model, names, [{"input_ids": ids[0], "attention_mask": torch.zeros_like(ids[0])}], row_wise)
    with pytest.raises(TypeError, match="labels must be integer token ids"):
        measure_errors(model, names, [{"input_ids": ids[0], "labels": ids[0].float()}], row_wise)


def test_max_error_takes_any_real_number():
    np = pytest.importorskip("numpy")
    model, batches = lm_and_batches()
    s = fp8ext.convert(model, "auto", calibration=batches, max_error=np.float32(1.0), weight_rounding="nearest")
    assert s.fp8_flop_fraction == 1.0
    for bad in (True, 0, -1.0, "0.01", torch.tensor(0.01)):
        model, batches = lm_and_batches()
        with pytest.raises(ValueError, match="max_error must be a positive number"):
            fp8ext.convert(model, "auto", calibration=batches, max_error=bad, weight_rounding="nearest")
