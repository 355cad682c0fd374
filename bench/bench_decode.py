"""Paged decode attention (../shared/BENCHMARKING.md's decode suite: GQA 32/8
heads, head_dim 128), graph-timed: our kernel over an E4M3 cache and over a
bf16 cache, and F.scaled_dot_product_attention over a contiguous bf16 cache of
the same shape, in one run; page sizes 16 and 64, pages scattered at random.
Also the fused cache write (one decode step's K/V, 4096- and 16384-token prefills)
against PyTorch's unfused cast and index_copy_.

    python bench/bench_decode.py --out DIR [--head-dim 64|128|256] [--page-sizes 16 64] [--writes-only]
"""
from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

import torch
import torch.nn.functional as F

from fp8ext.kv_cache import plan_splits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (check_output, copies_past_l2, graph_time_rotating_ms, print_table,  # noqa: E402
                      write_results)

Q_HEADS, KV_HEADS, DIM = 32, 8, 128
SUITE = [(1, 32768), (1, 131072), (8, 32768), (64, 4096), (256, 1024)]


def paged_inputs(batch, context, page_size, dtype, dim=DIM):
    """Copies of the (K, V) pools that together exceed twice the L2 (one block
    table for all): a real step reads the other layers' caches and weights
    between two calls of one layer, so no timed call may find its cache in L2
    (1 x 32768 in FP8 is 67 MB, about the H200's 60 MB L2)."""
    pages_per_seq = context // page_size
    num_pages = batch * pages_per_seq
    pool_bytes = 2 * num_pages * page_size * KV_HEADS * dim * torch.empty((), dtype=dtype).element_size()
    copies = [[(torch.randn(num_pages, page_size, KV_HEADS, dim, device="cuda") * 0.5).to(dtype) for _ in range(2)]
              for _ in range(copies_past_l2(pool_bytes))]
    table = torch.randperm(num_pages, device="cuda", dtype=torch.int32).reshape(batch, pages_per_seq)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    return copies, table, lens


