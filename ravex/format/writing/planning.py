"""Planning a commit: how a tree's arrays become chunks along dimension 0.

The writer (:mod:`.writer`) asks this module what to store (each array's dtype, shape, chunk
grid, codec chain and the raw bytes of each chunk) before it hashes a byte; the runtime asks it
too (:func:`rows_per_chunk`, :func:`hashed_chunk_len`), so that it splits and hashes arrays
exactly where the writer will chunk them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedValueError
from ..objects.codecs import codecs_for
from ..objects.dtypes import DataType, from_numpy
from ..objects.hashing import KNOWN_MIN_BYTES
from ..objects.tabledelta import TABLE_MIN_CHUNKS
from ..steps.manifest import grid_of

#: Target chunk size along the leading dimension. benchmarks/RESULTS.md: fsync'd local
#: writes of a 1 GiB state ran 0.62 GiB/s with 16 MiB chunks against 0.55 with 4 MiB and
#: 0.32 with 1 MiB (4 threads); a tensor smaller than this is one chunk anyway, so deltas
#: stay per tensor for all but the largest tensors.
DEFAULT_CHUNK_BYTES = 16 << 20
#: Chunks smaller than this are hashed (and encoded, written) in runs of about this many
#: bytes per pool task: a task costs ~100 us of pool overhead, a 2 KiB chunk ~1 us to hash.
BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class ArrayShard:
    """This rank's rows ``[offset, offset + len(local))`` of a global array.

    The global array is chunked along dimension 0 every ``chunk_rows`` rows; every
    rank writing a part of it must pass the same ``global_shape`` and ``chunk_rows``,
    and its part must start on a chunk boundary and end on one (or at the end).
    """

    local: np.ndarray
    global_shape: tuple[int, ...]
    offset: int
    chunk_rows: int


@dataclass
class PlannedArray:
    """One array of the commit: its metadata, and its raw bytes as ``count`` chunks of
    ``chunk_len`` along dimension 0 (the last one short, padded when hashed) starting at grid
    index ``first``."""

    path: str
    dtype: DataType
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    codecs: list[dict[str, Any]]
    flat: memoryview
    count: int
    first: int
    chunk_len: int  # bytes of a full chunk
    logical_bytes: int
    table: bool = False  # written as a chunk table (spec §5.1)

    @property
    def grid(self) -> tuple[int, ...]:
        return grid_of(self.shape, self.chunk_shape)

    def chunk_list(self) -> list[tuple[str, memoryview]]:
        """(chunk key, raw bytes) of each chunk."""
        if not self.shape:
            return [("c", self.flat)]
        tail = "/0" * (len(self.shape) - 1)
        n = self.chunk_len
        return [(f"c/{self.first + i}{tail}", self.flat[i * n : (i + 1) * n]) for i in range(self.count)]


def plan(path: str, value: Any, chunk_bytes: int, compression: str, tables: bool, table_max_chunk_bytes: int
         ) -> PlannedArray:
    """One array of a commit, chunked every ``chunk_bytes`` (an :class:`ArrayShard` keeps its own
    ``chunk_rows``). ``tables``: whether an array of at least TABLE_MIN_CHUNKS chunks, each below
    ``table_max_chunk_bytes``, is written as a chunk table (spec §5.1)."""
    if isinstance(value, ArrayShard):
        return _plan_shard(path, value, compression, tables, table_max_chunk_bytes)
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise UnsupportedValueError(
            f"value at {path!r} has type {type(value).__name__}, which Ravex stores neither as "
            "a tensor nor as a plain value; convert it to a numpy array or a Python value"
        )
    dtype = from_numpy(value.dtype)
    arr = np.require(value, dtype=dtype.numpy, requirements="C")  # keeps 0-d arrays 0-d
    shape = tuple(arr.shape)
    rows = rows_per_chunk(shape, dtype.itemsize, chunk_bytes)
    return _chunked(path, dtype, arr, shape, rows, 0, compression, tables, table_max_chunk_bytes)


def _plan_shard(path: str, shard: ArrayShard, compression: str, tables: bool, table_max_chunk_bytes: int
                ) -> PlannedArray:
    dtype = from_numpy(shard.local.dtype)
    arr = np.require(shard.local, dtype=dtype.numpy, requirements="C")
    g = tuple(shard.global_shape)
    rows = int(shard.chunk_rows)
    n = arr.shape[0] if arr.ndim else 0
    if (
        not g
        or tuple(arr.shape[1:]) != g[1:]
        or rows < 1
        or shard.offset % rows
        or not (n % rows == 0 or shard.offset + n == g[0])
        or shard.offset + n > g[0]
    ):
        raise ValueError(
            f"shard of {path!r}: rows [{shard.offset}, {shard.offset + n}) of global shape {g} "
            f"do not align with chunk_rows={rows}; shards must start and end on chunk boundaries"
        )
    return _chunked(path, dtype, arr, g, rows, shard.offset // rows, compression, tables, table_max_chunk_bytes)


def _chunked(
    path: str, dtype: DataType, arr: np.ndarray, shape: tuple[int, ...], rows: int, first: int,
    compression: str, tables: bool, table_max_chunk_bytes: int,
) -> PlannedArray:
    codecs = codecs_for(compression, dtype.itemsize)
    flat = arr.reshape(-1).view(np.uint8).data if arr.size else memoryview(b"")
    if not shape:
        return PlannedArray(path, dtype, (), (), codecs, flat, 1, 0, dtype.itemsize, arr.nbytes)
    tail = tuple(max(1, d) for d in shape[1:])
    chunk_len = rows * math.prod(shape[1:]) * dtype.itemsize
    count = math.ceil(arr.nbytes / chunk_len) if arr.size else 0
    whole = first == 0 and arr.shape[0] == shape[0]  # not a shard: the table covers the grid
    table = tables and whole and count >= TABLE_MIN_CHUNKS and chunk_len < table_max_chunk_bytes
    return PlannedArray(path, dtype, shape, (rows, *tail), codecs, flat, count, first, chunk_len, arr.nbytes,
                         table)


def rows_per_chunk(shape: tuple[int, ...], itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Rows per chunk along dimension 0: chunks near ``chunk_bytes`` and of equal size,
    so that the padded edge chunk wastes less than one row per chunk. The runtime uses the
    same rule to split replicated arrays across ranks on chunk boundaries."""
    if not shape or shape[0] == 0:
        return 1
    row_bytes = math.prod(shape[1:]) * itemsize
    if row_bytes == 0:
        return shape[0]
    n_chunks = max(1, math.ceil(shape[0] * row_bytes / chunk_bytes))
    return math.ceil(shape[0] / n_chunks)


