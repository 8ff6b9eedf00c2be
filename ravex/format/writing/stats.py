"""What a commit did: its counts and bytes (:class:`CommitStats`) and where its seconds went.

Kept apart from the writer because everything that reports a commit (log lines, ``ravex ls``,
benchmarks) reads these figures, and the writer's helpers (:mod:`.packs`) add to them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommitStats:
    """What one commit did, for log lines, ``ravex ls`` and benchmarks.

    ``seconds``: ``hash``, ``encode`` and ``write`` are summed over the worker threads
    (where the work went); ``manifest``, ``refs`` and ``total`` are wall-clock.
    """

    step: int
    arrays: int = 0
    chunks: int = 0
    new_chunks: int = 0
    reused_chunks: int = 0
    logical_bytes: int = 0
    new_bytes: int = 0
    reused_bytes: int = 0
    inline_bytes: int = 0
    manifest_bytes: int = 0
    #: chunks the base holds in a pack this step would read too little of, stored afresh
    #: (counted in ``new_chunks`` and ``new_bytes`` too)
    rewritten_chunks: int = 0
    rewritten_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "arrays": self.arrays,
            "chunks": self.chunks,
            "new_chunks": self.new_chunks,
            "reused_chunks": self.reused_chunks,
            "logical_bytes": self.logical_bytes,
            "new_bytes": self.new_bytes,
            "reused_bytes": self.reused_bytes,
            "inline_bytes": self.inline_bytes,
        }


class Timings:
    """Seconds summed over worker threads, per phase."""

    def __init__(self) -> None:
        self.hash = self.encode = self.write = 0.0
        self._lock = threading.Lock()

    def add(self, hash: float = 0.0, encode: float = 0.0, write: float = 0.0) -> None:
        with self._lock:
            self.hash += hash
            self.encode += encode
            self.write += write
