"""Writing a step: plan chunks, hash, reuse unchanged chunks, encode, write, then the manifest.

The pipeline is one task per chunk on a thread pool. xxhash, numcodecs and file
I/O release the GIL, so a 2-core machine overlaps hashing, encoding and writing.
A chunk whose raw digest (and codec chain) matches a chunk of the delta base is
reused as it is: no encoding, no write, no storage round trip, unless it sits in a
pack the commit would otherwise cover too little of (``_sparse_packs``): then it is stored
afresh, so that no pack stays alive for a few chunks once GC collects the steps that read
the rest of it.

The delta base is the previous manifest this writer committed, or, before its
first commit, the newest complete step's manifest for this rank. Either one is
at least as new as the store's newest complete step until this writer commits
again, and GC never deletes such a step (spec/FORMAT.md, "Garbage collection").
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import clock
from .codecs import codecs_for, parse_compression, pipeline
from .dtypes import DataType, from_numpy
from .errors import RavexError, UnsupportedValueError
from .gc import DEFAULT_GRACE_SECONDS
from .hashing import digest
from .manifest import ArrayEntry, ChunkRef, Manifest
from .names import escape_key, object_key
from .refs import refs_worth_writing, write_refs
from .values import encode_value

if TYPE_CHECKING:
    from .catalog import StoreCatalog
    from .storage import PendingWrite

logger = logging.getLogger("ravex.format")

#: Target chunk size along the leading dimension. benchmarks/RESULTS.md: fsync'd local
#: writes of a 1 GiB state ran 0.62 GiB/s with 16 MiB chunks against 0.55 with 4 MiB and
#: 0.32 with 1 MiB (4 threads); a tensor smaller than this is one chunk anyway, so deltas
#: stay per tensor for all but the largest tensors.
DEFAULT_CHUNK_BYTES = 16 << 20
#: Chunks whose encoded bytes are at most this size live inline in the manifest.
INLINE_MAX_BYTES = 512
#: New chunks whose encoded size is below this are packed together into shared objects
#: of about PACK_TARGET_BYTES (a chunk entry then carries an ``offset``).
PACK_MAX_CHUNK_BYTES = 256 << 10
PACK_TARGET_BYTES = 4 << 20
#: Pack liveness (spec/FORMAT.md §13). A commit stores afresh the chunks it would reuse from a
#: pack it covers less than PACK_LIVE_FLOOR of (re-storing them costs fewer bytes than the pack
#: then frees), and from a pack it covers less than PACK_LIVE_TARGET of while the bytes so
#: re-stored stay within the commit's own new packed bytes (sparsest packs first). So every manifest
#: covers at least the floor of each pack it names, and the target where most of its state
#: changed, as in training, which leaves at most ``1 - PACK_LIVE_TARGET`` of a pack dead after GC.
PACK_LIVE_TARGET = 0.9
PACK_LIVE_FLOOR = 0.5
DEFAULT_THREADS = 4
#: Chunks smaller than this are hashed (and encoded, written) in runs of about this many
#: bytes per pool task: a task costs ~100 us of pool overhead, a 2 KiB chunk ~1 us to hash.
BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class ArrayShard:
    """This rank's rows ``[offset, offset + len(local))`` of a global array.

    The global array is chunked along dimension 0 every ``chunk_rows`` rows; every
    rank writing a part of it must pass the same ``global_shape`` and ``chunk_rows``,
    and its part must start on a chunk boundary and end on one (or at the end).
    """

    local: np.ndarray
    global_shape: tuple[int, ...]
    offset: int
    chunk_rows: int


@dataclass
class CommitStats:
    """What one commit did, for log lines, ``ravex ls`` and benchmarks.

    ``seconds``: ``hash``, ``encode`` and ``write`` are summed over the worker threads
    (where the work went); ``manifest``, ``refs`` and ``total`` are wall-clock.
    """

    step: int
    arrays: int = 0
    chunks: int = 0
    new_chunks: int = 0
    reused_chunks: int = 0
    logical_bytes: int = 0
    new_bytes: int = 0
    reused_bytes: int = 0
    inline_bytes: int = 0
    manifest_bytes: int = 0
    #: chunks the base holds in a pack this step would read too little of, stored afresh
    #: (counted in ``new_chunks`` and ``new_bytes`` too)
    rewritten_chunks: int = 0
    rewritten_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "arrays": self.arrays,
            "chunks": self.chunks,
            "new_chunks": self.new_chunks,
            "reused_chunks": self.reused_chunks,
            "logical_bytes": self.logical_bytes,
            "new_bytes": self.new_bytes,
            "reused_bytes": self.reused_bytes,
            "inline_bytes": self.inline_bytes,
        }


@dataclass(frozen=True)
class _Small:
    """A new chunk too small for an object of its own: it goes into a pack."""

    raw: str
    codecs_json: str  # equal raw bytes under two codec chains are two different stored chunks
    data: bytes

    @property
    def identity(self) -> tuple[str, str]:
        return (self.codecs_json, self.raw)


@dataclass
class _PlannedArray:
    path: str
    dtype: DataType
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    codecs: list[dict[str, Any]]
    chunks: list[tuple[str, memoryview]]  # (chunk key, raw bytes; an edge chunk is padded when hashed)
    chunk_len: int  # bytes of a full chunk
    logical_bytes: int


class StepWriter:
    """Writes the steps of one rank. Create with :meth:`CheckpointStore.writer`."""

    def __init__(
        self,
        store: StoreCatalog,
        rank: int = 0,
        world_size: int = 1,
        compression: str = "none",
        chunk_bytes: int | None = None,
        threads: int | None = None,
        run: str | None = None,
        delta: bool = True,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> None:
        if not (0 <= rank < world_size):
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        parse_compression(compression)
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.compression = compression
        self.chunk_bytes = int(chunk_bytes or DEFAULT_CHUNK_BYTES)
        self.run = run or uuid.uuid4().hex
        self._pool = ThreadPoolExecutor(max_workers=threads or DEFAULT_THREADS, thread_name_prefix="ravex-write")
        self.delta = delta  # False: every commit stores every chunk anew (no reuse)
        self._base: dict[str, dict[str, ChunkRef]] | None = None if delta else {}
        #: per pack object the base names: the bytes its chunk entries cover, and where the
        #: last of them ends (a lower bound of the pack's size)
        self._base_packs: dict[str, tuple[int, int]] = {}
        #: GC's grace period. A base from this writer's own last manifest is trusted only
        #: while that step is complete or younger than half of it: GC drops incomplete
        #: steps (a rank that failed its part) once they are older than the grace.
        self.grace_seconds = grace_seconds
        self._base_step: int | None = None
        self._base_at = 0.0
        #: sizes of the pack objects this writer has written (a name is a content hash, so an
        #: entry never goes stale), kept for the packs its last manifest names
        self._pack_sizes: dict[str, int] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- delta base --------------------------------------------------------------------

    def _load_base(self) -> tuple[dict[str, dict[str, ChunkRef]], dict[str, tuple[int, int]]]:
        latest = self.store.latest_step()
        if latest is None:
            return {}, {}
        try:
            return _reuse_index(self.store.manifest(latest, self.rank))
        except (RavexError, OSError):
            return {}, {}  # a rank that did not exist then, or an unreadable base: write in full

    # ---- commit ------------------------------------------------------------------------

    def commit(
        self,
        step: int,
        tree: Any,
        metadata: dict[str, str] | None = None,
        chunk_bytes: Mapping[str, int] | None = None,
    ) -> CommitStats:
        """Write ``tree`` as this rank's part of ``step``; returns when it is durable.

        ``chunk_bytes`` maps array names (as in the manifest: escaped tree keys joined by
        ``/``) to a target chunk size for that array, overriding the writer's own. A table
        of which a few rows change per step wants small chunks, so that a delta stores
        only those rows' chunks; everything else keeps large ones. Unchanged chunks are
        reused across commits at the same chunk size; changing an array's chunk size
        rewrites it once. An :class:`ArrayShard` keeps its own ``chunk_rows``.
        """
        started = time.perf_counter()
        sizes = _check_chunk_bytes(chunk_bytes)
        if self.store.step_info(step).complete:
            raise RavexError(f"step {step} is already complete in {self.store.url!r}; steps are immutable")
        if (
            self._base_step is not None
            and time.monotonic() - self._base_at > self.grace_seconds / 2
            and not self.store.step_info(self._base_step).complete
        ):
            self._base, self._base_step = None, None  # a base GC may be collecting: start afresh
        if self._base is None:
            self._base, self._base_packs = self._load_base()
        planned: dict[str, _PlannedArray] = {}

        def on_array(value: Any, path: tuple[Any, ...]) -> str:
            name = "/".join(escape_key(str(k)) for k in path) or "%00"
            if name in planned:
                raise UnsupportedValueError(
                    f"two keys at {name!r} map to the same tensor name (e.g. 0 and '0' in one dict); rename one"
                )
            planned[name] = self._plan(name, value, sizes.get(name, self.chunk_bytes))
            return name

        tree_doc = encode_value(tree, on_array)
        stats = CommitStats(step=step, arrays=len(planned))
        base = self._base
        timings = _Timings()
        written: set[str] = set()
        pending: list[PendingWrite] = []  # objects durable and visible only once published
        lock = threading.Lock()

        def run_chunk(
            arr: _PlannedArray, pipe: Any, raw: memoryview, raw_digest: str, t: list[float]
        ) -> tuple[ChunkRef | _Small, bool]:
            """Store a chunk the base does not hold (``raw_digest``: the hash of ``raw``): its
            entry (or its encoded bytes, to be packed) and whether this commit stored new bytes
            for it; ``t`` sums seconds hashing, encoding, writing."""
            t1 = time.perf_counter()
            stored = pipe.encode(raw)
            t2 = time.perf_counter()
            t[1] += t2 - t1
            size = memoryview(stored).nbytes
            if size <= INLINE_MAX_BYTES:
                return ChunkRef(raw=raw_digest, size=size, inline=bytes(stored)), True
            if size < PACK_MAX_CHUNK_BYTES:
                return _Small(raw_digest, pipe.codecs_json, bytes(stored)), True
            name = raw_digest if pipe.compressor is None else digest(stored)
            t3 = time.perf_counter()
            with lock:
                fresh = name not in written
                written.add(name)
            if fresh:
                handle = self.store.storage.write_pending(object_key(name), stored)
                if handle is not None:
                    with lock:
                        pending.append(handle)
            t4 = time.perf_counter()
            t[0] += t3 - t2
            t[2] += t4 - t3
            return ChunkRef(raw=raw_digest, size=size, object=name), fresh

        def run_batch(arr: _PlannedArray, batch: list[tuple[str, memoryview]]) -> list[tuple[ChunkRef | _Small, bool]]:
            """Several chunks of one array in one task: thousands of small chunks (a sparse
            table's) would otherwise spend more time in the pool than in hashing.
            Every chunk is hashed and looked up here, in one tight loop (an unchanged chunk of a
            sparse table costs that and nothing else); a chunk not found goes to ``run_chunk``."""
            pipe = pipeline(arr.codecs)
            reusable = base.get(pipe.codecs_json, {})
            full = arr.chunk_len
            t = [0.0, 0.0, 0.0]
            out: list[tuple[ChunkRef | _Small, bool]] = []
            try:
                t0 = time.perf_counter()
                for _key, raw in batch:
                    if raw.nbytes != full:  # a Zarr edge chunk is stored at full size: pad it here,
                        padded = bytearray(full)  # in the worker, so padding costs a chunk per thread
                        padded[: raw.nbytes] = raw
                        raw = memoryview(padded)
                    raw_digest = digest(raw)
                    hit = reusable.get(raw_digest)
                    if hit is not None:
                        out.append((hit, False))
                        continue
                    t[0] += time.perf_counter() - t0
                    out.append(run_chunk(arr, pipe, raw, raw_digest, t))
                    t0 = time.perf_counter()
                t[0] += time.perf_counter() - t0
                return out
            finally:
                timings.add(hash=t[0], encode=t[1], write=t[2])

        jobs = [
            (arr, batch, self._pool.submit(run_batch, arr, batch))
            for arr in planned.values()
            for batch in _batches(arr)
        ]
        chunk_maps: dict[str, dict[str, ChunkRef]] = {path: {} for path in planned}
        small: list[tuple[str, str, _Small]] = []
        try:
            results = [
                (arr, key, result)
                for arr, batch, fut in jobs
                for (key, _raw), result in zip(batch, fut.result(), strict=True)
            ]
        except BaseException:
            # A failed write (storage down, disk full) fails the commit now: chunks not yet
            # started are dropped, not each retried in turn; running ones are waited for so
            # that the writer is idle when the error reaches the caller.
            for _, _, fut in jobs:
                fut.cancel()
            wait([fut for _, _, fut in jobs])
            self.store.storage.discard(pending)
            raise
        packed = {r.identity: len(r.data) for _, _, (r, _fresh) in results if isinstance(r, _Small)}
        sparse = self._sparse_packs((ref for _, _, (ref, fresh) in results if not fresh), sum(packed.values()))
        if sparse:
            raws: dict[str, dict[str, memoryview]] = {}
            for i, (arr, key, (ref, fresh)) in enumerate(results):
                if not fresh and isinstance(ref, ChunkRef) and ref.object in sparse:
                    by_key = raws.get(arr.path)
                    if by_key is None:
                        by_key = raws[arr.path] = dict(arr.chunks)
                    again = _encode_again(arr, by_key[key], ref)
                    results[i] = (arr, key, (again, True))
                    stats.rewritten_chunks += 1
                    stats.rewritten_bytes += len(again.data)
        for arr, key, (ref, fresh) in results:
            stats.chunks += 1
            if isinstance(ref, _Small):
                small.append((arr.path, key, ref))
                continue
            chunk_maps[arr.path][key] = ref
            if ref.inline is not None:
                stats.inline_bytes += ref.size
            if fresh:
                stats.new_chunks += 1
                stats.new_bytes += ref.size if ref.inline is None else 0
            else:
                stats.reused_chunks += 1
                stats.reused_bytes += ref.size
        try:
            for (path, key), ref in self._write_packs(small, timings, pending).items():
                chunk_maps[path][key] = ref
                stats.new_chunks += 1
            t_publish = time.perf_counter()
            self.store.storage.publish(pending)  # one batch of fsyncs, then the names appear
            timings.add(write=time.perf_counter() - t_publish)
        except BaseException:
            self.store.storage.discard(pending)
            raise
        stats.new_bytes += sum(len(s.data) for s in {s.identity: s for _, _, s in small}.values())
        stats.logical_bytes = sum(a.logical_bytes for a in planned.values())

        t_sync = time.perf_counter()
        self.store.storage.sync()  # every object durable before the manifest names it

        manifest = Manifest(
            step=step,
            rank=self.rank,
            world_size=self.world_size,
            run=self.run,
            created_at=clock.now_iso(),
            tree=tree_doc,
            arrays={p: ArrayEntry(zarr=_zarr_json(a), chunks=chunk_maps[p]) for p, a in planned.items()},
            metadata={str(k): str(v) for k, v in (metadata or {}).items()},
            stats=stats.to_json(),
        )
        data = manifest.to_bytes()
        stats.manifest_bytes = len(data)
        self.store.storage.write(self.store.manifest_key(step, self.rank), data)
        self.store.storage.sync()
        if self.delta:
            self._base, self._base_packs = _reuse_index(manifest)
            self._base_step, self._base_at = step, time.monotonic()
        packs = {ref.object for e in manifest.arrays.values() for ref in e.chunks.values() if ref.offset is not None}
        self._pack_sizes = {name: size for name, size in self._pack_sizes.items() if name in packs}
        t_refs = time.perf_counter()
        if self.world_size == 1:  # complete now; with several ranks, whoever sees it complete calls write_refs
            # A complete step is immutable: cache the manifest as written rather than have
            # write_refs (and the next commit's checks) parse it back, which costs ~50 us per
            # chunk entry: seconds for a table in small chunks.
            self.store.cache_manifest(manifest)
            try:
                if refs_worth_writing(self.store, step):
                    write_refs(self.store, step)
            except (RavexError, OSError) as exc:  # the step is complete and readable without it
                logger.warning("ravex: step %d is complete but its refs.json was not written: %s", step, exc)
        ended = time.perf_counter()
        stats.seconds = {
            "hash": timings.hash,
            "encode": timings.encode,
            "write": timings.write,
            "manifest": t_refs - t_sync,
            "refs": ended - t_refs,
            "total": ended - started,
        }
        return stats

    def _sparse_packs(self, reused: Iterator[ChunkRef | _Small], budget: int) -> set[str]:
        """The packs whose chunks among ``reused`` this commit stores afresh instead: those it
        covers less than PACK_LIVE_FLOOR of, then, sparsest first, those it covers less than
        PACK_LIVE_TARGET of while the bytes re-stored for them total at most ``budget`` (the
        commit's new packed bytes: its packs at most double).

        A pack this commit would name for a few chunks (an RNG state, a frozen bias, while
        the rest of the pack changed) would stay alive for them after GC has collected the
        steps that read the rest. Storing those chunks again costs a few small writes; the
        pack is then named by older steps only, and GC deletes it once they go. The floor
        bounds what a slowly changing table in small chunks costs: its packs are re-stored
        only once half dead, where holding them to the target would re-store the table on
        nearly every commit.

        Only a pack of which this commit covers fewer bytes than its base did is measured
        (unchanged state passed when its base was committed). No storage request is made: a
        pack's size is known when this writer wrote it; for one written before (by a run this
        one resumed) the end of its last chunk the base names stands in, a lower bound.
        """
        used: dict[str, dict[int, int]] = {}
        for ref in reused:
            if isinstance(ref, ChunkRef) and ref.object is not None and ref.offset is not None:
                used.setdefault(ref.object, {})[ref.offset] = ref.size  # a chunk used twice counts once
        covered = []
        for name, ranges in used.items():
            live = sum(ranges.values())
            base_live, base_end = self._base_packs.get(name, (0, 0))
            if live < base_live:
                covered.append((live / self._pack_sizes.get(name, base_end), live, name))
        sparse: set[str] = set()
        for fraction, live, name in sorted(covered):
            if fraction < PACK_LIVE_FLOOR:
                sparse.add(name)
            elif fraction < PACK_LIVE_TARGET and live <= budget:
                sparse.add(name)
                budget -= live
        return sparse

    def _write_packs(
        self, small: list[tuple[str, str, _Small]], timings: _Timings, pending: list[PendingWrite]
    ) -> dict[tuple[str, str], ChunkRef]:
        """Pack small new chunks into objects of about PACK_TARGET_BYTES, written in parallel.

        Thousands of small tensors (biases, norms) would otherwise be thousands of tiny
        objects: a PUT each on S3, an fsync each on a local disk. Identical chunks are
        packed once. The order is the tree's, so the same state packs the same way.
        """
        refs: dict[tuple[str, str], ChunkRef] = {}
        placed: dict[tuple[str, str], tuple[int, int]] = {}  # (codecs, raw) -> (pack index, offset)
        packs: list[bytearray] = []
        for _path, _key, chunk in small:
            if chunk.identity in placed:
                continue
            if not packs or (len(packs[-1]) and len(packs[-1]) + len(chunk.data) > PACK_TARGET_BYTES):
                packs.append(bytearray())
            placed[chunk.identity] = (len(packs) - 1, len(packs[-1]))
            packs[-1] += chunk.data

        def write_pack(data: bytearray) -> tuple[str, PendingWrite | None]:
            t0 = time.perf_counter()
            name = digest(data)
            t1 = time.perf_counter()
            handle = self.store.storage.write_pending(object_key(name), data)
            timings.add(hash=t1 - t0, write=time.perf_counter() - t1)
            return name, handle

        futures = [self._pool.submit(write_pack, data) for data in packs]
        wait(futures)  # every pack's temp file known to ``pending`` before an error propagates
        for fut in futures:
            handle = fut.result()[1] if fut.exception() is None else None
            if handle is not None:
                pending.append(handle)
        names = [fut.result()[0] for fut in futures]
        self._pack_sizes.update(zip(names, map(len, packs), strict=True))
        for path, key, chunk in small:
            index, offset = placed[chunk.identity]
            refs[(path, key)] = ChunkRef(raw=chunk.raw, size=len(chunk.data), object=names[index], offset=offset)
        return refs

    # ---- planning ----------------------------------------------------------------------

    def _plan(self, path: str, value: Any, chunk_bytes: int) -> _PlannedArray:
        if isinstance(value, ArrayShard):
            return self._plan_shard(path, value)
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise UnsupportedValueError(
                f"value at {path!r} has type {type(value).__name__}, which Ravex stores neither as "
                "a tensor nor as a plain value; convert it to a numpy array or a Python value"
            )
        dtype = from_numpy(value.dtype)
        arr = np.require(value, dtype=dtype.numpy, requirements="C")  # keeps 0-d arrays 0-d
        shape = tuple(arr.shape)
        return self._chunked(path, dtype, arr, shape, rows_per_chunk(shape, dtype.itemsize, chunk_bytes), 0)

    def _plan_shard(self, path: str, shard: ArrayShard) -> _PlannedArray:
        dtype = from_numpy(shard.local.dtype)
        arr = np.require(shard.local, dtype=dtype.numpy, requirements="C")
        g = tuple(shard.global_shape)
        rows = int(shard.chunk_rows)
        n = arr.shape[0] if arr.ndim else 0
        if (
            not g
            or tuple(arr.shape[1:]) != g[1:]
            or rows < 1
            or shard.offset % rows
            or not (n % rows == 0 or shard.offset + n == g[0])
            or shard.offset + n > g[0]
        ):
            raise ValueError(
                f"shard of {path!r}: rows [{shard.offset}, {shard.offset + n}) of global shape {g} "
                f"do not align with chunk_rows={rows}; shards must start and end on chunk boundaries"
            )
        return self._chunked(path, dtype, arr, g, rows, shard.offset // rows)

    def _chunked(
        self, path: str, dtype: DataType, arr: np.ndarray, shape: tuple[int, ...], rows: int, first: int
    ) -> _PlannedArray:
        codecs = codecs_for(self.compression, dtype.itemsize)
        flat = arr.reshape(-1).view(np.uint8).data if arr.size else memoryview(b"")
        if not shape:
            return _PlannedArray(path, dtype, (), (), codecs, [("c", flat)], dtype.itemsize, arr.nbytes)
        tail = tuple(max(1, d) for d in shape[1:])
        chunk_shape = (rows, *tail)
        chunks: list[tuple[str, memoryview]] = []
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        chunk_len = rows * row_bytes
        if arr.size:
            zeros = ("/0" * (len(shape) - 1))
            starts = range(0, arr.shape[0] * row_bytes, chunk_len)
            chunks = list(zip([f"c/{first + i}{zeros}" for i in range(len(starts))],
                              [flat[at : at + chunk_len] for at in starts], strict=True))
        return _PlannedArray(path, dtype, shape, chunk_shape, codecs, chunks, chunk_len, arr.nbytes)


def rows_per_chunk(shape: tuple[int, ...], itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Rows per chunk along dimension 0: chunks near ``chunk_bytes`` and of equal size,
    so that the padded edge chunk wastes less than one row per chunk. The runtime uses the
    same rule to split replicated arrays across ranks on chunk boundaries."""
    if not shape or shape[0] == 0:
        return 1
    row_bytes = math.prod(shape[1:]) * itemsize
    if row_bytes == 0:
        return shape[0]
    n_chunks = max(1, math.ceil(shape[0] * row_bytes / chunk_bytes))
    return math.ceil(shape[0] / n_chunks)


def _batches(arr: _PlannedArray) -> Iterator[list[tuple[str, memoryview]]]:
    """An array's chunks in runs of about BATCH_BYTES (one chunk per run when larger)."""
    n = max(1, BATCH_BYTES // max(1, arr.chunk_len))
    for i in range(0, len(arr.chunks), n):
        yield arr.chunks[i : i + n]


def _check_chunk_bytes(chunk_bytes: Mapping[str, int] | None) -> dict[str, int]:
    """The per-array chunk sizes of one commit, checked before anything is planned."""
    sizes = dict(chunk_bytes or {})
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"chunk_bytes[{name!r}] = {size!r}: a chunk size must be a positive int of bytes")
    return sizes


class _Timings:
    """Seconds summed over worker threads, per phase."""

    def __init__(self) -> None:
        self.hash = self.encode = self.write = 0.0
        self._lock = threading.Lock()

    def add(self, hash: float = 0.0, encode: float = 0.0, write: float = 0.0) -> None:
        with self._lock:
            self.hash += hash
            self.encode += encode
            self.write += write


def _encode_again(arr: _PlannedArray, raw: memoryview, ref: ChunkRef) -> _Small:
    """A reused chunk of ``arr`` (``raw``, its bytes in memory) encoded again, to be packed
    with the commit's new chunks; its raw digest, and so its identity, is ``ref``'s."""
    if raw.nbytes != arr.chunk_len:  # an edge chunk is stored at full size
        padded = bytearray(arr.chunk_len)
        padded[: raw.nbytes] = raw
        raw = memoryview(padded)
    pipe = pipeline(arr.codecs)
    return _Small(ref.raw, pipe.codecs_json, bytes(pipe.encode(raw)))


def _reuse_index(manifest: Manifest) -> tuple[dict[str, dict[str, ChunkRef]], dict[str, tuple[int, int]]]:
    """A step's chunks by codec chain, then by raw digest: what a commit may reuse (keyed in
    two levels so that a lookup builds no tuple: a sparse table looks up ~400k chunks); and per
    pack object it names, the bytes its chunk entries cover and where the last of them ends."""
    index: dict[str, dict[str, ChunkRef]] = {}
    ranges: dict[str, dict[int, int]] = {}
    for entry in manifest.arrays.values():
        by_raw = index.setdefault(json.dumps(entry.codecs, sort_keys=True), {})
        by_raw.update({ref.raw: ref for ref in entry.chunks.values()})
        for ref in entry.chunks.values():
            if ref.offset is not None and ref.object is not None:
                ranges.setdefault(ref.object, {})[ref.offset] = ref.size
    return index, {name: (sum(r.values()), max(o + n for o, n in r.items())) for name, r in ranges.items()}


def _zarr_json(arr: _PlannedArray) -> dict[str, Any]:
    """The exact ``zarr.json`` of one array, as stock zarr-python writes it."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(arr.shape),
        "data_type": arr.dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(arr.chunk_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": arr.dtype.fill_value,
        "codecs": arr.codecs,
        "attributes": {},
        "storage_transformers": [],
    }
