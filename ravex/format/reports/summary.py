"""Summaries of what a store holds, for the tools (``ravex ls/show``, ``ravex inspect``).

Pure functions over what the rest of the format already exposes: per-step sizes from the
manifests' headers, which chunks a step shares with the previous one, streaming tensor
statistics and histograms. Nothing here writes to a store, and nothing imports torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ManifestError, RavexError
from ..objects.dtypes import data_type
from ..objects.names import manifest_ranks
from ..steps.manifest import ArrayEntry
from ..steps.reader import ArrayRef, StepReader
from ..store import CheckpointStore

#: ``progress(done, total, what)``; ``total`` is 0 when unknown. A callback may raise to stop the work.
Progress = Callable[[int, int, str], None]

#: Tensors up to this size are read whole for statistics; larger ones are streamed twice in row blocks.
STATS_WHOLE_BYTES = 256 << 20
STATS_BLOCK_BYTES = 64 << 20


def no_progress(done: int, total: int, what: str) -> None:
    """A :data:`Progress` that reports nothing."""


# ---- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSummary:
    """What a listing shows for one step: from its manifests, no tensor is read."""

    step: int
    complete: bool
    problem: str | None
    world_size: int | None
    ranks: tuple[int, ...]
    created_at: str = ""
    tensors: int = 0
    logical_bytes: int = 0
    new_bytes: int = 0
    reused_bytes: int = 0
    #: the training loss rank 0 recorded for the step (spec §21); None where none was (1.0)
    loss: float | None = None
    #: the run that wrote the step: its record is ``runs/<run>.json``
    run: str | None = None

    @property
    def reuse_ratio(self) -> float | None:
        """Fraction of the logical bytes that did not have to be written."""
        return self.reused_bytes / self.logical_bytes if self.logical_bytes else None

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ranks"] = list(self.ranks)
        d["reuse_ratio"] = self.reuse_ratio
        if self.loss is not None and not math.isfinite(self.loss):
            d["loss"] = repr(self.loss)  # JSON has no nan or inf
        return d


def step_loss(metadata: Any) -> float | None:
    """The ``loss`` a manifest's metadata records (spec §21), or None: absent (1.0) or not a number."""
    text = metadata.get("loss") if isinstance(metadata, dict) else None
    try:
        return float(text) if isinstance(text, str) else None
    except ValueError:
        return None


#: A manifest's small fields (step, rank, world_size, run, created_at, metadata, stats) come before
#: its tree and arrays; a listing reads this many bytes of each manifest instead of all of it.
HEADER_BYTES = 64 << 10


def read_manifest_header(store: CheckpointStore, step: int, rank: int) -> dict[str, Any]:
    """The fields of one manifest other than ``tree`` and ``arrays``, without parsing those.

    A manifest of 10,000 tensors is megabytes of JSON; listing 100 steps must not parse them
    all. Reads the first :data:`HEADER_BYTES` and parses up to ``"tree"``; when that fails
    (another writer's key order, huge metadata) it falls back to parsing the whole document.
    Raises ``FileNotFoundError`` or :class:`ManifestError`.
    """
    key = store.manifest_key(step, rank)
    head = store.storage.read_range(key, 0, HEADER_BYTES)
    doc: Any = None
    cut = head.find(b',"tree":')
    if cut > 0:
        try:
            doc = json.loads(head[:cut] + b"}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            doc = None
    if not _header_ok(doc):
        data = head if len(head) < HEADER_BYTES else store.storage.read(key)
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ManifestError(f"step {step} rank {rank}: malformed manifest ({type(exc).__name__})") from None
        if not isinstance(doc, dict):
            raise ManifestError(f"step {step} rank {rank}: not a manifest")
        doc = {k: v for k, v in doc.items() if k not in ("tree", "arrays")}
    if not _header_ok(doc) or doc["step"] != step or doc["rank"] != rank:
        raise ManifestError(f"step {step} rank {rank}: not a Ravex manifest for this step and rank")
    header: dict[str, Any] = doc
    return header


def _header_ok(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("format") == "ravex-manifest"
        and all(isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool)
                for k in ("step", "rank", "world_size"))
    )


