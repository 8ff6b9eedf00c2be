"""Manifests: one JSON document per rank per step, naming every chunk it holds.

Frozen dataclasses whose JSON field names are exactly the spec's
(spec/FORMAT.md, "Manifest"). Parsing validates every name that could reach
storage, so a hostile manifest cannot make a reader touch a path outside the store.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._version import SPEC_VERSION, check_header
from ..errors import CorruptObjectError, ManifestError
from ..objects.chunkref import ChunkRef
from ..objects.chunktable import ChunkTable
from ..objects.hashing import DIGEST_HEX_LEN, HASH_NAME
from ..objects.names import check_array_path

MANIFEST_FORMAT = "ravex-manifest"


_json_str = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)


def _chunks_json(chunks: Mapping[str, ChunkRef]) -> str:
    """``json.dumps({k: c.to_json() ...}, separators=(",", ":"))`` without the dicts: the same
    text, an f-string per entry. Strings go through json's own encoder; an entry that is not
    plain (inline bytes, a field of an unexpected type) is written by ``json.dumps`` itself."""
    out = []
    for key, c in chunks.items():
        obj = c.object
        plain = (c.inline is None and type(c.size) is int and type(obj) is str and type(c.raw) is str
                 and (c.offset is None or type(c.offset) is int))
        if not plain or obj is None:  # inline chunks (base64), and anything unusual: as json writes it
            out.append(f"{_json_str(key)}:{json.dumps(c.to_json(), separators=(',', ':'), allow_nan=False)}")
        elif c.offset is not None:
            out.append(f'{_json_str(key)}:{{"object":{_json_str(obj)},"offset":{c.offset},'
                       f'"size":{c.size},"raw":{_json_str(c.raw)}}}')
        else:
            out.append(f'{_json_str(key)}:{{"object":{_json_str(obj)},"size":{c.size},"raw":{_json_str(c.raw)}}}')
    return "{" + ",".join(out) + "}"


@dataclass(frozen=True)
class ArrayEntry:
    """One Zarr v3 array (or this rank's part of one): metadata plus chunk map, which is a
    :class:`ChunkTable` where the manifest holds the array's entries as a table (§5.1)."""

    zarr: dict[str, Any]
    chunks: Mapping[str, ChunkRef]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.zarr["shape"])

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        return tuple(self.zarr["chunk_grid"]["configuration"]["chunk_shape"])

    @property
    def grid(self) -> tuple[int, ...]:
        """Chunks along each dimension."""
        return _grid(self.zarr)

    @property
    def data_type(self) -> str:
        name: str = self.zarr["data_type"]
        return name

    @property
    def codecs(self) -> list[dict[str, Any]]:
        codecs: list[dict[str, Any]] = self.zarr["codecs"]
        return codecs

    def stored_bytes(self) -> int:
        if isinstance(self.chunks, ChunkTable):
            return self.chunks.stored_bytes()
        return sum(c.size for c in self.chunks.values())

    def object_names(self) -> set[str]:
        """The objects this array's chunks read."""
        if isinstance(self.chunks, ChunkTable):
            return self.chunks.used_objects()
        return {c.object for c in self.chunks.values() if c.object is not None}

    def chunks_json(self) -> dict[str, Any]:
        """The entry's chunk member as the manifest writes it: ``{"table": ...}`` or ``{"chunks": ...}``."""
        if isinstance(self.chunks, ChunkTable):
            return {"table": self.chunks.to_json()}
        return {"chunks": {k: c.to_json() for k, c in self.chunks.items()}}


