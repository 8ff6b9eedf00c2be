"""Every error Ravex raises on purpose, in one place.

One base, :class:`RavexError`; subclasses also inherit the builtin a caller would
already catch. The format's errors are defined in :mod:`ravex.format.errors` (the
format is usable without the runtime) and re-exported here.
"""

from __future__ import annotations

from ravex.format import errors as format_errors
from ravex.format.errors import *  # noqa: F403 - the format's errors, every one, are Ravex's
from ravex.format.errors import RavexError


class ConfigError(RavexError, ValueError):
    """A configuration key is unknown or its value is invalid (names key, file, fix)."""


class RestoreError(RavexError, ValueError):
    """The checkpoint does not fit this run's objects (the script or model changed)."""


__all__ = [*format_errors.__all__, "ConfigError", "RestoreError"]
