"""One step as a Zarr v3 hierarchy: a read-only zarr-python ``Store`` over the step's key view.

A step maps onto Zarr keys without copying anything: :func:`~ravex.format.steps.keyview.step_keys`
builds that key view (``steps/keyview.py`` shows the layout; it imports no zarr-python), and
:class:`StepStore` serves it to zarr-python.

    >>> group = zarr.open_group(store=StepStore("./ckpt", "latest"), mode="r")
    >>> group["model/w"][:]

Importing this module also registers the ``bfloat16``, ``float8_e4m3fn`` and
``float8_e5m2`` data types (zarr-extensions names, numpy types from ``ml_dtypes``)
with zarr-python, which has no built-in type of those names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import ml_dtypes
import numpy as np
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.core.dtype import data_type_registry
from zarr.core.dtype.common import DataTypeValidationError
from zarr.core.dtype.npy.float import BaseFloat

from ..steps.keyview import KeyEntry, fetch_chunk, root_attributes, step_keys

if TYPE_CHECKING:
    from ..steps.reader import StepReader
    from ..store import CheckpointStore

__all__ = ["KeyEntry", "StepStore", "register_zarr_data_types", "root_attributes", "step_keys"]

# ---- the zarr-python Store -------------------------------------------------------------------


class StepStore(Store):
    """A read-only zarr-python ``Store`` over one complete step of a Ravex store.

    ``store`` is a path, an fsspec URL or an open :class:`CheckpointStore`; ``step`` a
    step number, ``"step_100"`` or ``"latest"`` (resolved once, when the store is made).
    Every chunk is checked against the manifest as it is read (``verify=False`` skips it).
    """

    supports_writes: bool = False
    supports_deletes: bool = False
    supports_listing: bool = True

    def __init__(
        self,
        store: str | CheckpointStore | Any,
        step: int | str = "latest",
        *,
        read_only: bool = True,
        verify: bool = True,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if not read_only:
            raise ValueError(
                f"StepStore({step=!r}) is read-only: a committed step is immutable; "
                "open it with read_only=True (the default)"
            )
        super().__init__(read_only=True)
        from ..store import CheckpointStore, open_store

        self._ckpt = store if isinstance(store, CheckpointStore) else open_store(store, storage_options=storage_options)
        self._storage_options = storage_options
        self.step = self._ckpt.resolve_step(step)
        self.verify = verify
        self._keys_cache: dict[str, KeyEntry] | None = None
        self._reader: StepReader | None = None

    # identity, pickling
    @property
    def url(self) -> str:
        return self._ckpt.url

    def __str__(self) -> str:
        return f"ravex+{self.url}#step={self.step}"

    def __repr__(self) -> str:
        return f"StepStore({self.url!r}, step={self.step})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, StepStore)
            and self.url == other.url
            and self.step == other.step
            and self.verify == other.verify
        )

    def __hash__(self) -> int:
        return hash((self.url, self.step))

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "step": self.step, "verify": self.verify, "options": self._storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["step"], verify=state["verify"], storage_options=state["options"])  # type: ignore[misc]

    @property
    def _keys(self) -> dict[str, KeyEntry]:
        if self._keys_cache is None:
            self._reader = self._ckpt.open_step(self.step)
            self._keys_cache = step_keys(self._reader, consolidate="all")
        return self._keys_cache

    # reading
    def _read(self, key: str) -> bytes | None:
        entry = self._keys.get(key)
        if entry is None:
            return None
        if entry.doc is not None:
            return entry.doc
        assert entry.ref is not None and self._reader is not None
        array = self._reader.arrays.get(entry.array or "")
        where = f"step {self.step} tensor {entry.array!r} key {key!r}"
        return fetch_chunk(self._ckpt, array, entry.ref, where, self.verify)

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        # docstring inherited
        if prototype is None:
            prototype = default_buffer_prototype()
        await self._ensure_open()
        entry = self._keys.get(key)
        if entry is None:
            return None
        data = entry.doc if entry.doc is not None else await asyncio.to_thread(self._read, key)
        if data is None:
            return None
        buf: Buffer = prototype.buffer.from_bytes(_byte_range(data, byte_range))
        return buf

    def get_sync(
        self, key: str, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """Synchronous :meth:`get` (zarr's ``SupportsGetSync``)."""
        if prototype is None:
            prototype = default_buffer_prototype()
        self._is_open = True
        data = self._read(key)
        if data is None:
            return None
        buf: Buffer = prototype.buffer.from_bytes(_byte_range(data, byte_range))
        return buf

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        # docstring inherited
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        # docstring inherited
        return key in self._keys

    async def getsize(self, key: str) -> int:
        # docstring inherited
        entry = self._keys.get(key)
        if entry is None:
            raise FileNotFoundError(f"{key!r} is not a key of {self!r}")
        return entry.size

    # writing: refused
    async def set(self, key: str, value: Buffer) -> None:
        # docstring inherited
        self._check_writable()

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        # docstring inherited
        self._check_writable()

    async def delete(self, key: str) -> None:
        # docstring inherited
        self._check_writable()

    # listing
    async def list(self) -> AsyncIterator[str]:
        # docstring inherited
        for key in list(self._keys):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        # docstring inherited
        for key in list(self._keys):
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        # docstring inherited
        prefix = prefix.rstrip("/")
        start = prefix + "/" if prefix else ""
        seen: set[str] = set()
        for key in list(self._keys):
            if key.startswith(start) and key != prefix:
                child = key[len(start) :].split("/", 1)[0]
                if child not in seen:
                    seen.add(child)
                    yield child


# ---- zarr-python data types for bfloat16 and float8 ---------------------------------------------


class _MLFloat(BaseFloat):  # type: ignore[type-arg]
    """A float type numpy spells through ``ml_dtypes``; Zarr v3 only (no v2 name)."""

    _ml_type: ClassVar[type]
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_native_dtype(cls, dtype: Any) -> Any:
        if type(dtype) is cls.dtype_cls:
            return cls()
        raise DataTypeValidationError(f"Invalid data type: {dtype}. Expected {np.dtype(cls._ml_type)}")

    def to_native_dtype(self) -> Any:
        return np.dtype(self._ml_type)

    @property
    def item_size(self) -> int:
        return np.dtype(self._ml_type).itemsize

    def from_json_scalar(self, data: Any, *, zarr_format: Any) -> Any:
        # "0x..." holds the raw bits, which the base class would read as float16/32/64
        if isinstance(data, str) and data.startswith("0x") and len(data) == 2 + 2 * self.item_size:
            return np.frombuffer(int(data, 16).to_bytes(self.item_size, "little"), self.to_native_dtype())[0]
        return super().from_json_scalar(data, zarr_format=zarr_format)


@dataclass(frozen=True, kw_only=True)
class BFloat16(_MLFloat):
    """zarr-extensions ``bfloat16``."""

    dtype_cls = type(np.dtype(ml_dtypes.bfloat16))
    _zarr_v3_name = "bfloat16"
    _ml_type = ml_dtypes.bfloat16


@dataclass(frozen=True, kw_only=True)
class Float8E4M3FN(_MLFloat):
    """zarr-extensions ``float8_e4m3fn``."""

    dtype_cls = type(np.dtype(ml_dtypes.float8_e4m3fn))
    _zarr_v3_name = "float8_e4m3fn"
    _ml_type = ml_dtypes.float8_e4m3fn


@dataclass(frozen=True, kw_only=True)
class Float8E5M2(_MLFloat):
    """zarr-extensions ``float8_e5m2``."""

    dtype_cls = type(np.dtype(ml_dtypes.float8_e5m2))
    _zarr_v3_name = "float8_e5m2"
    _ml_type = ml_dtypes.float8_e5m2


def register_zarr_data_types() -> None:
    """Teach zarr-python the extension data types Ravex writes. Idempotent; a type zarr
    (or another package) already registered under the same name is left alone."""
    for cls in (BFloat16, Float8E4M3FN, Float8E5M2):
        if cls._zarr_v3_name not in data_type_registry.contents:
            data_type_registry.register(cls._zarr_v3_name, cls)


register_zarr_data_types()


def _byte_range(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """The bytes of ``data`` that a zarr byte request asks for (all of them for None)."""
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[max(0, len(data) - byte_range.suffix) :]
    raise ValueError(f"Unexpected byte_range, got {byte_range}.")  # the message zarr's store tests expect
