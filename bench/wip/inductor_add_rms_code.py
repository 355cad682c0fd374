"""Prints the Triton code inductor writes for bench_fused_quantize's residual add +
RMSNorm + per-token quantize anchor (what the anchor does that ours does not)."""
import sys

import torch
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, "bench")
from bench_fused_quantize import plain_add_rms_norm_quantize  # noqa: E402

for m in (16, 8192):
    x, r = (torch.randn(m, 4096, device="cuda").to(torch.bfloat16) for _ in range(2))
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    _, code = run_and_get_code(torch.compile(plain_add_rms_norm_quantize, dynamic=False), x, r, w)
    print(f"===== M = {m}")
    for c in code:
        print(c)
