"""Reading a step: merge the ranks' manifests, fetch only the chunks asked for, verify each.

Every object is verified as it is read: its bytes must hash to its name (XXH3
runs at memory speed, so this costs little next to the read). Uncompressed
chunks that land whole inside the destination are read straight into it, so a
restore into caller-provided buffers makes no extra copy.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ArrayNotFoundError, CorruptObjectError, ManifestError
from ..objects.chunkref import ChunkRef
from ..objects.codecs import Pipeline, pipeline
from ..objects.dtypes import data_type
from ..objects.hashing import digest
from ..objects.names import object_key
from ..objects.values import decode_value
from .manifest import ArrayEntry, Manifest, check_chunks_present, merge_arrays

if TYPE_CHECKING:
    from .catalog import StoreCatalog

READ_THREADS = 8

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One reading pool per process, started on first use: a pool per call spent more on
    starting its threads than a warm read of a small step takes."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="ravex-read")
        return _POOL


def _forget_pool() -> None:
    """After ``fork()`` the child has none of the parent's threads: it starts its own pool."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


@dataclass(frozen=True)
class ArrayRef:
    """A tensor of a step, not yet read."""

    reader: StepReader
    path: str

    @property
    def entry(self) -> ArrayEntry:
        return self.reader.arrays[self.path]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.entry.shape

    @property
    def dtype(self) -> np.dtype:
        return data_type(self.entry.data_type).numpy

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def read(self, out: np.ndarray | None = None, rows: slice | None = None) -> np.ndarray:
        return self.reader.read_array(self.path, out=out, rows=rows)

    def __repr__(self) -> str:
        return f"ArrayRef({self.path!r}, shape={self.shape}, dtype={self.dtype})"


