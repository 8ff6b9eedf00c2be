"""``torch.distributed.checkpoint`` (DCP) writes and reads Ravex stores.

    >>> import torch.distributed.checkpoint as dcp
    >>> dcp.save(state_dict, storage_writer=RavexStorageWriter("./ckpt"))
    >>> dcp.load(state_dict, storage_reader=RavexStorageReader("./ckpt"))

**What a save writes.** One Ravex step (``spec/FORMAT.md`` §11): every rank commits its own
objects and its own manifest ``steps/<step>/rank-<r>.json``, with no lock; the step is
complete once all ranks' manifests exist. Each rank's writer takes the newest complete step
as its delta base, so a tensor that did not change since the last save is reused chunk by
chunk and writes no new object. The step number is the next after every step folder in the
store (``0`` in a new store), or ``RavexStorageWriter(url, step=n)`` for the next save.

**Names.** A tensor is stored under its state-dict path (``model/fc1.weight``), so every tool
and stock zarr (through ``refs.json``) sees the state as it was saved. A whole tensor rank 0
also holds is written by rank 0. A tensor sharded along dimension 0 (``Shard(0)``, FSDP) is one
global array, each rank writing its rows (:class:`ravex.format.ArrayShard`) with one chunk size
that divides every shard boundary; any other sharding is one array per piece,
``<name>/offset-<o0>.<o1>...``, at its place in the global tensor. DCP reshards either.

**DCP's metadata without pickle.** Rank 0's manifest ``metadata`` (§5) carries ``dcp``: a typed
JSON document (§9) with each tensor's dtype, global shape and stored chunks, where each
non-tensor value lives, and DCP's ``planner_data``; the reader builds DCP's ``Metadata`` from it.

**Non-tensor values.** DCP hands those over as ``torch.save`` pickles; Ravex stores the value
itself, as typed JSON (plain scalars, ``bytes``, lists, tuples and dicts of them), and refuses
anything else at save time, naming the key. Loading hands DCP's planner the ``torch.save`` of
the decoded value (the only form ``load_bytes`` accepts): nothing read is ever unpickled.

**Loading** reads only the chunks that overlap what each rank asks for (DCP's boxes, §12), so
any world size loads any other's save.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ravex.format import ArrayRef, ArrayShard, CheckpointStore, StepReader, UnsupportedValueError, open_store
from ravex.format.objects.names import escape_key
from ravex.format.objects.values import decode_value, encode_value
from ravex.format.steps.refs import refs_worth_writing, write_refs
from ravex.saving.dtypes import numpy_view, to_torch

__all__ = ["DOC_KEY", "RavexStorageReader", "RavexStorageWriter"]

#: The member of rank 0's manifest ``metadata`` that holds the DCP document.
DOC_KEY = "dcp"
DOC_FORMAT = "ravex-dcp-1"
#: Target bytes of one chunk of an array sharded along dimension 0 (the format writer's own
#: target for arrays it chunks itself).
SHARD_CHUNK_BYTES = 16 << 20
#: Bytes a load reads in one go before copying them into the destination tensors.
READ_BATCH_BYTES = 256 << 20

Key = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One stored box of a DCP tensor: the array holding it and the box's place in the
    global tensor."""

    array: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    """How one DCP tensor is stored.

    ``kind``: ``"whole"`` (one rank writes the whole tensor), ``"rows"`` (ranks write
    dimension-0 shards of one global array, ``chunk_rows`` rows per chunk) or ``"pieces"``
    (one array per piece).
    """

    kind: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]
    chunk_rows: int = 0


@dataclasses.dataclass(frozen=True)
class RankPlan:
    """What the coordinator tells each rank (``SavePlan.storage_data``)."""

    step: int
    run: str
    rank: int
    world_size: int
    layouts: dict[str, TensorLayout]
    keys: dict[str, Key]
    doc: str | None  # rank 0 only: the DCP document for its manifest


