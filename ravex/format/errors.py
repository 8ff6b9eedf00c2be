"""Errors raised by the format layer.

One base class, :class:`RavexError`. Subclasses also inherit the builtin a caller
would already catch (``FileNotFoundError``, ``ValueError``), the way zarr-python's
errors do, so existing ``except`` clauses keep working. Every message names the
store, step, rank or tensor involved and, where there is one, the fix.
"""

from __future__ import annotations


class RavexError(Exception):
    """Base class of every error Ravex raises on purpose."""


class StoreNotFoundError(RavexError, FileNotFoundError):
    """The store has no ``ravex.json``: it is not a Ravex store (or does not exist)."""


class StepNotFoundError(RavexError, KeyError):
    """The asked-for step is not in the store, or not complete."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ArrayNotFoundError(RavexError, KeyError):
    """The asked-for tensor is not in the step."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FormatVersionError(RavexError, ValueError):
    """The store or a manifest was written by an unknown major version of the spec."""


class ManifestError(RavexError, ValueError):
    """A manifest is truncated, malformed, or names something it must not."""


class UnsafeNameError(ManifestError):
    """A name in a manifest would escape the store (``..``, absolute path, bad object name)."""


class CorruptObjectError(RavexError, OSError):
    """An object is missing, has the wrong size, or its bytes do not match its name."""


class UnsupportedValueError(RavexError, TypeError):
    """A value in a state tree has a type the format cannot store without pickle."""


class StorageError(RavexError, OSError):
    """Storage failed: a write, read, listing or delete gave an error, after any retries.

    The message names the store, the operation, the key and the cause (and how many
    tries it took); ``errno`` is the cause's where it had one (``ENOSPC``, ``EROFS``,
    ``EACCES``). The cause is ``__cause__``.
    """


class RemoteConfigError(RavexError, ValueError):
    """Options of a remote store are missing or invalid: no credentials, a bad endpoint."""


class BadNameError(RavexError, ValueError):
    """A timeline or tag name is empty, too long, or holds characters that could leave the store."""


class NameTakenError(RavexError, FileExistsError):
    """A timeline or tag of that name already exists (names are written once, never replaced)."""


class TimelineBusyError(RavexError):
    """Another run holds the lease of the timeline this run would write (spec §21): the message
    names that run (host, pid, start) and what to do."""


class LeaseLostError(RavexError):
    """Another run took over the timeline this run was writing, after this run's lease went
    unrenewed past its bound (spec §21): this run's checkpoints stop."""


__all__ = [
    "ArrayNotFoundError",
    "BadNameError",
    "CorruptObjectError",
    "FormatVersionError",
    "LeaseLostError",
    "ManifestError",
    "NameTakenError",
    "RavexError",
    "RemoteConfigError",
    "StepNotFoundError",
    "StorageError",
    "StoreNotFoundError",
    "TimelineBusyError",
    "UnsafeNameError",
    "UnsupportedValueError",
]
