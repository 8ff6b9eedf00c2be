"""The last run's outcome for a store, kept beside the ``ravex.yaml`` for ``ravex status``.

A rerun that finds a checkpoint and exits without restoring it looks, from its exit status,
like a run that went well; ``ravex status`` shows what the last run under this ``ravex.yaml``
did with the step it found. The record is one small JSON file per store in ``.ravex/`` next to
the ``ravex.yaml`` that configured the run, written once at exit by rank 0 alone and replaced
whole (atomically), so no file is read, modified and written back by several processes. It is
not kept in the store: every byte there belongs to the format (``spec/FORMAT.md``), which has
no place for a run's outcome. Runs configured without a ``ravex.yaml`` are not recorded:
``ravex status`` finds its store through that file, so it would find no record anyway.
``.ravex/`` ignores itself in git.

Torch-free, so that ``ravex status`` stays a light command.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields

from ravex.format.storage.atomic import atomic_write

from ..config import RavexConfig

RECORD_DIR = ".ravex"


@dataclass(frozen=True)
class RunRecord:
    """What one run did with the store it was configured for."""

    store: str  #: the store's local path, or its URL when remote
    ended: str  #: when the run shut down, ISO 8601 UTC
    pid: int
    found: int | None  #: the complete step it found to resume from, or None
    restored: int | None  #: the step restored into the live objects, or None
    steps: int  #: optimizer steps this run took
    crashed: bool  #: it ended with an uncaught exception

    def resume_line(self) -> str:
        """The resume's outcome in a few words: ``found step 60, not restored``."""
        if self.found is None:
            return "no checkpoint found (a fresh start)"
        if self.restored is not None:
            older = f" (step {self.found} was unreadable)" if self.restored != self.found else ""
            return f"restored step {self.restored}{older}"
        return f"found step {self.found}, not restored" + (
            " (the run raised before restoring)" if self.crashed else "")


def store_key(config: RavexConfig) -> str:
    """The store as the record names it: an absolute path for local stores, else the URL."""
    return config.storage.local_path or config.storage.url


def record_path(config: RavexConfig) -> str | None:
    """Where the record of ``config``'s store lives; None without a ``ravex.yaml``."""
    if not config.config_file:
        return None
    digest = hashlib.sha256(store_key(config).encode("utf-8")).hexdigest()[:16]
    return os.path.join(os.path.dirname(config.config_file), RECORD_DIR, f"last-run-{digest}.json")


def write(config: RavexConfig, record: RunRecord) -> None:
    """Replace the record of ``config``'s store (nothing without a ``ravex.yaml``)."""
    path = record_path(config)
    if path is None:
        return
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, ".gitignore"), "w") as fh:
            fh.write("# Ravex's record of the last runs, for `ravex status`: never versioned.\n*\n")
    atomic_write(path, json.dumps(asdict(record), indent=1).encode("utf-8"))


def read(config: RavexConfig) -> RunRecord | None:
    """The record of ``config``'s store; None where there is none or it cannot be read."""
    path = record_path(config)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
        record = RunRecord(**{f.name: data[f.name] for f in fields(RunRecord)})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return record if record.store == store_key(config) else None
