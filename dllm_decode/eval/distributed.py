"""The sweep runner's ``torchrun`` data parallelism: the process group, a barrier and a
count summed over ranks (gloo; a no-op on one process)."""

from __future__ import annotations

import os

import torch


def process_group() -> tuple[int, int, bool]:
    """``(rank, world_size, created_here)``; creates a gloo group when ``WORLD_SIZE > 1``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def barrier(world: int) -> None:
    """Wait for every rank (nothing on one process)."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def sum_over_ranks(world: int, *counts: int) -> tuple[int, ...]:
    """``counts`` summed over every rank (one gloo all-reduce; unchanged on one process)."""
    if world <= 1:
        return counts
    import torch.distributed as dist

    total = torch.tensor(counts, dtype=torch.long)
    dist.all_reduce(total)
    return tuple(int(c) for c in total.tolist())