def hashed_chunk_len(shape: tuple[int, ...], itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                     rows: int | None = None) -> int | None:
    """The bytes of each chunk of an array of this shape (an :class:`ArrayShard`'s local rows:
    ``rows`` is its ``chunk_rows``) that :meth:`StepWriter.commit` hashes chunk by chunk and
    looks up in ``known`` (chunks from offset 0, the last one padded to this length); None
    where it does not: 0-d and empty arrays, chunks under
    :data:`~ravex.format.objects.hashing.KNOWN_MIN_BYTES` (chunk tables among them)."""
    if not shape or not all(shape):
        return None
    rows = rows or rows_per_chunk(shape, itemsize, chunk_bytes)
    chunk_len = rows * math.prod(shape[1:]) * itemsize
    return chunk_len if chunk_len >= KNOWN_MIN_BYTES else None


def batches(arr: PlannedArray) -> Iterator[list[tuple[str, memoryview]]]:
    """An array's chunks in runs of about BATCH_BYTES (one chunk per run when larger)."""
    chunks = arr.chunk_list()
    n = max(1, BATCH_BYTES // max(1, arr.chunk_len))
    for i in range(0, len(chunks), n):
        yield chunks[i : i + n]


def check_chunk_bytes(chunk_bytes: Mapping[str, int] | None) -> dict[str, int]:
    """The per-array chunk sizes of one commit, checked before anything is planned."""
    sizes = dict(chunk_bytes or {})
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"chunk_bytes[{name!r}] = {size!r}: a chunk size must be a positive int of bytes")
    return sizes


def zarr_json(arr: PlannedArray) -> dict[str, Any]:
    """The exact ``zarr.json`` of one array, as stock zarr-python writes it."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(arr.shape),
        "data_type": arr.dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(arr.chunk_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": arr.dtype.fill_value,
        "codecs": arr.codecs,
        "attributes": {},
        "storage_transformers": [],
    }
