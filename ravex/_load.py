"""``ravex.load``: a step's state tree with torch tensors, for users' other scripts.

The torch-free equivalent is ``ravex.format.open_store(path).read(step, subtree=...)``,
which gives numpy arrays. Nothing here unpickles: the tree is typed JSON and the
tensors are raw bytes; bfloat16 and float8 arrive as ``ml_dtypes`` arrays and become
torch tensors through a same-size integer view.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .format import CheckpointStore, open_store
from .format.values import all_plain

#: Zarr data types torch spells differently from numpy: (integer view, torch dtype).
_VIEWS: dict[str, tuple[np.dtype, torch.dtype]] = {
    "bfloat16": (np.dtype(np.uint16), torch.bfloat16),
    "float8_e4m3fn": (np.dtype(np.uint8), torch.float8_e4m3fn),
    "float8_e5m2": (np.dtype(np.uint8), torch.float8_e5m2),
}


def to_torch(array: np.ndarray, device: torch.device | str | None = None) -> torch.Tensor:
    """A numpy array from the format (ml_dtypes included) as a torch tensor, sharing memory on CPU."""
    array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
    view = _VIEWS.get(array.dtype.name)
    if view is not None:
        tensor = torch.from_numpy(array.view(view[0])).view(view[1])
    else:
        tensor = torch.from_numpy(array)
    return tensor if device is None else tensor.to(device)


def tree_to_torch(tree: Any, device: torch.device | str | None = None) -> Any:
    """Replace every numpy array of a state tree by a torch tensor."""
    if isinstance(tree, np.ndarray):
        return to_torch(tree, device)
    if isinstance(tree, dict):
        return {k: tree_to_torch(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and all_plain(tree):
        return tree  # a tree read from storage is the caller's own: no copy needed
    if isinstance(tree, list):
        return [tree_to_torch(v, device) for v in tree]
    if isinstance(tree, tuple):
        return tuple(tree_to_torch(v, device) for v in tree)
    return tree


def load(
    store: str | os.PathLike[str] | CheckpointStore,
    step: int | str = "latest",
    subtree: Any = None,
    device: torch.device | str | None = None,
    rank: int = 0,
) -> Any:
    """The state tree of a step with torch tensors at the leaves.

    ``subtree`` is a key or a sequence of keys (``"model"``, ``("optimizers", 0)``); only
    its tensors are read. ``device`` moves every tensor there (default: CPU).
    """
    ckpt = store if isinstance(store, CheckpointStore) else open_store(store)
    return tree_to_torch(ckpt.read(step, rank=rank, subtree=subtree), device)
