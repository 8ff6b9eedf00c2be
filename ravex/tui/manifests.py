"""Manifests parsed without stalling the inspector's event loop.

``json.loads`` of an 8 MB manifest is one C call that holds the GIL for ~0.2 s, and the UI
thread waits that long although a worker does the parsing. :func:`loads_in_pieces` parses a
manifest one tensor entry at a time so that the interpreter can switch threads in between,
and :class:`PiecewiseStore` is a store whose every manifest is parsed that way, inside
:func:`ravex.tui.heap.parsing`: opening a step, diffing and validating all go through it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ravex.format import CheckpointStore, RavexError
from ravex.format.history.timelines import Timeline
from ravex.format.steps.manifest import Manifest

from . import heap

#: How deep :func:`loads_in_pieces` splits objects below each top-level key of a manifest: each
#: tensor entry of ``arrays`` is one piece; the state ``tree`` is split further (it nests).
_SPLIT_DEPTH = {"arrays": 2, "tree": 3}
_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def loads_in_pieces(text: str) -> Any:
    """``json.loads(text)`` for a manifest, parsed one tensor entry at a time.

    Same values, same errors (``ValueError``) as ``json.loads``.
    """
    i = _skip(text, 0)
    value, i = _piece(text, i, 0, 1)
    if _skip(text, i) != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return value


def _skip(s: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON whitespace."""
    m = _WS.match(s, i)
    assert m is not None  # the pattern matches the empty string
    return m.end()


def _piece(s: str, i: int, depth: int, split: int) -> tuple[Any, int]:
    if depth >= split or not s.startswith("{", i):
        return _DECODER.raw_decode(s, i)
    out: dict[str, Any] = {}
    i = _skip(s, i + 1)
    if s.startswith("}", i):
        return out, i + 1
    while True:
        if not s.startswith('"', i):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
        key, i = json.decoder.scanstring(s, i + 1)  # type: ignore[attr-defined]
        i = _skip(s, i)
        if not s.startswith(":", i):
            raise json.JSONDecodeError("Expecting ':' delimiter", s, i)
        i = _skip(s, i + 1)
        out[key], i = _piece(s, i, depth + 1, _SPLIT_DEPTH.get(key, 1) if depth == 0 else split)
        i = _skip(s, i)
        if s.startswith(",", i):
            i = _skip(s, i + 1)
        elif s.startswith("}", i):
            return out, i + 1
        else:
            raise json.JSONDecodeError("Expecting ',' delimiter", s, i)


class PiecewiseStore(CheckpointStore):
    """The same store, each manifest parsed with :func:`loads_in_pieces` inside ``heap.parsing()``.

    Anything unusual about a manifest (not UTF-8, malformed, another step's) is left to
    :meth:`CheckpointStore.manifest`, so errors read exactly as they do everywhere else.
    """

    def __init__(self, store: CheckpointStore, cache_size: int | None = None) -> None:
        super().__init__(store.storage, store.root, store.timeline)
        if cache_size is not None:
            self.manifest_cache_size = cache_size

    def on_timeline(self, name: str, timelines: dict[str, Timeline] | None = None) -> CheckpointStore:
        """The same, for timeline ``name``: a parent's steps read through the lineage are parsed
        in pieces too (spec §19)."""
        view = super().on_timeline(name, timelines)
        return view if isinstance(view, PiecewiseStore) else PiecewiseStore(view, self.manifest_cache_size)

    def manifest(self, step: int, rank: int) -> Manifest:  # docstring inherited
        cached = self.cached_manifest(step, rank)
        if cached is not None:
            return cached
        with heap.parsing():
            try:
                text = self.storage.read(self.manifest_key(step, rank)).decode("utf-8")
                m = Manifest.from_json(loads_in_pieces(text), f"step {step} rank {rank}")
            except (OSError, ValueError, RecursionError, RavexError):
                return super().manifest(step, rank)  # it says what is wrong, in its words
            if (m.step, m.rank) != (step, rank):
                return super().manifest(step, rank)
            return m
