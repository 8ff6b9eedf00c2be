"""Data types: the Zarr v3 ``data_type`` names the format writes, and their numpy forms.

Core Zarr v3 types are used where they exist. bfloat16 and the float8 types have
no core name; they use the names registered in zarr-extensions, which tensorstore
reads natively. numpy spells them through ``ml_dtypes``.

``ml_dtypes`` is imported the first time one of those types' numpy form is needed
(:attr:`DataType.numpy`, or :func:`from_numpy` meeting a dtype numpy does not know),
not on import: its C extension takes most of a second to load, which every ``ravex``
command and every float32-only read would otherwise pay. Names, item sizes and fill
values need no numpy type and never import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import ManifestError


@dataclass(frozen=True)
class DataType:
    """One storable element type."""

    name: str  # Zarr v3 data_type
    itemsize: int
    fill_value: object  # the JSON fill value written into zarr.json
    extension: bool = False  # numpy spells it through ml_dtypes (attribute of the same name)

    @cached_property
    def numpy(self) -> np.dtype:
        """The little-endian numpy dtype; resolving an extension type imports ``ml_dtypes``."""
        if self.extension:
            import ml_dtypes

            scalar: object = getattr(ml_dtypes, self.name)
        else:
            scalar = self.name
        dtype: np.dtype[Any] = np.dtype(scalar).newbyteorder("<")  # type: ignore[call-overload]
        if dtype.itemsize != self.itemsize:
            raise ManifestError(f"data_type {self.name!r}: numpy gives {dtype.itemsize} bytes per item, "
                                f"Ravex format 1 says {self.itemsize}; upgrade ml_dtypes")
        return dtype


def _core(name: str, fill: object) -> DataType:
    return DataType(name, np.dtype(name).itemsize, fill)


_TABLE: tuple[DataType, ...] = (
    _core("bool", False),
    _core("int8", 0),
    _core("int16", 0),
    _core("int32", 0),
    _core("int64", 0),
    _core("uint8", 0),
    _core("uint16", 0),
    _core("uint32", 0),
    _core("uint64", 0),
    _core("float16", 0.0),
    _core("float32", 0.0),
    _core("float64", 0.0),
    _core("complex64", [0.0, 0.0]),
    _core("complex128", [0.0, 0.0]),
    DataType("bfloat16", 2, 0.0, extension=True),
    DataType("float8_e4m3fn", 1, 0.0, extension=True),
    DataType("float8_e5m2", 1, 0.0, extension=True),
)

BY_NAME: dict[str, DataType] = {d.name: d for d in _TABLE}
# native-byte-order numpy dtype -> DataType; the extension types join on the first miss
_BY_NUMPY: dict[np.dtype, DataType] = {d.numpy.newbyteorder("="): d for d in _TABLE if not d.extension}


def data_type(name: str) -> DataType:
    """The :class:`DataType` for a Zarr ``data_type`` name; a clear error if unknown."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ManifestError(
            f"unknown data_type {name!r}; Ravex format 1 stores {sorted(BY_NAME)}"
        ) from None


def from_numpy(dtype: np.dtype) -> DataType:
    """The :class:`DataType` of a numpy dtype (native or little-endian)."""
    key = np.dtype(dtype)
    if key.byteorder == ">":
        key = key.newbyteorder("<")
    key = key.newbyteorder("=")
    found = _BY_NUMPY.get(key)
    if found is None:  # an ml_dtypes type (or nothing storable): learn the extension types, once
        _BY_NUMPY.update({d.numpy.newbyteorder("="): d for d in _TABLE if d.extension})
        found = _BY_NUMPY.get(key)
    if found is None:
        raise ManifestError(f"numpy dtype {dtype!s} cannot be stored; supported: {sorted(BY_NAME)}")
    return found
