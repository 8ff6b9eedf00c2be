"""Any fsspec file system as a store: :class:`FsspecStorage` (``s3://``, ``gs://``, ``memory://``)."""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import fsspec
import fsspec.asyn

from ..errors import StorageError
from .base import BytesLike, ObjectInfo, Storage
from .retry import DEFAULT_RETRY, RetryPolicy, call_with_retries

T = TypeVar("T")


class FsspecStorage(Storage):
    """Any fsspec filesystem: ``s3://``, ``gs://``, ``memory://`` and the rest.

    Every call goes through :meth:`_retry`. For ``s3://`` the inner retry loops of
    botocore and s3fs are switched off (unless ``storage_options`` sets botocore's
    ``retries`` itself), so one policy decides how often and how long.
    """

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
    ) -> None:
        options = dict(storage_options or {})
        protocol = url.split("://", 1)[0].lower()
        own_retries = protocol in ("s3", "s3a")
        if own_retries:
            config = dict(options.get("config_kwargs") or {})
            own_retries = "retries" not in config
            if own_retries:
                config["retries"] = {"mode": "standard", "total_max_attempts": 1}
                options["config_kwargs"] = config
        self.fs, root = fsspec.core.url_to_fs(url, **options)
        if own_retries and hasattr(self.fs, "retries"):
            self.fs.retries = 1  # s3fs's own loop (5 tries by default) wraps botocore's
        self.root = root.rstrip("/")
        self._url = url.rstrip("/")
        self.retry_policy = retry or DEFAULT_RETRY
        self._rng = random.Random()
        # s3fs HEADs an object before reading it whole, to split big reads; ours are small.
        self._cat_kwargs: dict[str, Any] = {"max_concurrency": 1} if protocol in ("s3", "s3a") else {}
        #: How many retries this storage made (for tests, logs and status).
        self.retries = 0

    @property
    def url(self) -> str:
        return self._url

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _retry(self, op: str, key: str, fn: Callable[[], T], absent_ok: bool = False) -> T:
        """``fn`` under this storage's policy (:func:`~.retry.call_with_retries`)."""
        return call_with_retries(self.retry_policy, self._rng, self.url, op, key, fn, absent_ok, self._count_retry)

    def _count_retry(self) -> None:
        with _RETRY_LOCK:
            self.retries += 1

    def read(self, key: str) -> bytes:
        path = self._path(key)
        data: bytes = self._retry("read", key, lambda: self.fs.cat_file(path, **self._cat_kwargs), absent_ok=True)
        return data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        data: bytes = self._retry("read", key, lambda: self.fs.cat_file(path, start=start, end=end), absent_ok=True)
        return data

    def write(self, key: str, data: BytesLike) -> None:
        path = self._path(key)
        body = bytes(data)
        self._retry("write", key, lambda: self.fs.pipe_file(path, body))

    def create(self, key: str, data: BytesLike) -> bool:
        """One conditional PUT (``If-None-Match: *``, fsspec's ``mode="create"``) where the file
        system has one (S3, memory); elsewhere fsspec looks, then writes (the window of
        :meth:`Storage.create`). A PUT retried after its answer was lost may find its own first
        try landed: the name holds exactly these bytes then, and the create won."""
        path = self._path(key)
        body = bytes(data)

        def put() -> bool:
            try:
                self.fs.pipe_file(path, body, mode="create")
            except FileExistsError:
                return False
            except TypeError:  # a file system whose pipe_file takes no mode: look, then write
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, body)
            return True

        if self._retry("create", key, put):
            return True
        try:
            return self.read(key) == body
        except FileNotFoundError:
            return False

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return bool(self._retry("exists", key, lambda: self.fs.exists(path)))

    def size(self, key: str) -> int:
        path = self._path(key)
        return int(self._retry("size", key, lambda: self.fs.size(path), absent_ok=True))

    def list_dir(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        try:
            entries = self._retry("list", prefix, lambda: self._ls(path), absent_ok=True)
        except FileNotFoundError:
            return []
        except StorageError as exc:
            if isinstance(exc.__cause__, NotADirectoryError):
                return []
            raise
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def _ls(self, path: str) -> list[str]:
        """The names in the folder ``path``. s3fs's ``ls`` of a folder that does not exist
        lists its parent too (to tell a missing folder from a file): a second LIST request for
        each of a store's optional folders (``timelines/``, ``tags/``, ``repack/``) that GC and
        every open look at; its one-request listing is used instead."""
        lsdir = getattr(self.fs, "_lsdir", None)
        if lsdir is not None and type(self.fs).__module__.startswith("s3fs"):
            return [e["name"] for e in fsspec.asyn.sync(self.fs.loop, lsdir, path, refresh=True)]
        return list(self.fs.ls(path, detail=False, refresh=True))

    def walk(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self._path(prefix)
        try:
            found = self._retry("walk", prefix, lambda: self.fs.find(base, detail=True, withdirs=False), absent_ok=True)
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
        keys = list(keys)
        paths = [self._path(k) for k in keys]
        if not paths:
            return
        what = keys[0] if len(keys) == 1 else f"{keys[0]} and {len(keys) - 1} more"

        def remove_one(p: str) -> None:
            try:
                self.fs.rm_file(p)
            except FileNotFoundError:
                pass

        try:
            self._retry("delete", what, lambda: self.fs.rm(paths), absent_ok=True)
        except FileNotFoundError:
            for p, k in zip(paths, keys, strict=True):
                self._retry("delete", k, functools.partial(remove_one, p))

    def delete_if_older(self, key: str, cutoff: float) -> bool:
        """One HEAD for the age, then the DELETE: the short window spec/FORMAT.md (GC, A5) assumes.
        The base class's listing would cost a LIST per collected object. ``refresh``: never an age
        from fsspec's cache of an earlier listing."""
        path = self._path(key)
        try:
            info = self._retry("head", key, lambda: self.fs.info(path, refresh=True), absent_ok=True)
        except FileNotFoundError:
            return False
        if info.get("type") == "directory" or _mtime(info) >= cutoff:
            return False
        self.delete([key])
        return True


_RETRY_LOCK = threading.Lock()


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

