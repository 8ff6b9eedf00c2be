"""The spec version this code writes and the majors it reads."""

from __future__ import annotations

import re

from .errors import FormatVersionError

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
