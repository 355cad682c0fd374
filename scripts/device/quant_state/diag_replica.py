"""The standalone replica of the static quantize kernel (quant_variants.cu) runs
~9 us faster in its own program than the library's kernel in a torch process.
This times, in one torch process: the library's kernel, the replica on torch's
tensors, and the replica on buffers it cudaMalloc'ed itself.

    nvcc -O3 -std=c++17 -arch=sm_90a -I csrc/include -I csrc/quant -shared -Xcompiler -fPIC -DQV_LIBRARY \\
        -o /tmp/libqv.so scripts/device/quant_state/quant_variants.cu
    python3 scripts/device/quant_state/diag_replica.py /tmp/libqv.so
"""
import ctypes
import sys

import torch

import fp8ext  # noqa: F401

lib = ctypes.CDLL(sys.argv[1])
lib.qv_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                        ctypes.c_int, ctypes.c_int]
lib.qv_malloc.restype = ctypes.c_void_p
lib.qv_malloc.argtypes = [ctypes.c_int64]
lib.qv_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
lib.qv_time_rows_own_buffers.restype = ctypes.c_float
lib.qv_time_rows_isolated.restype = ctypes.c_float

def b2b(fn, n=20, queue_ahead=False):
    """n calls between two events; queue_ahead: a 2 ms spin first, so all n are
    queued before the GPU reaches the first (no launch pacing)."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if queue_ahead:
        torch.cuda._sleep(4_000_000)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / n


m, k = 16384, 8192
x = torch.full((m, k), 0.0115, dtype=torch.bfloat16, device="cuda")
q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
s = torch.tensor(0.05, device="cuda")
own_x, own_q = lib.qv_malloc(m * k * 2), lib.qv_malloc(m * k)
assert own_x and own_q and lib.qv_copy(own_x, x.data_ptr(), m * k * 2) == 0
ops, F8 = torch.ops.fp8ext, torch.float8_e4m3fn
lib_ms = lambda t: b2b(lambda: ops.quantize_with_scale(t, s, F8, 0))  # noqa: E731
rep_ms = lambda xp, qp: b2b(lambda: lib.qv_rows(xp, qp, s.data_ptr(), m, k, 1024, 1))  # noqa: E731
x2 = x.clone()  # a second torch allocation
for rnd in range(2):
    print(f"round {rnd}: library {lib_ms(x):.1f} us, queued ahead "
          f"{b2b(lambda: ops.quantize_with_scale(x, s, F8, 0), queue_ahead=True):.1f} | replica from Python "
          f"{rep_ms(own_x, own_q):.1f}, queued ahead "
          f"{b2b(lambda: lib.qv_rows(own_x, own_q, s.data_ptr(), m, k, 1024, 1), queue_ahead=True):.1f} | "
          f"replica timed in C: back to back {lib.qv_time_rows_own_buffers():.1f}, one at a time "
          f"{lib.qv_time_rows_isolated():.1f}", flush=True)
