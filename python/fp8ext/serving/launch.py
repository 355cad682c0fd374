"""Starting one process per GPU for tensor parallelism (NCCL), with NVLink
multicast kept off (the shared H200 hosts require it: ../.library/device)."""
from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fp8ext.checks import check_positive_int

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _entry(rank, world, init_file, fn, args):
    os.environ.update(MULTICAST_OFF)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn_on_gpus(fn, world: int, *args) -> None:
    """Runs fn(rank, world, *args) in `world` processes, rank r on cuda:r, NCCL initialized."""
    check_positive_int("world", world, " (processes, one per GPU)")
    if torch.cuda.device_count() < world:
        raise RuntimeError(f"{world} GPUs needed, {torch.cuda.device_count()} visible")
    os.environ.update(MULTICAST_OFF)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_entry, args=(world, os.path.join(d, "rendezvous"), fn, args), nprocs=world, join=True)
