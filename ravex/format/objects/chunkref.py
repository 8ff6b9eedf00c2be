"""One chunk entry of a manifest: where a chunk's stored bytes are, and its raw digest.

Its own module so that the manifest (``steps/manifest.py``) and the chunk table (``chunktable.py``),
which both hand out entries, share it without importing each other.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError
from .hashing import DIGEST_HEX_LEN
from .names import check_object_name


@dataclass(frozen=True)
class ChunkRef:
    """Where one chunk's encoded bytes live: a whole object, a byte range of a pack
    object (``offset`` set), or inline in the manifest.

    ``raw`` is the digest of the chunk's *decoded* bytes: a writer compares it to
    decide, without encoding or any storage round trip, that a chunk is unchanged,
    and a reader checks every decoded chunk against it.
    """

    raw: str
    size: int
    object: str | None = None
    inline: bytes | None = None
    offset: int | None = None  # set only for chunks packed with others into one object

    def to_json(self) -> dict[str, Any]:
        if self.inline is not None:
            return {"inline": base64.b64encode(self.inline).decode("ascii"), "raw": self.raw}
        if self.offset is not None:
            return {"object": self.object, "offset": self.offset, "size": self.size, "raw": self.raw}
        return {"object": self.object, "size": self.size, "raw": self.raw}

    @classmethod
    def from_json(cls, doc: Any, where: str, known_objects: set[str] | None = None) -> ChunkRef:
        """Parse and check one chunk entry; an object name it checks joins ``known_objects``."""
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: chunk entry must be an object, got {doc!r}")
        raw = doc.get("raw")
        if not isinstance(raw, str) or len(raw) != DIGEST_HEX_LEN:
            raise ManifestError(f"{where}: chunk entry has no valid 'raw' digest")
        if "inline" in doc:
            try:
                data = base64.b64decode(doc["inline"], validate=True)
            except (TypeError, ValueError) as exc:
                raise ManifestError(f"{where}: bad inline chunk: {exc}") from None
            return cls(raw=raw, size=len(data), inline=data)
        size = doc.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{where}: chunk entry has no valid 'size'")
        offset = doc.get("offset")
        if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool) or offset < 0):
            raise ManifestError(f"{where}: chunk entry has an invalid 'offset'")
        name = check_object_name(doc.get("object"), where)
        if known_objects is not None:
            known_objects.add(name)
        return cls(raw=raw, size=size, object=name, offset=offset)
