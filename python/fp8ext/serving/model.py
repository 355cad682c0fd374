"""A Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP) built from
fp8ext's pieces: fused QKV and gate_up projections (FP8Linear in the FP8
modes), prefill attention over the prompt that writes K and V into the paged
cache through the fused write op, and decode attention over the paged cache.
Embeddings, the LM head and the norms stay in the model's dtype."""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from fp8ext.kv_cache import DecodePlan, PagedKVCache
from fp8ext.recipes import Recipe
from fp8ext.serving.config import LlamaConfig
from fp8ext.serving.layers import (RMSNorm, Rotary, add_norm_for, apply_linear, fuse_linears, fused_rotary_write,
                                   swiglu_into)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int, dtype, device):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.qkv = nn.Linear(cfg.hidden_size, sum(cfg.qkv_sizes), bias=False, dtype=dtype, device=device)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False, dtype=dtype, device=device)
        self.kv_amax = None  # [k amax [H_kv], v amax [H_kv]] while calibrating

    def _project(self, x, rope):
        cfg = self.cfg
        q, k, v = apply_linear(self.qkv, x).split(cfg.qkv_sizes, dim=-1)
        q = Rotary.rotate(q.reshape(-1, cfg.num_heads, cfg.head_dim), rope)
        k = Rotary.rotate(k.reshape(-1, cfg.num_kv_heads, cfg.head_dim), rope)
        return q, k, v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)

    def prefill(self, x, rope, slots, lengths, cache: PagedKVCache):
        """x [total tokens, hidden]: the prompts packed back to back. Causal
        attention over each prompt's own (unquantized) K and V; K and V go to the
        cache through the fused write."""
        q, k, v = self._project(x, rope)
        if self.kv_amax is not None:  # calibration: amax per KV head of what the cache stores
            self.kv_amax = [torch.maximum(m, t.detach().abs().amax(dim=(0, 2)).float())
                            for m, t in zip(self.kv_amax, (k, v))]
        cache.write(self.layer, k, v, slots)
        outs = []
        for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
            o = F.scaled_dot_product_attention(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                                               vs.transpose(0, 1)[None], is_causal=True, enable_gqa=True)
            outs.append(o[0].transpose(0, 1).reshape(qs.shape[0], -1))
        return self.o(torch.cat(outs))

    def decode(self, x, rope, slots, plan: DecodePlan, cache: PagedKVCache):
        """x [batch, hidden]: one new token per sequence, written before the attention reads it;
        rope: the step's rotary tables (Rotary.tables)."""
        cfg = self.cfg
        if fused_rotary_write() and cfg.head_dim % 32 == 0:
            qkv = apply_linear(self.qkv, x)
            cos, sin = (t.reshape(-1, cfg.head_dim) for t in rope)
            q = cache.write_rotary(self.layer, qkv.reshape(-1, qkv.shape[-1]), cfg.num_heads, cos, sin, slots)
        else:
            q, k, v = self._project(x, rope)
            cache.write(self.layer, k, v, slots)
        return self.o(cache.attention(self.layer, q, plan).reshape(q.shape[0], -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, dtype, device):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False, dtype=dtype, device=device)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, dtype=dtype, device=device)

    def forward(self, x):
        return swiglu_into(self.down, apply_linear(self.gate_up, x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int, dtype, device):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.attn = Attention(cfg, layer, dtype, device)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MLP(cfg, dtype, device)


def check_prompt(prompt, vocab_size: int, name: str = "prompt") -> list:
    """A prompt as a list of token ids: a non-empty 1-D sequence of ints in [0, vocab_size)."""
    if isinstance(prompt, torch.Tensor) and prompt.dim() != 1:
        raise ValueError(f"{name} must be 1-D token ids, got shape {tuple(prompt.shape)}")
    try:
        items = list(prompt)  # once: a generator could not be read twice
    except TypeError:
        raise TypeError(f"{name} must be a sequence of integer token ids") from None
    # operator.index takes a bool (or a 0-d bool tensor) as 1 or 0
    if any(isinstance(t, bool) or (isinstance(t, torch.Tensor) and t.dtype == torch.bool) for t in items):
        raise TypeError(f"{name} must hold integer token ids, got a bool")
    try:
        ids = [operator.index(t) for t in items]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of integer token ids") from None
    if not ids:
        raise ValueError(f"{name} must hold at least one token")
    if not all(0 <= t < vocab_size for t in ids):  # on CUDA a bad id would be a device-side assert
        raise ValueError(f"{name} token ids must be in [0, {vocab_size}), got {min(ids)}..{max(ids)}")
    return ids


def check_prompt_tensors(prompts, vocab_size: int) -> None:
    """prefill's prompts: 1-D integer tensors of ids in [0, vocab_size) (one
    host read of their range where they are on a GPU)."""
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.dtype == torch.bool or p.is_floating_point() \
                or p.is_complex():
            raise TypeError(f"prompts[{i}] must be a 1-D integer token-id tensor, got "
                            f"{(p.dtype, tuple(p.shape)) if isinstance(p, torch.Tensor) else type(p).__name__}")
        if not p.numel():
            continue  # (prefill names an empty prompt)
        lo, hi = torch.stack(torch.aminmax(p)).tolist()  # one read
        if not 0 <= lo <= hi < vocab_size:  # else an IndexError in the embedding (a device-side assert on CUDA)
            raise ValueError(f"prompts[{i}] token ids must be in [0, {vocab_size}), got {lo}..{hi}")


MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class LlamaModel(nn.Module):
    """Built empty (``LlamaModel(cfg)``), from a Hugging Face model
    (:meth:`from_hf`) or with random weights (:meth:`random`); :meth:`quantize`
    turns the decoder's projections into FP8Linear layers."""

    def __init__(self, cfg: LlamaConfig, dtype=torch.bfloat16, device="cpu"):
        super().__init__()
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"cfg must be a fp8ext.serving.LlamaConfig, got {type(cfg).__name__}")
        if dtype not in MODEL_DTYPES:  # the cache writes and the fused kernels take these only
            raise TypeError(f"dtype must be one of {MODEL_DTYPES}, got {dtype}")
        self.cfg, self.dtype = cfg, dtype
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, device) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype, device=device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, device)
        self.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @classmethod
    def from_hf(cls, hf_model, dtype=torch.bfloat16, device=None) -> "LlamaModel":
        """From a transformers LlamaForCausalLM (its weights are copied; q/k/v and gate/up are concatenated)."""
        if not isinstance(hf_model, nn.Module) or not hasattr(hf_model, "config"):
            raise TypeError(f"hf_model must be a transformers LlamaForCausalLM, got {type(hf_model).__name__}")
        cfg = LlamaConfig.from_hf(hf_model.config)
        sd = hf_model.state_dict()
        fp8 = [n for n, t in sd.items() if t.is_floating_point() and t.element_size() == 1]
        if fp8:  # FP8 codes copied without their scales would be garbage weights
            raise ValueError(f"hf_model holds FP8 weights ({fp8[0]}, ...): from_hf takes a high-precision model; "
                             "convert the LlamaModel instead (LlamaModel.from_hf(hf).quantize(recipe))")
        model = cls(cfg, dtype, device or next(hf_model.parameters()).device)
        with torch.no_grad():
            model.embed.weight.copy_(sd["model.embed_tokens.weight"])
            model.norm.weight.copy_(sd["model.norm.weight"])
            if not cfg.tie_word_embeddings:
                model.lm_head.weight.copy_(sd["lm_head.weight"])
            for i, layer in enumerate(model.layers):
                p = f"model.layers.{i}."
                layer.attn_norm.weight.copy_(sd[p + "input_layernorm.weight"])
                layer.mlp_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
                layer.attn.qkv.weight.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
                layer.attn.o.weight.copy_(sd[p + "self_attn.o_proj.weight"])
                layer.mlp.gate_up.weight.copy_(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
                layer.mlp.down.weight.copy_(sd[p + "mlp.down_proj.weight"])
        return model

    @classmethod
    def random(cls, cfg: LlamaConfig, dtype=torch.bfloat16, device="cpu", seed: int = 0) -> "LlamaModel":
        """Random weights with a realistic scale (speed does not depend on the values)."""
        model = cls(cfg, dtype, device)
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    continue
                p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32).mul_(0.02))
        return model

    def quantize(self, recipe: Recipe) -> "LlamaModel":
        """W8A8: every decoder projection becomes an FP8Linear (fused ones with per-shard scales).
        Static activation scaling is refused: this model has no calibration pass
        for it, and its input scales would stay 1.0 (activations past +-448
        saturate). Current or delayed scaling needs none."""
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a fp8ext.recipes.Recipe, got {type(recipe).__name__}")
        if recipe.activation_mode == "static":
            raise ValueError("static activation scaling needs calibrated input scales, which LlamaModel does not "
                             "collect: use a current (RowWise, CurrentScaling, BlockWise) or delayed recipe")
        cfg = self.cfg
        if any(type(m) is not nn.Linear for layer in self.layers
               for m in (layer.attn.qkv, layer.attn.o, layer.mlp.gate_up, layer.mlp.down)):
            raise ValueError("quantize takes the model's nn.Linear projections: this model is already quantized "
                             "or sharded (quantize first, then shard_model)")
        for layer in self.layers:
            attn, mlp = layer.attn, layer.mlp
            attn.qkv = fuse_linears(_split(attn.qkv, cfg.qkv_sizes), recipe)
            attn.o = fuse_linears([attn.o], recipe)
            mlp.gate_up = fuse_linears(_split(mlp.gate_up, (cfg.intermediate_size,) * 2), recipe)
            mlp.down = fuse_linears([mlp.down], recipe)
        return self

    @torch.no_grad()
    def kv_scales(self, prompts, fmt: str = "e4m3") -> list:
        """Per layer {"k_scale", "v_scale"} [H_kv] for an FP8 cache: amax of K
        (after RoPE, as stored) and V over prefills of ``prompts``, divided by the
        format's largest value. Runs on a throwaway bf16/float32 cache."""
        from fp8ext.formats import get_format
        cfg = self.cfg
        fmax = get_format(fmt).max
        prompts = [check_prompt(p, cfg.vocab_size, f"prompts[{i}]") for i, p in enumerate(prompts)]
        if not prompts:
            raise ValueError("prompts must hold at least one prompt")
        total = sum(len(p) for p in prompts)
        scratch = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, num_pages=-(-total // 16) + len(prompts),
                               page_size=16, dtype=torch.float32 if self.device.type == "cpu" else torch.bfloat16,
                               device=self.device)
        for layer in self.layers:
            layer.attn.kv_amax = [torch.zeros(cfg.num_kv_heads, device=self.device) for _ in range(2)]
        try:
            slots = [scratch.append(i, len(p)) for i, p in enumerate(prompts)]
            self.prefill([torch.as_tensor(p) for p in prompts], slots, scratch)
            amax = [layer.attn.kv_amax for layer in self.layers]
        finally:
            for layer in self.layers:
                layer.attn.kv_amax = None
        tiny = torch.finfo(torch.float32).tiny
        return [{"k_scale": (k / fmax).clamp_min(tiny), "v_scale": (v / fmax).clamp_min(tiny)} for k, v in amax]

    def _logits(self, h):
        return self.lm_head(self.norm(h))

    def _layers(self, h, run_attention):
        # Each residual add is done by the norm after it (add_norm_for: one kernel with the norm
        # and the quantization where the next projection quantizes per token).
        delta = None
        for layer in self.layers:
            x, h = add_norm_for(layer.attn_norm, h, delta, layer.attn.qkv)
            delta = run_attention(layer.attn, x)
            x, h = add_norm_for(layer.mlp_norm, h, delta, layer.mlp.gate_up)
            delta = layer.mlp(x)
        return h if delta is None else h + delta

    @torch.no_grad()
    def prefill(self, prompts, slots, cache: PagedKVCache) -> torch.Tensor:
        """prompts: token-id tensors (one per sequence, already given their cache
        slots by ``cache.append``); returns the logits of each prompt's last token [B, vocab]."""
        check_prompt_tensors(prompts, self.cfg.vocab_size)
        lengths = [int(p.numel()) for p in prompts]
        if not lengths or min(lengths) < 1:
            raise ValueError(f"prompts must be a non-empty list of non-empty token tensors, got lengths {lengths}")
        if len(slots) != len(prompts):
            raise ValueError(f"slots must hold one tensor per prompt ({len(prompts)}), got {len(slots)}")
        tokens = torch.cat([p.reshape(-1) for p in prompts]).to(self.device)
        positions = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        slots = torch.cat([s.reshape(-1) for s in slots]).to(self.device)
        h = self.embed(tokens)
        rope = self.rotary.tables(positions, h.dtype)
        h = self._layers(h, lambda attn, x: attn.prefill(x, rope, slots, lengths, cache))
        last = torch.tensor(lengths).cumsum(0).to(self.device) - 1
        return self._logits(h[last])

    @torch.no_grad()
    def decode(self, tokens, positions, slots, plan: DecodePlan, cache: PagedKVCache, live=None) -> torch.Tensor:
        """One decode step: tokens, positions, slots [B] (device tensors), plan
        from ``cache.plan``; returns logits [B, vocab]. No host synchronisation:
        capturable in a CUDA graph. ``live`` [B] (1 for real rows, 0 for a
        graph's padding rows) zeroes the padding rows' hidden states, which then
        stay zero through every layer and so cannot move a per-tensor
        activation scale that the live rows share."""
        h = self.embed(tokens)
        if live is not None:
            h = h * live[:, None]
        rope = self.rotary.tables(positions, h.dtype)
        h = self._layers(h, lambda attn, x: attn.decode(x, rope, slots, plan, cache))
        return self._logits(h)


def _split(linear: nn.Linear, sizes) -> list:
    """A fused nn.Linear back into its shards (views of its weight)."""
    out = []
    for w in linear.weight.split(tuple(sizes)):
        shard = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        shard.weight = nn.Parameter(w, requires_grad=False)
        out.append(shard)
    return out
