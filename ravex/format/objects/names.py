"""Names on storage: escaping tree keys into Zarr node names, and refusing unsafe names.

A state tree's keys are arbitrary (``"layer.0.weight"``, ``"état"``, ``"a/b"``,
``0``). Zarr node names must not contain ``/``, be empty, consist only of dots, or
start with ``__``; object stores dislike many other characters. Every key is
therefore percent-encoded (UTF-8) outside ``[A-Za-z0-9._-]``, plus a leading ``_``
of ``__`` and the first dot of an all-dots name. Decoding is ``urllib.parse.unquote``.
Integer keys encode as their decimal text; the typed tree in the manifest keeps the
real key, so the path only needs to be unique and valid.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote

from ..errors import BadNameError, UnsafeNameError

_SAFE = "._-"
_OBJECT_NAME = re.compile(r"^[0-9a-f]{32}\Z")  # \Z: "$" would accept a trailing newline
_SEGMENT_OK = re.compile(r"^[A-Za-z0-9._%-]+\Z")


def escape_key(key: str) -> str:
    """Encode one tree key as a valid, reversible Zarr node name."""
    if key == "":
        return "%00"  # unquote gives "\x00"; the manifest tree holds the real (empty) key
    out = quote(key, safe=_SAFE).replace("~", "%7E")  # quote() never encodes "~"; node names must not hold it
    if out.startswith("__"):
        out = "%5F" + out[1:]
    if set(out) == {"."}:
        out = "%2E" + out[1:]
    return out


def array_name(path: tuple[object, ...]) -> str:
    """The name of the array at ``path`` in a tree, as manifests and ``chunk_bytes`` spell it:
    its escaped keys joined by ``/`` (the root: ``%00``)."""
    return "/".join(escape_key(str(k)) for k in path) or "%00"


def unescape_key(segment: str) -> str:
    """Invert :func:`escape_key` (except for the empty key, which the tree keeps)."""
    return unquote(segment)


_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


def is_decimal(text: str) -> bool:
    """A step or rank as the layout writes it: ASCII decimal, no sign, no leading zero (and
    no trailing newline, which a ``$``-anchored match would let through)."""
    return bool(_DECIMAL.fullmatch(text))


def check_array_path(path: str, where: str) -> str:
    """Validate an array path from a manifest: relative, escaped segments, no ``..``."""
    if not isinstance(path, str) or not path:
        raise UnsafeNameError(f"{where}: empty or non-string array path {path!r}")
    for seg in path.split("/"):
        if not _SEGMENT_OK.match(seg) or set(seg) == {"."} or seg.startswith("__"):
            raise UnsafeNameError(
                f"{where}: array path {path!r} has an unsafe segment {seg!r}; "
                "the manifest is corrupt or was not written by Ravex"
            )
    return path


def check_object_name(name: object, where: str) -> str:
    """Validate an object name: exactly 32 lowercase hex digits, nothing that forms a path."""
    return check_name(name, _OBJECT_NAME, where, "is not a 32-digit hex digest; the manifest is corrupt or was "
                      "not written by Ravex", what="object name ")


def check_name(name: object, pattern: re.Pattern[str], where: str, rule: str, what: str = "") -> str:
    """``name`` when it is a string ``pattern`` matches whole; else an :class:`UnsafeNameError`
    ``<where>: <what><name!r> <rule>``. For names read from documents or given by a caller that
    become a key segment: nothing that forms a path gets through."""
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise UnsafeNameError(f"{where}: {what}{name!r} {rule}")
    return name


def object_key(name: str) -> str:
    """Storage key of an object, relative to the store root: ``objects/ab/abcdef...``."""
    return f"objects/{name[:2]}/{name}"


#: Where the steps of the ``main`` timeline live (spec §2); another timeline's are under
#: ``timelines/<name>/steps`` (§19).
MAIN_STEPS = "steps"


def step_dir(step: int, steps: str = MAIN_STEPS) -> str:
    """Storage prefix of a step: ``<steps>/<step>`` in plain decimal."""
    return f"{steps}/{step}"


def manifest_key(step: int, rank: int, steps: str = MAIN_STEPS) -> str:
    """Storage key of one rank's manifest for a step."""
    return f"{steps}/{step}/rank-{rank}.json"


#: Longest timeline or tag name: a key segment every object store takes, short enough to read.
MAX_LABEL = 64
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_label(name: object, what: str) -> str:
    """A timeline or tag name as the layout stores it (one key segment, spec §19): 1 to
    :data:`MAX_LABEL` characters of ``A-Z a-z 0-9 . _ -``, not starting with ``.``, ``_`` or
    ``-``. Anything else is a :class:`BadNameError` naming the rule it breaks."""
    if not isinstance(name, str) or not name:
        raise BadNameError(f"{what} name is empty; give a name such as 'before-spike'")
    shown = name if len(name) <= 40 else f"{name[:40]}..."
    if len(name) > MAX_LABEL:
        raise BadNameError(f"{what} name {shown!r} is {len(name)} characters; use at most {MAX_LABEL}")
    if not _LABEL.fullmatch(name):
        raise BadNameError(
            f"{what} name {shown!r} may only hold letters, digits, '.', '_' and '-', starting with a "
            "letter or digit (no '/', '..' or '@': it must stay one name inside the store)"
        )
    return name


_MANIFEST_NAME = re.compile(r"rank-(0|[1-9][0-9]{0,8})\.json")


def manifest_ranks(names: Iterable[str]) -> list[int]:
    """The ranks whose manifest (``rank-<r>.json``, as :func:`manifest_key` names it) is among
    a step folder's file names, ascending. Other names (temp files, ``rank-01.json``) are not
    manifests."""
    return sorted(int(m.group(1)) for m in map(_MANIFEST_NAME.fullmatch, names) if m)


def no_rank_missing(ranks: Sequence[int]) -> bool:
    """Whether a step folder's listed ``ranks`` (ascending, :func:`manifest_ranks`) are ``0 ..
    n-1``: a folder missing one is incomplete whatever its manifests say, known without reading
    any (whether ``n`` is the world size takes rank 0's manifest)."""
    return bool(ranks) and list(ranks) == list(range(len(ranks)))
