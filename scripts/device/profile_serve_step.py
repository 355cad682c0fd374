"""Where a serving decode step's time goes: the engine's captured step
(Llama-3.1-8B shape, random weights, context 4096) under torch.profiler, GPU
time per kernel name per step, for each (mode, batch) given, and the
timeline: the span of a step, the time some kernel runs (the union of their
intervals) and the idle rest. PDL is off unless --pdl, so that kernels do not
overlap in the trace (FP8EXT_PDL=0).

    python3 scripts/device/profile_serve_step.py [--layers 32] [--steps 5] [--pdl] [--modes ...] [--batches ...]
"""
import argparse
import os
import sys

if "--pdl" not in sys.argv:
    os.environ["FP8EXT_PDL"] = "0"

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from fp8ext.kv_cache import PagedKVCache  # noqa: E402
from fp8ext.serving.bench import MODES, _fill_cache  # noqa: E402
from fp8ext.serving.config import LlamaConfig  # noqa: E402
from fp8ext.serving.engine import _Graph  # noqa: E402
from fp8ext.serving.model import LlamaModel  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--context", type=int, default=4096)
ap.add_argument("--pdl", action="store_true")
ap.add_argument("--modes", nargs="+", default=["w8a8+fp8kv", "bf16"])
ap.add_argument("--batches", type=int, nargs="+", default=[64, 1])
args = ap.parse_args()
cfg = LlamaConfig.llama3_8b(args.layers)


def timeline(prof, steps):
    """Per step: span from the first kernel's start to the last one's end, the union of kernel intervals
    (busy) and the rest (idle: launch gaps), in ms, and the kernel count."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start)
    if not spans:
        return "no kernel intervals in the trace"
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s0, e0 in spans[1:]:
        if s0 > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s0, e0
        else:
            cur_e = max(cur_e, e0)
    busy += cur_e - cur_s
    span = spans[-1][1] - spans[0][0]
    return (f"timeline per step: span {span / steps / 1e3:.3f} ms, kernels running {busy / steps / 1e3:.3f} ms, "
            f"idle {(span - busy) / steps / 1e3:.3f} ms, {len(spans) // steps} kernels")


for mode in args.modes:
    recipe, kv_dtype = MODES[mode]
    model = LlamaModel.random(cfg, torch.bfloat16, "cuda")
    if recipe:
        model = model.quantize(recipe)
    for batch in args.batches:
        pages = batch * -(-(args.context + 1) // 16)
        cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, pages, 16, kv_dtype, device="cuda",
                             scales=[{"k_scale": 1.0, "v_scale": 1.0}] * cfg.num_layers,
                             max_pages_per_seq=pages // batch)
        _fill_cache(cache, batch, args.context)
        graph = _Graph(model, cache, batch)
        slots = torch.cat([cache.append(s, 1) for s in range(batch)])
        plan = cache.plan(range(batch))
        tokens = torch.randint(0, cfg.vocab_size, (batch,), device="cuda")
        positions = torch.full((batch,), args.context, device="cuda")
        graph(tokens, positions, slots, plan)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                graph(tokens, positions, slots, plan)
            torch.cuda.synchronize()
        rows = [(e.key, e.self_device_time_total / args.steps / 1e3, e.count // args.steps)
                for e in prof.key_averages() if e.self_device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"\n== {mode} batch {batch} x {args.context}: {total:.3f} ms of kernels per step")
        for name, ms, n in rows[:22]:
            print(f"{ms:8.3f} ms {n:5d}x  {name[:110]}")
        print(timeline(prof, args.steps))
        del graph, cache
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
