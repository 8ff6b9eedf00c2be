"""The delta of an array written as a chunk table: which rows changed, found with numpy.

An array of many small chunks (a sparse embedding in 2 KiB chunks: 131k chunks per 256 MiB,
a few percent changed per commit) is hashed in bulk on the writer's pool, its digests compared
with its base table's in one vectorised step, and only the changed rows go through Python:
encoded, packed, written. Unchanged rows keep their base's object, offset and size. The writer
(``writing/writer.py``, with ``writing/packs.py``) does the packing and the writes; this module owns
the row arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .chunktable import ChunkTable, compact_table, distinct_ranges
from .hashing import digest_bytes

#: An array of at least this many chunks, each smaller than a pack's small-chunk limit, is
#: written as a table (spec/FORMAT.md §5.1). Below it a JSON map costs little, and stays
#: readable by every 1.x reader.
TABLE_MIN_CHUNKS = 1024


def pad(raw: memoryview, full: int) -> memoryview:
    """A Zarr edge chunk is stored at full size: ``raw`` zero-padded to ``full`` bytes."""
    if raw.nbytes == full:
        return raw
    padded = bytearray(full)
    padded[: raw.nbytes] = raw
    return memoryview(padded)


def row_view(flat: memoryview, chunk_len: int, row: int) -> memoryview:
    """Row ``row``'s raw bytes, padded when it is the edge chunk."""
    return pad(flat[row * chunk_len : (row + 1) * chunk_len], chunk_len)


def hash_rows(flat: memoryview, chunk_len: int, lo: int, hi: int) -> bytes:
    """The 16-byte XXH3-128 digests of rows ``[lo, hi)``, concatenated (runs on the pool)."""
    full = max(lo, min(hi, flat.nbytes // chunk_len))  # rows [lo, full) are whole; the rest, the edge
    out = b"".join([digest_bytes(flat[a : a + chunk_len]) for a in range(lo * chunk_len, full * chunk_len, chunk_len)])
    return out + b"".join(digest_bytes(row_view(flat, chunk_len, r)) for r in range(full, hi))


def row_batches(count: int, chunk_len: int, batch_bytes: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` row ranges of about ``batch_bytes`` each: one pool task per range."""
    step = max(1, batch_bytes // max(1, chunk_len))
    for lo in range(0, count, step):
        yield lo, min(count, lo + step)


@dataclass
class TableDelta:
    """One table array's commit: its digests, its base (if its codecs match), and per row
    whether the base's stored chunk is reused."""

    raw: np.ndarray  # (n, 16) uint8
    base: ChunkTable | None
    reused: np.ndarray  # (n,) bool

    @classmethod
    def of(cls, raw: np.ndarray, base: ChunkTable | None) -> TableDelta:
        """Rows whose digest equals the base's at the same grid index are reused: equal raw
        bytes under the same codec chain (the caller checked) decode from the same stored
        bytes. A grown or shrunk table compares the rows both have."""
        reused = np.zeros(raw.shape[0], dtype=bool)
        if base is not None:
            m = min(raw.shape[0], len(base))
            reused[:m] = (raw[:m] == base.raw[:m]).all(axis=1)
        return cls(raw, base, reused)

    def live_by_pack(self) -> dict[str, int]:
        """Bytes of each base pack the reused rows read (a range read by several rows once)."""
        if self.base is None or not self.reused.any():
            return {}
        rows = np.flatnonzero(self.reused)
        b = self.base
        first = rows[distinct_ranges(b.obj[rows], b.offset[rows])]
        live = np.bincount(b.obj[first].astype(np.int64), weights=b.size[first], minlength=len(b.objects))
        return {b.objects[i]: int(live[i]) for i in np.flatnonzero(live).tolist()}

    def drop_packs(self, packs: set[str]) -> tuple[int, int]:
        """Stop reusing rows the base holds in ``packs`` (stored afresh instead): how many rows,
        and the bytes of the distinct chunks they read (rows of one zero chunk: one chunk)."""
        if self.base is None or not packs:
            return 0, 0
        b = self.base
        m = min(self.reused.size, len(b))
        hit = np.zeros(self.reused.size, dtype=bool)
        hit[:m] = self.reused[:m] & b.reads_from(packs)[:m]
        self.reused &= ~hit
        rows = np.flatnonzero(hit)
        return int(rows.size), int(b.size[rows[distinct_ranges(b.obj[rows], b.offset[rows])]].sum())

    def fresh_chunks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows not reused; of them, one row per distinct raw digest (encoded and stored
        once: a table's untouched rows are often one zero chunk); and for each fresh row, the
        index of its distinct row."""
        rows = np.flatnonzero(~self.reused)
        keys = np.ascontiguousarray(self.raw[rows]).view(np.dtype((np.void, 16))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return rows, rows[first], inverse.ravel()

    def reused_bytes(self) -> int:
        if self.base is None:
            return 0
        m = min(self.reused.size, len(self.base))
        return int(self.base.size[:m][self.reused[:m]].sum())

    def table(self, grid: tuple[int, ...], fresh: np.ndarray, pack_names: list[str],
              pack_of: np.ndarray, offset_of: np.ndarray, size_of: np.ndarray) -> ChunkTable:
        """The commit's table: reused rows as the base has them, the ``fresh`` rows at
        (``pack_names[pack_of[k]]``, ``offset_of[k]``, ``size_of[k]``)."""
        n = self.raw.shape[0]
        assert math.prod(grid) == n
        base_objects = list(self.base.objects) if self.base is not None else []
        obj = np.empty(n, np.int64)  # into base_objects + pack_names
        offset = np.empty(n, np.int64)
        size = np.empty(n, np.int64)
        if self.base is not None:
            rows = np.flatnonzero(self.reused)
            obj[rows] = self.base.obj[rows]
            offset[rows] = self.base.offset[rows]
            size[rows] = self.base.size[rows]
        obj[fresh] = len(base_objects) + pack_of
        offset[fresh] = offset_of
        size[fresh] = size_of
        return compact_table(grid, self.raw, base_objects + pack_names, obj, offset, size)
