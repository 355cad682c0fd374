"""Capturing a CUDA graph the way the GPU tests need it: one warm-up call on a
side stream (allocations and lazy set-up stay out of the graph), then the
capture."""
import torch


def capture(fn, warm_up=None):
    """(graph, what fn returned while being captured): replaying the graph
    refills those tensors. warm_up (default: fn) is what runs once before."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (warm_up or fn)()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # not torch's default capture stream: it is on one device only
        out = fn()
    return graph, out
