"""Several ranks writing one step: which rank writes which chunks of a replicated array.

Every rank names every tensor of the replicated sections; each replicated array's chunks
are written by exactly one rank (a deterministic assignment balanced by bytes: an array of
at least ``world`` chunks is split across the ranks in contiguous chunk ranges, smaller ones
go whole to the least loaded rank), the others record an empty shard of it. A
:class:`~ravex.saving.plan.RowShard` (a ``Shard(0)`` DTensor's rows) is written as this rank's
part of the global array. Runs on the writer thread, on the staged tree.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ravex.format import ArrayShard
from ravex.format.writing.planning import DEFAULT_CHUNK_BYTES, rows_per_chunk
from ravex.format.writing.reshard import shard_rows

from .plan import RankLayout, RowShard
from .tree import leaves, tree_map

#: Sections every rank holds whole (or sharded); the rest of a rank's tree is its own.
REPLICATED = ("models", "optimizers", "schedulers", "scalers")


def chunk_rows_of(shape: tuple[int, ...], itemsize: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk of a replicated array: the writer's own rule, so assignments fall on its chunks."""
    return rows_per_chunk(shape, itemsize, chunk_bytes or DEFAULT_CHUNK_BYTES)


def assign(
    arrays: list[tuple[tuple[int, ...], int]], world: int, chunk_bytes: int | None = None
) -> list[list[tuple[int, tuple[int, int]]]]:
    """For each array (shape, itemsize): per rank, ``(chunk_rows, (row_lo, row_hi))``.

    Deterministic from the shapes alone, so every rank computes the same plan. An array of
    at least ``world`` chunks is split into contiguous chunk ranges over all ranks; the
    rest go whole, largest first, to the rank with the fewest bytes so far (ties: lowest
    rank). Each row of each array is written by exactly one rank.
    """
    load = [0] * world
    plan: list[list[tuple[int, tuple[int, int]]]] = [[] for _ in arrays]
    order = sorted(range(len(arrays)), key=lambda i: (-math.prod(arrays[i][0]) * arrays[i][1], i))
    for i in order:
        shape, itemsize = arrays[i]
        rows = chunk_rows_of(shape, itemsize, chunk_bytes)
        n_rows = shape[0]
        row_bytes = math.prod(shape[1:]) * itemsize
        n_chunks = math.ceil(n_rows / rows) if n_rows else 0
        per = [(rows, (0, 0))] * world
        if n_chunks >= world and world > 1:
            for r in range(world):
                c = shard_rows(n_chunks, world, r)
                lo, hi = min(n_rows, c.start * rows), min(n_rows, c.stop * rows)
                per[r] = (rows, (lo, hi))
                load[r] += (hi - lo) * row_bytes
        else:
            r = min(range(world), key=lambda k: (load[k], k))
            per[r] = (rows, (0, n_rows))
            load[r] += n_rows * row_bytes
        plan[i] = per
    return plan


def place(tree: dict[str, Any], layout: RankLayout) -> dict[str, Any]:
    """The staged ``tree`` with its replicated arrays as this rank's
    :class:`~ravex.format.ArrayShard` (empty on ranks that write none of an array) and its
    shards as this rank's part of their global arrays."""
    sections = {k: tree[k] for k in REPLICATED if k in tree}
    arrays = [a for a in leaves(sections) if isinstance(a, np.ndarray) and a.ndim >= 1]
    plan = assign([(a.shape, a.dtype.itemsize) for a in arrays], layout.world_size)
    mine = {id(a): plan[i][layout.rank] for i, a in enumerate(arrays)}

    def put(value: Any) -> Any:
        if isinstance(value, RowShard):
            local = np.ascontiguousarray(value.local)
            return ArrayShard(local, value.shape, value.offset, value.chunk_rows)
        if isinstance(value, np.ndarray) and id(value) in mine:
            rows, (lo, hi) = mine[id(value)]
            return ArrayShard(value[lo:hi] if hi > lo else value[:0], value.shape, lo if hi > lo else 0, rows)
        return value

    out = dict(tree)
    for key, value in sections.items():
        out[key] = tree_map(put, value)
    return out
