"""The one seam between the format and bytes on storage.

:class:`Storage` is a dozen small methods over keys relative to the store root
(``ravex.json``, ``objects/ab/ab...``, ``steps/100/rank-0.json``). Two
implementations: :class:`LocalStorage` uses ``os`` directly so that writes are
durable (fsync of file and directory) and atomic (temp file + rename);
:class:`FsspecStorage` serves every other fsspec URL (``s3://``, ``gs://``,
``memory://``), where a single PUT is already atomic.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec


@dataclass(frozen=True)
class ObjectInfo:
    """An entry of a listing: key relative to the root, size, modification time (epoch s)."""

    key: str
    size: int
    mtime: float


class Storage(ABC):
    """Byte storage under one root. Keys use ``/`` and never start with it."""

    #: Whether ``write`` fsyncs (local disks). Remote object stores are durable on PUT.
    durable_local: bool = False

    @property
    @abstractmethod
    def url(self) -> str:
        """The root as a URL or path a user would type."""

    @abstractmethod
    def read(self, key: str) -> bytes:
        """Whole object; ``FileNotFoundError`` if absent."""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object."""

    def read_into(self, key: str, out: memoryview) -> int:
        """Read an object into ``out``; returns its size. Default: read, then copy."""
        data = self.read(key)
        out[: len(data)] = data
        return len(data)

    @abstractmethod
    def write(self, key: str, data: bytes | memoryview) -> None:
        """Write an object atomically: a reader sees all of it or none of it."""

    def sync(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Make every completed ``write`` durable. Called before a manifest is written."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object exists."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Size of an object; ``FileNotFoundError`` if absent."""

    @abstractmethod
    def list_dir(self, prefix: str) -> list[str]:
        """Names of the immediate children of ``prefix`` (files and folders), sorted."""

    @abstractmethod
    def walk(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object below ``prefix``, recursively, with size and mtime."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete objects; absent ones are ignored."""


class LocalStorage(Storage):
    """A directory on a local disk: fsync'd, atomic writes."""

    durable_local = True

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._made: set[str] = set()
        self._dirty: set[str] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def read(self, key: str) -> bytes:
        with open(self._path(key), "rb") as f:
            return f.read()

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with open(self._path(key), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def read_into(self, key: str, out: memoryview) -> int:
        with open(self._path(key), "rb", buffering=0) as f:
            total = 0
            while total < len(out):
                n = f.readinto(out[total:])
                if not n:
                    break
                total += n
            if total == len(out) and f.read(1):
                total += 1 + len(f.read())  # larger than the caller expected
            return total

    def write(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            with self._lock:
                self._made.add(folder)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        with self._lock:
            self._dirty.add(folder)

    def sync(self) -> None:
        with self._lock:
            folders, self._dirty = self._dirty, set()
        for folder in folders:
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def size(self, key: str) -> int:
        return os.stat(self._path(key)).st_size

    def list_dir(self, prefix: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(prefix)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self._path(prefix)
        for folder, _dirs, files in os.walk(base):
            rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
            for name in files:
                try:
                    st = os.stat(os.path.join(folder, name))
                except FileNotFoundError:
                    continue
                yield ObjectInfo(f"{rel}/{name}", st.st_size, st.st_mtime)

    def delete(self, keys: Iterable[str]) -> None:
        folders = set()
        for key in keys:
            path = self._path(key)
            _unlink_quietly(path)
            folders.add(os.path.dirname(path))
        for folder in folders:
            try:
                fd = os.open(folder, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def remove_empty_dir(self, prefix: str) -> None:
        """Remove ``prefix`` if it is an empty folder (after its step was deleted)."""
        try:
            os.rmdir(self._path(prefix))
        except OSError:
            pass


class FsspecStorage(Storage):
    """Any fsspec filesystem: ``s3://``, ``gs://``, ``memory://`` and the rest."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.root = root.rstrip("/")
        self._url = url.rstrip("/")

    @property
    def url(self) -> str:
        return self._url

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def read(self, key: str) -> bytes:
        return self.fs.cat_file(self._path(key))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.fs.cat_file(self._path(key), start=start, end=end)

    def write(self, key: str, data: bytes | memoryview) -> None:
        self.fs.pipe_file(self._path(key), bytes(data))

    def exists(self, key: str) -> bool:
        return self.fs.exists(self._path(key))

    def size(self, key: str) -> int:
        return int(self.fs.size(self._path(key)))

    def list_dir(self, prefix: str) -> list[str]:
        try:
            entries = self.fs.ls(self._path(prefix), detail=False, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def walk(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self._path(prefix)
        try:
            found = self.fs.find(base, detail=True, withdirs=False)
        except FileNotFoundError:
            return
        root = self.root.lstrip("/")
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            key = path.lstrip("/")
            if root:
                key = key[len(root) + 1 :] if key.startswith(root + "/") else key
            yield ObjectInfo(key, int(info.get("size") or 0), _mtime(info))

    def delete(self, keys: Iterable[str]) -> None:
        paths = [self._path(k) for k in keys]
        if paths:
            try:
                self.fs.rm(paths)
            except FileNotFoundError:
                for p in paths:
                    try:
                        self.fs.rm_file(p)
                    except FileNotFoundError:
                        pass


def _mtime(info: dict[str, Any]) -> float:
    for field in ("LastModified", "mtime", "created", "updated"):
        value = info.get(field)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        try:
            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return time.time()  # unknown: treat as fresh, so GC never deletes it early


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def open_storage(url: str, storage_options: dict[str, Any] | None = None) -> Storage:
    """A :class:`Storage` for a path or fsspec URL (``file://`` and plain paths are local)."""
    url = os.fspath(url)
    if "://" not in url:
        return LocalStorage(url)
    if url.startswith("file://"):
        return LocalStorage(url[len("file://") :])
    return FsspecStorage(url, storage_options)
