"""Chunk tables: an array's chunk entries as columns instead of one JSON object each.

A sparse embedding table in 2 KiB chunks has ~131k chunks per 256 MiB. As JSON chunk entries
(spec/FORMAT.md §5) that is ~115 bytes and a few microseconds of Python per chunk on every commit
and every parse, most of it for chunks that did not change. A table (§5.1, since 1.2) holds the
same entries, all packed, as four little-endian columns in one base64 string: 32 bytes a chunk,
read and compared with numpy. :class:`ChunkTable` is the parsed form; it is a read-only mapping
from chunk key to :class:`~ravex.format.objects.chunkref.ChunkRef`, so every reader that walks chunk
entries reads a table unchanged, and the hot paths (the writer's delta, GC's scans) use the
columns directly.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import ManifestError
from .chunkref import ChunkRef
from .hashing import DIGEST_HEX_LEN
from .names import check_object_name

#: Bytes of one row across the four columns: raw digest 16, object index 4, offset 8, size 4.
ROW_BYTES = 32
_DIGEST_BYTES = DIGEST_HEX_LEN // 2


class ChunkTable(Mapping[str, ChunkRef]):
    """The packed chunk entries of one array, in C order of its chunk grid.

    Row ``i`` is the chunk at grid index ``np.unravel_index(i, grid)``: its raw digest
    (``raw[i]``, 16 bytes), the pack holding it (``objects[obj[i]]``), and the byte range
    ``[offset[i], offset[i] + size[i])`` of that pack.
    """

    __slots__ = ("_hex", "_ranges", "_refs", "_rows", "grid", "obj", "objects", "offset", "raw", "size")

    def __init__(self, grid: tuple[int, ...], objects: tuple[str, ...], raw: np.ndarray, obj: np.ndarray,
                 offset: np.ndarray, size: np.ndarray) -> None:
        self.grid = grid
        self.objects = objects
        self.raw = raw  # (n, 16) uint8
        self.obj = obj  # (n,) uint32 index into ``objects``
        self.offset = offset  # (n,) int64
        self.size = size  # (n,) int64
        self._hex: str | None = None
        self._ranges: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._refs: list[ChunkRef] | None = None  # built once a reader walks every entry
        self._rows: dict[str, int] | None = None  # chunk key -> row, built at the first lookup

    # ---- the mapping ------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.obj.shape[0])

    def __iter__(self) -> Iterator[str]:
        if not self.grid:
            yield "c"
            return
        if all(g == 1 for g in self.grid[1:]):  # chunked along dimension 0, as Ravex writes
            tail = "/0" * (len(self.grid) - 1)
            yield from (f"c/{i}{tail}" for i in range(self.grid[0]))
            return
        for index in np.ndindex(*self.grid):
            yield "c/" + "/".join(map(str, index))

    def key(self, row: int) -> str:
        """The chunk key of row ``row`` (C order of the grid)."""
        if not self.grid:
            return "c"
        return "c/" + "/".join(str(int(i)) for i in np.unravel_index(row, self.grid))

    def __getitem__(self, key: str) -> ChunkRef:
        row = self.row_of(key)
        if row is None:
            raise KeyError(key)
        return self.ref(row)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.row_of(key) is not None

    def items(self) -> Iterator[tuple[str, ChunkRef]]:  # type: ignore[override]
        return zip(iter(self), self.values(), strict=True)

    def values(self) -> Iterator[ChunkRef]:  # type: ignore[override]
        """Every entry, as ChunkRefs built once: a reader walks a table's entries several times
        (checks, planning runs, reading); the writer and GC use the columns instead."""
        if self._refs is None:
            hexes = self._hexes()
            names = [self.objects[i] for i in self.obj.tolist()]
            self._refs = [ChunkRef(raw=hexes[32 * i : 32 * i + 32], size=s, object=o, offset=f)
                          for i, (o, f, s) in enumerate(zip(names, self.offset.tolist(), self.size.tolist(),
                                                            strict=True))]
        return iter(self._refs)

    def row_of(self, key: str) -> int | None:
        """The row of chunk ``key`` (``c/<i>/<j>...``), or None when the grid has no such chunk."""
        if self._rows is None:  # a reader looks up every key: one dict, built in one pass
            self._rows = {k: row for row, k in enumerate(self)}
        return self._rows.get(key)

    def ref(self, row: int) -> ChunkRef:
        if self._refs is not None:
            return self._refs[row]
        return ChunkRef(raw=self.raw_hex(row), size=int(self.size[row]),
                        object=self.objects[int(self.obj[row])], offset=int(self.offset[row]))

    def raw_hex(self, row: int) -> str:
        return self._hexes()[row * DIGEST_HEX_LEN : (row + 1) * DIGEST_HEX_LEN]

    def _hexes(self) -> str:
        """Every row's raw digest in hex, one after the other (made once)."""
        if self._hex is None:
            self._hex = self.raw.tobytes().hex()
        return self._hex

    # ---- what the hot paths use -------------------------------------------------------

    def used_objects(self) -> set[str]:
        """The packs some row reads (the writer lists no other; a hostile table may)."""
        return {self.objects[i] for i in np.unique(self.obj).tolist()}

    def stored_bytes(self) -> int:
        return int(self.size.sum())

    def reads_from(self, packs: set[str]) -> np.ndarray:
        """Per row, whether its bytes are in one of ``packs``."""
        doomed = [i for i, name in enumerate(self.objects) if name in packs]
        return np.isin(self.obj, np.array(doomed, dtype=np.uint32))

    def pack_ranges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(object index, offset, size) of each distinct byte range the rows read, sorted by
        object then offset: rows of identical chunks share one range."""
        if self._ranges is None:  # a table is immutable: GC after every commit asks again
            first = distinct_ranges(self.obj, self.offset)
            self._ranges = (self.obj[first].astype(np.int64), self.offset[first], self.size[first])
        return self._ranges

    # ---- JSON -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"objects": list(self.objects), "rows": self.rows_base64()}

    def to_json_text(self) -> str:
        """:meth:`to_json` as compact JSON, the rows string written as it is (base64 needs no
        escaping, and a table of 400k rows is a 17 MB string)."""
        return f'{{"objects":{json.dumps(list(self.objects), separators=(",", ":"))},"rows":"{self.rows_base64()}"}}'

    def rows_base64(self) -> str:
        rows = b"".join((
            np.ascontiguousarray(self.raw, dtype=np.uint8).tobytes(),
            self.obj.astype("<u4").tobytes(),
            self.offset.astype("<u8").tobytes(),
            self.size.astype("<u4").tobytes(),
        ))
        assert len(rows) == len(self) * ROW_BYTES
        return base64.b64encode(rows).decode("ascii")

    @classmethod
    def from_json(cls, doc: Any, grid: tuple[int, ...], at: str, known_objects: set[str]) -> ChunkTable:
        """Parse and check a ``table`` member: every object name checked (and added to
        ``known_objects``), every row's object index within ``objects``, its size below 4 GiB."""
        if not (isinstance(doc, dict) and isinstance(doc.get("objects"), list) and isinstance(doc.get("rows"), str)):
            raise ManifestError(f"{at}: 'table' must be an object with 'objects' (a list) and 'rows' (a string)")
        objects = tuple(check_object_name(name, at) for name in doc["objects"])
        known_objects.update(objects)
        try:
            data = base64.b64decode(doc["rows"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ManifestError(f"{at}: bad table rows: {exc}") from None
        n = math.prod(grid)
        if len(data) != n * ROW_BYTES:
            raise ManifestError(f"{at}: table rows hold {len(data)} bytes, the grid {list(grid)} needs "
                                f"{n} rows of {ROW_BYTES}; the manifest is corrupt")
        buf = np.frombuffer(data, dtype=np.uint8)
        raw = buf[: n * _DIGEST_BYTES].reshape(n, _DIGEST_BYTES)
        at_obj = n * _DIGEST_BYTES
        obj = buf[at_obj : at_obj + 4 * n].view("<u4")
        offset = buf[at_obj + 4 * n : at_obj + 12 * n].view("<u8")
        size = buf[at_obj + 12 * n :].view("<u4").astype(np.int64)
        if n and int(obj.max()) >= len(objects):
            raise ManifestError(f"{at}: a table row names object {int(obj.max())} of {len(objects)}")
        if n and int(offset.max()) >= 1 << 62:
            raise ManifestError(f"{at}: a table row has an offset past 2**62")
        return cls(grid, objects, raw, obj.astype(np.uint32), offset.astype(np.int64), size)


def distinct_ranges(obj: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Indices of one row per distinct (object, offset), sorted by object then offset. The pair
    is one int64 where offsets fit in 40 bits (a pack is a few MiB), else sorted as two keys."""
    if not obj.size:
        return np.zeros(0, np.int64)
    if int(offset.max()) < 1 << 40 and len(obj) and int(obj.max()) < 1 << 23:
        key = (obj.astype(np.int64) << 40) | offset
        _, first = np.unique(key, return_index=True)
        return first
    order = np.lexsort((offset, obj))
    o, f = obj[order], offset[order]
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = (o[1:] != o[:-1]) | (f[1:] != f[:-1])
    return order[keep]


def compact_table(grid: tuple[int, ...], raw: np.ndarray, names: list[str], obj: np.ndarray,
                  offset: np.ndarray, size: np.ndarray) -> ChunkTable:
    """A table whose row ``i`` reads ``names[obj[i]]``: each name once in ``objects`` (a name
    listed twice, one index), in the order of ``names``, and only the names some row reads."""
    index: dict[str, int] = {}
    ids = np.array([index.setdefault(name, len(index)) for name in names], dtype=np.int64)[obj]
    used = np.unique(ids)
    remap = np.zeros(len(index), np.uint32)
    remap[used] = np.arange(used.size, dtype=np.uint32)
    unique = list(index)
    return ChunkTable(grid, tuple(unique[i] for i in used.tolist()), raw, remap[ids], offset, size)


def table_of(refs: Mapping[str, ChunkRef], grid: tuple[int, ...]) -> ChunkTable | None:
    """A chunk map as a table, when every chunk of the grid is packed; else None (a map holding
    a whole-object or inline chunk stays a map)."""
    if isinstance(refs, ChunkTable):
        return refs
    n = math.prod(grid)
    if len(refs) != n:
        return None
    names: dict[str, int] = {}
    obj = np.empty(n, np.uint32)
    offset = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    raws = []
    for row, index in enumerate(np.ndindex(*grid) if grid else [()]):
        ref = refs.get("c/" + "/".join(map(str, index)) if grid else "c")
        if ref is None or ref.offset is None or ref.object is None:
            return None
        obj[row] = names.setdefault(ref.object, len(names))
        offset[row], size[row] = ref.offset, ref.size
        raws.append(ref.raw)
    raw = np.frombuffer(bytes.fromhex("".join(raws)), np.uint8).reshape(n, _DIGEST_BYTES)
    return ChunkTable(grid, tuple(names), raw, obj, offset, size)
