"""Per-tensor current scaling on the 16384x8192 bf16 benchmark input under
several FP8EXT_L2_KEEP fractions (the share of L2 the amax pass keeps for the
quantize pass; 0 keeps nothing), side by side in one process, with static
scaling as the one-pass reference. Outputs must be identical under every
fraction (the hints change caching only).

    python3 scripts/device/tune_l2_keep.py [fractions...]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import time_ms  # noqa: E402

import fp8ext  # noqa: E402,F401  (registers the ops)

F8 = torch.float8_e4m3fn
ops = torch.ops.fp8ext
fractions = [float(f) for f in sys.argv[1:]] or [0.0, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9]
x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
y = torch.randn_like(x)  # a second tensor, quantized after x: do kept lines linger and slow it?
s = torch.tensor(0.05, device="cuda")
gb = x.numel() * 3 / 1e9
print(f"L2 {torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB")
static_ms = time_ms(lambda: ops.quantize_with_scale(x, s, F8, 0), repeats=50)
print(f"static: {static_ms * 1e3:.1f} us ({gb / static_ms:.3f} TB/s)")
want = None
for rnd in range(2):
    for f in fractions:
        os.environ["FP8EXT_L2_KEEP"] = str(f)
        q, sc = ops.quantize_per_tensor(x, F8, 0, False, 0)
        if want is None:
            want = (q.view(torch.uint8).clone(), sc.clone())
        assert torch.equal(q.view(torch.uint8), want[0]) and torch.equal(sc, want[1]), f"output changed at {f}"
        ms = time_ms(lambda: ops.quantize_per_tensor(x, F8, 0, False, 0), repeats=50)
        pair = time_ms(lambda: (ops.quantize_per_tensor(x, F8, 0, False, 0), ops.quantize_with_scale(y, s, F8, 0)),
                       repeats=30)
        print(f"round {rnd} keep {f:4.2f}: per-tensor {ms * 1e3:6.1f} us ({gb / ms:.3f} TB/s); "
              f"then static on another tensor: +{(pair - ms) * 1e3:6.1f} us")
