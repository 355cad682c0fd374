"""Why the residual variant of the fused RMSNorm kernel was slow at batch 1 on
the H200 (10.8 us a call in the decode step against 5 us without the add,
2026-12-01): times, graph-replayed, rms_norm_quantize, add_rms_norm_quantize
and torch's add followed by rms_norm_quantize, at M = 1 and 64, K = 4096, in
bf16 and fp16 (ptxas spills 10 bytes in the bf16 residual variant only).

    python3 scripts/device/probe_add_norm.py
"""
import torch

from fp8ext.cuda_graphs import capture
from fp8ext.quantize import add_rms_norm_quantize, rms_norm_quantize
from fp8ext.recipes import RowWise


def per_call_us(fn, calls=200):
    graph, _ = capture(lambda: [fn() for _ in range(calls)][-1])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[2]


recipe = RowWise()
for dtype in (torch.bfloat16, torch.float16):
    for m in (1, 64):
        x = torch.randn(m, 4096, device="cuda", dtype=dtype)
        res = torch.randn(m, 4096, device="cuda", dtype=dtype)
        w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
        plain = per_call_us(lambda: rms_norm_quantize(x, w, 1e-5, recipe, pad_k_to=16))
        fused = per_call_us(lambda: add_rms_norm_quantize(x, res, w, 1e-5, recipe, pad_k_to=16))
        apart = per_call_us(lambda: rms_norm_quantize(x + res, w, 1e-5, recipe, pad_k_to=16))
        print(f"{str(dtype):15s} M={m:3d}: rms_norm_quantize {plain:6.2f} us, add_rms_norm_quantize {fused:6.2f} us, "
              f"add then rms_norm_quantize {apart:6.2f} us", flush=True)
