"""Which CUDA kernels a call ran, for GPU tests that must tell one kernel from
another (a setting that can fall back to another kernel would otherwise let a
test compare a kernel with itself)."""
import torch


def kernels_run(fn):
    """fn's result and the names of the CUDA kernels it ran, space-separated."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, " ".join(e.name for e in prof.events())
