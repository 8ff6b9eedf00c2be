"""A checkpoint store and the verbs that act on it: :func:`open_store`, :class:`CheckpointStore`.

:class:`CheckpointStore` is the :class:`~ravex.format.catalog.StoreCatalog` (steps,
manifests, completeness) with the verbs that open a writer, a reader or a collection
(:mod:`.writer`, :mod:`.reader`, :mod:`.gc`). Those modules work on the catalog and never
import this one, so the import graph has no cycle.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import clock
from ._version import FORMAT_NAME, SPEC_VERSION, check_version
from .catalog import StepFiles, StepInfo, StoreCatalog
from .errors import ManifestError, StoreNotFoundError
from .gc import DEFAULT_GRACE_SECONDS, GCReport, gc
from .hashing import HASH_NAME
from .reader import StepReader
from .storage import RetryPolicy, open_storage
from .writer import StepWriter

__all__ = ["ROOT_KEY", "CheckpointStore", "StepFiles", "StepInfo", "open_store"]

ROOT_KEY = "ravex.json"


class CheckpointStore(StoreCatalog):
    """One Ravex store. Open with :func:`open_store`."""

    def writer(self, *args: Any, **options: Any) -> StepWriter:
        """A writer for one rank (arguments: :class:`~ravex.format.writer.StepWriter`'s after the
        store); it keeps the delta base between commits (``delta=False`` stores every chunk anew
        each time)."""
        return StepWriter(self, *args, **options)

    def open_step(self, step: int | str = "latest") -> StepReader:
        """A reader over one complete step (all ranks' manifests merged)."""
        return StepReader(self, self.resolve_step(step))

    def read(self, step: int | str = "latest", rank: int = 0, subtree: Any = None) -> Any:
        """The state tree of a step with numpy arrays at the leaves."""
        return self.open_step(step).read(rank=rank, subtree=subtree)

    def gc(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        dry_run: bool = False,
    ) -> GCReport:
        """Apply retention, then delete unreferenced objects older than the grace period."""
        return gc(self, keep_last=keep_last, keep_every=keep_every, grace_seconds=grace_seconds, dry_run=dry_run)


def open_store(
    url: str | os.PathLike[str],
    create: bool = False,
    storage_options: dict[str, Any] | None = None,
    created_by: str | None = None,
    retry: RetryPolicy | None = None,
) -> CheckpointStore:
    """Open (or with ``create=True``, create) the store at a path or fsspec URL.

    ``retry`` bounds how remote calls are retried (:class:`~ravex.format.storage.RetryPolicy`).
    """
    storage = open_storage(os.fspath(url), storage_options, retry)
    try:
        data = storage.read(ROOT_KEY)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: the path is a file
        if not create:
            raise StoreNotFoundError(
                f"{storage.url!r} is not a Ravex store (no {ROOT_KEY}); check the path, "
                "or pass create=True to start a new one"
            ) from None
        root = {
            "format": FORMAT_NAME,
            "version": SPEC_VERSION,
            "hash": HASH_NAME,
            "created_by": created_by or _creator(),
            "created_at": clock.now_iso(),
        }
        storage.write(ROOT_KEY, json.dumps(root, indent=2).encode() + b"\n")
        storage.sync()
        return CheckpointStore(storage, root)
    where = f"{storage.url}/{ROOT_KEY}"
    try:
        root = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit int
        raise ManifestError(f"{where}: malformed JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(root, dict) or root.get("format") != FORMAT_NAME:
        raise ManifestError(f"{where}: not a Ravex root document (format != {FORMAT_NAME!r})")
    check_version(root.get("version"), where)
    if root.get("hash") != HASH_NAME:
        raise ManifestError(f"{where}: hash {root.get('hash')!r} is unknown; expected {HASH_NAME!r}")
    return CheckpointStore(storage, root)


def _creator() -> str:
    try:
        from importlib.metadata import version

        return f"ravex {version('ravex')}"
    except Exception:
        return "ravex"
