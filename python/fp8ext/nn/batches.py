"""How calibration-style passes (calibrate, GPTQ's Hessians, recipe="auto") feed
a batch to a model, the mode they run it in, and what their hooks read of a
layer's call."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch
from torch import nn


def run_model(model: nn.Module, batch):
    """``model(**batch)`` for a mapping of keyword arguments (a dict, or a Hugging
    Face ``BatchEncoding``), ``model(*batch)`` for a tuple or list of positional
    ones, else ``model(batch)``. A DataLoader's ``[inputs, labels]`` pair is a
    list: pass the inputs alone (``(x for x, _ in loader)``), or labels reach
    the model as its second argument."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def check_batches(batches, what: str = "batches"):
    """``batches`` as given, unless it is one batch rather than a collection of
    them: iterating a tensor would feed its rows one by one, and a dict (a
    tokenizer's ``BatchEncoding``) its key names."""
    if isinstance(batches, (torch.Tensor, Mapping)):
        raise TypeError(f"{what} must be an iterable of batches (a list, a generator, a DataLoader), got one "
                        f"{type(batches).__name__}: pass [batch] for a single batch")
    return batches


def batch_tokens(batch):
    """The token ids of a batch: ``batch["input_ids"]``, the first positional
    argument, or the batch itself."""
    if isinstance(batch, Mapping):
        return batch.get("input_ids")
    if isinstance(batch, (tuple, list)):
        return batch[0] if batch else None
    return batch


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Runs the block with every submodule in eval mode (no dropout, frozen
    batch-norm statistics: what inference will see) and restores each one's
    own mode afterwards. Eval mode also turns off Hugging Face's gradient
    checkpointing, which only acts in training mode; these passes keep no
    gradients."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def is_token_batch(ids) -> bool:
    return isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()


def linear_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The input of a Linear's call as a hook registered with ``with_kwargs=True``
    sees it: positional, or by keyword (``layer(input=h)``)."""
    return args[0] if args else kwargs["input"]
