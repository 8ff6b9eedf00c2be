"""A store on a local disk: :class:`LocalStorage`."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from . import atomic, direct
from .base import BytesLike, ObjectInfo, PendingWrite, Storage
from .faults import storage_error

try:
    import fcntl

    _FLOCK = True
except ImportError:  # Windows
    _FLOCK = False


class LocalStorage(Storage):
    """A directory on a local disk: fsync'd, atomic writes.

    ``write`` puts the bytes in a temp file, fsyncs it and renames it into place.
    ``write_pending`` leaves the fsync and the rename to ``publish``, which fsyncs all
    pending temp files in parallel: a 1 GiB commit of 4-16 MiB objects then costs one batch of
    journal commits, not one each (0.94 s per GiB against 1.03 with an fsync per object, the
    median of 12 interleaved commits each). A name still appears only once its bytes are durable, so a crash can never
    leave a torn object under a name a manifest may use.
    """

    is_local_filesystem = True
    #: Threads fsyncing pending temp files in ``publish`` (the disk queues them together).
    SYNC_THREADS = 8
    #: Hand each pending temp file to the disk as soon as it is written (:func:`~.writeback.start_writeback`).
    START_WRITEBACK = True
    #: Write large objects from aligned buffers past the page cache (:mod:`.direct`).
    DIRECT = True

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

    def local_path(self, key: str) -> str:
        return self._path(key)

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

    def write(self, key: str, data: BytesLike) -> None:
        path = self._folder_made(key)
        try:
            atomic.atomic_write(path, data)
        except OSError as exc:
            raise storage_error(self.url, "write", key, exc) from exc
        with self._lock:
            self._dirty.add(os.path.dirname(path))

    def create(self, key: str, data: BytesLike) -> bool:
        """The bytes go to a durable temp file, then ``link`` gives it the name: the link fails
        when the name exists, so of two creators exactly one wins, and the winner's file is
        whole (docstring of :meth:`Storage.create`)."""
        path = self._folder_made(key)
        try:
            tmp = atomic.write_temp(path, data, fsync=True)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                atomic.unlink_quietly(tmp)
            atomic.fsync_path(os.path.dirname(path))
        except OSError as exc:
            raise storage_error(self.url, "create", key, exc) from exc
        return True

    def write_pending(self, key: str, data: BytesLike) -> PendingWrite:
        path = self._folder_made(key)
        try:
            tmp = self._write_direct(path, data) or atomic.write_temp(
                path, data, fsync=False, writeback=self.START_WRITEBACK)
        except OSError as exc:
            raise storage_error(self.url, "write", key, exc) from exc
        return PendingWrite(key, tmp, path)

    def _write_direct(self, path: str, data: BytesLike) -> str | None:
        """``data`` in a temp file beside ``path`` written past the page cache, where
        :data:`DIRECT` is on and :func:`~.direct.write_direct` can; else None."""
        if not self.DIRECT:
            return None
        tmp = atomic.temp_path(path)
        try:
            return tmp if direct.write_direct(tmp, memoryview(data)) else None
        except BaseException:
            atomic.unlink_quietly(tmp)
            raise

    def _folder_made(self, key: str) -> str:
        """The path of ``key``, its folder created if this storage has not made it yet."""
        path = self._path(key)
        folder = os.path.dirname(path)
        if folder not in self._made:
            try:
                self._make_dirs(folder)
            except OSError as exc:
                raise storage_error(self.url, "write", key, exc) from exc
        return path

    def discard(self, pending: Sequence[PendingWrite]) -> None:
        for item in pending:
            atomic.unlink_quietly(item.temp)

    def publish(self, pending: Sequence[PendingWrite]) -> None:
        """fsync every pending temp file (in parallel), then rename each into place. On an
        error, none of them is left as a temp file (those renamed already are whole)."""
        if not pending:
            return

        def fsync_one(item: PendingWrite) -> None:
            try:
                atomic.fsync_path(item.temp)
            except OSError as exc:
                raise storage_error(self.url, "write", item.key, exc) from exc

        try:
            if len(pending) == 1:
                fsync_one(pending[0])
            else:
                with ThreadPoolExecutor(min(self.SYNC_THREADS, len(pending)), "ravex-fsync") as pool:
                    list(pool.map(fsync_one, pending))
            for item in pending:
                try:
                    atomic.replace(item.temp, item.path)
                except OSError as exc:
                    raise storage_error(self.url, "write", item.key, exc) from exc
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

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """``flock`` on the store's folder (no file is created): the processes of this machine
        take turns. Where ``fcntl`` is missing (Windows) or the file system refuses ``flock``
        (some cluster file systems), no lock: each process then does the work itself, as the
        work shared this way is the same whoever does it."""
        if not _FLOCK:
            yield
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
            yield
        finally:
            os.close(fd)  # (closing the descriptor releases the lock)

    def sync(self) -> None:
        with self._lock:
            folders, self._dirty = self._dirty, set()
        for folder in folders:
            try:
                atomic.fsync_path(folder)
            except FileNotFoundError:
                continue  # removed since it was written into (a retired step's): nothing there to keep
            except OSError as exc:
                raise storage_error(self.url, "sync", os.path.relpath(folder, self.root), exc) from exc

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
                atomic.unlink_quietly(path)
            except OSError as exc:
                raise storage_error(self.url, "delete", key, exc) from exc
            folders.add(os.path.dirname(path))
        for folder in folders:
            try:
                atomic.fsync_path(folder)
            except FileNotFoundError:
                continue  # no such folder: nothing in it was deleted

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
        folder = self._path(prefix)
        try:
            os.rmdir(folder)
        except OSError:
            return
        with self._lock:  # nothing left there to sync; and a late write there (a retired step's
            self._dirty.discard(folder)  # witness) fails rather than make the folder again
