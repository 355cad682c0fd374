"""Does where the buffers sit decide the static-quantize replica's speed
(98.5 vs 107 us)? In one torch process: the replica timed in C on buffers
allocated after pads of several sizes, on buffers Python allocated through
cudaMalloc, and on torch's tensors; the library's kernel on torch's tensors.

    python3 scripts/device/quant_state/diag_placement.py /tmp/libqv.so
"""
import ctypes
import sys

import torch

import fp8ext  # noqa: F401

lib = ctypes.CDLL(sys.argv[1])
for name in ("qv_time_rows_on", "qv_time_rows_after_pad", "qv_time_rows_own_buffers"):
    getattr(lib, name).restype = ctypes.c_float
lib.qv_time_rows_on.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
lib.qv_time_rows_after_pad.argtypes = [ctypes.c_int64]
lib.qv_malloc.restype = ctypes.c_void_p
lib.qv_malloc.argtypes = [ctypes.c_int64]
lib.qv_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

m, k = 16384, 8192
print("fresh buffers after a pad, before any torch allocation:")
for pad in (0, 2, 64, 256, 1024):
    lib.qv_time_rows_after_pad(pad)
x = torch.full((m, k), 0.0115, dtype=torch.bfloat16, device="cuda")
q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
s = torch.tensor(0.05, device="cuda")
own_x, own_q = lib.qv_malloc(m * k * 2), lib.qv_malloc(m * k)
assert own_x and own_q and lib.qv_copy(own_x, x.data_ptr(), m * k * 2) == 0
print(f"own cudaMalloc'ed buffers x {own_x:#x} q {own_q:#x}: {lib.qv_time_rows_on(own_x, own_q, s.data_ptr(), m, k):.1f} us")
print(f"torch tensors x {x.data_ptr():#x} q {q.data_ptr():#x}: {lib.qv_time_rows_on(x.data_ptr(), q.data_ptr(), s.data_ptr(), m, k):.1f} us")
print("fresh buffers after a pad, with torch's tensors held:")
for pad in (0, 2, 64, 256, 1024):
    lib.qv_time_rows_after_pad(pad)
sys.stdout.flush()
