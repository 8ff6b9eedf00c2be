"""Content hashing.

XXH3-128 (see spec/FORMAT.md, "Hash"). It runs at memory speed (measured 6.6 GB/s
per core here, against 2.0 for BLAKE3 and 1.3 for SHA-256), so the hash never
limits a checkpoint, and 128 bits make an accidental collision negligible
(< 1e-18 for a store of 2**32 objects). It is not a cryptographic hash: a store is
trusted as much as the people who can write to it, and anyone who can write a
colliding object could as well rewrite a manifest.

**Digests known before the commit.** Hashing a chunk after it was copied reads its
bytes from memory a second time. A caller that produces a chunk's bytes itself (the
runtime's staging copy) can feed them to a :class:`ChunkHasher` block by block as they
land, while each block is still in the CPU's cache, and hand the digests to
:meth:`~ravex.format.writing.writer.StepWriter.commit` as :data:`KnownDigests`: one pass over
the bytes instead of two (issue 26, benchmarks/RESULTS.md (h)).
"""

from __future__ import annotations

from collections.abc import Mapping

import xxhash

#: The name recorded in ``ravex.json`` and manifests.
HASH_NAME = "xxh3-128"
#: Length of a hex digest: 128 bits.
DIGEST_HEX_LEN = 32
#: Chunks at least this large are looked up in :data:`KnownDigests`; below it a lookup
#: costs about what hashing the chunk does.
KNOWN_MIN_BYTES = 1 << 20

#: Raw digests of chunks whose bytes the caller hashed as it produced them:
#: ``(address of the chunk's first byte, its length, the length it is padded to) -> hex digest``.
#: The caller vouches that those bytes do not change until the commit returns.
KnownDigests = Mapping[tuple[int, int, int], str]


def digest(data: bytes | bytearray | memoryview) -> str:
    """Hex XXH3-128 digest of ``data`` (any C-contiguous buffer)."""
    return xxhash.xxh3_128_hexdigest(data)


def digest_bytes(data: bytes | bytearray | memoryview) -> bytes:
    """The same digest as 16 bytes (its hex is :func:`digest`'s): a chunk table's ``raw`` column."""
    return xxhash.xxh3_128_digest(data)


class ChunkHasher:
    """The digest of one chunk fed in order, block by block; an edge chunk shorter than
    ``padded_to`` is zero-padded as the writer stores it, so :meth:`hexdigest` equals
    :func:`digest` of the padded chunk."""

    def __init__(self, padded_to: int) -> None:
        self._state = xxhash.xxh3_128()
        self._padded_to = padded_to
        self._fed = 0

    def update(self, block: bytes | bytearray | memoryview) -> None:
        self._state.update(block)
        self._fed += memoryview(block).nbytes

    def hexdigest(self) -> str:
        if self._fed < self._padded_to:
            self._state.update(bytes(self._padded_to - self._fed))
            self._fed = self._padded_to
        return str(self._state.hexdigest())
