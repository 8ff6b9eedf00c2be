"""The one seam between the format and bytes on storage.

:class:`Storage` is a dozen small methods over keys relative to the store root
(``ravex.json``, ``objects/ab/ab...``, ``steps/100/rank-0.json``). Two
implementations: :class:`LocalStorage` uses ``os`` directly so that writes are
durable (fsync of file and directory) and atomic (temp file + rename);
:class:`FsspecStorage` serves every other fsspec URL (``s3://``, ``gs://``,
``memory://``), where a single PUT is already atomic.

Remote calls fail transiently (connection resets, timeouts, 500/502/503, SlowDown).
:class:`FsspecStorage` retries those with exponential backoff and jitter under one
:class:`RetryPolicy` (bounded in tries and in seconds), and nothing else does: for
``s3://`` it turns off botocore's and s3fs's own retry loops, which would otherwise
multiply (botocore's 5 attempts inside each of s3fs's 5). Permanent errors (403,
404, NoSuchBucket, a full or read-only disk) are not retried. Every error that is
not "absent" reaches the caller as :class:`~ravex.format.errors.StorageError`
(a ``RavexError`` and an ``OSError``) naming the store, the operation, the key and
the cause; ``FileNotFoundError`` from a read stays what it is.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import fsspec

from .errors import StorageError

log = logging.getLogger("ravex.format.storage")
T = TypeVar("T")


@dataclass(frozen=True)
class PendingWrite:
    """An object written to a temp file, not yet durable nor visible under its key."""

    key: str
    temp: str
    path: str


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

    def write_pending(self, key: str, data: bytes | memoryview) -> PendingWrite | None:
        """Write an object that need be neither visible nor durable until :meth:`publish`.

        A commit writes its chunk objects this way and publishes them all before its
        manifest names them; a disk then makes them durable in one batch instead of one
        journal commit per object. Returns what ``publish`` or ``discard`` takes, or None
        when the object is already written and durable (the default: :meth:`write`; an
        object store's PUT is durable at once)."""
        self.write(key, data)
        return None

    def publish(self, pending: Sequence[PendingWrite]) -> None:  # noqa: B027 - no-op by default
        """Make pending writes durable and visible under their keys (then ``sync`` the folders)."""

    def discard(self, pending: Sequence[PendingWrite]) -> None:  # noqa: B027 - no-op by default
        """Drop pending writes (a failed commit): nothing of them stays behind."""

    def sync(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Make every completed ``write`` and ``publish`` durable. Called before a manifest is written."""

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

    def delete_if_older(self, key: str, cutoff: float) -> bool:
        """Delete ``key`` if its modification time is before ``cutoff`` (epoch seconds), checked
        just before the delete. Default: look, then delete; object stores offer no atomic
        conditional delete on age, so a small window remains (spec/FORMAT.md, GC)."""
        try:
            mtime = next((o.mtime for o in self.walk(key) if o.key == key), None)
        except FileNotFoundError:
            return False
        if mtime is None or mtime >= cutoff:
            return False
        self.delete([key])
        return True


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Any = None


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages to disk now, without waiting.

    A commit writes its objects first and fsyncs them all at the end (``publish``). Left
    alone, the kernel writes nothing back until that fsync (a 1 GiB commit stays under
    the dirty-page thresholds), so the disk idles while later chunks are hashed and
    written. ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts the disk on each object as
    it is finished; the fsync then waits only for the tail. It is a hint: it gives no
    durability (the fsync still does), and where it is missing (not Linux) or fails,
    nothing changes but the overlap.
    """
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = _load_sync_file_range()
    if _sync_file_range:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # ctypes drops the GIL; errors ignored


def _load_sync_file_range() -> Any:
    """libc's ``sync_file_range`` through ctypes, or False where there is none."""
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


class LocalStorage(Storage):
    """A directory on a local disk: fsync'd, atomic writes.

    ``write`` puts the bytes in a temp file, fsyncs it and renames it into place.
    ``write_pending`` leaves the fsync and the rename to ``publish``, which fsyncs all
    pending temp files in parallel: a 1 GiB commit of 4-16 MiB objects then costs one batch of
    journal commits, not one each (an interleaved A/B of 12 commits each: 1.03 -> 0.94 s per
    GiB, median). A name still appears only once its bytes are durable, so a crash can never
    leave a torn object under a name a manifest may use.
    """

    durable_local = True
    #: Threads fsyncing pending temp files in ``publish`` (the disk queues them together).
    SYNC_THREADS = 8
    #: Hand each pending temp file to the disk as soon as it is written (:func:`start_writeback`).
    START_WRITEBACK = True

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
            size = os.fstat(f.fileno()).st_size
            if start >= size:  # past the end reads nothing (seek past the file system's limit is EINVAL)
                return b""
            f.seek(start)
            return f.read(min(end, size) - start)

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
        try:
            self._write(key, data)
        except OSError as exc:
            raise _storage_error(self.url, "write", key, exc) from exc

    def _write(self, key: str, data: bytes | memoryview) -> None:
        tmp, path = self._write_temp(key, data, fsync=True)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        with self._lock:
            self._dirty.add(os.path.dirname(path))

    def write_pending(self, key: str, data: bytes | memoryview) -> PendingWrite:
        try:
            tmp, path = self._write_temp(key, data, fsync=False)
        except OSError as exc:
            raise _storage_error(self.url, "write", key, exc) from exc
        return PendingWrite(key, tmp, path)

    def _write_temp(self, key: str, data: bytes | memoryview, fsync: bool) -> tuple[str, str]:
        """The bytes in a new temp file beside the object's path: (temp path, final path).
        No temp file is left if this raises."""
        path = self._path(key)
        folder = os.path.dirname(path)
        if folder not in self._made:
            self._make_dirs(folder)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                if fsync:
                    os.fsync(fd)
                elif self.START_WRITEBACK:
                    start_writeback(fd)
            finally:
                os.close(fd)  # close errors (NFS reports late write errors here) count too
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp, path

    def discard(self, pending: Sequence[PendingWrite]) -> None:
        for item in pending:
            _unlink_quietly(item.temp)

    def publish(self, pending: Sequence[PendingWrite]) -> None:
        """fsync every pending temp file (in parallel), then rename each into place. On an
        error, none of them is left as a temp file (those renamed already are whole)."""
        if not pending:
            return

        def fsync_one(item: PendingWrite) -> None:
            try:
                fd = os.open(item.temp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _storage_error(self.url, "write", item.key, exc) from exc

        try:
            if len(pending) == 1:
                fsync_one(pending[0])
            else:
                with ThreadPoolExecutor(min(self.SYNC_THREADS, len(pending)), "ravex-fsync") as pool:
                    list(pool.map(fsync_one, pending))
            for item in pending:
                try:
                    os.replace(item.temp, item.path)
                except OSError as exc:
                    raise _storage_error(self.url, "write", item.key, exc) from exc
                with self._lock:
                    self._dirty.add(os.path.dirname(item.path))
        except BaseException:
            self.discard(pending)  # (a temp already renamed is gone: no-op for it)
            raise

    def _make_dirs(self, folder: str) -> None:
        """Create ``folder`` and record every directory whose entries changed: a new folder's
        own entry lives in its parent, which ``sync`` must fsync too."""
        created = []
        probe = folder
        while probe != self.root and not os.path.isdir(probe):
            created.append(probe)
            probe = os.path.dirname(probe)
        os.makedirs(folder, exist_ok=True)
        with self._lock:
            self._made.add(folder)
            self._dirty.update(os.path.dirname(c) for c in created)

    def sync(self) -> None:
        with self._lock:
            folders, self._dirty = self._dirty, set()
        for folder in folders:
            try:
                fd = os.open(folder, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _storage_error(self.url, "sync", os.path.relpath(folder, self.root), exc) from exc

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
            try:
                _unlink_quietly(path)
            except OSError as exc:
                raise _storage_error(self.url, "delete", key, exc) from exc
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

    def delete_if_older(self, key: str, cutoff: float) -> bool:
        """Delete ``key`` only if its mtime, checked after it is moved aside, is before ``cutoff``.

        Moving it aside first closes the race with a writer that re-stores the same bytes
        between GC's listing and the delete: either the writer's copy lands after the move
        (and stays), or it is the one moved aside, found young, and put back. A young object
        is not moved at all when the age check before the move already sees it: a GC killed
        between moving it aside and putting it back would lose it for the writer's step.
        """
        path = self._path(key)
        try:
            if os.stat(path).st_mtime >= cutoff:
                return False
        except FileNotFoundError:
            return False
        aside = os.path.join(os.path.dirname(path), f".gc-{uuid.uuid4().hex}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if os.stat(aside).st_mtime < cutoff:
            os.unlink(aside)
            return True
        try:
            os.link(aside, path)  # put back, unless a writer has stored it again meanwhile
        except FileExistsError:
            pass
        os.unlink(aside)
        return False

    def remove_empty_dir(self, prefix: str) -> None:
        """Remove ``prefix`` if it is an empty folder (after its step was deleted)."""
        try:
            os.rmdir(self._path(prefix))
        except OSError:
            pass


@dataclass(frozen=True)
class RetryPolicy:
    """How :class:`FsspecStorage` retries transient faults.

    At most ``tries`` attempts per operation; before attempt ``n + 1`` it sleeps a
    random time in ``[d/2, d]`` with ``d = min(max_delay, base_delay * 2**(n-1))``
    ("equal jitter": backoff grows, concurrent writers spread out). It gives up early
    rather than start a sleep that would end past ``budget_seconds`` after the first
    attempt began, so a persistent outage costs one operation at most about that long.
    ``RetryPolicy(tries=1)`` disables retries.
    """

    tries: int = 6
    base_delay: float = 0.2
    max_delay: float = 3.0
    budget_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.tries < 1:
            raise ValueError(f"RetryPolicy.tries={self.tries}: at least one attempt")
        if self.base_delay < 0 or self.max_delay < 0 or self.budget_seconds < 0:
            raise ValueError("RetryPolicy delays and budget must be >= 0")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep after failed attempt number ``attempt`` (1-based)."""
        d = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return d / 2 + (rng or random).uniform(0, d / 2)


DEFAULT_RETRY = RetryPolicy()

#: Exception classes (matched by name anywhere in the MRO, so that botocore, aiohttp and
#: fsspec need not be imported) that mean "the request may not have reached the server,
#: or its answer was lost": retried.
_TRANSIENT_CLASSES = frozenset(
    {
        "ConnectionError",  # builtin (reset, refused, aborted, broken pipe) and botocore's
        "TimeoutError",  # builtin, socket.timeout, fsspec FSTimeoutError, aiohttp timeouts
        "HTTPClientError",  # botocore: ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
        "IncompleteReadError",
        "ResponseParserError",  # throttling answers with broken XML (s3fs issue 484)
        "ClientConnectionError",  # aiohttp: ServerDisconnectedError, ClientOSError
        "ClientPayloadError",
    }
)
#: Error codes of S3-style services that are worth retrying.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "OperationAborted",
        "BadDigest",  # body damaged in transit
        "XAmzContentSHA256Mismatch",
    }
)
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504, 509})
_PERMANENT_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR}
)


def _http_status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """Status and service error code of an HTTP error, looking through ``__cause__``."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            meta = response.get("ResponseMetadata") or {}
            err = response.get("Error") or {}
            status = meta.get("HTTPStatusCode")
            return (int(status) if status else None), err.get("Code")
        status = getattr(e, "status", None) or getattr(e, "code", None)  # aiohttp, gcsfs
        if isinstance(status, int) and 100 <= status < 600:
            return status, None
        e = e.__cause__ or e.__context__
        seen += 1
    return None, None


def is_transient(exc: BaseException) -> bool:
    """Whether an exception from a storage call is worth retrying."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)):
        return False
    status, code = _http_status_and_code(exc)
    if code is not None and code in _TRANSIENT_CODES:
        return True
    if status is not None:
        return status in _TRANSIENT_STATUS
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return False
    names = {c.__name__ for c in type(exc).__mro__}
    if names & _TRANSIENT_CLASSES:
        return True
    cause = exc.__cause__
    return cause is not None and cause is not exc and is_transient(cause)


def _describe(exc: BaseException) -> str:
    """``HTTP 503 SlowDown: Please reduce your request rate.``, ``ConnectionResetError: ...``"""
    text = str(exc) or repr(exc)
    status, code = _http_status_and_code(exc)
    if status is not None:
        return f"HTTP {status}{f' {code}' if code else ''}: {text}"
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _storage_error(url: str, op: str, key: str, exc: BaseException, note: str = "") -> StorageError:
    err = StorageError(f"store {url!r}: {op} {key!r} failed{note}: {_describe(exc)}")
    if isinstance(exc, OSError) and exc.errno is not None:
        err.errno = exc.errno  # (not strerror: OSError.__str__ would then drop the message)
    return err


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
        """Run ``fn`` under the retry policy. ``absent_ok``: ``FileNotFoundError`` is an
        answer (reads), passed through; otherwise it is a failure like any other."""
        policy = self.retry_policy
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:
                if absent_ok and isinstance(exc, FileNotFoundError):
                    raise
                elapsed = time.monotonic() - started
                transient = is_transient(exc)
                pause = policy.delay(attempt, self._rng) if transient else 0.0
                if not transient or attempt >= policy.tries or elapsed + pause > policy.budget_seconds:
                    note = f" after {attempt} tries in {elapsed:.1f} s" if transient and attempt > 1 else ""
                    if not transient and attempt > 1:
                        note = f" on try {attempt}"
                    raise _storage_error(self.url, op, key, exc, note) from exc
                log.debug("%s %s %r: %s; retry %d in %.2f s", self.url, op, key, _describe(exc), attempt, pause)
                with _RETRY_LOCK:
                    self.retries += 1
                time.sleep(pause)

    def read(self, key: str) -> bytes:
        path = self._path(key)
        return self._retry("read", key, lambda: self.fs.cat_file(path, **self._cat_kwargs), absent_ok=True)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        return self._retry("read", key, lambda: self.fs.cat_file(path, start=start, end=end), absent_ok=True)

    def write(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        body = bytes(data)
        self._retry("write", key, lambda: self.fs.pipe_file(path, body))

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return self._retry("exists", key, lambda: self.fs.exists(path))

    def size(self, key: str) -> int:
        path = self._path(key)
        return int(self._retry("size", key, lambda: self.fs.size(path), absent_ok=True))

    def list_dir(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        try:
            entries = self._retry("list", prefix, lambda: self.fs.ls(path, detail=False, refresh=True), absent_ok=True)
        except FileNotFoundError:
            return []
        except StorageError as exc:
            if isinstance(exc.__cause__, NotADirectoryError):
                return []
            raise
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

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
                self._retry("delete", k, lambda p=p: remove_one(p))

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


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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
