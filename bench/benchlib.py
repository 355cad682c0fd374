"""Timing and result-writing helpers shared by the benchmarks (protocol:
../shared/BENCHMARKING.md): CUDA events after warm-up, median of >= 20 repeats;
calls under ~50 us are captured 20 at a time in a CUDA graph and divided."""
from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import statistics
import subprocess

import torch


# GPU cycles of busy-wait queued before each timed call (~0.5 ms on an H200).
HEAD_START_CYCLES = 1_000_000


# Warm-up before timing: 200 ms of back-to-back calls after the first few, so
# clocks and caches settle before the median is taken (METHOD.md). It did not
# remove the two speeds of the quantize kernels seen on 2026-11-30
# (bench/NOTES.md, session 8), whose cause is not known.
WARMUP_MS = 200.0


def _warm_up(fn, warmup: int) -> None:
    """`warmup` calls, then WARMUP_MS of back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    for _ in range(min(20_000, int(WARMUP_MS / max(start.elapsed_time(end), 1e-3)))):
        fn()
    torch.cuda.synchronize()


def _event_times_ms(fn, repeats: int) -> list:
    """`repeats` calls, each timed alone with CUDA events behind a busy-wait head start."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HEAD_START_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_ms(fn, repeats: int = 30, warmup: int = 5) -> float:
    """Median time of fn() in ms, each call timed with CUDA events, after at
    least `warmup` calls and WARMUP_MS of back-to-back calls.

    A busy-wait kernel is queued before the start event so that the host has
    enqueued all of fn's work before the GPU reaches the event: otherwise an
    idle GPU records the start at once and the time includes the host's
    dispatch latency (~20 us per op from Python, seen 2026-11-29: ncu gave a
    100 us kernel that this timer, without the head start, read as 124 us)."""
    _warm_up(fn, warmup)
    return statistics.median(_event_times_ms(fn, repeats))


def time_interleaved_ms(fns, rounds: int = 6, repeats: int = 8, warmup: int = 5):
    """Times several functions in alternating bursts: each round times `repeats`
    calls of each, the order reversed every other round. Returns the median time
    of each (ms) and each one's per-round medians.

    Why: large FP8 GEMMs run the H200 at its power limit, and the clocks a
    kernel gets drift over seconds; timed one after the other, the same two
    kernels swapped ratios by up to 10-25% between runs (bench_gemm, sessions
    11 and 12). In alternating bursts both meet the same drift, and the
    median of the per-round ratios is the figure to compare."""
    for fn in fns:
        _warm_up(fn, warmup)
    rounds_ms = [[] for _ in fns]
    for r in range(rounds):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            rounds_ms[i].append(statistics.median(_event_times_ms(fns[i], repeats)))
    return [statistics.median(t) for t in rounds_ms], rounds_ms


def round_ratio(anchor_rounds: list, ours_rounds: list) -> float:
    """Median over rounds of anchor time / our time (> 1: ours faster)."""
    return statistics.median(a / o for a, o in zip(anchor_rounds, ours_rounds))


def ratio_fields(anchor_rounds: list, ours_rounds: list) -> dict:
    """A row's "ratio" (round_ratio) and "ratio_rounds" (each round's), rounded for the record."""
    return {"ratio": round(round_ratio(anchor_rounds, ours_rounds), 3),
            "ratio_rounds": [round(a / o, 3) for a, o in zip(anchor_rounds, ours_rounds)]}


def capture_graph(fn, calls: int = 20):
    """A callable replaying `calls` back-to-back fn() captured in one CUDA graph
    (fn warmed up outside it first, on a side stream as capture requires)."""
    fn()  # warm up (compiles, allocates) outside the graph
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def graph_time_ms(fn, calls: int = 20, repeats: int = 30) -> float:
    """Median per-call time of `calls` back-to-back fn() captured in one CUDA graph."""
    return time_ms(capture_graph(fn, calls), repeats=repeats) / calls


# The H200's L2 (the H100's is 50 MB): weights rotated past twice this are read from DRAM.
L2_BYTES = 60 * 2**20


def copies_past_l2(nbytes: int) -> int:
    """How many copies of an operand of `nbytes` together exceed twice the L2."""
    return max(1, math.ceil(2 * L2_BYTES / nbytes))


def whole_rounds(copies: int) -> int:
    """Calls a graph needs to go round `copies` items a whole number of times, at
    least 20 (rotating says why whole rounds)."""
    return copies * math.ceil(20 / copies)


def rotating(fn, items):
    """fn(item) for the next of `items` at each call, and the number of calls a
    graph needs: at least 20, and whole rounds of `items`. A graph that stopped
    mid-round would start its next replay on the items it just read (8 copies
    in 20 calls: four of every 20 calls re-read a weight 3 copies after its last
    read, 50 MB for a 4096 x 4096 FP8 weight, which a 60 MB L2 still holds)."""
    cycle = itertools.cycle(items)
    return (lambda: fn(next(cycle))), whole_rounds(len(items))


def graph_time_rotating_ms(fn, items) -> float:
    """graph_time_ms of fn(item), each call taking the next of `items` (copies of
    the weights that together exceed L2, so that no call reads them from L2)."""
    call, calls = rotating(fn, items)
    return graph_time_ms(call, calls=calls)


def sm_clock_mhz():
    """The SM clock now (NVML through torch), or None where it cannot be read."""
    try:
        return torch.cuda.clock_rate()
    except Exception:  # no NVML binding, or no permission: the figure is optional
        return None


