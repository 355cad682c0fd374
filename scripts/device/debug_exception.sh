#!/usr/bin/env bash
# Diagnoses a crash when a C++ exception leaves the extension (torch 2.11 on the device).
OUT=$1
python3 -c "import torch; print('cxx11abi', torch.compiled_with_cxx11_abi(), torch.__file__)"
SO=$(python3 -c "import fp8ext._C as c; print(c.__file__)")
ldd "$SO" | grep -E "stdc|gcc|c10|torch"
strings /opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libc10.so | grep -m3 "GCC: ("
cat > /tmp/throw.py <<'PY'
import torch, fp8ext
try:
    torch.ops.fp8ext.quantize_per_row(torch.ones(2, 3, 4), torch.float8_e4m3fn, 0, False, 0)
except Exception as e:
    print("caught", type(e).__name__, str(e)[:80])
PY
python3 /tmp/throw.py; echo "rc=$?"
/usr/local/cuda/bin/cuda-gdb -batch -ex run -ex bt --args python3 /tmp/throw.py 2>&1 | tail -30
