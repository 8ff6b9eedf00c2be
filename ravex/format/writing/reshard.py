"""Sharded arrays: write a rank's dim-0 shard as whole chunks, read any rank's rows back.

A tensor sharded along dimension 0 over ``W`` ranks the way ``torch.chunk`` (DTensor
``Shard(0)``, FSDP2) does it gives each rank ``ceil(N / W)`` rows, the last non-empty
rank fewer, ranks after it none. Every shard then starts at a multiple of that size, so
a chunk grid whose rows divide it is aligned to every shard: each rank writes whole
chunks of the global array, no rank writes a chunk another rank writes, and a reader at
any other world size fetches only the chunks its own rows overlap.

    >>> rows = aligned_chunk_rows(global_shape, world, itemsize)
    >>> tree = {"w": shard_of(local, global_shape, world, rank, rows)}   # each rank commits
    >>> part = read_rows(store.open_step(step), "w", new_world, new_rank)  # any world size

Torch-free, like the rest of :mod:`ravex.format`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .writer import DEFAULT_CHUNK_BYTES, ArrayShard

if TYPE_CHECKING:
    from ..steps.reader import StepReader

__all__ = ["aligned_chunk_rows", "read_rows", "shard_of", "shard_rows"]


def shard_rows(n_rows: int, world: int, rank: int) -> slice:
    """Rows ``[start, stop)`` of rank ``rank`` when ``n_rows`` rows are split like
    ``torch.chunk(x, world)``: ``ceil(n_rows / world)`` each, the tail ranks fewer or none."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside world size {world}")
    size = math.ceil(n_rows / world) if n_rows else 0
    start = min(n_rows, rank * size)
    return slice(start, min(n_rows, start + size))


def aligned_chunk_rows(
    global_shape: tuple[int, ...], world: int, itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> int:
    """Rows per chunk for a tensor sharded over ``world`` ranks: the largest divisor of
    the shard size whose chunk stays within ``chunk_bytes`` (one row if a row is bigger)."""
    if not global_shape:
        raise ValueError("a 0-d array cannot be sharded along dimension 0")
    n = global_shape[0]
    size = max(1, math.ceil(n / world)) if n else 1
    row_bytes = max(1, math.prod(global_shape[1:]) * itemsize)
    for parts in range(1, size + 1):
        if size % parts == 0 and (size // parts) * row_bytes <= chunk_bytes:
            return size // parts
    return 1


def shard_of(
    local: np.ndarray, global_shape: tuple[int, ...], world: int, rank: int, chunk_rows: int | None = None
) -> ArrayShard:
    """This rank's part of a ``torch.chunk``-sharded array, ready for ``StepWriter.commit``."""
    rows = shard_rows(global_shape[0], world, rank)
    if local.shape[:1] != (rows.stop - rows.start,):
        raise ValueError(
            f"rank {rank} of {world} holds rows {rows.start}:{rows.stop} of {global_shape}, "
            f"but its local array has shape {local.shape}"
        )
    chunk_rows = chunk_rows or aligned_chunk_rows(tuple(global_shape), world, local.dtype.itemsize)
    offset = rows.start if rows.stop > rows.start else 0  # an empty shard claims no chunk
    return ArrayShard(local, tuple(global_shape), offset, chunk_rows)


def read_rows(reader: StepReader, path: str, world: int, rank: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rank ``rank``'s shard (at world size ``world``) of the array ``path``, whatever
    world size wrote it: only the chunks overlapping those rows are fetched."""
    shape = reader.arrays[path].shape if path in reader.arrays else None
    if not shape:
        return reader.read_array(path, out=out)
    return reader.read_array(path, out=out, rows=shard_rows(shape[0], world, rank))
