"""Static and per-tensor current quantization of the benchmark input (16384x8192
bf16, bench_quantize.py's values) timed in one process in several states, to
show the two speeds seen on the H200 on 2026-11-30: 107/170 us from a fresh
process, 99.4/159.6 us once a torch.compile'd function had run (and from then
on), while bench/bench_quantize.py read 108.5/171.8 us. The cause is not known
yet (leads in bench/NOTES.md, session 8).

    python3 scripts/device/quant_state/diag_quant_env.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))
import bench_quantize  # noqa: E402
from benchlib import time_ms  # noqa: E402

import fp8ext  # noqa: E402,F401  (registers the ops)

F8 = torch.float8_e4m3fn
ops = torch.ops.fp8ext
torch.manual_seed(0)
m, k = 16384, 8192
x = (torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-4, 4, (m, k), device="cuda").float())).to(
    torch.bfloat16)
s = torch.tensor(0.05, device="cuda")


def show(state):
    """Times both ops and prints where the input and each op's output live (the
    caching allocator hands the same block back to every timed call)."""
    static = time_ms(lambda: ops.quantize_with_scale(x, s, F8, 0))
    current = time_ms(lambda: ops.quantize_per_tensor(x, F8, 0, False, 0))
    q_static, (q_current, _) = ops.quantize_with_scale(x, s, F8, 0), ops.quantize_per_tensor(x, F8, 0, False, 0)
    print(f"{state:32s} static {static * 1e3:6.1f} us  per-tensor current {current * 1e3:6.1f} us  "
          f"x at {x.data_ptr():#x}, outputs at {q_static.data_ptr():#x} / {q_current.data_ptr():#x}", flush=True)


show("fresh")
show("fresh, again")
scratch = [torch.empty(512 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
del scratch
show("after 4 GB allocated and freed")
compiled = torch.compile(bench_quantize.plain_static, dynamic=False)
compiled(x, s)
torch.cuda.synchronize()
show("after a torch.compile'd function")
time.sleep(3)
show("after 3 s idle")
x = x.clone()  # the same values in a new block: does the input's place matter?
torch.cuda.empty_cache()
show("input copied, cache emptied")
