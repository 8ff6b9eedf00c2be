"""The key view of a step: every key its Zarr v3 hierarchy has, and where its bytes are.

::

    zarr.json                 root group; attributes["ravex"] holds the step, the typed
                              state tree and the metadata (spec/FORMAT.md, "Zarr view");
                              with consolidated_metadata (refs.json, StepStore), the
                              groups and arrays below
    model/zarr.json           a group for every prefix of an array path
    model/w/zarr.json         the array's exact ``zarr.json`` from the manifest
    model/w/c/0/0             the chunk's encoded bytes: an object, a byte range of a
                              pack object, or an inline chunk of the manifest

``interop.zarr_store.StepStore`` serves it to zarr-python, ``refs.py`` renders it as fsspec
references and ``interop/export.py`` as a plain directory. This module imports neither zarr-python
nor ``ml_dtypes``: a commit that writes ``refs.json`` needs neither (importing both costs
~0.9 s on the writer thread at a run's first checkpoint).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .._version import SPEC_VERSION
from ..errors import CorruptObjectError
from ..objects.chunkref import ChunkRef
from ..objects.codecs import pipeline
from ..objects.dtypes import BY_NAME, data_type
from ..objects.hashing import digest
from ..objects.names import object_key
from .manifest import ArrayEntry

if TYPE_CHECKING:
    from .catalog import StoreCatalog
    from .reader import StepReader

GROUP_DOC = {"zarr_format": 3, "node_type": "group", "attributes": {}}
#: Zarr v3 inline consolidated metadata up to its ``metadata`` map's first entry.
_CONSOLIDATED_OPEN = b'{"kind":"inline","must_understand":false,"metadata":{'


# ---- the key view of a step ----------------------------------------------------------------


@dataclass(frozen=True)
class KeyEntry:
    """What one Zarr key of a step holds: a document, or a chunk of an array."""

    doc: bytes | None = None  # a zarr.json document
    array: str | None = None  # for a chunk: the array path ...
    ref: ChunkRef | None = None  # ... and where its encoded bytes are

    @property
    def size(self) -> int:
        if self.doc is not None:
            return len(self.doc)
        assert self.ref is not None
        return self.ref.size


def root_attributes(reader: StepReader) -> dict[str, Any]:
    """The root group's attributes: ``{"ravex": {...}}`` with the step and rank 0's typed tree."""
    first = reader.manifests[0]
    return {
        "ravex": {
            "version": SPEC_VERSION,
            "step": reader.step,
            "world_size": reader.world_size,
            "run": first.run,
            "created_at": first.created_at,
            "metadata": first.metadata,
            "tree": first.tree,
        }
    }


def _doc(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


#: A group's entry in the root's consolidated metadata, as zarr-python writes it.
_CONSOLIDATED_GROUP = _doc({**GROUP_DOC, "consolidated_metadata": {"kind": "inline", "must_understand": False,
                                                                   "metadata": {}}})


def step_keys(reader: StepReader, consolidate: Literal["core", "all"] | None = None) -> dict[str, KeyEntry]:
    """Every Zarr key of a step (all ranks merged), sorted.

    ``consolidate`` adds Zarr v3 consolidated metadata to the root's ``zarr.json``
    (zarr-python reads it by default): every group, and every array of a core Zarr data type
    (``"core"``) or every array (``"all"``). A tool that discovers arrays
    (``group.members(max_depth=None)``, ``tree()``) then finds them without listing keys,
    which zarr-python cannot do through fsspec's reference file system (``refs.json``).
    zarr-python parses every entry when it opens the root, and stock zarr-python has no
    bfloat16 or float8 type: listing such an array would make the whole step unopenable, so
    ``"all"`` is for a reader that knows those types (:class:`~ravex.format.interop.zarr_store.StepStore`
    teaches them). An array left out still opens by path with ``use_consolidated=False``.
    A plain directory (``export_zarr``) lists itself and needs none (spec/FORMAT.md, 18.1).
    """
    keys: dict[str, KeyEntry] = {}
    listed: dict[str, bytes] = {}  # path -> its document, for the consolidated metadata
    group = _doc(GROUP_DOC)
    for path, entry in reader.arrays.items():
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            keys.setdefault(f"{prefix}/zarr.json", KeyEntry(doc=group))
            listed.setdefault(prefix, _CONSOLIDATED_GROUP)
        doc = _doc(entry.zarr)
        keys[f"{path}/zarr.json"] = KeyEntry(doc=doc)
        known = BY_NAME.get(entry.data_type)
        if known is not None and (consolidate == "all" or not known.extension):
            listed[path] = doc
        for key, ref in entry.chunks.items():
            keys[f"{path}/{key}"] = KeyEntry(array=path, ref=ref)
    root = _doc({**GROUP_DOC, "attributes": root_attributes(reader)})
    if consolidate is not None:  # the documents encoded above, spliced in: each is encoded once
        body = b",".join(json.dumps(path).encode() + b":" + doc for path, doc in sorted(listed.items()))
        root = root[:-1] + b',"consolidated_metadata":' + _CONSOLIDATED_OPEN + body + b"}}}"
    keys["zarr.json"] = KeyEntry(doc=root)
    return dict(sorted(keys.items()))


def decoded_chunk_size(entry: ArrayEntry) -> int:
    """Bytes of one decoded chunk of an array (edge chunks are stored at full size)."""
    return math.prod(entry.chunk_shape) * data_type(entry.data_type).itemsize


def fetch_chunk(
    store: StoreCatalog, entry: ArrayEntry | None, ref: ChunkRef, where: str, verify: bool = True
) -> bytes:
    """The encoded bytes of one chunk, checked against the manifest.

    A whole object is checked against its name (the hash of its bytes); a chunk of a
    pack and an inline chunk are decoded (with ``entry``'s codecs) and checked against
    their ``raw`` digest.
    """
    if ref.inline is not None:
        data = ref.inline
    else:
        assert ref.object is not None
        key = object_key(ref.object)
        try:
            if ref.offset is None:
                data = store.storage.read(key)
            else:
                data = store.storage.read_range(key, ref.offset, ref.offset + ref.size)
        except FileNotFoundError:
            raise CorruptObjectError(f"{where}: object {ref.object} is missing from {store.url!r}") from None
        if len(data) != ref.size:
            raise CorruptObjectError(f"{where}: object {ref.object} gave {len(data)} bytes, manifest says {ref.size}")
    if not verify:
        return data
    if ref.inline is None and ref.offset is None:
        if digest(data) != ref.object:
            raise CorruptObjectError(f"{where}: object {ref.object} does not match its hash (corrupt bytes)")
        return data
    if entry is None:
        raise CorruptObjectError(f"{where}: no array metadata to decode this chunk with")
    try:
        decoded = pipeline(entry.codecs, where).decode(data, decoded_chunk_size(entry))
    except ValueError as exc:
        raise CorruptObjectError(f"{where}: {exc}") from None
    if digest(decoded) != ref.raw:
        raise CorruptObjectError(f"{where}: chunk does not match its digest (corrupt bytes)")
    return data
