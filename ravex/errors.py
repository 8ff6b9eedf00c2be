"""Every error Ravex raises on purpose, in one place.

One base, :class:`RavexError`; subclasses also inherit the builtin a caller would
already catch. The format's errors are defined in :mod:`ravex.format.errors` (the
format is usable without the runtime) and re-exported here.
"""

from __future__ import annotations

from ravex.format.errors import (
    ArrayNotFoundError,
    CorruptObjectError,
    FormatVersionError,
    ManifestError,
    RavexError,
    StepNotFoundError,
    StoreNotFoundError,
    UnsafeNameError,
    UnsupportedValueError,
)


class ConfigError(RavexError, ValueError):
    """A configuration key is unknown or its value is invalid (names key, file, fix)."""


class RestoreError(RavexError, ValueError):
    """The checkpoint does not fit this run's objects (the script or model changed)."""


__all__ = [
    "ArrayNotFoundError",
    "ConfigError",
    "CorruptObjectError",
    "FormatVersionError",
    "ManifestError",
    "RavexError",
    "RestoreError",
    "StepNotFoundError",
    "StoreNotFoundError",
    "UnsafeNameError",
    "UnsupportedValueError",
]
