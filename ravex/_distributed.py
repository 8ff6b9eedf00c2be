"""Rank and world size. Single-process today; reads ``torch.distributed`` when it is up.

Multi-rank checkpointing (agreeing on a resume step, sharded tensors) comes later; the
runtime already asks here rather than assuming rank 0, so that change stays local.
"""

from __future__ import annotations


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def get_rank() -> int:
    """This process's rank, 0 when not distributed."""
    dist = _dist()
    return dist.get_rank() if dist is not None else 0


def get_world_size() -> int:
    """The number of ranks, 1 when not distributed."""
    dist = _dist()
    return dist.get_world_size() if dist is not None else 1


def agree_on_step(step: int | None) -> int | None:
    """The resume step every rank holds. One rank: its own."""
    return step