class StepReader:
    """All ranks' manifests of one complete step, merged. From :meth:`CheckpointStore.open_step`."""

    def __init__(self, store: StoreCatalog, step: int) -> None:
        self.store = store
        self.step = step
        info = store.step_info(step)
        self.world_size = info.world_size or 1
        self.manifests: list[Manifest] = [store.manifest(step, r) for r in range(self.world_size)]
        for m in self.manifests:
            store.cache_manifest(m)
        self.arrays: dict[str, ArrayEntry] = merge_arrays(self.manifests)

    def __repr__(self) -> str:
        return f"StepReader({self.store.url!r}, step={self.step}, ranks={self.world_size})"

    @property
    def metadata(self) -> dict[str, str]:
        return self.manifests[0].metadata

    def tree(self, rank: int = 0) -> Any:
        """The state tree of ``rank`` with :class:`ArrayRef` leaves (nothing is read)."""
        where = f"step {self.step} rank {rank}"
        m = self._manifest(rank)

        def on_array(path: str) -> ArrayRef:
            if path not in self.arrays:
                raise ManifestError(f"{where}: tree names tensor {path!r} that no manifest holds")
            return ArrayRef(self, path)

        try:
            return decode_value(m.tree, on_array, where)
        except RecursionError:
            raise ManifestError(f"{where}: state tree nested too deeply") from None

    def read(self, rank: int = 0, subtree: Any = None) -> Any:
        """The state tree of ``rank`` (or one subtree of it) with numpy arrays at the leaves.

        ``subtree`` is a key or a sequence of keys, e.g. ``"model"`` or ``("optimizers", 0)``.
        """
        tree = self.tree(rank)
        for key in _keys(subtree):
            try:
                tree = tree[key]
            except (KeyError, IndexError, TypeError):
                raise ArrayNotFoundError(f"step {self.step}: no subtree {subtree!r} (missing {key!r})") from None
        refs: list[ArrayRef] = []
        _collect(tree, refs)
        arrays = self.read_arrays([r.path for r in refs])
        return _materialize(tree, arrays)

    def read_array(self, path: str, out: np.ndarray | None = None, rows: slice | None = None) -> np.ndarray:
        """One tensor, or the rows ``rows`` of it, fetching only the chunks they overlap.

        ``out``, if given, must be a writable C-contiguous array of the result's shape
        and element size (any dtype of that size, e.g. a uint16 view for bfloat16);
        it is filled in place and returned.
        """
        return self.read_arrays([path], outs={path: out} if out is not None else None, rows=rows)[path]

    def read_arrays(
        self,
        paths: Sequence[str],
        outs: dict[str, np.ndarray] | None = None,
        rows: slice | None = None,
    ) -> dict[str, np.ndarray]:
        """Several tensors at once, all their chunks fetched in parallel."""
        jobs: list[_Job] = []
        results: dict[str, np.ndarray] = {}
        for path in paths:
            entry = self.arrays.get(path)
            if entry is None:
                raise ArrayNotFoundError(f"step {self.step} has no tensor {path!r}")
            dt = data_type(entry.data_type)
            shape = entry.shape
            if shape:
                start, stop, step = (rows or slice(None)).indices(shape[0])
                if step != 1:
                    raise ValueError("rows must be a contiguous slice (step 1)")
                stop = max(start, stop)
                out_shape = (stop - start, *shape[1:])
            else:
                start, stop, out_shape = 0, 0, ()
            check_chunks_present(path, entry, self.step)  # before allocating what the metadata claims
            out = (outs or {}).get(path)
            if out is None:
                out = _allocate(out_shape, dt.numpy, f"step {self.step} tensor {path!r}")
            elif (
                tuple(out.shape) != out_shape
                or out.dtype.itemsize != dt.itemsize
                or not out.flags.c_contiguous
                or not out.flags.writeable
            ):
                raise ValueError(
                    f"out for {path!r} must be a writable C-contiguous array of shape {out_shape} "
                    f"and itemsize {dt.itemsize}; got shape {out.shape}, dtype {out.dtype}"
                )
            results[path] = out
            if out.size == 0:
                continue
            dst = out.reshape(-1).view(np.uint8).data
            pipe = pipeline(entry.codecs, f"step {self.step} tensor {path!r}")  # once per array, not per chunk
            if not shape:
                jobs.append((path, entry, "c", 0, dt.itemsize, dst, 0, pipe))
                continue
            row_bytes = math.prod(shape[1:]) * dt.itemsize
            crow = entry.chunk_shape[0]
            full = crow * row_bytes  # a decoded chunk's size
            runs = _Runs(path, entry, dst, jobs) if pipe.compressor is None else None
            for ci in range(start // crow, math.ceil(stop / crow)):
                lo, hi = max(start, ci * crow), min(stop, (ci + 1) * crow)
                key = "c/" + str(ci) + "/0" * (len(shape) - 1)
                d_lo, d_hi = (lo - start) * row_bytes, (hi - start) * row_bytes
                if runs is not None and hi - lo == crow and runs.add(key, d_lo, full):
                    continue
                jobs.append(
                    (
                        path,
                        entry,
                        key,
                        (lo - ci * crow) * row_bytes,  # offset inside the decoded chunk
                        (hi - lo) * row_bytes,  # bytes wanted
                        dst[d_lo:d_hi],
                        full,
                        pipe,
                    )
                )
            if runs is not None:
                runs.flush()
        spans = _pack_spans(jobs)
        if len(jobs) <= 1:
            for job in jobs:
                self._read_job(job, None)
        else:
            pool = _pool()
            # Chunks packed together are fetched together: one request per pack, not per
            # chunk (on S3, 300 small tensors were 300 GETs of a few KB each).
            packs = dict(zip(spans, pool.map(self._fetch_span, spans.items()), strict=True))
            # A few workers drain one list (largest chunks first, so they finish together):
            # a future per chunk cost more than a small chunk's read.
            jobs.sort(key=lambda job: -(job.nbytes if isinstance(job, _Run) else job[4]))
            todo = iter(jobs)  # next() on a list iterator is atomic under the GIL

            def drain() -> None:
                for job in todo:
                    self._read_job(job, packs)

            for fut in [pool.submit(drain) for _ in range(min(READ_THREADS, len(jobs)))]:
                fut.result()
        return results

    def check_objects(self, paths: Sequence[str]) -> None:
        """Check that every object the chunks of ``paths`` live in exists and is long enough,
        without reading it: a reader about to read into memory it cannot restore (a live
        model) rejects a damaged step first. Digests are still checked as chunks are read."""
        need: dict[str, tuple[int, str]] = {}  # object -> (bytes it must hold, who needs it)
        for path in paths:
            entry = self.arrays.get(path)
            if entry is None:
                raise ArrayNotFoundError(f"step {self.step} has no tensor {path!r}")
            check_chunks_present(path, entry, self.step)
            for key, ref in entry.chunks.items():
                if ref.object is None or ref.inline is not None:
                    continue
                end = (ref.offset or 0) + ref.size
                if end > need.get(ref.object, (-1, ""))[0]:
                    need[ref.object] = (end, f"step {self.step} tensor {path!r} chunk {key}")
        items = list(need.items())
        if self.store.storage.is_local_filesystem or len(items) <= 1:
            sizes = [self._object_size(name) for name, _ in items]
        else:  # a remote store: one request per object, several in flight
            sizes = list(_pool().map(self._object_size, [name for name, _ in items]))
        for (name, (end, where)), size in zip(items, sizes, strict=True):
            if size is None:
                raise CorruptObjectError(f"{where}: object {name} is missing")
            if size < end:
                raise CorruptObjectError(f"{where}: object {name} has {size} bytes, the manifest needs {end}")

    def _object_size(self, name: str) -> int | None:
        try:
            return self.store.storage.size(object_key(name))
        except FileNotFoundError:
            return None

    def _fetch_span(self, item: tuple[str, tuple[int, int]]) -> tuple[int, bytes | None]:
        """Bytes ``[start, end)`` of a pack, or None if it is missing (the chunk reports it)."""
        name, (start, end) = item
        try:
            return start, self.store.storage.read_range(object_key(name), start, end)
        except FileNotFoundError:
            return start, None

    def _read_job(self, job: _Job, packs: dict[str, tuple[int, bytes | None]] | None) -> None:
        if isinstance(job, _Run):
            self._read_run(job, packs)
        else:
            self._read_chunk(*job, packs)

    def _read_run(self, run: _Run, packs: dict[str, tuple[int, bytes | None]] | None) -> None:
        """Whole uncompressed chunks stored back to back in one pack, landing back to back in
        the destination: one copy for all of them, then each checked against its ``raw``.

        A table in 2 KiB chunks is ~100k chunks per 200 MiB; per chunk this costs a hash of
        it, not a fetch, a slice and a copy each (~10 us of Python per chunk before)."""
        first_key = run.refs[0][0]
        span = packs.get(run.object) if packs else None
        try:
            if span is not None and span[1] is not None and span[0] <= run.start:
                data: bytes | memoryview = memoryview(span[1])[run.start - span[0] : run.end - span[0]]
            elif span is not None and span[1] is None:
                raise FileNotFoundError(run.object)
            else:
                data = self.store.storage.read_range(object_key(run.object), run.start, run.end)
        except FileNotFoundError:
            raise CorruptObjectError(
                f"step {self.step} tensor {run.path!r} chunk {first_key}: object {run.object} is missing"
            ) from None
        got = len(data)
        if got != run.nbytes:
            for key, ref in run.refs:  # the first chunk the short read cuts into
                if ref.offset is not None and ref.offset + ref.size - run.start > got:
                    raise CorruptObjectError(
                        f"step {self.step} tensor {run.path!r} chunk {key}: object {ref.object} gave "
                        f"{max(0, got - ref.offset + run.start)} bytes, manifest says {ref.size} (truncated?)"
                    )
        run.dst[:] = data
        for key, ref in run.refs:
            rel = (ref.offset or 0) - run.start
            if digest(run.dst[rel : rel + ref.size]) != ref.raw:
                _check_raw(run.dst[rel : rel + ref.size], ref, f"step {self.step} tensor {run.path!r} chunk {key}")

    def _read_chunk(
        self,
        path: str,
        entry: ArrayEntry,
        key: str,
        offset: int,
        length: int,
        dst: memoryview,
        full: int,
        pipe: Pipeline,
        packs: dict[str, tuple[int, bytes | None]] | None = None,
    ) -> None:
        """Fetch one chunk, check it against its ``raw`` digest, copy the wanted bytes to ``dst``."""
        where = f"step {self.step} tensor {path!r} chunk {key}"
        ref = entry.chunks.get(key)
        if ref is None:
            raise CorruptObjectError(f"{where}: no manifest entry for this chunk; the step is incomplete")
        full = full or length
        if ref.inline is not None:
            stored: bytes | memoryview = ref.inline
        elif ref.offset is None and pipe.compressor is None and offset == 0 and length == full == ref.size:
            self._read_object_into(ref, dst, where)  # straight into the caller's buffer
            _check_raw(dst, ref, where)
            return
        else:
            stored = self._fetch(ref, where, packs)
        whole = offset == 0 and length == full and pipe.compressor is not None
        try:  # a compressed chunk that fills its destination decodes straight into it
            decoded = memoryview(pipe.decode(stored, full, into=dst if whole else None)).cast("B")
        except ValueError as exc:
            raise CorruptObjectError(f"{where}: {exc}") from None
        except MemoryError:
            raise CorruptObjectError(f"{where}: a decoded chunk of {full} bytes does not fit in memory; "
                                     "the manifest's shapes are not believable") from None
        if decoded.nbytes != full:
            raise CorruptObjectError(f"{where}: decoded to {decoded.nbytes} bytes, expected {full}")
        _check_raw(decoded, ref, where)
        if not whole:
            dst[:] = decoded[offset : offset + length]

    def _fetch(
        self, ref: ChunkRef, where: str, packs: dict[str, tuple[int, bytes | None]] | None = None
    ) -> bytes | memoryview:
        """The chunk's stored bytes: a whole object, or its range of a pack."""
        assert ref.object is not None
        key = object_key(ref.object)
        span = packs.get(ref.object) if packs and ref.offset is not None else None
        data: bytes | memoryview
        try:
            if span is not None and ref.offset is not None:
                start, whole = span
                if whole is None:
                    raise FileNotFoundError(key)
                lo = ref.offset - start
                data = memoryview(whole)[lo : lo + ref.size]
            elif ref.offset is None:
                data = self.store.storage.read(key)
            else:
                data = self.store.storage.read_range(key, ref.offset, ref.offset + ref.size)
        except FileNotFoundError:
            raise CorruptObjectError(f"{where}: object {ref.object} is missing") from None
        if len(data) != ref.size:
            raise CorruptObjectError(
                f"{where}: object {ref.object} gave {len(data)} bytes, manifest says {ref.size} (truncated?)"
            )
        return data

    def _read_object_into(self, ref: ChunkRef, dst: memoryview, where: str) -> None:
        assert ref.object is not None
        try:
            n = self.store.storage.read_into(object_key(ref.object), dst)
        except FileNotFoundError:
            raise CorruptObjectError(f"{where}: object {ref.object} is missing") from None
        if n != ref.size:
            raise CorruptObjectError(f"{where}: object {ref.object} has {n} bytes, manifest says {ref.size}")

    def _manifest(self, rank: int) -> Manifest:
        if not 0 <= rank < self.world_size:
            raise ArrayNotFoundError(f"step {self.step} has ranks 0..{self.world_size - 1}, not {rank}")
        return self.manifests[rank]


class RankReader(StepReader):
    """One rank's own manifest of a step, alone: what that rank wrote by itself (its per-rank
    sections: RNG streams, loaders, loop position), read with one request whatever the world
    size. Never a sharded or replicated tensor: their chunks are spread over other ranks'
    manifests, which this reader does not hold. Completeness is not checked (it would read
    every rank's manifest); a rank uses it before the ranks agree on the step."""

    def __init__(self, store: StoreCatalog, step: int, rank: int) -> None:
        self.store = store
        self.step = step
        self.rank = rank
        own = store.manifest(step, rank)
        self.world_size = own.world_size
        self.manifests = [own]
        self.arrays = merge_arrays([own])

    def tree(self, rank: int = 0) -> Any:
        """``rank``'s state tree; a tensor this manifest does not hold is None (another rank
        wrote it), one it holds an :class:`ArrayRef` over this rank's chunks only."""
        where = f"step {self.step} rank {rank}"
        m = self._manifest(rank)

        def on_array(path: str) -> ArrayRef | None:
            return ArrayRef(self, path) if path in self.arrays else None

        try:
            return decode_value(m.tree, on_array, where)
        except RecursionError:
            raise ManifestError(f"{where}: state tree nested too deeply") from None

    def _manifest(self, rank: int) -> Manifest:
        if rank != self.rank:
            raise ArrayNotFoundError(f"step {self.step}: this reader holds rank {self.rank}'s manifest, not {rank}'s")
        return self.manifests[0]


SPAN_SLACK = 1 << 20
"""A pack's chunks are read in one range when it holds little else: at most twice their bytes
plus this. A hostile manifest (offsets far apart) then cannot make one read ask for a petabyte."""


@dataclass
class _Run:
    """Consecutive whole, uncompressed chunks of one array that lie back to back in one pack
    (bytes ``[start, end)`` of ``object``) and land back to back in ``dst``: read as one job."""

    path: str
    object: str
    start: int
    end: int
    dst: memoryview
    refs: list[tuple[str, ChunkRef]]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


#: One chunk to read: (path, entry, key, offset, length, dst, full, pipe), :meth:`StepReader._read_chunk`'s
#: arguments.
_ChunkJob = tuple[str, ArrayEntry, str, int, int, memoryview, int, Pipeline]
_Job = _ChunkJob | _Run


class _Runs:
    """Gathers an array's chunks into :class:`_Run` jobs, in chunk order, appending each
    finished run to ``jobs``."""

    def __init__(self, path: str, entry: ArrayEntry, dst: memoryview, jobs: list[_Job]) -> None:
        self.path, self.entry, self.dst, self.jobs = path, entry, dst, jobs
        self.refs: list[tuple[str, ChunkRef]] = []
        self.object = ""
        self.start = self.end = self.d_lo = self.d_hi = 0

    def add(self, key: str, d_lo: int, full: int) -> bool:
        """Take chunk ``key`` (all of it wanted, at ``d_lo`` in the destination) into a run, or
        return False for the caller to read it alone (inline, a whole object, not of full size)."""
        ref = self.entry.chunks.get(key)
        if ref is None or ref.offset is None or ref.object is None or ref.inline is not None or ref.size != full:
            self.flush()
            return False
        if not (self.refs and ref.object == self.object and ref.offset == self.end and d_lo == self.d_hi):
            self.flush()
            self.object, self.start, self.d_lo = ref.object, ref.offset, d_lo
        self.refs.append((key, ref))
        self.end, self.d_hi = ref.offset + ref.size, d_lo + full
        return True

    def flush(self) -> None:
        if self.refs:
            self.jobs.append(_Run(self.path, self.object, self.start, self.end, self.dst[self.d_lo : self.d_hi],
                                  self.refs))
            self.refs = []


def _pack_spans(jobs: list[_Job]) -> dict[str, tuple[int, int]]:
    """For each pack that two or more of ``jobs`` read from: the byte range covering them."""
    spans: dict[str, list[int]] = {}
    for job in jobs:
        if isinstance(job, _Run):
            name, lo, hi, n = job.object, job.start, job.end, len(job.refs)
        else:
            ref = job[1].chunks.get(job[2])
            if ref is None or ref.object is None or ref.offset is None or ref.inline is not None:
                continue
            name, lo, hi, n = ref.object, ref.offset, ref.offset + ref.size, 1
        have = spans.get(name)
        if have is None:
            spans[name] = [lo, hi, n, hi - lo]
        else:
            have[0], have[1] = min(have[0], lo), max(have[1], hi)
            have[2], have[3] = have[2] + n, have[3] + hi - lo
    return {name: (lo, hi) for name, (lo, hi, n, size) in spans.items() if n > 1 and hi - lo <= 2 * size + SPAN_SLACK}


def _allocate(shape: tuple[int, ...], dtype: np.dtype, where: str) -> np.ndarray:
    """``np.empty``, with a Ravex error when a manifest's shape is too large to believe."""
    try:
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError) as exc:
        raise CorruptObjectError(
            f"{where}: shape {list(shape)} of {dtype} cannot be allocated ({exc}); "
            "the manifest's shapes are not believable"
        ) from None


def _check_raw(decoded: bytes | memoryview, ref: ChunkRef, where: str) -> None:
    if digest(decoded) != ref.raw:
        what = f"object {ref.object}" if ref.object else "inline chunk"
        raise CorruptObjectError(f"{where}: {what} does not match its digest (corrupt bytes)")


def _keys(subtree: Any) -> tuple[Any, ...]:
    if subtree is None:
        return ()
    if isinstance(subtree, (list, tuple)):
        return tuple(subtree)
    return (subtree,)


def _collect(tree: Any, out: list[ArrayRef]) -> None:
    if isinstance(tree, ArrayRef):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _collect(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _collect(v, out)


def _materialize(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(tree, ArrayRef):
        return arrays[tree.path]
    if isinstance(tree, dict):
        return {k: _materialize(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_materialize(v, arrays) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_materialize(v, arrays) for v in tree)
    return tree


