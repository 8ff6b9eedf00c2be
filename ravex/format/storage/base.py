"""The one seam between the format and bytes on storage: :class:`Storage`.

:class:`Storage` is a dozen small methods over keys relative to the store root
(``ravex.json``, ``objects/ab/ab...``, ``steps/100/rank-0.json``). What an
implementation can do beyond them is declared as class attributes
(:attr:`Storage.is_local_filesystem`), never found out by testing its type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TypeAlias

#: What a write takes: any contiguous bytes.
BytesLike: TypeAlias = bytes | bytearray | memoryview


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

    #: Keys are files under a local directory (:meth:`local_path`): a folder exists on its own,
    #: so an empty one is listed and must be removed (:meth:`remove_empty_dir`); reads cost no
    #: round trip, so nothing gains from issuing them in parallel; tools on this machine (hard
    #: links, tensorstore's ``file`` driver) can open the files directly.
    is_local_filesystem: bool = False

    def local_path(self, key: str) -> str | None:
        """The file that holds ``key`` on this machine's file system, or None for a store that
        has no such file (:attr:`is_local_filesystem`)."""
        return None

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
    def write(self, key: str, data: BytesLike) -> None:
        """Write an object atomically: a reader sees all of it or none of it."""

    def write_pending(self, key: str, data: BytesLike) -> PendingWrite | None:
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

    def exclusive(self) -> AbstractContextManager[None]:
        """Held by one process of this machine at a time, for work its processes share (the
        ranks of one machine fetching a step into their local tier). Default: no lock."""
        return nullcontext()

    def create(self, key: str, data: BytesLike) -> bool:
        """Write a small document once: False, writing nothing, if ``key`` exists. Timelines and
        tags are created this way, so two writers of one name cannot both win. Default: look,
        then write; object stores that lack a conditional PUT leave a short window between the
        two (spec/FORMAT.md §19 says who may race there)."""
        if self.exists(key):
            return False
        self.write(key, data)
        return True

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

    def remove_empty_dir(self, prefix: str) -> None:  # noqa: B027 - object stores have no folders
        """Remove ``prefix`` if it is an empty folder (after its step was deleted)."""
