"""Reading one of the store's small JSON documents (root, run records, timelines, tags,
leases): the one place that turns bytes that are not JSON into an error naming the document,
and that checks the shape timelines and tags share (:func:`load_named`)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ManifestError


def load_document(data: bytes, where: str, detail: bool = False) -> Any:
    """``data`` parsed; malformed JSON (or a number too long to parse) is a
    :class:`ManifestError` naming ``where``, with the parser's message when ``detail``."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit int
        why = f"{type(exc).__name__}: {exc}" if detail else type(exc).__name__
        raise ManifestError(f"{where}: malformed JSON ({why})") from None


def load_named(data: bytes, key: str, kind: str, fmt: str, text: str, count: str,
               both_null: bool = False) -> dict[str, Any]:
    """A document named by its key (``<folder>/<name>.json``: a timeline's, a tag's) parsed and
    checked: an object of format ``fmt`` whose ``name`` is the key's, whose ``text`` member is a
    string and whose ``count`` member an int >= 0, or, where ``both_null``, both null (a root
    timeline). Anything else is a :class:`ManifestError` naming ``key``, the ``kind`` of
    document and the members it must hold (spec §19)."""
    doc: dict[str, Any] = load_document(data, key)
    name = key.rsplit("/", 1)[-1].removesuffix(".json")
    ok = isinstance(doc, dict) and doc.get("format") == fmt and doc.get("name") == name
    filled = ok and isinstance(doc.get(text), str) and type(doc.get(count)) is int and doc[count] >= 0
    null = ok and both_null and doc.get(text) is None and doc.get(count) is None
    if not (filled or null):
        raise ManifestError(f"{key}: not a {kind} document (format, name, {text}, {count}; spec §19)")
    return doc
