"""The one bridge between torch dtypes and the format's numpy arrays.

The format names its element types (:mod:`ravex.format.objects.dtypes`); three of them (bfloat16
and the float8 types) have no numpy type, and numpy spells them through ``ml_dtypes``.
torch has them natively, so a tensor of one of them crosses to numpy, and back, as a
same-size integer view: no copy, no conversion, the bits unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ravex.format.objects.dtypes import BY_NAME, data_type

#: Format data types numpy has no type for, by name, with the torch dtype of that name.
EXTENSION: dict[str, torch.dtype] = {d.name: getattr(torch, d.name) for d in BY_NAME.values() if d.extension}
_NAME_OF: dict[torch.dtype, str] = {dtype: name for name, dtype in EXTENSION.items()}
_TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_INT = {1: np.dtype(np.uint8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a contiguous CPU tensor (bfloat16/float8 as ``ml_dtypes``)."""
    name = _NAME_OF.get(tensor.dtype)
    if name is not None:
        return tensor.view(_TORCH_INT[tensor.element_size()]).numpy().view(data_type(name).numpy)
    return tensor.numpy()


def raw_view(tensor: torch.Tensor) -> np.ndarray:
    """A writable numpy array over ``tensor``'s memory, types numpy lacks as same-size
    integers: what a reader filling the tensor needs (the item size, not the type)."""
    t = tensor.detach()
    try:
        return t.numpy()
    except TypeError:
        return t.view(_TORCH_INT[t.element_size()]).numpy()


def to_torch(array: np.ndarray, device: torch.device | str | None = None) -> torch.Tensor:
    """A numpy array from the format (``ml_dtypes`` included) as a torch tensor, sharing
    memory on the CPU."""
    array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
    dtype = EXTENSION.get(array.dtype.name)
    if dtype is not None:
        tensor = torch.from_numpy(array.view(_NUMPY_INT[array.dtype.itemsize])).view(dtype)
    else:
        tensor = torch.from_numpy(array)
    return tensor if device is None else tensor.to(device)


def as_tensor(value: Any) -> torch.Tensor:
    """A tensor from a restored leaf: a tensor (torch_save) or an array (format), copied
    when the array is read-only (torch writes into what it restores)."""
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if not array.flags.writeable:
        array = array.copy()
    return to_torch(array)


def torch_dtype(value: Any) -> torch.dtype | None:
    """The torch dtype of a saved leaf (tensor, numpy array, or anything with a numpy
    ``dtype``, such as :class:`~ravex.format.ArrayRef`); None if torch has none."""
    if isinstance(value, torch.Tensor):
        return value.dtype
    dtype = getattr(value, "dtype", None)
    if not isinstance(dtype, np.dtype):
        return None
    found = EXTENSION.get(dtype.name)
    if found is not None:
        return found
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError:
        return None
