"""``.pt`` export: a step's state tree saved with ``torch.save``, loadable with
``torch.load(path, weights_only=True)``: tensors and plain Python values only."""

from __future__ import annotations

import os
from typing import Any

import torch

from ravex.format import CheckpointStore
from ravex.format.storage import atomic_file

from .load import load


def export_pt(
    store: str | os.PathLike[str] | CheckpointStore,
    dest: str | os.PathLike[str],
    step: int | str = "latest",
    subtree: Any = None,
) -> str:
    """Write the state tree of a step (or one subtree) to a ``.pt`` file; returns ``dest``.

    The tree holds only what ``weights_only=True`` accepts: tensors, dicts, lists,
    tuples, str, int, float, bool, None and bytes. The write is atomic (temp + rename).
    """
    dest = os.fspath(dest)
    with atomic_file(dest) as fh:
        torch.save(load(store, step, subtree=subtree), fh)
    return dest
