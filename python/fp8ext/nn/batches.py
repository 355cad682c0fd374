"""How calibration-style passes (calibrate, GPTQ's Hessians, recipe="auto") feed
a batch to a model, and the mode they run it in."""
from __future__ import annotations

import contextlib

import torch
from torch import nn


def run_model(model: nn.Module, batch):
    """``model(**batch)`` for a dict of keyword arguments, ``model(*batch)`` for a
    tuple or list of positional ones, else ``model(batch)``."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def batch_tokens(batch):
    """The token ids of a batch: ``batch["input_ids"]``, the first positional
    argument, or the batch itself."""
    if isinstance(batch, dict):
        return batch.get("input_ids")
    if isinstance(batch, (tuple, list)):
        return batch[0] if batch else None
    return batch


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Runs the block with every submodule in eval mode (no dropout, frozen
    batch-norm statistics: what inference will see) and restores each one's
    own mode afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def is_token_batch(ids) -> bool:
    return isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()