def decode_row(batch, context, page_size, dim=DIM):
    q = torch.randn(batch, Q_HEADS, dim, device="cuda", dtype=torch.bfloat16)
    scale = torch.ones((), device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    row = {"op": "paged_decode", "batch": batch, "context": context, "page_size": page_size, "head_dim": dim}
    kv_elems = 2 * batch * context * KV_HEADS * dim
    for name, dtype in (("fp8", torch.float8_e4m3fn), ("bf16", torch.bfloat16)):
        # As PagedKVCache.plan picks them: the FP8 rule applies to the pipelined kernel (head_dim 128).
        splits = plan_splits(batch, KV_HEADS, context, sms, pipelined=name == "fp8" and dim == 128)
        row[f"{name}_num_splits"] = splits
        copies, table, lens = paged_inputs(batch, context, page_size, dtype, dim)
        k, v = copies[0]
        on = lambda kv: torch.ops.fp8ext.paged_decode_attention(q, kv[0], kv[1], table, lens, scale,  # noqa: E731
                                                                scale, dim ** -0.5, splits)
        run = lambda: on(copies[0])  # noqa: E731
        ms = graph_time_rotating_ms(on, copies)
        row[f"{name}_cache_copies"] = len(copies)
        row[f"{name}_ms"] = round(ms, 5)
        row[f"{name}_TBps"] = round(kv_elems * k.element_size() / ms / 1e9, 3)
        # Each timed kernel checked once against the same cache through float SDPA
        # (rows: one query head of one sequence, so that a wrong split or head shows).
        kd = k.float()[table.long()].reshape(batch, context, KV_HEADS, dim).transpose(1, 2)
        vd = v.float()[table.long()].reshape(batch, context, KV_HEADS, dim).transpose(1, 2)
        want = F.scaled_dot_product_attention(q.float().unsqueeze(2), kd, vd, enable_gqa=True).squeeze(2)
        del kd, vd
        error = lambda fn, what: round(check_output(fn().reshape(-1, dim), want.reshape(-1, dim),  # noqa: E731
                                                    f"{batch}x{context} page {page_size} {what}"), 5)
        row[f"{name}_rel_error"] = error(run, name)
        if name == "fp8" and dim == 128:  # the register kernel (FP8EXT_DECODE_PIPELINE=0) beside the pipeline
            reg_splits = plan_splits(batch, KV_HEADS, context, sms)  # what the cache plans with it
            row["fp8_registers_num_splits"] = reg_splits
            reg_on = lambda kv: torch.ops.fp8ext.paged_decode_attention(  # noqa: E731
                q, kv[0], kv[1], table, lens, scale, scale, dim ** -0.5, reg_splits)
            with mock.patch.dict(os.environ, {"FP8EXT_DECODE_PIPELINE": "0"}):
                row["fp8_registers_rel_error"] = error(lambda: reg_on(copies[0]), "fp8 registers")
                reg_ms = graph_time_rotating_ms(reg_on, copies)
            row["fp8_registers_ms"] = round(reg_ms, 5)
            row["fp8_registers_TBps"] = round(kv_elems / reg_ms / 1e9, 3)
        del k, v
        copies.clear()  # (the closures above hold the list, not its pools)
    cache_bytes = 2 * kv_elems  # bf16 K and V
    dense = [[torch.randn(batch, KV_HEADS, context, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
             for _ in range(copies_past_l2(cache_bytes))]
    sdpa = lambda kv: F.scaled_dot_product_attention(q.unsqueeze(2), kv[0], kv[1], enable_gqa=True)  # noqa: E731
    ms = graph_time_rotating_ms(sdpa, dense)
    row["sdpa_bf16_ms"] = round(ms, 5)
    row["sdpa_bf16_TBps"] = round(kv_elems * 2 / ms / 1e9, 3)
    row["fp8_vs_sdpa"] = round(ms / row["fp8_ms"], 3)
    row["timing"] = "cuda-graph, cache copies rotated past L2 (*_cache_copies)"
    del dense
    torch.cuda.empty_cache()
    return row


def write_rows():
    """The fused write of one decode step's K and V (64 tokens) and of a 4096- and
    a 16384-token prefill's, graph-timed with the sources and slots rotated among
    copies that exceed L2 (bytes moved: read bf16 K and V, write FP8), each copy's
    result checked against PyTorch's cast. The anchor is what plain PyTorch does
    with a paged cache: divide by the scale, cast, index_copy_ into the pool, for
    K and V, in the same graph-timed rotation."""
    rows = []
    fp8 = torch.float8_e4m3fn
    for tokens in (64, 4096, 16384):
        num_pages = 8192
        pools = [torch.zeros(num_pages, 16, KV_HEADS, DIM, device="cuda", dtype=fp8) for _ in range(2)]
        moved = 2 * tokens * KV_HEADS * DIM * (2 + 1)  # read bf16, write FP8, for K and V
        copies = copies_past_l2(moved)
        slots = torch.randperm(num_pages * 16, device="cuda")[:copies * tokens].reshape(copies, tokens)
        items = [(torch.randn(tokens, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16),
                  torch.randn(tokens, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16), slots[i])
                 for i in range(copies)]
        scale = torch.ones((), device="cuda")
        write = lambda item: torch.ops.fp8ext.kv_cache_write(item[0], item[1], pools[0], pools[1], item[2],  # noqa: E731
                                                             scale, scale)

        def unfused(item):
            for x, pool in zip(item[:2], pools):
                # As bytes: index_copy_ has no CUDA kernel for float8 (torch 2.11).
                codes = (x / scale).to(fp8).view(torch.uint8)
                pool.view(torch.uint8).view(-1, KV_HEADS, DIM).index_copy_(0, item[2], codes)

        for fn in (write, unfused):
            for pool in pools:
                pool.zero_()
            for item in items:
                fn(item)
                for x, pool in zip(item[:2], pools):
                    if not torch.equal(pool.view(-1, KV_HEADS, DIM)[item[2]].float(), x.to(fp8).float()):
                        raise AssertionError(f"kv_cache_write, {tokens} tokens: the cache differs from PyTorch's cast")
        ms = graph_time_rotating_ms(write, items)
        anchor_ms = graph_time_rotating_ms(unfused, items)
        rows.append({"op": "kv_cache_write", "tokens": tokens, "ms": round(ms, 5), "TBps": round(moved / ms / 1e9, 3),
                     "unfused_ms": round(anchor_ms, 5), "ratio_vs_unfused": round(anchor_ms / ms, 3),
                     "timing": f"cuda-graph, {copies} copies of K, V and slots rotated past L2"})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--head-dim", type=int, default=DIM,
                    help="64, 128 or 256: a bf16 cache at 64 has the 128-byte rows of FP8 at 128, which tells "
                         "DRAM access granularity apart from FP8's per-token work (bench/NOTES.md)")
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--writes-only", action="store_true", help="only the fused cache write's rows")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for page_size in [] if args.writes_only else args.page_sizes:
        for batch, context in SUITE:
            rows.append(decode_row(batch, context, page_size, args.head_dim))
            print(rows[-1], flush=True)
    rows += write_rows()
    path = write_results(args.out, "decode", rows)
    print(f"wrote {path}")
    print_table([r for r in rows if r["op"] == "paged_decode"],
                ["batch", "context", "page_size", "head_dim", "fp8_num_splits", "fp8_ms", "fp8_TBps", "fp8_registers_TBps",
                 "bf16_ms", "sdpa_bf16_ms",
                 "sdpa_bf16_TBps", "fp8_vs_sdpa", "fp8_rel_error"])
    print_table([r for r in rows if r["op"] == "kv_cache_write"], ["tokens", "ms", "TBps", "unfused_ms",
                                                                    "ratio_vs_unfused"])


if __name__ == "__main__":
    main()
