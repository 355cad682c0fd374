"""Runs each quantization op twice on the benchmark shapes, for `ncu` to profile
(scripts/device/run.sh's `profile` stage):

    ncu --clock-control none --section SpeedOfLight ... python3 scripts/device/profile_quantize.py [--per-tensor]
"""
import sys

import torch

F8 = torch.float8_e4m3fn
# --per-tensor: only current scaling's two kernels, for the L2 question (run.sh's `profile_l2` stage)
PER_TENSOR_ONLY = "--per-tensor" in sys.argv[1:]
ops = torch.ops.fp8ext
import fp8ext  # noqa: E402,F401  (registers the ops)

for m, k in [(16384, 8192), (16, 4096)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    s = torch.tensor(0.05, device="cuda")
    hist, sd = torch.zeros(16, device="cuda"), torch.ones((), device="cuda")
    x.clone()  # a plain copy, for comparison
    for _ in range(2):
        if PER_TENSOR_ONLY:
            ops.quantize_per_tensor(x, F8, 0, False, 0)
            continue
        ops.quantize_with_scale(x, s, F8, 0)
        ops.quantize_delayed(x, hist, sd, F8, 0, False, True, 0)
        ops.quantize_per_tensor(x, F8, 0, False, 0)
        ops.quantize_per_row(x, F8, 0, False, 0)
        ops.quantize_per_group(x, F8, 0, False, 0)
        if m >= 128:
            ops.quantize_per_block(x, F8, 0, False, 0)
torch.cuda.synchronize()
