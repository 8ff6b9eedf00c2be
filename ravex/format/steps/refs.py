"""``steps/<step>/refs.json``: a step in fsspec's reference format (version 1).

With it, ``fsspec`` and ``zarr`` alone open a step as a Zarr v3 hierarchy: no Ravex,
no torch. Every key of the step's Zarr view (``keyview.step_keys``) becomes a
reference: metadata documents as JSON text, inline chunks as ``"base64:..."``, and
chunks in objects as ``["{{u}}/objects/ab/abcd...", offset, size]``. The template
``u`` is the store root; the file records ``"."`` (the working directory), and a
reader anywhere else passes the store's location::

    import zarr                  # with fsspec, which serves "reference://"
    root = "/data/ckpt"          # or "s3://bucket/ckpt"; "." inside the store
    group = zarr.open_group("reference://", mode="r", storage_options={
        "fo": f"{root}/steps/100/refs.json", "template_overrides": {"u": root}})

The file is derived from the manifests; it adds nothing they do not say, so a
missing or stale ``refs.json`` never makes a step unreadable by Ravex.

Writers add it to a step on their own only while it stays small beside the step
(:func:`refs_worth_writing`): a table checkpointed in 2 KiB chunks would otherwise write
~105 bytes of ``refs.json`` per chunk, 40 MiB per commit of a 768 MiB embedding table,
more than the rows that changed. ``ravex export STEP --format refs OUT`` writes it for
any step on demand.
"""

from __future__ import annotations

import base64
import json
import math
import os
from typing import TYPE_CHECKING, Any

from ..objects.dtypes import data_type
from ..objects.names import MAIN_STEPS, object_key, step_dir
from ..storage import atomic_write
from .keyview import step_keys
from .reader import StepReader

if TYPE_CHECKING:
    from .catalog import StoreCatalog

__all__ = ["REFS_NAME", "export_refs", "refs_key", "refs_worth_writing", "step_refs", "write_refs"]

REFS_NAME = "refs.json"
#: The template naming the store root inside ``refs.json``.
ROOT_TEMPLATE = "u"
_OBJECT_URL = "{{u}}/"
#: A writer adds ``refs.json`` by itself to a step of at most this many chunk entries ...
AUTO_ALWAYS_ENTRIES = 4096
#: ... or where ~128 bytes per entry stay within this share of the step's logical bytes
#: (mean chunk >= 12.8 KiB: every dense model at the default 16 MiB chunks).
AUTO_MAX_SHARE = 0.01
_BYTES_PER_ENTRY = 128


def refs_key(step: int, steps: str = MAIN_STEPS) -> str:
    """Storage key of a step's reference file (``steps``: its timeline's folder of steps)."""
    return f"{step_dir(step, steps)}/{REFS_NAME}"


def step_refs(store: StoreCatalog, step: int | str, root: str = ".") -> dict[str, Any]:
    """The fsspec reference document (version 1) of a complete step.

    ``root`` is what the ``{{u}}`` template stands for: ``"."`` (the default) keeps the
    file valid wherever the store is copied; a reader elsewhere overrides it.
    """
    reader = StepReader(store, store.resolve_step(step))
    refs: dict[str, Any] = {}
    for key, entry in step_keys(reader, consolidate="core").items():
        if entry.doc is not None:
            refs[key] = entry.doc.decode()
            continue
        ref = entry.ref
        assert ref is not None
        if ref.inline is not None:
            refs[key] = "base64:" + base64.b64encode(ref.inline).decode("ascii")
        else:
            assert ref.object is not None
            refs[key] = [_OBJECT_URL + object_key(ref.object), ref.offset or 0, ref.size]
    return {"version": 1, "templates": {ROOT_TEMPLATE: root}, "refs": refs}


def refs_worth_writing(store: StoreCatalog, step: int | str) -> bool:
    """Whether a writer should add ``refs.json`` to ``step`` unasked (see the module doc)."""
    reader = StepReader(store, store.resolve_step(step))
    entries = sum(len(entry.chunks) for entry in reader.arrays.values())
    logical = sum(math.prod(e.shape) * data_type(e.data_type).itemsize for e in reader.arrays.values())
    return entries <= AUTO_ALWAYS_ENTRIES or entries * _BYTES_PER_ENTRY <= AUTO_MAX_SHARE * logical


def export_refs(store: StoreCatalog, dest: str, step: int | str = "latest") -> str:
    """Write a step's reference document to the local file ``dest`` (which must not exist).

    Its ``{{u}}`` template records ``"."``; a reader passes the store's location (module doc).
    """
    if os.path.exists(dest):
        raise FileExistsError(f"export destination {dest!r} already exists; choose a new path")
    data = json.dumps(step_refs(store, store.resolve_step(step)), separators=(",", ":"), sort_keys=True)
    atomic_write(dest, data.encode() + b"\n")
    return dest


def write_refs(store: StoreCatalog, step: int | str) -> str:
    """Write ``steps/<step>/refs.json`` for a complete step; returns its key.

    Deterministic and idempotent: calling it again (from another rank, after a retry)
    writes the same bytes, and skips the write when the file already holds them.
    The write is atomic (``Storage.write``), so a reader never sees half a file; it is
    not synced further, since a lost ``refs.json`` loses nothing the manifests lack.
    """
    number = store.resolve_step(step)
    key = refs_key(number, store.steps_prefix)
    data = json.dumps(step_refs(store, number), separators=(",", ":"), sort_keys=True).encode() + b"\n"
    try:
        if store.storage.read(key) == data:
            return key
    except FileNotFoundError:
        pass
    store.storage.write(key, data)
    return key
