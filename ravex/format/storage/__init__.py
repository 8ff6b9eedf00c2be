"""The one seam between the format and bytes on storage.

:class:`Storage` (:mod:`.base`) is a dozen small methods over keys relative to the store
root. Two implementations, one per module: :class:`LocalStorage` (:mod:`.local`) uses
``os`` directly so that writes are durable (fsync of file and folder) and atomic (temp file
and rename, :mod:`.atomic`); :class:`FsspecStorage` (:mod:`.fsspec_store`) serves every
other fsspec URL (``s3://``, ``gs://``, ``memory://``), where a single PUT is already
atomic, and retries transient faults under one :class:`RetryPolicy` (:mod:`.retry`,
:mod:`.faults`). ``FileNotFoundError`` from a read stays what it is; every other error
reaches the caller as :class:`~ravex.format.errors.StorageError`. The options of S3-compatible
stores (endpoint, credentials) are :mod:`.remote`'s.
"""

from __future__ import annotations

import os
from typing import Any

from .atomic import atomic_directory, atomic_file, atomic_write
from .base import ObjectInfo, PendingWrite, Storage
from .faults import is_transient
from .fsspec_store import FsspecStorage
from .local import LocalStorage
from .retry import DEFAULT_RETRY, RetryPolicy
from .writeback import start_writeback

__all__ = [
    "DEFAULT_RETRY",
    "FsspecStorage",
    "LocalStorage",
    "ObjectInfo",
    "PendingWrite",
    "RetryPolicy",
    "Storage",
    "atomic_directory",
    "atomic_file",
    "atomic_write",
    "is_transient",
    "open_storage",
    "start_writeback",
]


def open_storage(
    url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
) -> Storage:
    """A :class:`Storage` for a path or fsspec URL (``file://`` and plain paths are local).

    ``retry`` applies to remote stores (default :data:`DEFAULT_RETRY`); local disks do
    not fail transiently, so a local error is reported at once.
    """
    url = os.fspath(url)
    if "://" not in url:
        return LocalStorage(url)
    if url.startswith("file://"):
        return LocalStorage(url[len("file://") :])
    return FsspecStorage(url, storage_options, retry)