def run_info() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    # The device machine's copy of the tree may carry a stale .git: the caller
    # passes the commit it sent in FP8EXT_COMMIT, which wins.
    return {"commit": os.environ.get("FP8EXT_COMMIT") or commit or "unknown",
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "date": datetime.date.today().isoformat()}


def gemm_scales(m: int, n: int, row_wise: bool):
    """The GEMM suite's scales: per-token [M, 1] and per-channel [1, N] in [0.01, 0.11),
    or one value each (0.05, 0.02). Here, not in bench_gemm, so that scripts timing
    cuBLAS alone need no fp8ext build."""
    if row_wise:
        return torch.rand(m, 1, device="cuda") * 0.1 + 0.01, torch.rand(1, n, device="cuda") * 0.1 + 0.01
    return torch.tensor(0.05, device="cuda"), torch.tensor(0.02, device="cuda")


def env_setting(text: str) -> dict:
    """One setting of a one-process A/B over environment variables that the
    library reads at launch: "VAR=VALUE,VAR=VALUE", or "-" for none."""
    return dict(a.split("=", 1) for a in text.split(",") if a != "-")


def apply_env(assignment: dict, named) -> None:
    """Unsets every variable in `named` (all the A/B's settings name), then sets `assignment`."""
    for var in named:
        os.environ.pop(var, None)
    os.environ.update(assignment)


def relative_error(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """||got - ref|| / ||ref|| (Frobenius, computed in `dtype`)."""
    got, ref = got.to(dtype), ref.to(dtype)
    return ((got - ref).norm() / ref.norm()).item()


def worst_slice_error(got: torch.Tensor, ref: torch.Tensor, columns: bool = True) -> float:
    """The largest relative Frobenius error (float32) of the whole output, of any
    row and (columns=True) of any column. A wrong tile or row hides in the whole
    output's error (one zeroed 128 x 128 tile of a 16384 x 57344 D: 0.004) but
    not in its rows' (0.047) or columns' (0.088). columns=False where a column
    holds too few values for its error to be steady (a few rows against bf16)."""
    d, r = got.float() - ref.float(), ref.float()
    whole = r.norm().clamp(min=1e-30)
    errors = [d.norm() / whole]
    if r.dim() == 2 and r.numel():
        for dim in (1, 0) if columns else (1,):
            # A slice's norm is floored at a typical slice's: a short slice (a column
            # of an M = 1 output is one value) can hold a value near 0, which two
            # correct kernels round differently by more than 3% of it (cuBLAS's fast
            # accumulation is off by up to 0.0044 of the RMS value, session 27). A
            # wrong tile's slices have typical norms, so the floor does not hide it.
            typical = whole * (r.shape[dim] / r.numel()) ** 0.5
            errors.append((d.norm(dim=dim) / r.norm(dim=dim).clamp(min=typical)).max())
    return max(e.item() for e in errors)


def check_output(got: torch.Tensor, ref: torch.Tensor, what: str, tol: float = 3e-2, columns: bool = True) -> float:
    """Raises unless worst_slice_error(got, ref, columns) < tol; returns it. 3e-2:
    ours against cuBLAS on the same FP8 operands differ by output rounding and
    sum order (fast accumulation: <= 0.0044 against float64 over the whole
    output, session 27), while a zeroed 128 x 128 tile gives >= 0.047 on its
    rows at the suite's widest N (57344)."""
    if not torch.equal(got.isnan(), ref.isnan()):
        raise AssertionError(f"{what}: NaN where the reference has none, or the other way")
    err = worst_slice_error(got.nan_to_num(), ref.nan_to_num(), columns)
    if not err < tol:
        raise AssertionError(f"{what}: differs from the reference by {err:.2e} (worst row / column, relative)")
    return err


def same_output(got: torch.Tensor, ref: torch.Tensor, exact: bool) -> bool:
    """Whether two settings' outputs agree: equal bits, or (exact=False, for
    settings that change the order of a sum, such as split-K) within 1e-2
    relative Frobenius error."""
    return torch.equal(got, ref) if exact else relative_error(got, ref) < 1e-2


def codes_differing(ours: torch.Tensor, ref: torch.Tensor, name: str, max_share: float, max_rel: float) -> float:
    """The share of FP8 codes of `ours` that differ from `ref`'s; raises past
    max_share of them, past max_rel relative error, or where only one of the
    two holds a NaN (a NaN code must never pass as equal to a finite one)."""
    a, b = ours.float(), ref.float()
    if not torch.equal(a.isnan(), b.isnan()):
        raise AssertionError(f"{name}: NaN codes where the reference has none, or the other way")
    frac = ((a != b) & ~a.isnan()).float().mean().item()
    rel = ((a - b).nan_to_num().norm() / b.nan_to_num().norm().clamp(min=1e-30)).item()
    if frac > max_share or rel > max_rel:
        raise AssertionError(f"{name}: {frac:.2e} of codes differ (rel err {rel:.2e})")
    return frac


def write_results(out_dir: str, name: str, rows: list) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    info = run_info()
    with open(path, "w") as f:
        json.dump([{**info, **r} for r in rows], f, indent=1)
    return path


def write_record(out_dir: str, name: str, record: dict) -> str:
    """One JSON object (an A/B script's whole result) with run_info() merged in."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump({**run_info(), **record}, f, indent=1)
    return path


def print_table(rows: list, columns: list) -> None:
    if not rows:  # e.g. bench_decode --writes-only has no attention rows
        return
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))
