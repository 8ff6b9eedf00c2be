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
from .export import export_safetensors, export_zarr
from .reader import ArrayRef, StepReader
from .refs import write_refs
from .store import CheckpointStore, StepInfo, open_store
from .tensorstore_spec import open_tensorstore, tensorstore_spec
from .writer import ArrayShard, CommitStats, StepWriter
from .zarr_store import StepStore  # importing it teaches zarr-python bfloat16 and float8

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
    "StepStore",
    "StepWriter",
    "StoreNotFoundError",
    "UnsafeNameError",
    "UnsupportedValueError",
    "export_safetensors",
    "export_zarr",
    "open_store",
    "open_tensorstore",
    "tensorstore_spec",
    "write_refs",
]
