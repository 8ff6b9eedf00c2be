"""The one way Ravex writes a local file: into a temp file beside it, then renamed into place.

A reader (or a crash) sees the old file or the new one whole, never a torn one. Every
local writer uses these: the store's objects and manifests (:class:`~.local.LocalStorage`),
exports, the pickle backend and the CLI's autoloader file. Temp files are named
``.tmp-<uuid>`` in the target's folder (the same file system, so the rename is atomic; the
name says what a crash leaves behind).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from .base import BytesLike
from .writeback import start_writeback


def temp_path(path: str) -> str:
    """A fresh temp name in ``path``'s folder."""
    return os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")


def unlink_quietly(path: str) -> None:
    """Remove a file; an absent one is not an error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_path(path: str) -> None:
    """fsync a file or a folder by path (a folder's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(path: str, data: BytesLike, fsync: bool, writeback: bool = False) -> str:
    """``data`` in a new temp file beside ``path`` (fsync'd, or with ``writeback`` handed to the
    disk without waiting: :func:`~.writeback.start_writeback`); returns the temp file's path.
    No temp file is left if this raises. :func:`replace` finishes the write."""
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
            elif writeback:
                start_writeback(fd)
        finally:
            os.close(fd)  # close errors (NFS reports late write errors here) count too
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def replace(tmp: str, path: str) -> None:
    """Rename a finished temp file onto ``path``; on an error the temp file is removed."""
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def atomic_write(path: str | os.PathLike[str], data: BytesLike) -> None:
    """Write ``path`` whole or not at all, durably (the file is fsync'd before the rename)."""
    path = os.fspath(path)
    replace(write_temp(path, data, fsync=True), path)


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to stream into; when the block ends without an error its bytes are
    fsync'd and appear under ``path`` at once. On an error ``path`` is untouched and the
    temp file removed."""
    path = os.fspath(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[str]:
    """A temp folder to fill; when the block ends without an error it is renamed to ``path``
    (which must not exist). On an error it is removed, and ``path`` never appears."""
    path = os.fspath(path)
    tmp = temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
