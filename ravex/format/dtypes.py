"""Data types: the Zarr v3 ``data_type`` names the format writes, and their numpy forms.

Core Zarr v3 types are used where they exist. bfloat16 and the float8 types have
no core name; they use the names registered in zarr-extensions, which tensorstore
reads natively. numpy spells them through ``ml_dtypes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import ManifestError


@dataclass(frozen=True)
class DataType:
    """One storable element type."""

    name: str  # Zarr v3 data_type
    numpy: np.dtype
    fill_value: object  # the JSON fill value written into zarr.json

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


def _dt(name: str, np_dtype: object, fill: object) -> DataType:
    return DataType(name, np.dtype(np_dtype).newbyteorder("<"), fill)


_TABLE: tuple[DataType, ...] = (
    _dt("bool", np.bool_, False),
    _dt("int8", np.int8, 0),
    _dt("int16", np.int16, 0),
    _dt("int32", np.int32, 0),
    _dt("int64", np.int64, 0),
    _dt("uint8", np.uint8, 0),
    _dt("uint16", np.uint16, 0),
    _dt("uint32", np.uint32, 0),
    _dt("uint64", np.uint64, 0),
    _dt("float16", np.float16, 0.0),
    _dt("float32", np.float32, 0.0),
    _dt("float64", np.float64, 0.0),
    _dt("complex64", np.complex64, [0.0, 0.0]),
    _dt("complex128", np.complex128, [0.0, 0.0]),
    _dt("bfloat16", ml_dtypes.bfloat16, 0.0),
    _dt("float8_e4m3fn", ml_dtypes.float8_e4m3fn, 0.0),
    _dt("float8_e5m2", ml_dtypes.float8_e5m2, 0.0),
)

BY_NAME: dict[str, DataType] = {d.name: d for d in _TABLE}
_BY_NUMPY: dict[np.dtype, DataType] = {d.numpy.newbyteorder("="): d for d in _TABLE}


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
    try:
        return _BY_NUMPY[key]
    except KeyError:
        raise ManifestError(
            f"numpy dtype {dtype!s} cannot be stored; supported: {sorted(BY_NAME)}"
        ) from None
