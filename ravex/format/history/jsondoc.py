"""Reading one of the store's small JSON documents (root, run records, timelines, tags,
leases): the one place that turns bytes that are not JSON into an error naming the document."""

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
