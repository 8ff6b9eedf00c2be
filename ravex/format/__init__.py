"""The Ravex checkpoint format: a content-addressed, chunked Zarr v3 store.

Torch-free: tensors arrive as numpy arrays (bfloat16 and float8 through
``ml_dtypes``). Everything Ravex puts on storage goes through this package;
``spec/FORMAT.md`` is the normative description of the bytes.

    >>> store = open_store("./ckpt", create=True)
    >>> with store.writer() as w:
    ...     w.commit(100, {"model": {"w": np.ones((4, 4), "float32")}, "lr": 0.1})
    >>> store.read("latest")["lr"]
    0.1
"""

from __future__ import annotations

from ._version import SPEC_VERSION
from .errors import (
    ArrayNotFoundError,
    CorruptObjectError,
    FormatVersionError,
    ManifestError,
    RavexError,
    StepNotFoundError,
    StoreNotFoundError,
    UnsafeNameError,
    UnsupportedValueError,
)
from .reader import ArrayRef, StepReader
from .store import CheckpointStore, StepInfo, open_store
from .writer import ArrayShard, CommitStats, StepWriter

__all__ = [
    "SPEC_VERSION",
    "ArrayNotFoundError",
    "ArrayRef",
    "ArrayShard",
    "CheckpointStore",
    "CommitStats",
    "CorruptObjectError",
    "FormatVersionError",
    "ManifestError",
    "RavexError",
    "StepInfo",
    "StepNotFoundError",
    "StepReader",
    "StepWriter",
    "StoreNotFoundError",
    "UnsafeNameError",
    "UnsupportedValueError",
    "open_store",
]
