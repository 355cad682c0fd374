"""Decode attention under several split counts, graph-timed in one process,
next to what plan_splits picks (bench/bench_decode.py's heads: 32/8, head_dim
128, page 16). Each timed call reads a different copy of the cache (copies
that together exceed L2), as a decode step does after the weights have
streamed through.

    python3 scripts/device/tune_decode_splits.py [--rows 1x4096 1x32768 ...] [--dtypes fp8 bf16]
        [--splits 16 33 ...] [--env - FP8EXT_DECODE_STAGES=3 ...] [--out DIR]

With --env, every split count is timed under each setting ("VAR=VALUE,..." or
"-" for none; the variables are read at launch, so at graph capture), the
settings interleaved, in one process.
"""
import argparse
import itertools
import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_decode import DIM, KV_HEADS, Q_HEADS  # noqa: E402
from benchlib import apply_env, check_output, env_setting, graph_time_rotating_ms, run_info  # noqa: E402

from fp8ext.kv_cache import plan_splits  # noqa: E402

DTYPES = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}
CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 33, 40, 49, 66, 99, 132)
PAGE = 16


def copies_of_cache(batch, context, dtype, min_bytes=256 << 20):
    """K/V pools holding enough copies of a batch's cache to exceed L2, and one block table per copy."""
    pages = batch * context // PAGE
    bytes_one = 2 * pages * PAGE * KV_HEADS * DIM * torch.empty((), dtype=dtype).element_size()
    copies = max(1, math.ceil(min_bytes / bytes_one))
    pools = [(torch.randn(copies * pages, PAGE, KV_HEADS, DIM, device="cuda") * 0.5).to(dtype) for _ in range(2)]
    perm = torch.randperm(copies * pages, device="cuda", dtype=torch.int32)
    tables = [perm[i * pages:(i + 1) * pages].reshape(batch, context // PAGE) for i in range(copies)]
    return pools, tables, bytes_one


def reference(q, k, v, table, batch, context):
    """Float SDPA over the cache that `table` names: [batch * Q_HEADS, DIM] (rows:
    one query head of one sequence, as benchlib.check_output compares them)."""
    kd, vd = (c.float()[table.long()].reshape(batch, context, KV_HEADS, DIM).transpose(1, 2) for c in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.float().unsqueeze(2), kd, vd, enable_gqa=True)
    return out.reshape(-1, DIM)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", default=["1x4096", "1x16384", "1x32768", "1x131072", "8x4096", "8x32768",
                                                 "32x4096", "64x4096", "256x1024"])
    ap.add_argument("--dtypes", nargs="+", default=["fp8", "bf16"], choices=list(DTYPES))
    ap.add_argument("--splits", nargs="+", type=int, default=list(CANDIDATES))
    ap.add_argument("--env", nargs="+", default=["-"])
    ap.add_argument("--rounds", type=int, default=1, help="median of this many interleaved rounds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    settings = {st: env_setting(st) for st in args.env}
    env_vars = {var for assignment in settings.values() for var in assignment}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for spec in args.rows:
        batch, context = (int(x) for x in spec.split("x"))
        q = torch.randn(batch, Q_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        one = torch.ones((), device="cuda")
        lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
        for name in args.dtypes:
            planned = plan_splits(batch, KV_HEADS, context, sms, pipelined=name != "bf16")  # FP8 at DIM 128
            (k, v), tables, nbytes = copies_of_cache(batch, context, DTYPES[name])
            want = reference(q, k, v, tables[0], batch, context)
            timings = {st: {} for st in settings}
            rounds = {st: {} for st in settings}
            for splits, _, (st, assignment) in itertools.product(
                    sorted({s for s in args.splits if context // s >= 128} | {planned}), range(args.rounds),
                    settings.items()):
                apply_env(assignment, env_vars)
                run = lambda table, s=splits: torch.ops.fp8ext.paged_decode_attention(  # noqa: E731
                    q, k, v, table, lens, one, one, DIM ** -0.5, s)
                check_output(run(tables[0]).reshape(-1, DIM), want, f"{spec} {name} {splits} splits {st}")
                ms = graph_time_rotating_ms(run, tables)
                rounds[st].setdefault(splits, []).append(ms * 1e3)
                timings[st][splits] = round(statistics.median(rounds[st][splits]), 2)
            apply_env({}, env_vars)
            for st, by_splits in timings.items():
                best = min(by_splits, key=by_splits.get)
                results.append({"batch": batch, "context": context, "cache": name, "env": st, "planned": planned,
                                "us_by_splits": by_splits, "best": best,
                                "planned_TBps": round(nbytes / by_splits[planned] / 1e6, 3),
                                "best_TBps": round(nbytes / by_splits[best] / 1e6, 3)})
                line = ", ".join(f"{s}{'*' if s == planned else ''}: {t}" for s, t in by_splits.items())
                print(f"{spec} {name} [{st}] us by splits (* planned): {line}", flush=True)
            del k, v, tables
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "decode_splits.json"), "w") as f:
            json.dump({**run_info(), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
