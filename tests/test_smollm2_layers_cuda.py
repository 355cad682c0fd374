"""Real SmolLM2 layers on the GPU: FP8Linear's CUDA path against its CPU reference
and against the bf16 layer, on the inputs those layers see on real text
(.data/smollm2_layers.safetensors, written by scripts/make_smollm2_layers.py and
carried to the device)."""
import os

import pytest
import torch
from torch import nn

import fp8ext
from fp8ext.nn import FP8Linear

pytestmark = pytest.mark.gpu
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".data",
                    "smollm2_layers.safetensors")
RECIPES = {"per-tensor": fp8ext.CurrentScaling(), "row-wise": fp8ext.RowWise(), "block-wise": fp8ext.BlockWise()}


def layers():
    if not os.path.exists(DATA):
        return []
    from safetensors.torch import load_file

    t = load_file(DATA)
    return [(k[:-len(".weight")], t[k], t[k[:-len(".weight")] + ".input"]) for k in sorted(t) if k.endswith(".weight")]


LAYERS = layers()


@pytest.mark.skipif(not LAYERS, reason=f"{DATA} is missing: run scripts/make_smollm2_layers.py and carry .data")
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_real_layers_cuda_matches_cpu_and_bf16(recipe):
    for name, weight, x in LAYERS:
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.bfloat16)
        linear.weight.data.copy_(weight)
        cpu = FP8Linear.from_linear(linear, RECIPES[recipe])
        gpu = FP8Linear.from_linear(linear, RECIPES[recipe]).cuda()
        want = cpu(x).double()
        got = gpu(x.cuda()).cpu().double()
        assert ((got - want).norm() / want.norm()).item() < 5e-3, f"{name} {recipe}: CUDA differs from CPU"
        ref = (x.double() @ weight.double().t())
        assert ((got - ref).norm() / ref.norm()).item() < 0.08, f"{name} {recipe}: FP8 error against bf16"
