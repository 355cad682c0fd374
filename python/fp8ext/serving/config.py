"""The shape of a Llama-style decoder, read from a Hugging Face config or a preset."""
from __future__ import annotations

from dataclasses import dataclass

from fp8ext.checks import check_bool, check_positive_int, is_finite_number


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim"):
            check_positive_int(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if not (is_finite_number(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"rope_theta must be a finite number > 0, got {self.rope_theta!r}")
        if not (is_finite_number(self.rms_norm_eps) and self.rms_norm_eps >= 0):
            raise ValueError(f"rms_norm_eps must be a finite number >= 0, got {self.rms_norm_eps!r}")
        check_bool("tie_word_embeddings", self.tie_word_embeddings)

    @classmethod
    def from_hf(cls, hf) -> "LlamaConfig":
        """From a transformers LlamaConfig (or a Mistral one without a sliding
        window). RoPE scaling (Llama 3.1's long-context rule), sliding windows,
        biases and other architectures are not implemented: such configs are
        refused rather than run wrong."""
        if not hasattr(hf, "hidden_size"):
            raise TypeError(f"hf must be a transformers Llama config (model.config), got {type(hf).__name__}")
        model_type = getattr(hf, "model_type", "llama")
        if model_type not in ("llama", "mistral"):  # Qwen2's q/k/v biases, say, have no config flag to check
            raise ValueError(f"model_type {model_type!r} is not supported (Llama-architecture models only)")
        if getattr(hf, "sliding_window", None) is not None:
            raise ValueError(f"sliding_window={hf.sliding_window} is not supported (full causal attention only)")
        scaling = getattr(hf, "rope_scaling", None) or {}
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ValueError(f"rope_scaling {scaling} is not supported (plain RoPE only)")
        params = getattr(hf, "rope_parameters", None) or {}
        if params and params.get("rope_type", "default") != "default":
            raise ValueError(f"rope_parameters {params} are not supported (plain RoPE only)")
        if getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False):
            raise ValueError("attention_bias / mlp_bias are not supported (the projections have no bias)")
        if getattr(hf, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf.hidden_act!r} is not supported (SwiGLU with SiLU only)")
        theta = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        heads = hf.num_attention_heads
        return cls(vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
                   num_layers=hf.num_hidden_layers, num_heads=heads,
                   num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
                   head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads, rope_theta=float(theta),
                   rms_norm_eps=float(hf.rms_norm_eps), tie_word_embeddings=bool(hf.tie_word_embeddings))

    @classmethod
    def llama3_8b(cls, num_layers: int = 32) -> "LlamaConfig":
        """Llama-3.1-8B's shapes (for speed runs with random weights)."""
        return cls(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=num_layers,
                   num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5)

    @property
    def qkv_sizes(self) -> tuple:
        return (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)
