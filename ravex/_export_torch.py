"""``.pt`` export: a step's state tree saved with ``torch.save``, loadable with
``torch.load(path, weights_only=True)``: tensors and plain Python values only."""

from __future__ import annotations

import os
from typing import Any

import torch

from ._load import load
from .format import CheckpointStore


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
    tmp = f"{dest}.tmp-{os.getpid()}"
    try:
        torch.save(load(store, step, subtree=subtree), tmp)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest
