"""What flips the static replica (quant_variants.cu, timed in C on fixed buffers)
from ~99 to ~105 us within one process? Steps in order, the replica timed after each.

    python3 scripts/device/quant_state/diag_flip.py /tmp/libqv.so
"""
import ctypes
import sys

import torch

import fp8ext  # noqa: F401

lib = ctypes.CDLL(sys.argv[1])
lib.qv_time_rows_on.restype = ctypes.c_float
lib.qv_time_rows_on.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
m, k = 16384, 8192
x = torch.full((m, k), 0.0115, dtype=torch.bfloat16, device="cuda")
q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
s = torch.tensor(0.05, device="cuda")
args = (x.data_ptr(), q.data_ptr(), s.data_ptr(), m, k)
ops, F8 = torch.ops.fp8ext, torch.float8_e4m3fn
keep = []
steps = [
    ("start", lambda: None),
    ("new 128 MB torch tensor, written", lambda: keep.append(torch.ones(m, k, dtype=torch.uint8, device="cuda"))),
    ("torch copy kernel on x", lambda: keep.append(x.clone())),
    ("library static op, once", lambda: keep.append(ops.quantize_with_scale(x, s, F8, 0))),
    ("library static op, 20 more", lambda: [ops.quantize_with_scale(x, s, F8, 0) for _ in range(20)]),
    ("torch.cuda.empty_cache()", torch.cuda.empty_cache),
]
for name, fn in steps:
    fn()
    torch.cuda.synchronize()
    print(f"{name:34s} replica {[round(lib.qv_time_rows_on(*args), 1) for _ in range(3)]}", flush=True)
