"""Per-tensor current scaling on 16384x8192 bf16, the one-launch cooperative
kernel against the two-kernel path (FP8EXT_CURRENT_FUSED=0), with static
quantization for scale; event-timed in one process. Prints one JSON line.

    python3 scripts/device/tune_quantize.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fp8ext  # noqa: E402,F401
from benchlib import time_ms  # noqa: E402

F8 = torch.float8_e4m3fn
ops = torch.ops.fp8ext
torch.manual_seed(0)
x = torch.randn(16384, 8192, device="cuda").to(torch.bfloat16)
s = torch.tensor(0.01, device="cuda")
current = lambda: ops.quantize_per_tensor(x, F8, 0, False, 0)  # noqa: E731
row = {}
for path in ("1", "0"):
    os.environ["FP8EXT_CURRENT_FUSED"] = path
    q, scale = current()
    want = (x.float() / scale).clamp(-448, 448).to(F8)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8)), f"path {path} disagrees with the reference"
    row["fused_us" if path == "1" else "two_kernels_us"] = round(1e3 * time_ms(current, repeats=50), 2)
row["static_us"] = round(1e3 * time_ms(lambda: ops.quantize_with_scale(x, s, F8, 0), repeats=50), 2)
print(json.dumps(row))
