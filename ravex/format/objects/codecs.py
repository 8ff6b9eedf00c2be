"""Chunk codecs: the standard Zarr v3 ``bytes``, ``zstd`` and ``blosc`` codecs.

Ravex encodes chunks itself with numcodecs (which releases the GIL) and writes
the codec list into each array's ``zarr.json``, so stock zarr-python and
tensorstore decode the same bytes. A writer names a compression by a short
spec: ``"none"``, ``"zstd"`` / ``"zstd:3"``, ``"blosc"`` (lz4, bitshuffle) /
``"blosc:zstd"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from ..errors import ManifestError

_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
COMPRESSIONS = ("none", "zstd", "blosc")


def parse_compression(spec: str) -> tuple[str, str | None]:
    """Split ``"zstd:3"`` into ``("zstd", "3")``; a clear error for anything else."""
    name, _, arg = str(spec).partition(":")
    if name not in COMPRESSIONS:
        raise ValueError(f"unknown compression {spec!r}; expected one of {list(COMPRESSIONS)} (e.g. 'zstd:3')")
    return name, arg or None


def codecs_for(compression: str, itemsize: int) -> list[dict[str, Any]]:
    """The Zarr v3 codec list for a compression spec and element size."""
    name, arg = parse_compression(compression)
    if name == "none":
        return [_BYTES]
    if name == "zstd":
        level = int(arg) if arg else 1
        return [_BYTES, {"name": "zstd", "configuration": {"level": level, "checksum": False}}]
    cname = arg or "lz4"
    return [
        _BYTES,
        {
            "name": "blosc",
            "configuration": {
                "cname": cname,
                "clevel": 5,
                "shuffle": "bitshuffle" if itemsize > 1 else "shuffle",
                "typesize": itemsize,
                "blocksize": 0,
            },
        },
    ]


@dataclass(frozen=True)
class Pipeline:
    """Encode/decode one chunk's bytes for a codec list. Cached by :func:`pipeline`."""

    codecs_json: str
    compressor: Any  # a numcodecs codec, or None for plain bytes
    typesize: int

    def encode(self, raw: memoryview) -> memoryview | bytes:
        if self.compressor is None:
            return raw
        if isinstance(self.compressor, numcodecs.Blosc):
            # blosc reads the element size from the buffer's dtype
            arr = np.frombuffer(raw, dtype=f"u{self.typesize}" if self.typesize in (1, 2, 4, 8) else "u1")
            packed: bytes = self.compressor.encode(arr)
            return packed
        encoded: bytes = self.compressor.encode(raw)
        return encoded

    def decode(self, stored: bytes | memoryview, size: int, into: memoryview | None = None) -> bytes | memoryview:
        """Decode into a buffer of exactly ``size`` bytes, the chunk's decoded size from the
        metadata (``into``, if given: then nothing is allocated); anything that would decode
        to more (a decompression bomb) is refused."""
        if self.compressor is None:
            return stored
        out = np.empty(size, dtype="u1") if into is None else np.frombuffer(into, dtype="u1")
        try:
            self.compressor.decode(stored, out=out)
        except (ValueError, RuntimeError) as exc:
            raise ValueError(f"chunk does not decode to {size} bytes: {exc}") from None
        return out.data


_CACHE: dict[str, Pipeline] = {}


def pipeline(codecs: list[dict[str, Any]], where: str = "array") -> Pipeline:
    """The :class:`Pipeline` for a ``zarr.json`` codec list Ravex can decode."""
    try:
        key = json.dumps(codecs, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"{where}: malformed codec list {_short(codecs)}: {exc}") from None
    found = _CACHE.get(key)
    if found is not None:
        return found
    try:
        found = _build(codecs, key, where)
    except ManifestError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        # a hostile or foreign codec configuration: one line naming the tensor, never a codec's traceback
        raise ManifestError(
            f"{where}: invalid codec configuration {_short(codecs)} ({type(exc).__name__}: {exc})"
        ) from None
    _CACHE[key] = found
    return found


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _build(codecs: list[dict[str, Any]], key: str, where: str) -> Pipeline:
    if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
        raise ManifestError(f"{where}: codecs must be a list of objects, got {_short(codecs)}")
    if not codecs or codecs[0].get("name") != "bytes" or len(codecs) > 2:
        raise ManifestError(f"{where}: unsupported codec chain {_short(codecs)}; expected bytes[, zstd|blosc]")
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    if endian not in ("little", None):
        raise ManifestError(f"{where}: big-endian chunks are not written by Ravex")
    compressor = None
    typesize = 1
    if len(codecs) == 2:
        c = codecs[1]
        conf = c.get("configuration") or {}
        if c.get("name") == "zstd":
            compressor = numcodecs.Zstd(level=int(conf.get("level", 0)), checksum=bool(conf.get("checksum", False)))
        elif c.get("name") == "blosc":
            typesize = int(conf.get("typesize") or 1)
            compressor = numcodecs.Blosc(
                cname=conf.get("cname", "lz4"),
                clevel=int(conf.get("clevel", 5)),
                shuffle=_SHUFFLE[conf.get("shuffle", "noshuffle")],
                blocksize=int(conf.get("blocksize", 0)),
            )
        else:
            raise ManifestError(f"{where}: unknown codec {c.get('name')!r}")
    return Pipeline(key, compressor, typesize)
