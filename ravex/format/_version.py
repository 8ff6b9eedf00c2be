"""The spec version this code writes and the majors it reads."""

from __future__ import annotations

import re
from typing import Any

from .errors import FormatVersionError, ManifestError

FORMAT_NAME = "ravex"
#: Written into every ``ravex.json`` and manifest. Minor versions only add fields.
SPEC_VERSION = "1.0"
#: Written into a manifest that holds a chunk table (spec §5.1), and only there: every other
#: manifest stays readable by 1.0 readers.
TABLE_SPEC_VERSION = "1.2"
SUPPORTED_MAJOR = 1


def check_version(version: object, where: str) -> None:
    """Reject a document whose major version this reader does not know."""
    if not isinstance(version, str) or not re.fullmatch(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)", version):
        raise FormatVersionError(f"{where}: malformed spec version {version!r}; expected 'MAJOR.MINOR'")
    major = int(version.partition(".")[0])
    if major != SUPPORTED_MAJOR:
        raise FormatVersionError(
            f"{where}: written with Ravex format {version}, this reader understands "
            f"{SUPPORTED_MAJOR}.x only; upgrade ravex to read it"
        )


def check_header(doc: Any, where: str, fmt: str, not_ours: str, field: str, expected: str, unknown: str) -> None:
    """The checks a manifest or a witness passes before its body is read: a JSON object of format
    ``fmt`` (else ``not_ours``), of a major version this reader knows (:func:`check_version`), whose
    ``field`` names the ``expected`` algorithm (else ``unknown``, with ``{got}`` the value found).
    Each is a :class:`ManifestError` (or :class:`FormatVersionError`) naming ``where``."""
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ManifestError(f"{where}: {not_ours}")
    check_version(doc.get("version"), where)
    if doc.get(field) != expected:
        raise ManifestError(f"{where}: " + unknown.format(got=repr(doc.get(field))))
