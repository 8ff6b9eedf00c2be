"""Packs: the shared objects that hold a commit's small chunks, and which of them stay alive.

The writer (:mod:`.writer`) hands this module the chunks too small for an object of their own;
it lays them out into packs (:class:`PackLayout`), indexes what a commit may reuse of its base
(:func:`reuse_index`) and picks the packs a commit covers too little of to keep naming
(:func:`sparse_packs`, spec/FORMAT.md §13). The thresholds stay the writer's
(``PACK_MAX_CHUNK_BYTES``, ``PACK_LIVE_FLOOR``, ``PACK_LIVE_TARGET``), passed in at each call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..objects.chunkref import ChunkRef
from ..objects.chunktable import ChunkTable, table_of
from ..objects.codecs import pipeline
from ..objects.tabledelta import TABLE_MIN_CHUNKS, TableDelta, pad, row_view
from ..steps.manifest import Manifest
from .planning import BATCH_BYTES, PlannedArray
from .stats import Timings

#: New small chunks are packed into shared objects of about this size.
PACK_TARGET_BYTES = 4 << 20


@dataclass(frozen=True)
class Small:
    """A new chunk too small for an object of its own: it goes into a pack."""

    raw: str
    codecs_json: str  # equal raw bytes under two codec chains are two different stored chunks
    data: bytes

    @property
    def identity(self) -> tuple[str, str]:
        return (self.codecs_json, self.raw)


def encode_again(arr: PlannedArray, raw: memoryview, ref: ChunkRef) -> Small:
    """A reused chunk of ``arr`` (``raw``, its bytes in memory) encoded again, to be packed
    with the commit's new chunks; its raw digest, and so its identity, is ``ref``'s."""
    pipe = pipeline(arr.codecs)
    return Small(ref.raw, pipe.codecs_json, bytes(pipe.encode(pad(raw, arr.chunk_len))))


class PackLayout:
    """New small chunks laid out into packs of about PACK_TARGET_BYTES. The order of the calls
    is the tree's, so the same state packs the same way."""

    def __init__(self) -> None:
        self.packs: list[list[Any]] = []  # per pack, its chunks' stored bytes in order
        self.fill: list[int] = []
        self.placed: dict[tuple[str, str], tuple[int, int]] = {}  # identity -> (pack, offset)
        self.total = 0

    def place(self, identity: tuple[str, str], data: Any) -> tuple[int, int]:
        """One chunk of a map array; an identical chunk (same codec chain and raw digest) is
        placed once."""
        where = self.placed.get(identity)
        if where is None:
            size = memoryview(data).nbytes
            if not self.packs or (self.fill[-1] and self.fill[-1] + size > PACK_TARGET_BYTES):
                self.packs.append([])
                self.fill.append(0)
            where = self.placed[identity] = (len(self.packs) - 1, self.fill[-1])
            self.packs[-1].append(data)
            self.fill[-1] += size
            self.total += size
        return where

    def place_run(self, stored: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A run of a table's distinct new chunks (the table deduplicated them), placed with
        numpy: (pack, offset, size) of each. A pack takes chunks while it holds less than
        PACK_TARGET_BYTES, so it may end one chunk past it."""
        sizes = np.fromiter((memoryview(d).nbytes for d in stored), np.int64, len(stored))
        if not sizes.size:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        if not self.packs or self.fill[-1] >= PACK_TARGET_BYTES:
            self.packs.append([])
            self.fill.append(0)
        starts = self.fill[-1] + np.cumsum(sizes) - sizes  # as if the current pack had no end
        group = starts // PACK_TARGET_BYTES  # 0: the current pack; k: the k-th one opened after it
        bounds = (np.flatnonzero(np.diff(group)) + 1).tolist()
        packs = np.empty(sizes.size, np.int64)
        offsets = np.empty(sizes.size, np.int64)
        for i, (lo, hi) in enumerate(zip([0, *bounds], [*bounds, sizes.size], strict=True)):
            if i:
                self.packs.append([])
                self.fill.append(0)
            offsets[lo:hi] = starts[lo:hi] - (int(starts[lo]) if i else 0)
            packs[lo:hi] = len(self.packs) - 1
            self.packs[-1].append(b"".join(stored[lo:hi]))
            self.fill[-1] = int(offsets[hi - 1] + sizes[hi - 1])
        self.total += int(sizes.sum())
        return packs, offsets, sizes


def live_by_pack(reused: Iterator[ChunkRef | Small]) -> dict[str, int]:
    """Bytes of each pack that ``reused`` entries read (a chunk used twice counts once)."""
    used: dict[str, dict[int, int]] = {}
    for ref in reused:
        if isinstance(ref, ChunkRef) and ref.object is not None and ref.offset is not None:
            used.setdefault(ref.object, {})[ref.offset] = ref.size
    return {name: sum(ranges.values()) for name, ranges in used.items()}


def reuse_index(
    manifest: Manifest, tables_wanted: bool = True
) -> tuple[dict[str, dict[str, ChunkRef]], dict[str, dict[str, ChunkTable]], dict[str, tuple[int, int]]]:
    """What a commit may reuse of a step: its map arrays' chunks by codec chain, then by raw
    digest (two levels, so that a lookup builds no tuple); its tables (§5.1) by array path, then
    codec chain, compared row by row; and per pack object it names, the bytes its chunk entries
    cover and where the last of them ends.

    With ``tables_wanted``, a map array of the base large enough to be written as a table (a
    store from before tables, or an array that grew past TABLE_MIN_CHUNKS) becomes its table
    here, once, so that the first commit after the switch still reuses every unchanged chunk."""
    index: dict[str, dict[str, ChunkRef]] = {}
    tables: dict[str, dict[str, ChunkTable]] = {}
    ranges: dict[str, dict[int, int]] = {}
    packs: dict[str, tuple[int, int]] = {}
    for path, entry in manifest.arrays.items():
        codecs_json = json.dumps(entry.codecs, sort_keys=True)
        if isinstance(entry.chunks, ChunkTable):
            table = entry.chunks
            tables[path] = {codecs_json: table}
            obj, offset, size = table.pack_ranges()
            live = np.bincount(obj, weights=size, minlength=len(table.objects))
            end = np.zeros(len(table.objects), np.int64)
            np.maximum.at(end, obj, offset + size)
            for i in np.flatnonzero(live).tolist():
                have = packs.get(table.objects[i], (0, 0))
                packs[table.objects[i]] = (have[0] + int(live[i]), max(have[1], int(end[i])))
            continue
        by_raw = index.setdefault(codecs_json, {})
        by_raw.update({ref.raw: ref for ref in entry.chunks.values()})
        if tables_wanted and len(entry.chunks) >= TABLE_MIN_CHUNKS:
            as_table = table_of(entry.chunks, entry.grid)
            if as_table is not None:
                tables[path] = {codecs_json: as_table}
        for ref in entry.chunks.values():
            if ref.offset is not None and ref.object is not None:
                ranges.setdefault(ref.object, {})[ref.offset] = ref.size
    for name, r in ranges.items():
        have = packs.get(name, (0, 0))
        packs[name] = (have[0] + sum(r.values()), max(have[1], max(o + n for o, n in r.items())))
    return index, tables, packs


def sparse_packs(live: dict[str, int], budget: int, base_packs: Mapping[str, tuple[int, int]],
                 pack_sizes: Mapping[str, int], floor: float, target: float) -> set[str]:
    """The packs whose chunks this commit would reuse (``live``: the bytes of each pack the
    reused chunks read) that it stores afresh instead: those it covers less than ``floor``
    (PACK_LIVE_FLOOR) of, then, sparsest first, those it covers less than ``target`` (PACK_LIVE_TARGET) of
    while the bytes re-stored for them total at most ``budget`` (the commit's new packed
    bytes of chunk maps: those packs at most double).

    A pack this commit would name for a few chunks (an RNG state, a frozen bias, while
    the rest of the pack changed) would stay alive for them after GC has collected the
    steps that read the rest. Storing those chunks again costs a few small writes; the
    pack is then named by older steps only, and GC deletes it once they go. The floor
    bounds what a slowly changing table in small chunks costs: its packs are re-stored
    only once half dead, where holding them to the target would re-store the table on
    nearly every commit.

    Only a pack of which this commit covers fewer bytes than its base did is measured
    (unchanged state passed when its base was committed). No storage request is made: a
    pack's size is known when this writer wrote it (``pack_sizes``); for one written before (by a run this
    one resumed) the end of its last chunk the base names stands in, a lower bound (``base_packs``: per pack
    of the base, the bytes it reads and that end).
    """
    covered = []
    for name, used in live.items():
        base_live, base_end = base_packs.get(name, (0, 0))
        if used < base_live:
            covered.append((used / pack_sizes.get(name, base_end), used, name))
    sparse: set[str] = set()
    for fraction, used, name in sorted(covered):
        if fraction < floor:
            sparse.add(name)
        elif fraction < target and used <= budget:
            sparse.add(name)
            budget -= used
    return sparse


def place_rows(
    pool: Executor, arr: PlannedArray, delta: TableDelta, layout: PackLayout, timings: Timings
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Encode a table's rows that it does not reuse (on the pool, in runs of BATCH_BYTES) and
    place them in ``layout``: (rows, pack index, offset, stored size) of each, in row order."""
    rows, distinct, inverse = delta.fresh_chunks()
    pipe = pipeline(arr.codecs)

    def encode(part: np.ndarray) -> list[Any]:
        t0 = time.perf_counter()
        try:
            return [pipe.encode(row_view(arr.flat, arr.chunk_len, r)) for r in part.tolist()]
        finally:
            timings.add(encode=time.perf_counter() - t0)

    per_task = max(1, BATCH_BYTES // arr.chunk_len)
    futures = [pool.submit(encode, distinct[i : i + per_task]) for i in range(0, distinct.size, per_task)]
    try:
        stored = [data for fut in futures for data in fut.result()]
    except BaseException:
        for fut in futures:
            fut.cancel()
        wait(futures)  # the writer idle when the error reaches the caller
        raise
    pack_of, offset_of, size_of = layout.place_run(stored)
    return rows, pack_of[inverse], offset_of[inverse], size_of[inverse]