def summarize_step(store: CheckpointStore, step: int) -> StepSummary:
    """A step's completeness and size from its manifests' headers (see :func:`read_manifest_header`).

    Complete means what :meth:`CheckpointStore.step_info` means: the manifests of ranks
    ``0..W-1`` (and no others) exist and agree on ``world_size`` ``W`` and ``run``; for ``W > 1``
    the store is asked too, since whether the ranks' tensors merge needs their whole manifests.
    """
    ranks = manifest_ranks(store.storage.list_dir(store.step_dir(step)))
    if not ranks:
        return StepSummary(step, False, "no manifest", None, ())
    headers: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        try:
            headers[rank] = read_manifest_header(store, step, rank)
        except (RavexError, OSError) as exc:
            return StepSummary(step, False, f"rank {rank}: {exc}", None, tuple(ranks))
    first = headers[ranks[0]]
    world = first["world_size"]
    problem = None
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        problem = f"missing manifests of ranks {missing}"
    elif any(h["world_size"] != world or h.get("run") != first.get("run") for h in headers.values()):
        problem = "ranks belong to another run or world size (mixed writers)"
    elif ranks[-1] >= world:
        problem = f"rank {ranks[-1]} is beyond world_size {world}"
    elif world > 1:
        # whether the ranks' tensors merge needs the whole manifests: ask the store (it keeps them)
        info = store.step_info(step)
        problem = None if info.complete else (info.problem or "incomplete")
    used = [headers[r] for r in ranks if r < world] if problem is None else list(headers.values())

    def total(field: str) -> int:
        return sum(int((h.get("stats") or {}).get(field, 0) or 0) for h in used)

    return StepSummary(
        step, problem is None, problem, world, tuple(ranks),
        max(str(h.get("created_at", "")) for h in used),
        max(int((h.get("stats") or {}).get("arrays", 0) or 0) for h in used),
        total("logical_bytes"), total("new_bytes"), total("reused_bytes"),
        step_loss(headers[0].get("metadata")) if 0 in headers else None,
        first.get("run") if isinstance(first.get("run"), str) else None,
    )


def summarize_steps(store: CheckpointStore, progress: Progress | None = None) -> Iterable[StepSummary]:
    """Every step, ascending, summarised one at a time (a generator, so a UI can show them as they come)."""
    progress = progress or no_progress
    numbers = store.step_numbers()
    for i, step in enumerate(numbers):
        progress(i, len(numbers), f"step {step}")
        yield summarize_step(store, step)
    progress(len(numbers), len(numbers), "")


# ---- tensors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkShare:
    """One chunk of a tensor and whether the previous step holds the same bytes."""

    key: str
    status: str  # shared | changed | new
    size: int  # stored bytes
    where: str  # object | pack | inline


def chunk_sharing(entry: ArrayEntry, previous: ArrayEntry | None) -> list[ChunkShare]:
    """Per chunk (in grid order): ``shared`` with the previous step, ``changed``, or ``new`` there.

    Known from the manifests' raw digests alone; nothing is read.
    """
    out = []
    prev = previous.chunks if previous is not None and previous.shape == entry.shape else {}
    for key in sorted(entry.chunks, key=_chunk_order):
        ref = entry.chunks[key]
        other = prev.get(key)
        status = "new" if other is None else ("shared" if other.raw == ref.raw else "changed")
        where = "inline" if ref.inline is not None else ("pack" if ref.offset is not None else "object")
        out.append(ChunkShare(key, status, ref.size, where))
    return out


def _chunk_order(key: str) -> tuple[int, ...]:
    return tuple(int(p) for p in key.split("/")[1:])


