"""Diff of two steps, possibly from two stores.

Which chunks changed is known from the manifests alone (raw digests); only the
tensors that changed are read, to measure by how much. RNG streams and loader/loop
positions (:mod:`ravex.format.steps.sections`) sit apart from the training tensors and values, compared
from the manifests only: how far an RNG state moved means nothing. This is the one diff: the
``ravex diff`` verb, the inspector and anything that exports a diff use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..steps.reader import ArrayRef, StepReader
from ..steps.sections import is_bookkeeping
from .summary import Progress, no_progress


@dataclass(frozen=True)
class TensorDiff:
    """One tensor of a diff; the measures are None until the tensor is read."""

    name: str
    status: str  # added | removed | changed | unchanged | reshaped
    chunks_changed: int = 0
    chunks_total: int = 0
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    max_abs: float | None = None
    rel_l2: float | None = None  # ||a - b|| / ||a||
    cosine: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["shape"] = list(self.shape) if self.shape is not None else None
        return d


@dataclass(frozen=True)
class ValueDiff:
    """One non-tensor leaf of the state trees (lr, step, epoch ...)."""

    name: str
    status: str  # added | removed | changed | unchanged
    a: Any = None
    b: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "a": jsonable(self.a), "b": jsonable(self.b)}


@dataclass
class StepDiff:
    """Every tensor and value of two steps, ``a`` the reference; RNG and loader/loop
    bookkeeping in ``bookkeeping`` and ``bookkeeping_values``, not in ``tensors``/``values``."""

    a: str
    b: str
    tensors: list[TensorDiff] = field(default_factory=list)
    values: list[ValueDiff] = field(default_factory=list)
    bookkeeping: list[TensorDiff] = field(default_factory=list)
    bookkeeping_values: list[ValueDiff] = field(default_factory=list)

    def changed(self) -> list[TensorDiff]:
        return [t for t in self.tensors if t.status != "unchanged"]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "tensors": [t.to_json() for t in self.tensors],
            "values": [v.to_json() for v in self.values],
            "bookkeeping": [t.to_json() for t in self.bookkeeping],
            "bookkeeping_values": [v.to_json() for v in self.bookkeeping_values],
        }


def diff(a: StepReader, b: StepReader, stats: bool = True, progress: Progress | None = None) -> StepDiff:
    """Compare step ``a`` (the reference) with step ``b``.

    ``stats=False`` stops at what the manifests tell (status and chunk counts). Otherwise each
    changed tensor is read and measured by :func:`compare_tensor`, one at a time, reporting
    ``progress`` before each.
    """
    out = StepDiff(f"{a.store.url}@{a.step}", f"{b.store.url}@{b.step}")
    for name in sorted(set(a.arrays) | set(b.arrays)):
        (out.bookkeeping if is_bookkeeping(name) else out.tensors).append(_manifest_diff(a, b, name))
    if stats:
        progress = progress or no_progress
        changed = [i for i, t in enumerate(out.tensors) if t.status == "changed"]
        for n, i in enumerate(changed):
            progress(n, len(changed), out.tensors[i].name)
            out.tensors[i] = compare_tensor(a, b, out.tensors[i])
        progress(len(changed), len(changed), "")
    va, vb = _flat_values(a), _flat_values(b)
    for name in sorted(set(va) | set(vb)):
        values = out.bookkeeping_values if is_bookkeeping(name) else out.values
        if name not in va:
            values.append(ValueDiff(name, "added", None, vb[name]))
        elif name not in vb:
            values.append(ValueDiff(name, "removed", va[name], None))
        else:
            same = _same(va[name], vb[name])
            values.append(ValueDiff(name, "unchanged" if same else "changed", va[name], vb[name]))
    return out


def _manifest_diff(a: StepReader, b: StepReader, name: str) -> TensorDiff:
    """A tensor's status and changed chunks from the two manifests' raw digests; nothing is read."""
    ea, eb = a.arrays.get(name), b.arrays.get(name)
    if ea is None or eb is None:
        e = eb if ea is None else ea
        assert e is not None
        return TensorDiff(name, "added" if ea is None else "removed", 0, len(e.chunks), e.shape, e.data_type)
    if ea.shape != eb.shape or ea.data_type != eb.data_type:
        return TensorDiff(name, "reshaped", len(eb.chunks), len(eb.chunks), eb.shape, eb.data_type)
    keys = set(ea.chunks) | set(eb.chunks)
    changed = sum(1 for k in keys if k not in ea.chunks or k not in eb.chunks or ea.chunks[k].raw != eb.chunks[k].raw)
    if changed == 0 and ea.chunk_shape == eb.chunk_shape:
        return TensorDiff(name, "unchanged", 0, len(keys), ea.shape, ea.data_type)
    return TensorDiff(name, "changed", changed, len(keys), ea.shape, ea.data_type)


def compare_tensor(a: StepReader, b: StepReader, td: TensorDiff) -> TensorDiff:
    """Fill in max |a-b|, ||a-b||/||a|| and cosine for one tensor the manifests call changed.

    A tensor chunked differently in the two steps differs in every raw digest though its values
    may be equal: when they are, it is ``unchanged`` with no chunk changed.
    """
    x = ArrayRef(a, td.name).read()
    y = ArrayRef(b, td.name).read()
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    xa, ya = x.astype(wide), y.astype(wide)
    d = ya - xa
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    if max_abs == 0.0 and a.arrays[td.name].chunk_shape != b.arrays[td.name].chunk_shape:
        return TensorDiff(td.name, "unchanged", 0, td.chunks_total, td.shape, td.dtype, 0.0, 0.0, 1.0)
    na, nd, nb = (float(np.linalg.norm(v.ravel())) for v in (xa, d, ya))
    rel = nd / na if na else (0.0 if nd == 0 else math.inf)
    cos = float(np.real(np.vdot(xa.ravel(), ya.ravel()))) / (na * nb) if na and nb else None
    return TensorDiff(td.name, td.status, td.chunks_changed, td.chunks_total, td.shape, td.dtype, max_abs, rel, cos)


def change_order(td: TensorDiff) -> tuple[int, float, str]:
    """Sort key: added/removed/reshaped first, then the largest relative change, unchanged last."""
    rank = {"added": 0, "removed": 0, "reshaped": 0, "changed": 1, "unchanged": 2}.get(td.status, 3)
    rel = td.rel_l2 if td.rel_l2 is not None else (td.chunks_changed / td.chunks_total if td.chunks_total else 0.0)
    return (rank, -rel if not math.isnan(rel) else 0.0, td.name)


def _flat_values(r: StepReader) -> dict[str, Any]:
    """Non-tensor leaves of every rank's tree, named by their path."""
    out: dict[str, Any] = {}
    for rank in range(r.world_size):
        walk_values(r.tree(rank), f"rank-{rank}/" if r.world_size > 1 else "", out)
    return out


def walk_values(node: Any, path: str, out: dict[str, Any]) -> None:
    """Collect the non-tensor leaves of a state tree into ``out`` by ``/``-joined key path."""
    if isinstance(node, ArrayRef):
        return
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    else:
        out[path] = node
        return
    sep = "" if not path or path.endswith("/") else "/"
    for k, v in items:
        walk_values(v, f"{path}{sep}{k}", out)


def step_values(reader: StepReader, rank: int = 0) -> dict[str, Any]:
    """Non-tensor leaves of one rank's state tree (lr, step, epoch ...), by their ``/`` path."""
    out: dict[str, Any] = {}
    walk_values(reader.tree(rank), "", out)
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y


def jsonable(value: Any) -> Any:
    """``value`` with what strict JSON cannot hold spelled out: ``inf``/``nan`` as text, bytes as hex,
    tuples as lists, keys as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value
