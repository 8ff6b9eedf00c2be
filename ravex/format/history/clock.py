"""The wall-clock time a root document or a manifest records (``created_at``).

One function, looked up at each call, so that a test or the spec's worked example can fix
the time and get the same bytes every run.
"""

from __future__ import annotations

from datetime import datetime, timezone


def now_iso() -> str:
    """Now, in UTC, as ISO 8601 with milliseconds: ``2026-12-01T12:00:00.000+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
