"""``ravex.load``: a step's state tree with torch tensors, for users' other scripts.

The torch-free equivalent is ``ravex.format.open_store(path).read(step, subtree=...)``,
which gives numpy arrays. Nothing here unpickles: the tree is typed JSON and the
tensors are raw bytes; bfloat16 and float8 arrive as ``ml_dtypes`` arrays and become
torch tensors through a same-size integer view.
"""

from __future__ import annotations

import os
from collections.abc import Set
from typing import Any

import numpy as np
import torch

from ravex.format import ArrayRef, CheckpointStore, open_store

from .dtypes import to_torch
from .tree import leaves, tree_map


def tree_to_torch(tree: Any, device: torch.device | str | None = None) -> Any:
    """Replace every numpy array of a state tree by a torch tensor."""
    return tree_map(lambda leaf: to_torch(leaf, device) if isinstance(leaf, np.ndarray) else leaf, tree)


def read_refs(tree: Any, keep: Set[int] = frozenset()) -> Any:
    """``tree`` with every :class:`~ravex.format.ArrayRef` leaf (but those whose ``id`` is in
    ``keep``) replaced by its array, all of them fetched in one parallel read."""
    refs = [v for v in leaves(tree) if isinstance(v, ArrayRef) and id(v) not in keep]
    if not refs:
        return tree
    arrays = refs[0].reader.read_arrays([r.path for r in refs])
    return tree_map(lambda v: arrays[v.path] if isinstance(v, ArrayRef) and id(v) not in keep else v, tree)


def load(
    store: str | os.PathLike[str] | CheckpointStore,
    step: int | str = "latest",
    subtree: Any = None,
    device: torch.device | str | None = None,
    rank: int = 0,
) -> Any:
    """The state tree of a step with torch tensors at the leaves.

    ``subtree`` is a key or a sequence of keys (``"model"``, ``("optimizers", 0)``); only
    its tensors are read. ``device`` moves every tensor there (default: CPU). A bare step
    (``60``, ``"latest"``) is one of the current timeline, the one a plain rerun continues,
    as the CLI reads it; ``"exp@60"`` names another.
    """
    ckpt = store if isinstance(store, CheckpointStore) else open_store(store)
    view = ckpt if isinstance(step, str) and "@" in step else ckpt.current()
    return tree_to_torch(view.read(step, rank=rank, subtree=subtree), device)