@dataclass(frozen=True)
class Manifest:
    """What one rank wrote for one step. Written last, atomically; never modified."""

    step: int
    rank: int
    world_size: int
    run: str
    created_at: str
    tree: Any
    arrays: dict[str, ArrayEntry]
    metadata: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    version: str = SPEC_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            **self._header(),
            "arrays": {
                path: {"zarr": entry.zarr, **entry.chunks_json()}
                for path, entry in self.arrays.items()
            },
        }

    def _header(self) -> dict[str, Any]:
        """Every field but ``arrays``, in the spec's order."""
        return {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "hash": HASH_NAME,
            "step": self.step,
            "rank": self.rank,
            "world_size": self.world_size,
            "run": self.run,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "stats": self.stats,
            "tree": self.tree,
        }

    def to_bytes(self) -> bytes:
        """The manifest as compact JSON: exactly ``json.dumps(self.to_json(), separators=(",",
        ":"), allow_nan=False)``, with the chunk maps written by :func:`_chunks_json` (a table
        in 2 KiB chunks has ~400k entries: as dicts through ``json`` they took ~1 s a commit)."""
        head = json.dumps(self._header(), separators=(",", ":"), allow_nan=False)
        parts = [head[:-1], ',"arrays":{']
        for i, (path, entry) in enumerate(self.arrays.items()):
            parts.append(f'{"," if i else ""}{_json_str(path)}:{{"zarr":')
            parts.append(json.dumps(entry.zarr, separators=(",", ":"), allow_nan=False))
            if isinstance(entry.chunks, ChunkTable):
                parts.append(',"table":')
                parts.append(entry.chunks.to_json_text())
            else:
                parts.append(',"chunks":')
                parts.append(_chunks_json(entry.chunks))
            parts.append("}")
        parts.append("}}")
        return "".join(parts).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit int
            raise ManifestError(f"{where}: truncated or malformed JSON ({type(exc).__name__}: {exc})") from None
        try:
            return cls.from_json(doc, where)
        except RecursionError:
            raise ManifestError(f"{where}: JSON nested too deeply") from None

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Manifest:
        check_header(doc, where, MANIFEST_FORMAT, f"not a Ravex manifest (no format {MANIFEST_FORMAT!r})",
                     "hash", HASH_NAME, f"unknown hash {{got}}; expected {HASH_NAME!r}")
        try:
            step, rank, world = (_json_int(doc[k], k, where) for k in ("step", "rank", "world_size"))
            arrays_doc = doc["arrays"]
            tree = doc["tree"]
        except KeyError as exc:
            raise ManifestError(f"{where}: missing field {exc}") from None
        if not (0 <= rank < world) or step < 0:
            raise ManifestError(f"{where}: bad step/rank/world_size {step}/{rank}/{world}")
        if not isinstance(arrays_doc, dict):
            raise ManifestError(f"{where}: 'arrays' must be an object")
        arrays: dict[str, ArrayEntry] = {}
        known_objects: set[str] = set()
        for path, entry in arrays_doc.items():
            at = f"{where} tensor {path!r}"
            check_array_path(path, at)
            if not isinstance(entry, dict) or not isinstance(entry.get("zarr"), dict):
                raise ManifestError(f"{at}: entry has no 'zarr' metadata")
            _check_zarr_meta(entry["zarr"], at)
            chunks = entry.get("chunks")
            parsed: Mapping[str, ChunkRef]
            if "table" in entry and chunks is not None:
                raise ManifestError(f"{at}: entry holds both 'chunks' and 'table'; a writer writes one")
            if "table" in entry:
                parsed = ChunkTable.from_json(entry["table"], _grid(entry["zarr"]), f"{at} table", known_objects)
            elif isinstance(chunks, dict):
                parsed = _chunk_map(chunks, at, known_objects)
            else:
                raise ManifestError(f"{at}: entry has no 'chunks' map")
            arrays[path] = ArrayEntry(zarr=entry["zarr"], chunks=parsed)
            _check_stored_sizes(arrays[path], at)
        for name in ("metadata", "stats"):
            if not isinstance(doc.get(name) or {}, dict):
                raise ManifestError(f"{where}: {name!r} must be an object, got {type(doc[name]).__name__}")
        return cls(
            step=step,
            rank=rank,
            world_size=world,
            run=str(doc.get("run", "")),
            created_at=str(doc.get("created_at", "")),
            tree=tree,
            arrays=arrays,
            metadata=dict(doc.get("metadata") or {}),
            stats=dict(doc.get("stats") or {}),
            version=doc["version"],
        )


def _json_int(value: Any, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ManifestError(f"{where}: field {name!r} must be a JSON integer, got {value!r}")
    return value


def _check_zarr_meta(meta: dict[str, Any], where: str) -> None:
    """Shape and chunk shape are lists of JSON integers (chunk sides >= 1, so no reader divides
    by zero), of one length; codecs a list of named objects."""
    try:
        shape, chunk_shape = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
        ok = (
            meta["zarr_format"] == 3
            and meta["node_type"] == "array"
            and isinstance(shape, list)
            and isinstance(chunk_shape, list)
            and all(_is_int(n) and n >= 0 for n in shape)
            and all(_is_int(n) and n >= 1 for n in chunk_shape)
            and len(chunk_shape) == len(shape)
            and isinstance(meta["codecs"], list)
            and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in meta["codecs"])
            and isinstance(meta["data_type"], str)
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise ManifestError(f"{where}: malformed zarr.json metadata")


def _grid(meta: dict[str, Any]) -> tuple[int, ...]:
    """Chunks along each dimension of a checked ``zarr.json``."""
    return grid_of(meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"])


def grid_of(shape: Sequence[int], chunk_shape: Sequence[int]) -> tuple[int, ...]:
    """Chunks along each dimension of an array of ``shape`` in chunks of ``chunk_shape``."""
    return tuple(math.ceil(s / c) for s, c in zip(shape, chunk_shape, strict=True))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: The largest element a Zarr data type of format 1 has (complex128).
_MAX_ITEMSIZE = 16


def _check_stored_sizes(entry: ArrayEntry, where: str) -> None:
    """No chunk's stored ``size`` may exceed what any codec makes of a full chunk (zstd and
    blosc add well under 1/64 plus a header): a hostile size could otherwise make a reader
    ask storage for petabytes before any byte is checked."""
    if not entry.chunks:
        return
    decoded = _MAX_ITEMSIZE
    for n in entry.chunk_shape:
        decoded *= n
    limit = decoded + decoded // 64 + 4096
    if isinstance(entry.chunks, ChunkTable):
        if len(entry.chunks) and int(entry.chunks.size.max()) > limit:
            raise ManifestError(f"{where}: a table row's stored size is larger than a chunk of shape "
                                f"{list(entry.chunk_shape)} can encode to; the manifest is corrupt")
        return
    for key, ref in entry.chunks.items():
        if ref.size > limit:
            raise ManifestError(
                f"{where} chunk {key}: stored size {ref.size} is larger than a chunk of shape "
                f"{list(entry.chunk_shape)} can encode to; the manifest is corrupt"
            )


def _chunk_map(doc: dict[str, Any], at: str, known_objects: set[str]) -> dict[str, ChunkRef]:
    """An array's chunk entries, checked. A table in 2 KiB chunks has ~100k of them, nearly all
    packed into a few objects: for an entry of exactly that shape whose object name was checked
    already, the checks are inlined here (~1 us an entry instead of ~5)."""
    out: dict[str, ChunkRef] = {}
    for key, ref in doc.items():
        _check_chunk_key(key, at)
        if type(ref) is dict and len(ref) == 4:
            raw, size, offset, name = ref.get("raw"), ref.get("size"), ref.get("offset"), ref.get("object")
            if (type(raw) is str and len(raw) == DIGEST_HEX_LEN and type(size) is int and size >= 0
                    and type(offset) is int and offset >= 0 and type(name) is str and name in known_objects):
                out[key] = ChunkRef(raw=raw, size=size, object=name, offset=offset)
                continue
        out[key] = ChunkRef.from_json(ref, f"{at} chunk {key}", known_objects)
    return out


#: ``c`` then ``/<i>`` per dimension, each index decimal as the layout writes it (no sign, no
#: leading zero); ``fullmatch``, so no trailing newline slips through as ``$`` would let it.
_CHUNK_KEY = re.compile(r"c(?:/(?:0|[1-9][0-9]{0,18}))*")


def _check_chunk_key(key: str, where: str) -> str:
    if not _CHUNK_KEY.fullmatch(key):
        raise ManifestError(f"{where}: bad chunk key {key!r}; expected 'c/<i>/<j>...'")
    return key


def merge_arrays(manifests: list[Manifest]) -> dict[str, ArrayEntry]:
    """Union of the ranks' arrays; metadata must agree, a chunk may come from one rank only
    (or from several with identical content)."""
    if len(manifests) == 1:  # nothing to merge: a table in small chunks stays a table
        return dict(manifests[0].arrays)
    merged: dict[str, ArrayEntry] = {}
    for m in manifests:
        for path, entry in m.arrays.items():
            have = merged.get(path)
            if have is None:
                merged[path] = ArrayEntry(zarr=entry.zarr, chunks=dict(entry.chunks))
                continue
            if have.zarr != entry.zarr:
                raise ManifestError(f"step {m.step} rank {m.rank}: tensor {path!r} metadata differs between ranks")
            assert isinstance(have.chunks, dict)
            for key, ref in entry.chunks.items():
                other = have.chunks.setdefault(key, ref)
                if other.raw != ref.raw:
                    raise ManifestError(
                        f"step {m.step} rank {m.rank}: tensor {path!r} chunk {key} differs between ranks"
                    )
    return merged


def check_chunks_present(path: str, entry: ArrayEntry, step: int) -> None:
    """Every chunk of a non-empty array must have an entry: Ravex writes them all. This also
    stops a hostile manifest from making a reader allocate a huge array it cannot fill."""
    shape, chunk_shape = entry.shape, entry.chunk_shape
    if not shape:
        expected = 1
    elif math.prod(shape) == 0:
        expected = 0
    else:
        expected = math.prod(math.ceil(s / c) for s, c in zip(shape, chunk_shape, strict=True))
    grid = [math.ceil(s / c) if c > 0 else 0 for s, c in zip(shape, chunk_shape, strict=True)]
    if isinstance(entry.chunks, ChunkTable) and list(entry.chunks.grid) == grid and len(entry.chunks) == expected:
        return
    if (
        any(c <= 0 for c in chunk_shape)
        or len(entry.chunks) != expected
        or not _exactly_the_grid(entry.chunks, grid)
    ):
        raise CorruptObjectError(
            f"step {step} tensor {path!r}: {len(entry.chunks)} chunk entries for a grid of {expected} "
            f"(shape {list(shape)}, chunks {list(chunk_shape)}); the manifest is inconsistent"
        )


def _exactly_the_grid(chunks: Mapping[str, Any], grid: list[int]) -> bool:
    """Whether the chunk keys (as many as the grid has cells) are the grid's keys."""
    if not grid:  # a scalar: one chunk, key "c"
        return list(chunks) == ["c"]
    if all(g == 1 for g in grid[1:]):  # chunked along dim 0 only: build the keys
        tail = "/0" * (len(grid) - 1)
        return all(f"c/{i}{tail}" in chunks for i in range(grid[0]))
    return all(_in_grid(key, grid) for key in chunks)  # same count, all in the grid: exactly the grid


def _in_grid(key: str, grid: list[int]) -> bool:
    parts = key.split("/")[1:]
    return len(parts) == len(grid) and all(int(p) < g for p, g in zip(parts, grid, strict=True))
