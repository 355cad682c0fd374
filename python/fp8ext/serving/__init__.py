"""fp8ext.serving: a small Llama-architecture inference engine built from
fp8ext's kernels (FP8Linear, the paged FP8 KV cache) and PyTorch."""
from fp8ext.serving.config import LlamaConfig
from fp8ext.serving.engine import Engine, Request
from fp8ext.serving.layers import RMSNorm, Rotary, fuse_linears
from fp8ext.serving.model import LlamaModel

__all__ = ["Engine", "LlamaConfig", "LlamaModel", "RMSNorm", "Request", "Rotary", "fuse_linears"]
