"""Per-tensor current scaling on 16384x8192 bf16 under one setting of the
tuning knobs (FP8EXT_TUNE_AMAX_BLOCKS_PER_SM, FP8EXT_TUNE_CURRENT_QUANT_BLOCKS_PER_SM,
read once per process): event-timed total, static quantization in the same
process for scale, and each kernel's time from the profiler. Prints one JSON line.

    FP8EXT_TUNE_AMAX_BLOCKS_PER_SM=16 python3 scripts/device/tune_quantize.py
"""
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fp8ext  # noqa: E402,F401
from benchlib import time_ms  # noqa: E402

F8 = torch.float8_e4m3fn
ops = torch.ops.fp8ext
torch.manual_seed(0)
x = torch.randn(16384, 8192, device="cuda").to(torch.bfloat16)
s = torch.tensor(0.01, device="cuda")
current = lambda: ops.quantize_per_tensor(x, F8, 0, False, 0)  # noqa: E731
static = lambda: ops.quantize_with_scale(x, s, F8, 0)  # noqa: E731
q, scale = current()
want = (x.float() / scale).clamp(-448, 448).to(F8)
assert torch.equal(q.view(torch.uint8), want.view(torch.uint8)), "per-tensor current disagrees with the reference"
row = {k: os.environ.get(k, "") for k in ("FP8EXT_TUNE_AMAX_BLOCKS_PER_SM", "FP8EXT_TUNE_CURRENT_QUANT_BLOCKS_PER_SM")}
row["current_us"] = round(1e3 * time_ms(current, repeats=50), 2)
row["static_us"] = round(1e3 * time_ms(static, repeats=50), 2)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        current()
    torch.cuda.synchronize()
for e in prof.key_averages():
    name = next((k for k in ("amax_kernel", "quantize_chunks_kernel", "Memset") if k in e.key), None)
    if name and e.count >= 20:
        row[name + "_us"] = round(e.device_time_total / e.count, 2)
print(json.dumps(row))