class _OnStore:
    """What the writer and the reader share: the store they address (a ``checkpoint_id`` DCP
    passes replaces it) and the one way they open it."""

    def __init__(self, store_url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> None:
        super().__init__()
        self.url = os.fspath(store_url)
        self.storage_options = storage_options

    def _retarget(self, checkpoint_id: str | os.PathLike[str] | None) -> bool:
        """``checkpoint_id`` given: address it from now on (True)."""
        if checkpoint_id is None:
            return False
        self.url = os.fspath(checkpoint_id)
        return True

    def _open(self, create: bool = False) -> CheckpointStore:
        return open_store(self.url, create=create, storage_options=self.storage_options)


class RavexStorageWriter(_OnStore, StorageWriter):
    """A DCP ``StorageWriter`` that writes each ``dcp.save`` as one step of a Ravex store.

    ``store_url`` is a path or fsspec URL (``checkpoint_id``, if ``dcp.save`` is given one,
    replaces it). ``step``: the number of the next save's step (default: one past the highest
    step in the store). ``compression``: ``"none"``, ``"zstd"`` or ``"blosc"`` as for
    ``ravex.yaml``.
    """

    def __init__(
        self,
        store_url: str | os.PathLike[str],
        step: int | None = None,
        compression: str = "none",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(store_url, storage_options)
        self.step = step
        self.compression = compression
        self._rank = 0
        self._local_whole: dict[str, tuple[Any, ...]] = {}
        self._plan: RankPlan | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._retarget(checkpoint_id)
        self._plan = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._rank = int(kwargs.get("rank", 0))  # DCP passes it to a method that takes **kwargs

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.url)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Kept for the coordinator's global plan: the whole tensors and values this rank holds.
        self._local_whole = {item.index.fqn: _signature(item) for item in plan.items if _is_whole(item)}
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        world = len(plans)
        items = [list(p.items) for p in plans]
        mine = self._local_whole if self._rank == 0 else {}  # the coordinator is rank 0 under dcp.save

        def rank_0_holds(item: WriteItem) -> bool:
            return _is_whole(item) and mine.get(item.index.fqn) == _signature(item)

        for r in range(1, world):  # rank 0 writes every whole tensor and value it holds too
            items[0].extend(i for i in items[r] if rank_0_holds(i))
            items[r] = [i for i in items[r] if not rank_0_holds(i)]
        keys: dict[str, Key] = {}
        for p in plans:
            if isinstance(p.planner_data, dict):
                for fqn, path in p.planner_data.items():
                    keys[str(fqn)] = tuple(str(k) for k in path)
        for rank_items in items:
            for item in rank_items:
                keys.setdefault(item.index.fqn, (item.index.fqn,))
        layouts = _layouts(items, keys)
        values = {
            item.index.fqn: {"rank": r, "keys": list(keys[item.index.fqn])}
            for r, rank_items in enumerate(items)
            for item in rank_items
            if item.type == WriteItemType.BYTE_IO
        }
        planner_data = {
            str(fqn): tuple(path)
            for p in plans
            if isinstance(p.planner_data, dict)
            for fqn, path in p.planner_data.items()
        }
        doc = {
            "format": DOC_FORMAT,
            "tensors": {
                fqn: {
                    "dtype": lay.dtype,
                    "shape": list(lay.shape),
                    "chunks": [
                        {"array": c.array, "offsets": list(c.offsets), "sizes": list(c.sizes)} for c in lay.chunks
                    ],
                }
                for fqn, lay in layouts.items()
            },
            "values": values,
            "planner_data": planner_data,
        }
        store = self._open(create=True)
        step = self.step if self.step is not None else max(store.step_numbers(), default=-1) + 1
        run = uuid.uuid4().hex
        text = json.dumps(encode_value(doc, _no_arrays), separators=(",", ":"))
        return [
            dataclasses.replace(
                plans[r],
                items=items[r],
                storage_data=RankPlan(step, run, r, world, layouts, keys, text if r == 0 else None),
            )
            for r in range(world)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        assignment = plan.storage_data
        if not isinstance(assignment, RankPlan):
            raise TypeError("RavexStorageWriter.write_data needs the plan from its own prepare_global_plan")
        self._plan = assignment
        tree: dict[str, Any] = {}
        results: list[WriteResult] = []
        held: set[str] = set()
        for item in plan.items:
            fqn = item.index.fqn
            keys = assignment.keys[fqn]
            if item.type == WriteItemType.BYTE_IO:
                value = _plain_value(planner, item)
                _insert(tree, keys, value, fqn)
                results.append(WriteResult(index=item.index, size_in_bytes=0, storage_data=None))
                continue
            tensor = planner.resolve_data(item)
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"DCP item {fqn!r}: the planner resolved a tensor item to {type(tensor).__name__}")
            array = numpy_view(tensor.detach().to("cpu").contiguous())
            layout = assignment.layouts[fqn]
            td = item.tensor_data
            assert td is not None  # a tensor item always carries its tensor data
            offsets = tuple(td.chunk.offsets)
            if layout.kind == "whole":
                _insert(tree, keys, array, fqn)
            elif layout.kind == "rows":
                held.add(fqn)
                start = offsets[0] if array.shape[0] else 0  # an empty shard may sit past the end
                shard = ArrayShard(array, layout.shape, start, layout.chunk_rows)
                _insert(tree, keys, shard, fqn)
            else:
                _insert(tree, (*keys, _piece_key(offsets)), array, fqn)
            results.append(WriteResult(index=item.index, size_in_bytes=array.nbytes, storage_data=None))
        if assignment.rank == 0:  # rank 0's tree names every global array, rows or not
            for fqn, layout in assignment.layouts.items():
                if layout.kind == "rows" and fqn not in held:
                    element = numpy_view(torch.empty(0, dtype=_dtype(layout.dtype))).dtype
                    empty = np.empty((0, *layout.shape[1:]), element)
                    _insert(tree, assignment.keys[fqn], ArrayShard(empty, layout.shape, 0, layout.chunk_rows), fqn)
        store = self._open()
        metadata = {DOC_KEY: assignment.doc} if assignment.doc is not None else None
        with store.writer(
            rank=assignment.rank, world_size=assignment.world_size, compression=self.compression, run=assignment.run
        ) as writer:
            writer.commit(assignment.step, tree, metadata=metadata)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator, once every rank's write returned: check that the step is
        complete and, with several ranks, write its ``refs.json`` (one rank does it)."""
        assignment = self._plan
        if assignment is None:
            raise RuntimeError("RavexStorageWriter.finish before write_data")
        store = self._open()
        info = store.step_info(assignment.step)
        if not info.complete:
            raise RuntimeError(f"DCP save to {self.url!r}: step {assignment.step} is not complete ({info.problem})")
        if assignment.world_size > 1 and refs_worth_writing(store, assignment.step):
            write_refs(store, assignment.step)
        if self.step is not None:
            self.step = None  # an explicit step names one save

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _is_store(checkpoint_id)


class RavexStorageReader(_OnStore, StorageReader):
    """A DCP ``StorageReader`` over one complete step of a Ravex store written by
    :class:`RavexStorageWriter` (``step``: a number or ``"latest"``, resolved once)."""

    def __init__(
        self,
        store_url: str | os.PathLike[str],
        step: int | str = "latest",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(store_url, storage_options)
        self.step = step
        self._reader: StepReader | None = None
        self._chunks: dict[tuple[str, tuple[int, ...]], Chunk] = {}
        self._values: dict[str, tuple[int, Key]] = {}
        self._trees: dict[int, Any] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if self._retarget(checkpoint_id):
            self._reader = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._reader is None:
            self._reader = self._open().open_step(self.step)
            self._trees = {}
        reader = self._reader
        text = reader.metadata.get(DOC_KEY)
        where = f"{self.url!r} step {reader.step}"
        if text is None:
            raise ValueError(
                f"{where} was not written by RavexStorageWriter (its rank 0 manifest has no "
                f"{DOC_KEY!r} metadata); read it with ravex.load or ravex.format.open_store instead"
            )
        doc = decode_value(json.loads(text), _no_refs, f"{where} DCP document")
        if not isinstance(doc, dict) or doc.get("format") != DOC_FORMAT:
            raise ValueError(f"{where}: the {DOC_KEY!r} metadata is not a {DOC_FORMAT} document")
        state: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        self._chunks = {}
        for fqn, t in doc["tensors"].items():
            chunks = [Chunk(c["array"], tuple(c["offsets"]), tuple(c["sizes"])) for c in t["chunks"]]
            for c in chunks:
                self._chunks[(fqn, c.offsets)] = c
            state[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_dtype(t["dtype"])),
                size=torch.Size(t["shape"]),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)) for c in chunks],
            )
        self._values = {fqn: (int(v["rank"]), tuple(v["keys"])) for fqn, v in doc["values"].items()}
        for fqn in self._values:
            state[fqn] = BytesStorageMetadata()
        return Metadata(state_dict_metadata=state, planner_data=doc["planner_data"])

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self._reader is None:
            self.read_metadata()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        reader = self._reader
        if reader is None:
            raise RuntimeError("RavexStorageReader.read_data before read_metadata")
        boxes: dict[tuple[int, int] | None, list[tuple[ReadItem, Chunk]]] = {}
        for item in plan.items:
            fqn = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                rank, keys = self._values[fqn]
                value = self._tree(rank)
                for key in keys:
                    value = value[key]
                buffer = io.BytesIO()
                torch.save(value, buffer)  # a plain value decoded from typed JSON
                buffer.seek(0)
                planner.load_bytes(item, buffer)
                continue
            chunk = self._chunks[(fqn, tuple(item.storage_index.offset or ()))]
            lo, n = item.storage_offsets, item.lengths
            boxes.setdefault((lo[0], lo[0] + n[0]) if chunk.sizes else None, []).append((item, chunk))
        # Items reading the same rows are read together (their chunks fetched in parallel), in
        # batches of about READ_BATCH_BYTES so that a large state is not held twice in memory.
        for rows, group in boxes.items():
            batch: list[tuple[ReadItem, Chunk]] = []
            size = 0
            for i, (item, chunk) in enumerate(group):
                batch.append((item, chunk))
                size += math.prod(item.lengths) * _dtype_size(reader, chunk.array)
                if size >= READ_BATCH_BYTES or i == len(group) - 1:
                    self._read_batch(reader, planner, batch, rows)
                    batch, size = [], 0
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_batch(
        self,
        reader: StepReader,
        planner: LoadPlanner,
        batch: list[tuple[ReadItem, Chunk]],
        rows: tuple[int, int] | None,
    ) -> None:
        arrays = reader.read_arrays(
            sorted({chunk.array for _, chunk in batch}), rows=None if rows is None else slice(*rows)
        )
        for item, chunk in batch:
            source = to_torch(arrays[chunk.array])
            if rows is not None:
                lo, n = item.storage_offsets, item.lengths
                box = [slice(None)] + [slice(o, o + k) for o, k in zip(lo[1:], n[1:], strict=True)]
                source = source[tuple(box)]
            target = planner.resolve_tensor(item).detach()
            if target.size() != source.size():
                raise ValueError(
                    f"DCP load of {item.storage_index.fqn!r}: stored box {tuple(source.size())} does not "
                    f"fit the destination's {tuple(target.size())}"
                )
            target.copy_(source)
            planner.commit_tensor(item, target)

    def _tree(self, rank: int) -> Any:
        if rank not in self._trees:
            assert self._reader is not None
            self._trees[rank] = self._reader.tree(rank)
        return self._trees[rank]

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _is_store(checkpoint_id)


# ---- planning -------------------------------------------------------------------------


def _is_whole(item: WriteItem) -> bool:
    """A value, or a tensor item that covers its whole tensor."""
    if item.type == WriteItemType.BYTE_IO:
        return True
    td = item.tensor_data
    return td is not None and not any(td.chunk.offsets) and tuple(td.chunk.sizes) == tuple(td.size)


def _signature(item: WriteItem) -> tuple[Any, ...]:
    """What must match for rank 0's copy of a whole item to stand in for another rank's."""
    td = item.tensor_data
    return (item.type,) if td is None else (item.type, tuple(td.size), td.properties.dtype)


def _layouts(items: Sequence[Sequence[WriteItem]], keys: dict[str, Key]) -> dict[str, TensorLayout]:
    """Each tensor's layout from every rank's items (see the module doc, "Names")."""
    pieces: dict[str, list[tuple[int, WriteItem]]] = {}
    for rank, rank_items in enumerate(items):
        for item in rank_items:
            if item.type != WriteItemType.BYTE_IO:
                pieces.setdefault(item.index.fqn, []).append((rank, item))
    out: dict[str, TensorLayout] = {}
    for fqn, found in pieces.items():
        tds = [item.tensor_data for _, item in found]
        assert all(td is not None for td in tds)
        first = tds[0]
        assert first is not None
        shape = tuple(first.size)
        dtype = str(first.properties.dtype).removeprefix("torch.")
        path = "/".join(escape_key(k) for k in keys[fqn])
        boxes = [(tuple(td.chunk.offsets), tuple(td.chunk.sizes)) for td in tds if td is not None]
        if len(found) == 1 and _is_whole(found[0][1]):
            out[fqn] = TensorLayout("whole", dtype, shape, (Chunk(path, boxes[0][0], boxes[0][1]),))
            continue
        rows = _row_shards(shape, boxes, [r for r, _ in found])
        if rows is not None:
            row_bytes = math.prod(shape[1:]) * first.properties.dtype.itemsize
            chunk_rows = _chunk_rows(shape[0], rows, max(1, SHARD_CHUNK_BYTES // max(1, row_bytes)))
            zero = (0,) * len(shape)
            out[fqn] = TensorLayout("rows", dtype, shape, (Chunk(path, zero, shape),), chunk_rows)
            continue
        chunks = tuple(Chunk(f"{path}/{escape_key(_piece_key(o))}", o, s) for o, s in boxes)
        out[fqn] = TensorLayout("pieces", dtype, shape, chunks)
    return out


Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


def _row_shards(shape: tuple[int, ...], boxes: list[Box], ranks: list[int]) -> list[int] | None:
    """The row boundaries where ``boxes`` tile ``shape`` along dimension 0, at most one box per
    rank, each spanning every other dimension; else ``None``."""
    if not shape or len(set(ranks)) != len(ranks):
        return None
    if any(o[1:] != (0,) * (len(shape) - 1) or s[1:] != shape[1:] for o, s in boxes):
        return None
    spans = sorted((o[0], o[0] + s[0]) for o, s in boxes if s[0] > 0)
    at = 0
    for lo, hi in spans:
        if lo != at:
            return None
        at = hi
    if at != shape[0]:
        return None
    return [lo for lo, _ in spans[1:]]


def _chunk_rows(n: int, boundaries: list[int], target: int) -> int:
    """The largest row count at most ``target`` that divides every inner shard boundary of ``n``
    rows; with no inner boundary, equal chunks of at most ``target`` rows, as the format writer
    cuts an array of its own (never more rows than the array has: a chunk is stored padded)."""
    g = 0
    for b in boundaries:
        g = math.gcd(g, b)
    if g == 0:
        return max(1, math.ceil(n / math.ceil(n / target))) if n else 1
    best = 1
    d = 1
    while d * d <= g:
        if g % d == 0:
            for c in (d, g // d):
                if c <= target:
                    best = max(best, c)
        d += 1
    return best


def _piece_key(offsets: Sequence[int]) -> str:
    return "offset-" + ".".join(str(o) for o in offsets)


def _insert(tree: dict[str, Any], keys: Key, leaf: Any, fqn: str) -> None:
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise UnsupportedValueError(f"DCP key {fqn!r}: its path {'/'.join(keys)} passes through another value")
        node = child
    if keys[-1] in node:
        raise UnsupportedValueError(f"DCP key {fqn!r}: its path {'/'.join(keys)} is taken by another key")
    node[keys[-1]] = leaf


def _plain_value(planner: SavePlanner, item: WriteItem) -> Any:
    """The value behind a non-tensor item, checked to be representable as typed JSON."""
    fqn = item.index.fqn
    lookup = getattr(planner, "lookup_object", None)
    if lookup is None:
        raise UnsupportedValueError(
            f"DCP key {fqn!r}: RavexStorageWriter stores non-tensor values as typed JSON and needs a "
            "planner with lookup_object (DefaultSavePlanner or a subclass) to reach the value"
        )
    value = lookup(item.index)

    def refuse(leaf: Any, path: tuple[Any, ...]) -> str:
        raise UnsupportedValueError(
            f"DCP key {fqn!r}: a {type(leaf).__name__} is neither a tensor nor a plain value; Ravex stores None, "
            "bool, int, float, str, bytes and lists/tuples/dicts of them: convert it, or keep it out of the state dict"
        )

    encode_value(value, refuse)
    return value


def _no_arrays(leaf: Any, path: tuple[Any, ...]) -> str:
    raise UnsupportedValueError(f"the DCP document holds a {type(leaf).__name__} at {path!r}")


def _no_refs(path: str) -> Any:
    raise ValueError(f"the DCP document names an array ({path!r}) where it holds plain values")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"DCP document: {name!r} is not a torch dtype")
    return dtype


def _dtype_size(reader: StepReader, array: str) -> int:
    return ArrayRef(reader, array).dtype.itemsize


def _is_store(checkpoint_id: str | os.PathLike[str]) -> bool:
    try:
        open_store(checkpoint_id)
    except (OSError, ValueError):
        return False
    return True
