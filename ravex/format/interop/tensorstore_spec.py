"""Reading a step with tensorstore, in place: a ``zarr3`` spec over a ``kvstack`` kvstore.

Each chunk key of the array (``c/0/0``) is an ``exact`` layer of a ``kvstack`` kvstore
whose base is the object file holding it, and the array's ``zarr.json`` is given in
the spec with ``assume_metadata`` (nothing is written, nothing copied)::

    {"driver": "zarr3", "assume_metadata": true, "metadata": {...zarr.json...},
     "kvstore": {"driver": "kvstack", "layers": [
         {"exact": "c/0/0", "base": {"driver": "file", "path": "<store>/objects/ab/ab..."}}, ...]}}

A ``file`` (or ``gs://``/``s3://`` URL) kvstore can only name a whole object. Small
chunks are inline in the manifest or packed with others into one object; their bytes
are put into an in-memory kvstore of the spec's context by :func:`open_tensorstore`.
:func:`tensorstore_step` gives every array's spec at once with those chunks as plain
references (a file and byte range, or base64), so a process with tensorstore and
nothing else (no Ravex, no torch) fills the memory kvstore itself and reads the whole
step. For a directory every tool can read with no help, export the step with
``export.export_zarr`` instead.

tensorstore does not check the chunks against the manifest; Ravex's own readers do.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from ..objects.names import object_key

if TYPE_CHECKING:
    from ..objects.chunkref import ChunkRef
    from ..store import CheckpointStore

#: Key prefix, in the context's memory kvstore, of chunks that have no object of their own.
MEMORY_PREFIX = "ravex-chunks/"

_METADATA_FIELDS = ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "codecs")


def _object_location(store: CheckpointStore, name: str) -> str:
    """A local path or a URL tensorstore reaches an object at."""
    key = object_key(name)
    path = store.storage.local_path(key)
    if path is not None:
        return path
    url = store.url
    if url.startswith(("gs://", "s3://", "http://", "https://")):
        return f"{url}/{key}"
    raise ValueError(f"tensorstore cannot reach {url!r}; export the step with export_zarr() to a path it can")


def _object_kvstore(store: CheckpointStore, name: str) -> dict[str, Any] | str:
    where = _object_location(store, name)
    return where if "://" in where else {"driver": "file", "path": where}


def _whole(ref: ChunkRef) -> bool:
    return ref.inline is None and ref.offset is None


def tensorstore_spec(store: CheckpointStore, step: int | str, path: str) -> dict[str, Any]:
    """A tensorstore JSON spec (driver ``zarr3``) reading tensor ``path`` of ``step`` in place.

    Chunks with an object of their own are file layers; the others are memory layers
    (``MEMORY_PREFIX + <path>/<chunk key>``) that :func:`open_tensorstore` fills.
    """
    reader = store.open_step(step)
    entry = reader.arrays[path] if path in reader.arrays else None
    if entry is None:
        from ..errors import ArrayNotFoundError

        raise ArrayNotFoundError(f"step {reader.step} has no tensor {path!r}; tensors: {sorted(reader.arrays)[:10]}")
    layers = []
    for key, ref in sorted(entry.chunks.items()):
        if _whole(ref):
            assert ref.object is not None
            base: dict[str, Any] | str = _object_kvstore(store, ref.object)
        else:
            base = {"driver": "memory", "path": f"{MEMORY_PREFIX}{path}/{key}"}
        layers.append({"exact": key, "base": base})
    return {
        "driver": "zarr3",
        "kvstore": {"driver": "kvstack", "layers": layers},
        "metadata": {k: entry.zarr[k] for k in _METADATA_FIELDS if k in entry.zarr},
        "assume_metadata": True,
    }


def tensorstore_step(store: CheckpointStore, step: int | str) -> dict[str, Any]:
    """Every array of ``step`` for tensorstore alone, as plain JSON::

        {"step": 7, "arrays": {path: spec}, "memory": {key: chunk}}

    ``spec`` is :func:`tensorstore_spec`'s; ``memory`` holds the chunks its memory layers
    name (``MEMORY_PREFIX + <path>/<chunk key>``), each ``[location, offset, size]`` (a
    byte range of a local file or of a URL) or ``"base64:..."`` (inline). A reader writes
    them into a ``memory`` kvstore of one ``ts.Context`` and opens each spec with it
    (spec §18.3 shows the lines).
    """
    reader = store.open_step(step)
    arrays: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    for path in sorted(reader.arrays):
        arrays[path] = tensorstore_spec(store, reader.step, path)
        for key, ref in sorted(reader.arrays[path].chunks.items()):
            if _whole(ref):
                continue
            if ref.inline is not None:
                chunk: Any = "base64:" + base64.b64encode(ref.inline).decode("ascii")
            else:
                assert ref.object is not None
                chunk = [_object_location(store, ref.object), ref.offset or 0, ref.size]
            memory[f"{MEMORY_PREFIX}{path}/{key}"] = chunk
    return {"step": reader.step, "arrays": arrays, "memory": memory}


def open_tensorstore(store: CheckpointStore, step: int | str, path: str, context: Any = None) -> Any:
    """Open tensor ``path`` of ``step`` read-only with tensorstore (``ts.open(...).result()``)."""
    import tensorstore as ts

    from ..steps.keyview import fetch_chunk

    reader = store.open_step(step)
    spec = tensorstore_spec(store, reader.step, path)
    context = context if context is not None else ts.Context()
    entry = reader.arrays[path]
    small = {key: ref for key, ref in entry.chunks.items() if not _whole(ref)}
    if small:
        memory = ts.KvStore.open({"driver": "memory"}, context=context).result()
        for key, ref in small.items():
            where = f"step {reader.step} tensor {path!r} chunk {key}"
            memory.write(f"{MEMORY_PREFIX}{path}/{key}", fetch_chunk(store, entry, ref, where)).result()
    return ts.open(spec, context=context, read=True).result()
