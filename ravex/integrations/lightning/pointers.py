"""The pointer files Lightning sees: at each path it names, a small JSON naming the store and step.

Both the plugin (which writes, reads and removes them) and the zero-code take-over (which writes
the resume pointer it gives a Trainer) use them, so they have a module of their own.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ravex.format import CheckpointStore
from ravex.format.history.timelines import MAIN, split_ref
from ravex.format.storage.atomic import atomic_write

POINTER_FORMAT = 1

#: a step as a pointer names it: its number (a step of ``main``) or ``<timeline>@<number>``
Ref = int | str


def write_pointer(path: str, url: str, step: Ref, where: dict[str, int] | None = None) -> None:
    """The file Lightning sees at ``path``: which step of which store holds its checkpoint (its
    number, or ``<timeline>@<number>`` for a step of another timeline than ``main``), and
    (``where``) Lightning's epoch and global step in it, for a person or a script to read."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    doc: dict[str, Any] = {"ravex_checkpoint": POINTER_FORMAT, "store": _absolute(url), "step": step, **(where or {})}
    atomic_write(path, json.dumps(doc).encode() + b"\n")


def read_pointer(path: str) -> tuple[str, Ref]:
    """The store URL and step a pointer file names; a one-line error for any other file."""
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        doc = json.loads(head)
        step = doc["step"]
        return str(doc["store"]), step if isinstance(step, str) and "@" in step else int(step)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path} is not a RavexCheckpointIO checkpoint (a torch.save file? load it without "
                         "the RavexCheckpointIO plugin)") from None


def _is_pointer(path: Any) -> bool:
    """Whether ``path`` is a local pointer file (a file Lightning's own CheckpointIO never wrote)."""
    try:
        read_pointer(_local(path))
    except (OSError, ValueError):
        return False
    return True


def _ref(view: CheckpointStore, step: int) -> Ref:
    """How a pointer names ``step`` of the timeline ``view``: a bare number on ``main`` (as every
    pointer written before timelines did)."""
    return step if view.timeline.name == MAIN else f"{view.timeline.name}@{step}"


def _split(ref: Ref) -> tuple[str, int]:
    """A pointer's step as (timeline, number)."""
    if isinstance(ref, int):
        return MAIN, ref
    name, text = split_ref(ref)
    return name or MAIN, int(text)


def _still_named(directory: str, url: str, step: Ref) -> bool:
    """Whether another pointer file in ``directory`` names the same step."""
    for name in os.listdir(directory):
        if name.endswith(".ckpt"):
            try:
                if read_pointer(os.path.join(directory, name)) == (url, step):
                    return True
            except (OSError, ValueError):
                continue
    return False


def _local(path: Any) -> str:
    path = os.fspath(path)
    if "://" in path:
        raise ValueError(f"RavexCheckpointIO keeps its pointer files on a local path, not {path!r}: give "
                         "ModelCheckpoint a local dirpath (the store itself, RavexCheckpointIO(url), may be remote)")
    return str(path)


def _absolute(url: str) -> str:
    return url if "://" in url else os.path.abspath(url)

