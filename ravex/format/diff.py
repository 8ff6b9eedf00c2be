"""Diff of two steps, possibly from two stores.

Which chunks changed is known from the manifests alone (raw digests); only the
tensors that changed are read, to measure by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .reader import ArrayRef, StepReader


@dataclass(frozen=True)
class TensorDiff:
    name: str
    status: str  # added | removed | changed | unchanged | reshaped
    chunks_changed: int = 0
    chunks_total: int = 0
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    max_abs: float | None = None
    rel_l2: float | None = None  # ||a - b|| / ||a||
    cosine: float | None = None

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["shape"] = list(self.shape) if self.shape is not None else None
        return d


@dataclass(frozen=True)
class ValueDiff:
    name: str
    status: str  # added | removed | changed | unchanged
    a: Any = None
    b: Any = None

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "a": _jsonable(self.a), "b": _jsonable(self.b)}


@dataclass
class StepDiff:
    a: str
    b: str
    tensors: list[TensorDiff] = field(default_factory=list)
    values: list[ValueDiff] = field(default_factory=list)

    def changed(self) -> list[TensorDiff]:
        return [t for t in self.tensors if t.status != "unchanged"]

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "tensors": [t.to_json() for t in self.tensors],
            "values": [v.to_json() for v in self.values],
        }


def diff(a: StepReader, b: StepReader, stats: bool = True) -> StepDiff:
    """Compare step ``a`` (the reference) with step ``b``.

    ``stats=False`` stops at what the manifests tell (status and chunk counts).
    """
    out = StepDiff(f"{a.store.url}@{a.step}", f"{b.store.url}@{b.step}")
    names = sorted(set(a.arrays) | set(b.arrays))
    for name in names:
        ea, eb = a.arrays.get(name), b.arrays.get(name)
        if ea is None or eb is None:
            e = eb if ea is None else ea
            out.tensors.append(
                TensorDiff(name, "added" if ea is None else "removed", 0, len(e.chunks), e.shape, e.data_type)
            )
            continue
        if ea.shape != eb.shape or ea.data_type != eb.data_type:
            out.tensors.append(TensorDiff(name, "reshaped", len(eb.chunks), len(eb.chunks), eb.shape, eb.data_type))
            continue
        changed = sum(
            1 for k in set(ea.chunks) | set(eb.chunks)
            if k not in ea.chunks or k not in eb.chunks or ea.chunks[k].raw != eb.chunks[k].raw
        )
        total = len(set(ea.chunks) | set(eb.chunks))
        if changed == 0 and ea.chunk_shape == eb.chunk_shape:
            out.tensors.append(TensorDiff(name, "unchanged", 0, total, ea.shape, ea.data_type))
            continue
        td = TensorDiff(name, "changed", changed, total, ea.shape, ea.data_type)
        if stats:
            td = _with_stats(td, ArrayRef(a, name).read(), ArrayRef(b, name).read())
            if td.max_abs == 0.0 and ea.chunk_shape != eb.chunk_shape:
                td = TensorDiff(name, "unchanged", 0, total, ea.shape, ea.data_type, 0.0, 0.0, 1.0)
        out.tensors.append(td)
    va, vb = _flat_values(a), _flat_values(b)
    for name in sorted(set(va) | set(vb)):
        if name not in va:
            out.values.append(ValueDiff(name, "added", None, vb[name]))
        elif name not in vb:
            out.values.append(ValueDiff(name, "removed", va[name], None))
        else:
            same = _same(va[name], vb[name])
            out.values.append(ValueDiff(name, "unchanged" if same else "changed", va[name], vb[name]))
    return out


def _with_stats(td: TensorDiff, x: np.ndarray, y: np.ndarray) -> TensorDiff:
    if x.dtype.kind in "fcbiu" and x.dtype.itemsize and x.dtype.name not in ("bool",):
        xa = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
        ya = y.astype(xa.dtype)
    else:
        xa, ya = x.astype(np.float64), y.astype(np.float64)
    d = ya - xa
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    na, nd, nb = (float(np.linalg.norm(v.ravel())) for v in (xa, d, ya))
    rel = nd / na if na else (0.0 if nd == 0 else math.inf)
    cos = float(np.real(np.vdot(xa.ravel(), ya.ravel()))) / (na * nb) if na and nb else None
    return TensorDiff(td.name, td.status, td.chunks_changed, td.chunks_total, td.shape, td.dtype, max_abs, rel, cos)


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


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if isinstance(v, bytes):
        return v.hex()
    return v
