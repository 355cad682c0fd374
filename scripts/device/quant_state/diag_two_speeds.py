"""Which process state gives the quantize kernels their fast speed (bench/NOTES.md,
"two speeds")? Each case runs in a fresh subprocess: it builds bench_quantize's
16384x8192 bf16 input, optionally does one thing first, then times static and
per-tensor current quantization and torch's copy of the input (benchlib.time_ms)
three times, then each 20 times back to back, and prints where
the input and the output sit in the caching allocator's segments.

    python3 scripts/device/quant_state/diag_two_speeds.py [--out DIR] [--cases a,b,...]
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import os, sys, time, torch
sys.path.insert(0, os.path.join({here!r}, "..", "..", "..", "bench"))
from benchlib import time_ms
import bench_quantize
import fp8ext
F8 = torch.float8_e4m3fn
ops = torch.ops.fp8ext
case = {case!r}
if case == "alloc_first":  # the input is the process's first big allocation, made in its final dtype
    x = torch.empty(16384, 8192, dtype=torch.bfloat16, device="cuda")
torch.manual_seed(0)
m, k = 16384, 8192
def make(rows):
    return (torch.randn(rows, k, device="cuda") * torch.exp2(torch.randint(-4, 4, (rows, k), device="cuda").float())).to(torch.bfloat16)
if case == "chunked_input":  # the same kind of data without 3.5 GB of fp32/int64 temporaries left in the cache
    src = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
    for r in range(0, m, 256):
        src[r:r + 256] = make(256)
else:
    src = make(m)
if case == "alloc_first":
    x.copy_(src); del src
else:
    x = src
s = torch.tensor(0.05, device="cuda")
if case == "scratch_4gb":
    scratch = [torch.empty(512 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]; del scratch
if case == "compile_small":  # a Triton kernel on a tiny tensor
    torch.compile(lambda t: t * 2 + 1)(torch.ones(1024, device="cuda")); torch.cuda.synchronize()
if case == "compile_static":  # bench_quantize's anchor on the real input
    torch.compile(bench_quantize.plain_static, dynamic=False)(x, s); torch.cuda.synchronize()
if case == "scratch_then_compile":  # diag_quant_env.py's sequence
    scratch = [torch.empty(512 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]; del scratch
    torch.compile(bench_quantize.plain_static, dynamic=False)(x, s); torch.cuda.synchronize()
if case == "empty_cache":
    torch.cuda.empty_cache()
if case in ("empty_then_hold_2gb", "empty_then_hold_20gb"):  # only a freed-but-cached block, no temporaries
    torch.cuda.empty_cache()
    gb = 2 if case.endswith("2gb") else 20
    scratch = torch.empty(gb << 30, dtype=torch.uint8, device="cuda"); del scratch
if case == "hold_20gb_then_empty":
    scratch = torch.empty(20 << 30, dtype=torch.uint8, device="cuda"); del scratch
    torch.cuda.empty_cache()
if case == "sleep_2s":
    time.sleep(2)
def back_to_back_us(fn, n=20):  # n calls between two events: no idle gap before any call
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record(); b.synchronize()
    return a.elapsed_time(b) * 1e3 / n
y = torch.empty_like(x)
res = []
for _ in range(3):
    st = time_ms(lambda: ops.quantize_with_scale(x, s, F8, 0)) * 1e3
    pt = time_ms(lambda: ops.quantize_per_tensor(x, F8, 0, False, 0)) * 1e3
    cp = time_ms(lambda: y.copy_(x)) * 1e3  # torch's own copy kernel: does the state touch it too?
    res.append((round(st, 1), round(pt, 1), round(cp, 1)))
res.append(("back_to_back", round(back_to_back_us(lambda: ops.quantize_with_scale(x, s, F8, 0)), 1),
            round(back_to_back_us(lambda: ops.quantize_per_tensor(x, F8, 0, False, 0)), 1),
            round(back_to_back_us(lambda: y.copy_(x)), 1)))
q = ops.quantize_with_scale(x, s, F8, 0)
def segment_of(ptr):  # (segment size MB, offset MB) of the caching allocator's segment holding ptr
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return (seg["total_size"] >> 20, (ptr - seg["address"]) >> 20)
print("RESULT", res, "x", hex(x.data_ptr()), segment_of(x.data_ptr()), "q", hex(q.data_ptr()), segment_of(q.data_ptr()),
      "reserved_GB", round(torch.cuda.memory_reserved() / 2**30, 2))
"""

CASES = [
    ("baseline", {}), ("pdl_off", {"FP8EXT_PDL": "0"}),
    ("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("alloc_first", {}), ("compile_small", {}), ("scratch_then_compile", {}), ("empty_cache", {}),
    ("chunked_input", {}), ("empty_then_hold_2gb", {}), ("empty_then_hold_20gb", {}), ("hold_20gb_then_empty", {}),
    ("scratch_4gb", {}), ("compile_static", {}), ("sleep_2s", {}),
]


def main():
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    rows = []
    pick = sys.argv[sys.argv.index("--cases") + 1].split(",") if "--cases" in sys.argv else None
    for name, env in CASES:
        if pick and name not in pick:
            continue
        p = subprocess.run([sys.executable, "-c", CHILD.format(here=HERE, case=name)], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=240)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
        print(f"{name:22s} {line[0] if line else 'FAILED ' + p.stderr[-600:]}", flush=True)
        rows.append({"case": name, "env": env, "result": line[0] if line else p.stderr[-2000:]})
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "two_speeds.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
