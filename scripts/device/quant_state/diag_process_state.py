"""The static-quantize replica (quant_variants.cu) takes ~98 us as a standalone
program and ~107 us inside a torch process, on its own buffers either way.
Each stage here is a fresh Python process that does a little more of what a
torch program does, then times the replica entirely in C
(qv_time_rows_own_buffers): where does the time change?

    python3 scripts/device/quant_state/diag_process_state.py /tmp/libqv.so
"""
import subprocess
import sys

STAGES = {
    "ctypes only (no torch)": "",
    "import torch": "import torch",
    "torch.cuda.init()": "import torch; torch.cuda.init()",
    "one torch CUDA tensor": "import torch; torch.zeros(1, device='cuda')",
    "2 GB torch tensor": "import torch; t = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')",
    "import fp8ext + tensor": "import torch, fp8ext; torch.zeros(1, device='cuda')",
}

CHILD = """
import ctypes
{setup}
lib = ctypes.CDLL({lib!r})
lib.qv_time_rows_own_buffers.restype = ctypes.c_float
print("US", [round(lib.qv_time_rows_own_buffers(), 1) for _ in range(3)])
"""

for name, setup in STAGES.items():
    p = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, lib=sys.argv[1])], capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("US")]
    print(f"{name:26s} {line[0] if line else 'FAILED ' + p.stderr[-400:]}", flush=True)
