"""Same buffers (torch's), same kernel (the static replica of quant_variants.cu),
one process: timed entirely in C, launched 20 times from C but timed with
torch's events, and launched one by one from Python (ctypes) timed with torch's
events. Which step costs the ~8 us?

    python3 scripts/device/quant_state/diag_launch_path.py /tmp/libqv.so
"""
import ctypes
import sys

import torch

import fp8ext  # noqa: F401

lib = ctypes.CDLL(sys.argv[1])
lib.qv_time_rows_on.restype = ctypes.c_float
lib.qv_time_rows_on.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
lib.qv_launch_rows_n.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int]
lib.qv_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                        ctypes.c_int, ctypes.c_int]
m, k = 16384, 8192
x = torch.full((m, k), 0.0115, dtype=torch.bfloat16, device="cuda")
q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
s = torch.tensor(0.05, device="cuda")
args = (x.data_ptr(), q.data_ptr(), s.data_ptr(), m, k)


def torch_events(fn, calls):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(4_000_000)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def python_loop():
    for _ in range(20):
        lib.qv_rows(*args[:3], m, k, 1024, 1)


ops, F8 = torch.ops.fp8ext, torch.float8_e4m3fn
for rnd in range(3):
    print(f"round {rnd}: all in C {lib.qv_time_rows_on(*args):.1f} us | C launches, torch events "
          f"{torch_events(lambda: lib.qv_launch_rows_n(*args, 20), 20):.1f} | Python launches, torch events "
          f"{torch_events(python_loop, 20):.1f} | library op from Python "
          f"{torch_events(lambda: [ops.quantize_with_scale(x, s, F8, 0) for _ in range(20)], 20):.1f}", flush=True)
print("stream", torch.cuda.current_stream(), "legacy default?", torch.cuda.current_stream().cuda_stream)
