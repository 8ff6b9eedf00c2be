"""Exporting a step for tools that want something else: one safetensors file, or a plain
Zarr v3 directory. (The ``.pt`` export is torch's side: ``ravex._export_torch``.)

Both are bit-exact copies of the step's tensors. The safetensors file names each tensor
by its path in the state tree (keys joined with ``sep``, ``"."`` by default, so a model's
subtree gives its ``state_dict`` names) and keeps the typed tree in its metadata. The
Zarr directory is the step's Zarr view (``keyview.step_keys``) written out; on a local
disk its chunk files are hard links to the store's objects, so it costs no space.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ArrayNotFoundError, UnsupportedValueError
from ..objects.names import object_key
from ..objects.values import encode_value
from ..steps.keyview import fetch_chunk, step_keys
from ..steps.reader import ArrayRef, StepReader
from ..storage import atomic_directory, atomic_file
from ..store import CheckpointStore, open_store

__all__ = ["SAFETENSORS_DTYPES", "export_safetensors", "export_zarr", "tensor_names"]

#: Zarr data_type -> safetensors dtype.
SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_HEADER_ALIGN = 8


def _as_store(store: CheckpointStore | str | os.PathLike[str]) -> CheckpointStore:
    return store if isinstance(store, CheckpointStore) else open_store(store)


def _subtree(reader: StepReader, subtree: Any) -> Any:
    tree = reader.tree()
    keys = () if subtree is None else tuple(subtree) if isinstance(subtree, (list, tuple)) else (subtree,)
    for key in keys:
        try:
            tree = tree[key]
        except (KeyError, IndexError, TypeError):
            raise ArrayNotFoundError(f"step {reader.step}: no subtree {subtree!r} (missing {key!r})") from None
    return tree


def _walk(tree: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], ArrayRef]]:
    if isinstance(tree, ArrayRef):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _walk(v, (*path, k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _walk(v, (*path, i))


def tensor_names(tree: Any, sep: str = ".") -> dict[str, ArrayRef]:
    """Name every tensor of a tree (with :class:`ArrayRef` leaves) by its key path."""
    names: dict[str, ArrayRef] = {}
    for path, ref in _walk(tree):
        name = sep.join(str(k) for k in path) or "tensor"
        if name in names:
            raise UnsupportedValueError(
                f"tensors {names[name].path!r} and {ref.path!r} both export as {name!r}; pass another sep (e.g. '/')"
            )
        names[name] = ref
    return names


def export_safetensors(
    store: CheckpointStore | str | os.PathLike[str],
    dest: str | os.PathLike[str],
    step: int | str = "latest",
    subtree: Any = None,
    sep: str = ".",
) -> dict[str, str]:
    """Write the tensors of a step (or of one subtree) to one safetensors file.

    Non-tensor values go into the file's ``__metadata__`` as ``ravex.tree``: the typed
    tree (spec/FORMAT.md, "Values") with each tensor given as ``{"$array": <name>}``.
    Returns the metadata written. Tensors are streamed one at a time.
    """
    reader = _as_store(store).open_step(step)
    tree = _subtree(reader, subtree)
    names = tensor_names(tree, sep)
    by_path = {ref.path: name for name, ref in names.items()}
    header: dict[str, Any] = {}
    offset = 0
    for name, ref in sorted(names.items()):
        dtype = ref.entry.data_type
        if dtype not in SAFETENSORS_DTYPES:
            raise UnsupportedValueError(f"tensor {ref.path!r} has data_type {dtype!r}, which safetensors cannot hold")
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(ref.shape),
            "data_offsets": [offset, offset + ref.nbytes],
        }
        offset += ref.nbytes
    metadata = {
        "format": "ravex",
        "ravex.step": str(reader.step),
        "ravex.tree": json.dumps(
            encode_value(tree, lambda ref, _path: by_path[ref.path]), separators=(",", ":"), allow_nan=False
        ),
    }
    text = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _HEADER_ALIGN)
    with atomic_file(dest) as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _name, ref in sorted(names.items()):
            f.write(np.ascontiguousarray(ref.read()).reshape(-1).view(np.uint8).data)
    return metadata


def export_zarr(
    store: CheckpointStore | str | os.PathLike[str],
    dest: str | os.PathLike[str],
    step: int | str = "latest",
    link: bool = True,
) -> str:
    """Write a step as a plain Zarr v3 directory that zarr-python and tensorstore read.

    With ``link=True`` and the store on a local disk, every chunk that is a whole object
    becomes a hard link to it (no space, no copy; both tools replace files atomically
    rather than write into them, so the store's objects stay intact). Chunks packed with
    others or inline in the manifest, and every chunk where linking fails (another
    file system, a remote store), are written as files. Every chunk is checked against its
    hash first, linked or not: a damaged object is an error, never a silent export.
    ``dest`` must not exist yet. Returns ``dest``.
    """
    ckpt = _as_store(store)
    reader = ckpt.open_step(step)
    dest = os.fspath(dest)
    if os.path.exists(dest):
        raise FileExistsError(f"export destination {dest!r} already exists; choose a new path")
    with atomic_directory(dest) as tmp:
        for key, entry in step_keys(reader).items():
            path = os.path.join(tmp, *key.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if entry.doc is not None:
                _write_file(path, entry.doc)
                continue
            ref = entry.ref
            assert ref is not None and entry.array is not None
            where = f"step {reader.step} tensor {entry.array!r} chunk {key}"
            data = fetch_chunk(ckpt, reader.arrays[entry.array], ref, where)  # checked, linked or not
            source = ckpt.storage.local_path(object_key(ref.object)) if ref.object is not None else None
            if link and source is not None and ref.offset is None:
                try:
                    os.link(source, path)
                    continue
                except OSError:
                    pass  # another file system, or no hard links: copy
            _write_file(path, data)
    return dest


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)

