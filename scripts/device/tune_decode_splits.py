"""Decode attention over an E4M3 cache at the suite's batch-1 rows under
several split counts, graph-timed in one process, next to what plan_splits
picks (bench/bench_decode.py's inputs: 32/8 heads, head_dim 128, page 16).

    python3 scripts/device/tune_decode_splits.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_decode import KV_HEADS, Q_HEADS, paged_inputs  # noqa: E402
from benchlib import graph_time_ms  # noqa: E402

from fp8ext.kv_cache import plan_splits  # noqa: E402

sms = torch.cuda.get_device_properties(0).multi_processor_count
for batch, context in [(1, 32768), (1, 131072), (8, 32768)]:
    (k, v), table, lens = paged_inputs(batch, context, 16, torch.float8_e4m3fn)
    q = torch.randn(batch, Q_HEADS, 128, device="cuda", dtype=torch.bfloat16)
    one = torch.ones((), device="cuda")
    planned = plan_splits(batch, KV_HEADS, context, sms)
    line = []
    for splits in sorted({8, 16, 24, 33, 40, 49, 66, 82, 99, 132, planned}):
        ms = graph_time_ms(lambda: torch.ops.fp8ext.paged_decode_attention(q, k, v, table, lens, one, one,
                                                                           128 ** -0.5, splits))
        line.append(f"{splits}{'*' if splits == planned else ''}: {k.numel() * 2 / ms / 1e9:.2f}")
    print(f"{batch} x {context} TB/s by splits (* planned): " + ", ".join(line))
    del k, v
