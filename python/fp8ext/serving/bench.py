"""`fp8ext bench serve`: decode throughput and latency of the serving engine on
a Llama-3.1-8B-shaped model with random weights (speed does not depend on the
values), in each precision mode, beside a plain-PyTorch bf16 decode step
(F.linear through cuBLAS, SDPA over a contiguous cache, one CUDA graph) in the
same run. Decode sweeps fill the cache with random K/V instead of prefilling
every context; prefill (time to first token) is timed on its own, smaller.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import sys

import torch
import torch.nn.functional as F

from fp8ext.cuda_graphs import capture, replay_times_ms
from fp8ext.kv_cache import PagedKVCache, bytes_per_token
from fp8ext.recipes import RowWise
from fp8ext.serving.config import LlamaConfig
from fp8ext.serving.engine import _Graph
from fp8ext.serving.model import LlamaModel

MODES = {  # name: (weight recipe or None, KV-cache dtype)
    "bf16": (None, torch.bfloat16),
    "bf16+fp8kv": (None, torch.float8_e4m3fn),
    "w8a8": (RowWise(), torch.bfloat16),
    "w8a8+fp8kv": (RowWise(), torch.float8_e4m3fn),
}
FULL = dict(batches=(1, 8, 32, 64, 128, 256), contexts=(1024, 4096, 16384, 32768))
QUICK = dict(batches=(1, 64), contexts=(4096,))
CURVES = dict(batches=(1, 16, 64, 128), contexts=(4096,))  # the report's throughput/latency curves


def _stats(times: list, batch: int) -> dict:
    median = statistics.median(times)
    return {"step_ms": round(median, 4), "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 4),
            "tokens_per_s": round(batch * 1000 / median, 1)}


def _fill_cache(cache: PagedKVCache, batch: int, context: int) -> None:
    """Sequences of `context` tokens with random K/V (of realistic magnitude for the codes)."""
    for s in range(batch):
        cache.append(s, context)
    for pool in cache.k + cache.v:
        pool.copy_((torch.randn(pool.shape, device=pool.device) * 0.5).to(pool.dtype))


def engine_decode(model: LlamaModel, dtype, batch: int, context: int, repeats: int) -> dict:
    cfg = model.cfg
    pages = batch * -(-(context + 1) // 16)
    cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, pages, 16, dtype, device="cuda",
                         scales=[{"k_scale": 1.0, "v_scale": 1.0}] * cfg.num_layers,
                         max_pages_per_seq=pages // batch)  # the graph's block table and splits fit the context
    _fill_cache(cache, batch, context)
    graph = _Graph(model, cache, batch)
    slots = torch.cat([cache.append(s, 1) for s in range(batch)])
    plan = cache.plan(range(batch))
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device="cuda")
    positions = torch.full((batch,), context, device="cuda")
    times = replay_times_ms(lambda: graph(tokens, positions, slots, plan).argmax(-1), repeats)
    del graph, cache
    return _stats(times, batch)


def reference_decode(model: LlamaModel, batch: int, context: int, repeats: int) -> dict:
    """The plain-PyTorch bf16 step: same weights, contiguous [B, H_kv, T, D] caches, SDPA, one graph."""
    cfg = model.cfg
    caches = [(torch.randn(batch, cfg.num_kv_heads, context + 1, cfg.head_dim, device="cuda", dtype=torch.bfloat16),
               torch.randn(batch, cfg.num_kv_heads, context + 1, cfg.head_dim, device="cuda", dtype=torch.bfloat16))
              for _ in range(cfg.num_layers)]
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device="cuda")
    positions = torch.full((batch,), context, device="cuda")

    def step():
        h = model.embed(tokens)
        for layer, (kc, vc) in zip(model.layers, caches):
            x = layer.attn_norm(h)
            q, k, v = F.linear(x, layer.attn.qkv.weight).split(cfg.qkv_sizes, dim=-1)
            q = model.rotary(q.reshape(batch, cfg.num_heads, cfg.head_dim), positions)
            k = model.rotary(k.reshape(batch, cfg.num_kv_heads, cfg.head_dim), positions)
            kc[:, :, context] = k
            vc[:, :, context] = v.reshape(batch, cfg.num_kv_heads, cfg.head_dim)
            o = F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)
            h = h + F.linear(o.reshape(batch, -1), layer.attn.o.weight)
            gate, up = F.linear(layer.mlp_norm(h), layer.mlp.gate_up.weight).split(cfg.intermediate_size, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.mlp.down.weight)
        return F.linear(model.norm(h), model.lm_head.weight).argmax(-1)

    graph, _ = capture(step)
    times = replay_times_ms(graph.replay, repeats)
    del graph, caches
    return _stats(times, batch)


def prefill_ms(model: LlamaModel, dtype, length: int, repeats: int = 5) -> float:
    cfg = model.cfg
    pages = -(-length // 16)
    times = []
    for _ in range(repeats + 1):
        cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, pages, 16, dtype, device="cuda",
                             scales=[{"k_scale": 1.0, "v_scale": 1.0}] * cfg.num_layers)
        prompt = torch.randint(0, cfg.vocab_size, (length,), device="cuda")
        slots = cache.append(0, length)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model.prefill([prompt], [slots], cache).argmax(-1)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times[1:]), 3)


def max_batch(cfg: LlamaConfig, weight_bytes: int, dtype, context: int, budget_bytes: int) -> int:
    """Sequences of `context` tokens whose KV cache fits next to the weights in the budget."""
    per_seq = bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype) * context
    return max(0, (budget_bytes - weight_bytes) // per_seq)


def _save(rows: list, out_dir: str) -> str:
    """Writes the rows so far to out_dir/serve.json (replaced whole, so a sweep cut
    short by a time limit keeps every row it finished)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "serve.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def run(out_dir: str, quick: bool = False, num_layers: int = 32, repeats: int = 20,
        memory_budget_gb: float = 80.0, modes=tuple(MODES), sweep: dict | None = None,
        command: str | None = None) -> list:
    """Decode (and prefill) timings of every mode over `sweep` (batches x contexts;
    default FULL, or QUICK with quick=True), written to out_dir/serve.json after
    every row; each row records `command` (default: this process's command line)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty subset of {list(MODES)}, got {list(modes)}")
    if not torch.cuda.is_available():
        raise RuntimeError("fp8ext bench serve needs a CUDA GPU (it times the H200 kernels)")
    sweep = sweep or (QUICK if quick else FULL)
    cfg = LlamaConfig.llama3_8b(num_layers)
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "commit": os.environ.get("FP8EXT_COMMIT", "unknown"), "date": datetime.date.today().isoformat(),
            "model": f"Llama-3.1-8B shape, {num_layers} layers, random weights",
            "command": command or shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]])}
    rows = []
    base = LlamaModel.random(cfg, torch.bfloat16, "cuda")
    budget = int(memory_budget_gb * 2**30)
    for mode in modes:
        recipe, kv_dtype = MODES[mode]
        model = LlamaModel.random(cfg, torch.bfloat16, "cuda").quantize(recipe) if recipe else base
        weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
        for context in sweep["contexts"]:
            for batch in sweep["batches"]:
                fits = max_batch(cfg, weights, kv_dtype, context, budget)
                row = dict(info, op="serve_decode", mode=mode, batch=batch, context=context,
                           max_batch_in_budget=fits, budget_gb=memory_budget_gb)
                if batch * context * bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, kv_dtype) \
                        > 0.6 * torch.cuda.mem_get_info()[0]:
                    row["skipped"] = "the cache does not fit on this GPU"
                else:
                    row.update(engine_decode(model, kv_dtype, batch, context, repeats))
                rows.append(row)
                _save(rows, out_dir)
                print(row, flush=True)
        rows.append(dict(info, op="serve_prefill", mode=mode, prompt_tokens=1024,
                         ttft_ms=prefill_ms(model, kv_dtype, 1024)))
        _save(rows, out_dir)
        print(rows[-1], flush=True)
        if model is not base:
            del model
            torch.cuda.empty_cache()
    for context in sweep["contexts"]:
        for batch in sweep["batches"]:
            if batch * context * bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16) \
                    > 0.6 * torch.cuda.mem_get_info()[0]:
                continue
            rows.append(dict(info, op="serve_decode", mode="pytorch_bf16_reference", batch=batch, context=context,
                             **reference_decode(base, batch, context, repeats)))
            _save(rows, out_dir)
            print(rows[-1], flush=True)
    _print_table(rows)
    return rows


def _print_table(rows: list) -> None:
    ref = {(r["batch"], r["context"]): r for r in rows if r.get("mode") == "pytorch_bf16_reference"}
    print(f"{'mode':<24}{'batch':>6}{'context':>9}{'step ms':>10}{'p99 ms':>9}{'tok/s':>10}{'vs ref':>8}{'fits':>7}")
    for r in rows:
        if r["op"] != "serve_decode" or "step_ms" not in r:
            continue
        base = ref.get((r["batch"], r["context"]))
        ratio = f"{base['step_ms'] / r['step_ms']:.2f}x" if base else "-"
        print(f"{r['mode']:<24}{r['batch']:>6}{r['context']:>9}{r['step_ms']:>10}{r['p99_ms']:>9}"
              f"{r['tokens_per_s']:>10}{ratio:>8}{str(r.get('max_batch_in_budget', '-')):>7}")
