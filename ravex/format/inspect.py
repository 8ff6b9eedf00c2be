"""Read-only helpers for the inspector tools (`ravex ls/show/diff/validate`, `ravex inspect`).

Pure functions over what the rest of the format already exposes: per-step summaries from the
manifests, streaming tensor statistics and histograms, which chunks a step shares with the
previous one, a diff that reports progress, and a validation that reports progress. Nothing
here writes to a store, and nothing imports torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .diff import StepDiff, TensorDiff, diff, walk_values
from .dtypes import data_type
from .errors import ManifestError, RavexError
from .hashing import digest
from .manifest import ArrayEntry, Manifest
from .names import manifest_key, manifest_ranks, object_key, step_dir, unescape_key
from .reader import ArrayRef, StepReader
from .store import CheckpointStore
from .validate import Finding, ValidationReport, validate

#: ``progress(done, total, what)``; ``total`` is 0 when unknown.
Progress = Callable[[int, int, str], None]

#: Tensors up to this size are read whole for statistics; larger ones are streamed twice in row blocks.
STATS_WHOLE_BYTES = 256 << 20
STATS_BLOCK_BYTES = 64 << 20


def _noop(done: int, total: int, what: str) -> None:
    pass


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

    @property
    def reuse_ratio(self) -> float | None:
        """Fraction of the logical bytes that did not have to be written."""
        return self.reused_bytes / self.logical_bytes if self.logical_bytes else None

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ranks"] = list(self.ranks)
        d["reuse_ratio"] = self.reuse_ratio
        return d


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
    key = manifest_key(step, rank)
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
    return doc


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
    ranks = manifest_ranks(store.storage.list_dir(step_dir(step)))
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
    )


def summarize_steps(store: CheckpointStore, progress: Progress | None = None) -> Iterable[StepSummary]:
    """Every step, ascending, summarised one at a time (a generator, so a UI can show them as they come)."""
    progress = progress or _noop
    numbers = store.step_numbers()
    for i, step in enumerate(numbers):
        progress(i, len(numbers), f"step {step}")
        yield summarize_step(store, step)
    progress(len(numbers), len(numbers), "")


def previous_complete(store: CheckpointStore, step: int) -> int | None:
    """The newest complete step older than ``step``, or None."""
    for number in reversed(store.step_numbers()):
        if number < step and store.step_info(number).complete:
            return number
    return None


# ---- reading a step without stalling a UI ----------------------------------------------------

#: How deep :func:`loads_in_pieces` splits objects below each top-level key of a manifest: each
#: tensor entry of ``arrays`` is one piece; the state ``tree`` is split further (it nests).
_SPLIT_DEPTH = {"arrays": 2, "tree": 3}
_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def loads_in_pieces(text: str) -> Any:
    """``json.loads(text)`` for a manifest, parsed one tensor entry at a time.

    ``json.loads`` of an 8 MB manifest is one C call that holds the GIL for ~0.2 s, and every
    other thread of the process (a UI's event loop) waits that long. Parsed in pieces, the
    interpreter can switch threads between two entries. Same values, same errors
    (``ValueError``) as ``json.loads``.
    """
    i = _WS.match(text, 0).end()
    value, i = _piece(text, i, 0, 1)
    if _WS.match(text, i).end() != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return value


def _piece(s: str, i: int, depth: int, split: int) -> tuple[Any, int]:
    if depth >= split or not s.startswith("{", i):
        return _DECODER.raw_decode(s, i)
    out: dict[str, Any] = {}
    i = _WS.match(s, i + 1).end()
    if s.startswith("}", i):
        return out, i + 1
    while True:
        if not s.startswith('"', i):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
        key, i = json.decoder.scanstring(s, i + 1)
        i = _WS.match(s, i).end()
        if not s.startswith(":", i):
            raise json.JSONDecodeError("Expecting ':' delimiter", s, i)
        i = _WS.match(s, i + 1).end()
        out[key], i = _piece(s, i, depth + 1, _SPLIT_DEPTH.get(key, 1) if depth == 0 else split)
        i = _WS.match(s, i).end()
        if s.startswith(",", i):
            i = _WS.match(s, i + 1).end()
        elif s.startswith("}", i):
            return out, i + 1
        else:
            raise json.JSONDecodeError("Expecting ',' delimiter", s, i)


def open_step_in_pieces(store: CheckpointStore, step: int) -> StepReader:
    """:meth:`CheckpointStore.open_step`, its manifests parsed with :func:`loads_in_pieces`.

    For a UI's worker thread: the store's own parse would stall the UI thread for as long as
    ``json.loads`` runs. The parsed manifests go to the store's cache, where ``open_step``
    finds them; anything unusual (not UTF-8, malformed) is left to ``open_step``, so errors
    read exactly as they do everywhere else.
    """
    rank, world = 0, 1
    while rank < world:
        cached = store.cached_manifest(step, rank)
        if cached is None:
            cached = _parse_in_pieces(store, step, rank)
            if cached is None:
                break  # open_step reads it again and says what is wrong
            store.cache_manifest(cached)
        world = cached.world_size
        rank += 1
    return store.open_step(step)


def _parse_in_pieces(store: CheckpointStore, step: int, rank: int) -> Manifest | None:
    """One manifest parsed with :func:`loads_in_pieces`; None when anything is wrong with it
    (the store's own parse then says what, in its words)."""
    try:
        text = store.storage.read(manifest_key(step, rank)).decode("utf-8")
        m = Manifest.from_json(loads_in_pieces(text), f"step {step} rank {rank}")
    except (OSError, ValueError, RecursionError, RavexError):
        return None
    return m if (m.step, m.rank) == (step, rank) else None


# ---- tensors -------------------------------------------------------------------------------


def display_path(path: str) -> str:
    """An array path as the user's keys: each segment unescaped (``layer%2F0`` -> ``layer/0``)."""
    return "/".join(unescape_key(seg) for seg in path.split("/"))


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
    extra: dict = field(default_factory=dict)

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
    if a.dtype.kind == "c":
        return np.abs(a).astype(np.float64)
    return np.asarray(a).astype(np.float64)


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
    progress = progress or _noop
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


def step_values(reader: StepReader, rank: int = 0) -> dict[str, Any]:
    """Non-tensor leaves of one rank's state tree (lr, step, epoch ...), by their ``/`` path."""
    out: dict[str, Any] = {}
    walk_values(reader.tree(rank), "", out)
    return out


def dtype_name(entry: ArrayEntry) -> str:
    """The numpy name of an entry's data type (``bfloat16``, ``float32`` ...)."""
    try:
        return str(data_type(entry.data_type).numpy)
    except RavexError:
        return entry.data_type


# ---- diff ----------------------------------------------------------------------------------


def diff_steps(a: StepReader, b: StepReader, stats: bool = True, progress: Progress | None = None) -> StepDiff:
    """:func:`ravex.format.diff.diff`, reporting progress while it reads the tensors that changed.

    Which chunks changed comes from the manifests; only changed tensors are read, one at a time.
    """
    out = diff(a, b, stats=False)
    if not stats:
        return out
    progress = progress or _noop
    changed = [i for i, t in enumerate(out.tensors) if t.status == "changed"]
    for n, i in enumerate(changed):
        progress(n, len(changed), out.tensors[i].name)
        out.tensors[i] = compare_tensor(a, b, out.tensors[i])
    progress(len(changed), len(changed), "")
    return out


def compare_tensor(a: StepReader, b: StepReader, td: TensorDiff) -> TensorDiff:
    """Fill in max |a-b|, ||a-b||/||a|| and cosine for one changed tensor."""
    x = ArrayRef(a, td.name).read()
    y = ArrayRef(b, td.name).read()
    if x.dtype.kind == "c":
        xa, ya = x.astype(np.complex128), y.astype(np.complex128)
    else:
        xa, ya = x.astype(np.float64), y.astype(np.float64)
    d = ya - xa
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    na, nd, nb = (float(np.linalg.norm(v.ravel())) for v in (xa, d, ya))
    rel = nd / na if na else (0.0 if nd == 0 else math.inf)
    cos = float(np.real(np.vdot(xa.ravel(), ya.ravel()))) / (na * nb) if na and nb else None
    status = td.status
    if max_abs == 0.0 and a.arrays[td.name].chunk_shape != b.arrays[td.name].chunk_shape:
        status = "unchanged"  # same values, chunked differently
    return TensorDiff(td.name, status, td.chunks_changed, td.chunks_total, td.shape, td.dtype, max_abs, rel, cos)


def change_order(td: TensorDiff) -> tuple:
    """Sort key: largest relative change first; added/removed/reshaped before measured changes."""
    rank = {"added": 0, "removed": 0, "reshaped": 0, "changed": 1, "unchanged": 2}.get(td.status, 3)
    rel = td.rel_l2 if td.rel_l2 is not None else (td.chunks_changed / td.chunks_total if td.chunks_total else 0.0)
    return (rank, -rel if not math.isnan(rel) else 0.0, td.name)


# ---- validate ------------------------------------------------------------------------------


def validate_with_progress(
    store: CheckpointStore,
    full: bool = False,
    progress: Progress | None = None,
    parsing: Callable[[], AbstractContextManager[Any]] | None = None,
) -> ValidationReport:
    """:func:`ravex.format.validate.validate`, reporting progress while ``full`` rehashes objects.

    The listing checks (manifests, missing and truncated objects, incomplete steps, orphans) are
    the validator's own; the rehash of every referenced object is done here, one object at a time,
    so that a caller can show how far it got. Manifests are parsed in pieces (see
    :func:`loads_in_pieces`), each inside ``parsing()`` when given (a UI pauses its garbage
    collector there), once each, and only a few are held at a time: 100 steps of 10,000 tensors
    are gigabytes once parsed.
    """
    progress = progress or _noop
    counting = _CountingStore(store, progress, parsing or nullcontext)
    report = validate(counting, full=False)
    if not full:
        return report
    missing = {f.object for f in report.findings if f.kind in ("missing_object", "size_mismatch")}
    referenced = {k: v for k, v in counting.referenced.items() if k not in missing}
    names = sorted(referenced)
    for i, name in enumerate(names):
        progress(i, len(names), name)
        step, rank, path, key = referenced[name]
        try:
            data = store.storage.read(object_key(name))
        except FileNotFoundError:
            continue
        if digest(data) != name:
            chunks = damaged_chunks(counting, name, data, report.steps_checked)
            report.findings.extend(chunks or [
                Finding(
                    "hash_mismatch",
                    f"step {step} rank {rank} tensor {path!r} chunk {key}: object {name} "
                    "does not match its hash (corrupt bytes)",
                    step, rank, path, key, name,
                )
            ])
    report.objects_checked = len(names)
    progress(len(names), len(names), "")
    return report


class _CountingStore(CheckpointStore):
    """The same store, reporting ``progress`` as the validator reaches each step's manifests.

    It parses each manifest in pieces, keeps only the last few (the validator reads a step's
    manifests, then asks for the step's completeness, which reads them again), and notes which
    tensor chunk first names each object, for the rehash that follows.
    """

    manifest_cache_size = 16  # manifests held: the ranks of the step being checked

    def __init__(
        self, store: CheckpointStore, progress: Progress, parsing: Callable[[], AbstractContextManager[Any]]
    ) -> None:
        super().__init__(store.storage, store.root)
        self._progress = progress
        self._parsing = parsing
        self._numbers = store.step_numbers()
        self._seen: set[int] = set()
        self.referenced: dict[str, tuple[int, int, str, str]] = {}  # object -> its first chunk
        progress(0, len(self._numbers), "manifests")

    def manifest(self, step: int, rank: int) -> Manifest:  # docstring inherited
        if step not in self._seen:
            self._seen.add(step)
            self._progress(len(self._seen) - 1, len(self._numbers), f"step {step}")
        m = self.cached_manifest(step, rank)
        if m is not None:
            return m
        with self._parsing():
            m = _parse_in_pieces(self, step, rank) or super().manifest(step, rank)
        self.cache_manifest(m)
        for path, entry in m.arrays.items():
            for key, ref in entry.chunks.items():
                if ref.object is not None:
                    self.referenced.setdefault(ref.object, (step, rank, path, key))
        return m


def damaged_chunks(store: CheckpointStore, name: str, data: bytes, steps: Iterable[int]) -> list[Finding]:
    """The chunks of a damaged object that no longer decode to their raw digest.

    A pack object holds the chunks of many tensors; a flipped byte damages one of them. Each
    damaged chunk is reported once, at the oldest of ``steps`` that names it.
    """
    found: dict[tuple[str, str, str], Finding] = {}
    for step in steps:
        for rank in store.step_info(step).ranks:
            try:
                m = store.manifest(step, rank)
            except (RavexError, OSError):
                continue
            for path, entry in m.arrays.items():
                for key, ref in entry.chunks.items():
                    if ref.object != name or (path, key, ref.raw) in found:
                        continue
                    stored = data if ref.offset is None else data[ref.offset : ref.offset + ref.size]
                    if not _chunk_intact(entry, stored, ref.raw):
                        found[(path, key, ref.raw)] = Finding(
                            "hash_mismatch",
                            f"step {step} rank {rank} tensor {path!r} chunk {key}: its bytes in object {name} "
                            "are corrupt (the object does not match its hash)",
                            step, rank, path, key, name,
                        )
    return list(found.values())


def _chunk_intact(entry: ArrayEntry, stored: bytes, raw: str) -> bool:
    from .codecs import pipeline

    try:
        full = math.prod(entry.chunk_shape) * data_type(entry.data_type).itemsize
        decoded = pipeline(entry.codecs, "validate").decode(stored, full)
        return digest(decoded) == raw
    except Exception:  # does not decode at all
        return False
