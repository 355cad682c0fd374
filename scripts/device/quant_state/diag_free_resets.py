"""Does a cudaMalloc + cudaFree of a dummy buffer, outside torch's allocator,
put the library's static and per-tensor kernels back in the fast state (the
state a fresh mapping leaves them out of; diag_flip.py)? One process: timed,
then a dummy malloc/free, timed again, twice over.

    python3 scripts/device/quant_state/diag_free_resets.py
"""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))
from benchlib import time_ms  # noqa: E402

import fp8ext  # noqa: E402,F401

path = next(ln.split()[-1] for ln in open("/proc/self/maps") if "libcudart" in ln)
cudart = ctypes.CDLL(path)


def dummy_malloc_free(mb=64):
    p = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(mb << 20)) == 0
    assert cudart.cudaFree(p) == 0


ops, F8 = torch.ops.fp8ext, torch.float8_e4m3fn
m, k = 16384, 8192
torch.manual_seed(0)
x = (torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-4, 4, (m, k), device="cuda").float())).to(torch.bfloat16)
s = torch.tensor(0.05, device="cuda")
st = lambda: time_ms(lambda: ops.quantize_with_scale(x, s, F8, 0)) * 1e3  # noqa: E731
pt = lambda: time_ms(lambda: ops.quantize_per_tensor(x, F8, 0, False, 0)) * 1e3  # noqa: E731
cp_out = torch.empty_like(x)
cp = lambda: time_ms(lambda: cp_out.copy_(x)) * 1e3  # noqa: E731
print(f"libcudart: {path}")
for rnd in range(2):
    print(f"round {rnd} as found:              static {st():.1f} us, per-tensor {pt():.1f}, torch copy {cp():.1f}", flush=True)
    dummy_malloc_free()
    print(f"round {rnd} after dummy malloc/free: static {st():.1f} us, per-tensor {pt():.1f}, torch copy {cp():.1f}", flush=True)
    keep = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")  # a fresh mapping through torch
    print(f"round {rnd} after a new torch block: static {st():.1f} us, per-tensor {pt():.1f}, torch copy {cp():.1f}", flush=True)
