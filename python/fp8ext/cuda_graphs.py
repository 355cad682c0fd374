"""CUDA-graph capture and replay timing shared by the serving engine, its
benchmark and the report's GPU sections."""
from __future__ import annotations

import torch

from fp8ext.checks import check_positive_int


def capture(fn, device=None):
    """(graph, fn's output): fn runs once on a side stream first (lazy
    initialisation, allocator warm-up stay out of the graph), then is captured
    on that stream. Not on torch.cuda.graph's default one: it is made once per
    process, on whatever device was current then, so a later capture on
    another GPU would record nothing of that GPU's kernels."""
    current = torch.cuda.current_stream(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        fn()
    current.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    return graph, out


def replay_times_ms(replay, repeats: int) -> list:
    """Sorted CUDA-event times of `repeats` calls of replay(), after one untimed call."""
    check_positive_int("repeats", repeats)
    replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)
