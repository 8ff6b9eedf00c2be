"""Which part of a Ravex training step an array path is in, and the names a user knows.

The runtime lays a step's tree out as :mod:`ravex.runtime.state.plan` says: ``models``,
``optimizers`` ... as lists in creation order (optimizer state under parameter names),
and beside them bookkeeping: RNG streams (``rng``), data-loader positions (``loaders``,
whose ``epoch_rng`` holds a tensor), ``ravex.loop`` positions (``loops``) and where the
main script's loops stood with the variables they carry (``script``); with several
ranks the bookkeeping sits under ``rank-<r>/``. The tools count and compare training
tensors apart from that bookkeeping, and show a model or optimizer by the main script's
global bound to it (``models/netG/...``) where its entry records one (``name``), by its
index otherwise. Paths only: a store of any other tree is shown as it is.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["BOOKKEEPING", "is_bookkeeping", "named", "object_names"]

#: Top-level keys of a training tree that are bookkeeping, not training state.
BOOKKEEPING = frozenset({"rng", "loaders", "loops", "script"})
#: Top-level lists whose entries may record the script's name for them.
_NAMED = ("models", "optimizers")
_RANK = re.compile(r"rank-\d+")


def is_bookkeeping(path: str) -> bool:
    """Whether an array path (or a value's path) is RNG, loader or loop bookkeeping."""
    head, _, rest = path.partition("/")
    while _RANK.fullmatch(head) and rest:  # a rank's subtree, as a diff of several ranks names it
        head, _, rest = rest.partition("/")
    return head in BOOKKEEPING


def object_names(tree: Any) -> dict[str, str]:
    """``{"models/0": "models/netG"}``: each model and optimizer entry of a step's tree
    (rank 0's) that records the name the script gave it. ``tree`` decoded or as the
    manifest holds it (typed JSON: these entries are plain objects there), so a caller
    need not decode a tree of thousands of tensors for it."""
    out: dict[str, str] = {}
    if not isinstance(tree, dict):
        return out
    for section in _NAMED:
        entries = tree.get(section)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name and "/" not in name and not name.isdigit():
                out[f"{section}/{i}"] = f"{section}/{name}"
    return out


def named(path: str, names: dict[str, str]) -> str:
    """A ``/`` path with its model or optimizer index replaced by the name in ``names``
    (:func:`object_names`); unchanged where there is none."""
    parts = path.split("/", 2)
    if len(parts) < 2:
        return path
    shown = names.get(f"{parts[0]}/{parts[1]}")
    if shown is None:
        return path
    return f"{shown}/{parts[2]}" if len(parts) == 3 else shown