@dataclass(frozen=True)
class TensorStats:
    """Statistics of a tensor's finite values, with NaN/Inf counted apart and a histogram."""

    count: int
    nan: int
    inf: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    l2: float
    hist_counts: tuple[int, ...] = ()
    hist_edges: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["hist_counts"] = list(self.hist_counts)
        d["hist_edges"] = list(self.hist_edges)
        return d


@dataclass
class _Moments:
    count: int = 0
    nan: int = 0
    inf: int = 0
    finite: int = 0
    lo: float = math.inf
    hi: float = -math.inf
    total: float = 0.0
    sq: float = 0.0

    def add(self, block: np.ndarray) -> None:
        x = _as_float(block).ravel()
        self.count += x.size
        isnan = np.isnan(x)
        isinf = np.isinf(x)
        self.nan += int(isnan.sum())
        self.inf += int(isinf.sum())
        f = x[~(isnan | isinf)]
        if f.size:
            self.finite += f.size
            self.lo = min(self.lo, float(f.min()))
            self.hi = max(self.hi, float(f.max()))
            self.total += float(f.sum())
            self.sq += float(np.dot(f, f))


def _as_float(a: np.ndarray) -> np.ndarray:
    """``a`` in float64 (complex numbers by their magnitude)."""
    wide: np.ndarray = np.abs(a) if a.dtype.kind == "c" else np.asarray(a)
    return wide.astype(np.float64)


def tensor_stats(array: np.ndarray, bins: int = 20) -> TensorStats:
    """Statistics of an in-memory array (any real dtype, bfloat16/float8 included; complex by magnitude)."""
    m = _Moments()
    m.add(array)
    counts, edges = _histogram([array], m, bins)
    return _finish(m, counts, edges)


def read_tensor_stats(reader: StepReader, path: str, bins: int = 20, progress: Progress | None = None) -> TensorStats:
    """Statistics of one tensor of a step, read in blocks of rows when it is large (two passes)."""
    ref = ArrayRef(reader, path)
    if ref.nbytes <= STATS_WHOLE_BYTES or not ref.shape:
        return tensor_stats(ref.read(), bins)
    progress = progress or no_progress
    rows = ref.shape[0]
    row_bytes = max(1, ref.nbytes // max(rows, 1))
    step = max(1, STATS_BLOCK_BYTES // row_bytes)
    blocks = [slice(i, min(rows, i + step)) for i in range(0, rows, step)]
    m = _Moments()
    for i, b in enumerate(blocks):
        progress(i, 2 * len(blocks), path)
        m.add(ref.read(rows=b))
    counts, edges = _histogram((ref.read(rows=b) for b in blocks), m, bins)
    progress(2 * len(blocks), 2 * len(blocks), path)
    return _finish(m, counts, edges)


def _histogram(blocks: Iterable[np.ndarray], m: _Moments, bins: int) -> tuple[np.ndarray, np.ndarray]:
    if not m.finite:
        return np.zeros(0, np.int64), np.zeros(0)
    lo, hi = m.lo, m.hi
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts = np.zeros(bins, np.int64)
    edges = np.linspace(lo, hi, bins + 1)
    for block in blocks:
        x = _as_float(block).ravel()
        x = x[np.isfinite(x)]
        counts += np.histogram(x, bins=edges)[0]
    return counts, edges


def _finish(m: _Moments, counts: np.ndarray, edges: np.ndarray) -> TensorStats:
    if m.finite:
        mean = m.total / m.finite
        var = max(0.0, m.sq / m.finite - mean * mean)
        return TensorStats(
            m.count, m.nan, m.inf, m.lo, m.hi, mean, math.sqrt(var), math.sqrt(m.sq),
            tuple(int(c) for c in counts), tuple(float(e) for e in edges),
        )
    return TensorStats(m.count, m.nan, m.inf, None, None, None, None, 0.0)


def dtype_name(entry: ArrayEntry) -> str:
    """The numpy name of an entry's data type (``bfloat16``, ``float32`` ...)."""
    try:
        return str(data_type(entry.data_type).numpy)
    except RavexError:
        return entry.data_type
