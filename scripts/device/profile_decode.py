"""Runs the paged decode kernel twice on two suite rows (1 x 32768 and
64 x 4096, page 16, E4M3), for `ncu` to profile."""
import torch

import fp8ext  # noqa: F401
from fp8ext.kv_cache import plan_splits

for batch, context in [(1, 32768), (64, 4096)]:
    pages = batch * context // 16
    k, v = [(torch.randn(pages, 16, 8, 128, device="cuda") * 0.5).to(torch.float8_e4m3fn) for _ in range(2)]
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, -1)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, 32, 128, device="cuda", dtype=torch.bfloat16)
    one = torch.ones((), device="cuda")
    splits = plan_splits(batch, 8, context, torch.cuda.get_device_properties(0).multi_processor_count, pipelined=True)
    for _ in range(2):
        torch.ops.fp8ext.paged_decode_attention(q, k, v, table, lens, one, one, 128 ** -0.5, splits)
torch.cuda.synchronize()
