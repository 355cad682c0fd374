"""Is the "slow state" heat? The static replica (quant_variants.cu, timed in C
on the same buffers) measured while the GPU idles, while it runs flat out for
~15 s, and while it idles again, with the memory and GPU temperature logged.

    python3 scripts/device/quant_state/diag_thermal.py /tmp/libqv.so [--out DIR]
"""
import ctypes
import json
import os
import subprocess
import sys
import time

import torch

lib = ctypes.CDLL(sys.argv[1])
lib.qv_time_rows_on.restype = ctypes.c_float
lib.qv_time_rows_on.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
lib.qv_launch_rows_n.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int]
m, k = 16384, 8192
x = torch.full((m, k), 0.0115, dtype=torch.bfloat16, device="cuda")
q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
s = torch.tensor(0.05, device="cuda")
args = (x.data_ptr(), q.data_ptr(), s.data_ptr(), m, k)


def temps():
    out = subprocess.run(["nvidia-smi", "--query-gpu=temperature.gpu,temperature.memory,power.draw,clocks.sm,clocks.mem",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()
    return out


rows = []
t0 = time.time()


def sample(phase):
    us = lib.qv_time_rows_on(*args)
    rows.append({"t": round(time.time() - t0, 2), "phase": phase, "us": round(us, 1), "smi": temps()})
    print(rows[-1], flush=True)


for _ in range(3):
    sample("cold")
    time.sleep(1)
end = time.time() + 15
while time.time() < end:  # flat out: ~1 s of kernels between samples
    lib.qv_launch_rows_n(*args, 10000)
    torch.cuda.synchronize()
    sample("hot")
for _ in range(6):
    time.sleep(2)
    sample("cooling")
if "--out" in sys.argv:
    d = sys.argv[sys.argv.index("--out") + 1]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "thermal.json"), "w") as f:
        json.dump(rows, f, indent=1)
