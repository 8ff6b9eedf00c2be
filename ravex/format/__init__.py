"""The Ravex checkpoint format: a content-addressed, chunked Zarr v3 store.

Torch-free: tensors arrive as numpy arrays (bfloat16 and float8 through
``ml_dtypes``). Everything Ravex puts on storage goes through this package;
``spec/FORMAT.md`` is the normative description of the bytes.

    >>> store = open_store("./ckpt", create=True)
    >>> with store.writer() as w:
    ...     w.commit(100, {"model": {"w": np.ones((4, 4), "float32")}, "lr": 0.1})
    >>> store.read("latest")["lr"]
    0.1

Importing the package is cheap: the errors and the spec version are loaded with it, every
other name on first use (module ``__getattr__``), so ``import ravex.errors`` and a ``ravex``
command that lists a store pay for neither zarr-python nor ``ml_dtypes``. Using
:class:`StepStore` (or importing ``ravex.format.interop.zarr_store``) imports zarr-python and teaches
it the bfloat16 and float8 data types.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .interop.export import export_safetensors, export_zarr
    from .interop.tensorstore_spec import open_tensorstore, tensorstore_spec
    from .interop.zarr_store import StepStore
    from .maintenance.tiers import CopyReport, copy_step
    from .steps.catalog import StepInfo
    from .steps.reader import ArrayRef, StepReader
    from .steps.refs import write_refs
    from .store import CheckpointStore, open_store
    from .writing.planning import ArrayShard
    from .writing.stats import CommitStats
    from .writing.writer import StepWriter

#: name -> the submodule that defines it, imported on first access
_LAZY: dict[str, str] = {
    "export_safetensors": "interop.export",
    "export_zarr": "interop.export",
    "ArrayRef": "steps.reader",
    "StepReader": "steps.reader",
    "write_refs": "steps.refs",
    "CheckpointStore": "store",
    "StepInfo": "steps.catalog",
    "CopyReport": "maintenance.tiers",
    "copy_step": "maintenance.tiers",
    "open_store": "store",
    "open_tensorstore": "interop.tensorstore_spec",
    "tensorstore_spec": "interop.tensorstore_spec",
    "ArrayShard": "writing.planning",
    "CommitStats": "writing.stats",
    "StepWriter": "writing.writer",
    "StepStore": "interop.zarr_store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "SPEC_VERSION",
    "ArrayNotFoundError",
    "ArrayRef",
    "ArrayShard",
    "CheckpointStore",
    "CommitStats",
    "CopyReport",
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
    "copy_step",
    "export_safetensors",
    "export_zarr",
    "open_store",
    "open_tensorstore",
    "tensorstore_spec",
    "write_refs",
]
