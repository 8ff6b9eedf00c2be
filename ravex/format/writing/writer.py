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
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import SPEC_VERSION, TABLE_SPEC_VERSION
from ..errors import RavexError, UnsupportedValueError
from ..history import clock
from ..maintenance.gc import DEFAULT_GRACE_SECONDS
from ..objects.chunkref import ChunkRef
from ..objects.chunktable import ChunkTable, table_of
from ..objects.codecs import codecs_for, parse_compression, pipeline
from ..objects.dtypes import DataType, from_numpy
from ..objects.hashing import KNOWN_MIN_BYTES, KnownDigests, digest
from ..objects.names import array_name, object_key
from ..objects.tabledelta import TABLE_MIN_CHUNKS, TableDelta, hash_rows, pad, row_batches, row_view
from ..objects.values import encode_value
from ..steps.manifest import ArrayEntry, Manifest, grid_of
from ..steps.refs import refs_worth_writing, write_refs

if TYPE_CHECKING:
    from ..steps.catalog import StoreCatalog
    from ..storage import PendingWrite

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
    """One array of the commit: its metadata, and its raw bytes as ``count`` chunks of
    ``chunk_len`` along dimension 0 (the last one short, padded when hashed) starting at grid
    index ``first``."""

    path: str
    dtype: DataType
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    codecs: list[dict[str, Any]]
    flat: memoryview
    count: int
    first: int
    chunk_len: int  # bytes of a full chunk
    logical_bytes: int
    table: bool = False  # written as a chunk table (spec §5.1)

    @property
    def grid(self) -> tuple[int, ...]:
        return grid_of(self.shape, self.chunk_shape)

    def chunk_list(self) -> list[tuple[str, memoryview]]:
        """(chunk key, raw bytes) of each chunk."""
        if not self.shape:
            return [("c", self.flat)]
        tail = "/0" * (len(self.shape) - 1)
        n = self.chunk_len
        return [(f"c/{self.first + i}{tail}", self.flat[i * n : (i + 1) * n]) for i in range(self.count)]


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
        tables: bool = True,
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
        #: False: every array's chunks as a JSON map, readable by 1.0 and 1.1 readers (spec §16)
        self.tables = tables
        self._base: dict[str, dict[str, ChunkRef]] | None = None if delta else {}
        #: per table array (§5.1) of the base: its table, under its codec chain
        self._tables: dict[str, dict[str, ChunkTable]] = {}
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

    def _load_base(self) -> tuple[dict[str, dict[str, ChunkRef]], dict[str, dict[str, ChunkTable]],
                                  dict[str, tuple[int, int]]]:
        latest = self.store.latest_step()
        if latest is None:
            return {}, {}, {}
        try:
            return _reuse_index(self.store.manifest(latest, self.rank), self.tables)
        except (RavexError, OSError):
            return {}, {}, {}  # a rank that did not exist then, or an unreadable base: write in full

    # ---- commit ------------------------------------------------------------------------

    def commit(
        self,
        step: int,
        tree: Any,
        metadata: dict[str, str] | None = None,
        chunk_bytes: Mapping[str, int] | None = None,
        on_read: Callable[[], None] | None = None,
        known: KnownDigests | None = None,
    ) -> CommitStats:
        """Write ``tree`` as this rank's part of ``step``; returns when it is durable.

        ``chunk_bytes`` maps array names (as in the manifest: escaped tree keys joined by
        ``/``) to a target chunk size for that array, overriding the writer's own. A table
        of which a few rows change per step wants small chunks, so that a delta stores
        only those rows' chunks; everything else keeps large ones. Unchanged chunks are
        reused across commits at the same chunk size; changing an array's chunk size
        rewrites it once. An :class:`ArrayShard` keeps its own ``chunk_rows``.

        ``on_read`` is called once every byte of the tree's arrays has been read (hashed,
        encoded and handed to storage), before the objects are published and the manifest
        written: from then on the caller may change the arrays (a runtime that handed over its
        live tensors rather than copies lets training go on). Not called if the commit fails
        before that point.

        ``known`` holds digests of chunks the caller hashed as it produced their bytes
        (:data:`~ravex.format.objects.hashing.KnownDigests`); a chunk found there is not hashed again.
        Only arrays whose chunks are hashed one by one and are at least
        :data:`~ravex.format.objects.hashing.KNOWN_MIN_BYTES` look there (:func:`hashed_chunk_len`).
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
            self._tables = {}
        if self._base is None:
            self._base, self._tables, self._base_packs = self._load_base()
        planned: dict[str, _PlannedArray] = {}

        def on_array(value: Any, path: tuple[Any, ...]) -> str:
            name = array_name(path)
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
            """Several chunks of one array in one task: thousands of small chunks would otherwise
            spend more time in the pool than in hashing. Every chunk is hashed and looked up
            here, in one tight loop; a chunk not found goes to ``run_chunk``."""
            pipe = pipeline(arr.codecs)
            reusable = base.get(pipe.codecs_json, {})
            full = arr.chunk_len
            looked_up = known if known and full >= KNOWN_MIN_BYTES else None
            t = [0.0, 0.0, 0.0]
            out: list[tuple[ChunkRef | _Small, bool]] = []
            try:
                t0 = time.perf_counter()
                for _key, raw in batch:
                    found = looked_up.get((_address(raw), raw.nbytes, full)) if looked_up and raw.nbytes else None
                    raw = pad(raw, full)
                    raw_digest = found or digest(raw)
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

        def hash_table(arr: _PlannedArray, lo: int, hi: int) -> bytes:
            t0 = time.perf_counter()
            try:
                return hash_rows(arr.flat, arr.chunk_len, lo, hi)
            finally:
                timings.add(hash=time.perf_counter() - t0)

        tables = [arr for arr in planned.values() if arr.table]
        jobs: list[Future[Any]] = []
        try:
            map_jobs = [(arr, batch, self._pool.submit(run_batch, arr, batch))
                        for arr in planned.values() if not arr.table for batch in _batches(arr)]
            hash_jobs = [(arr, [self._pool.submit(hash_table, arr, lo, hi)
                                for lo, hi in row_batches(arr.count, arr.chunk_len, BATCH_BYTES)]) for arr in tables]
            jobs = [fut for _, _, fut in map_jobs] + [fut for _, futs in hash_jobs for fut in futs]
            results = [
                (arr, key, result)
                for arr, batch, fut in map_jobs
                for (key, _raw), result in zip(batch, fut.result(), strict=True)
            ]
            deltas = [  # one per table, in the order of ``tables``
                TableDelta.of(np.frombuffer(b"".join(f.result() for f in futs), np.uint8).reshape(arr.count, 16),
                              self._tables.get(arr.path, {}).get(pipeline(arr.codecs).codecs_json))
                for arr, futs in hash_jobs
            ]
        except BaseException:
            # A failed write (storage down, disk full) fails the commit now: chunks not yet
            # started are dropped, not each retried in turn; running ones are waited for so
            # that the writer is idle when the error reaches the caller.
            for fut in jobs:
                fut.cancel()
            wait(jobs)
            self.store.storage.discard(pending)
            raise
        # The target tier's budget: the new packed bytes of chunk maps only. A table's changed rows
        # pay for no re-storing: its packs drop below the target after a commit or two, and holding
        # them to it would store the changes again on every commit; they keep to the floor (§13).
        packed = sum(len(r.data) for r in {r.identity: r for _, _, (r, _) in results if isinstance(r, _Small)}.values())
        live = _live_by_pack(ref for _, _, (ref, fresh) in results if not fresh)
        for d in deltas:
            for name, n in d.live_by_pack().items():
                live[name] = live.get(name, 0) + n
        sparse = self._sparse_packs(live, packed)
        if sparse:
            raws: dict[str, dict[str, memoryview]] = {}
            for i, (arr, key, (ref, fresh)) in enumerate(results):
                if not fresh and isinstance(ref, ChunkRef) and ref.object in sparse:
                    by_key = raws.get(arr.path)
                    if by_key is None:
                        by_key = raws[arr.path] = dict(arr.chunk_list())
                    again = _encode_again(arr, by_key[key], ref)
                    results[i] = (arr, key, (again, True))
                    stats.rewritten_chunks += 1
                    stats.rewritten_bytes += len(again.data)
            for d in deltas:
                rows, nbytes = d.drop_packs(sparse)
                stats.rewritten_chunks += rows
                stats.rewritten_bytes += nbytes
        chunk_maps: dict[str, dict[str, ChunkRef]] = {path: {} for path, arr in planned.items() if not arr.table}
        small: list[tuple[str, str, _Small]] = []
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
        layout = _PackLayout()
        for _path, _key, s in small:
            layout.place(s.identity, s.data)
        fresh_rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        try:
            for arr, d in zip(tables, deltas, strict=True):
                fresh_rows[arr.path] = self._place_rows(arr, d, layout, timings)
                stats.chunks += arr.count
                stats.new_chunks += int(fresh_rows[arr.path][0].size)
                stats.reused_chunks += arr.count - int(fresh_rows[arr.path][0].size)
                stats.reused_bytes += d.reused_bytes()
            names = self._write_packs(layout, timings, pending)
            if on_read is not None:  # nothing below reads an array's bytes
                on_read()
            for path, key, s in small:
                index, offset = layout.placed[s.identity]
                chunk_maps[path][key] = ChunkRef(raw=s.raw, size=len(s.data), object=names[index], offset=offset)
                stats.new_chunks += 1
            t_publish = time.perf_counter()
            self.store.storage.publish(pending)  # one batch of fsyncs, then the names appear
            timings.add(write=time.perf_counter() - t_publish)
        except BaseException:
            self.store.storage.discard(pending)
            raise
        stats.new_bytes += layout.total
        stats.logical_bytes = sum(a.logical_bytes for a in planned.values())
        entries: dict[str, Mapping[str, ChunkRef]] = dict(chunk_maps)
        for arr, d in zip(tables, deltas, strict=True):
            stored_rows, pack_of, offset_of, size_of = fresh_rows[arr.path]
            entries[arr.path] = d.table(arr.grid, stored_rows, names, pack_of, offset_of, size_of)

        t_sync = time.perf_counter()
        self.store.storage.sync()  # every object durable before the manifest names it

        manifest = Manifest(
            step=step,
            rank=self.rank,
            world_size=self.world_size,
            run=self.run,
            created_at=clock.now_iso(),
            tree=tree_doc,
            arrays={p: ArrayEntry(zarr=_zarr_json(a), chunks=entries[p]) for p, a in planned.items()},
            metadata={str(k): str(v) for k, v in (metadata or {}).items()},
            stats=stats.to_json(),
            version=TABLE_SPEC_VERSION if tables else SPEC_VERSION,
        )
        data = manifest.to_bytes()
        stats.manifest_bytes = len(data)
        self.store.storage.write(self.store.manifest_key(step, self.rank), data)
        self.store.storage.sync()
        if self.delta:
            self._base, self._tables, self._base_packs = _reuse_index(manifest, self.tables)
            self._base_step, self._base_at = step, time.monotonic()
        packs = {name for entry in manifest.arrays.values() for name in entry.object_names()}
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

    def _sparse_packs(self, live: dict[str, int], budget: int) -> set[str]:
        """The packs whose chunks this commit would reuse (``live``: the bytes of each pack the
        reused chunks read) that it stores afresh instead: those it covers less than
        PACK_LIVE_FLOOR of, then, sparsest first, those it covers less than PACK_LIVE_TARGET of
        while the bytes re-stored for them total at most ``budget`` (the commit's new packed
        bytes of chunk maps: those packs at most double).

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
        covered = []
        for name, used in live.items():
            base_live, base_end = self._base_packs.get(name, (0, 0))
            if used < base_live:
                covered.append((used / self._pack_sizes.get(name, base_end), used, name))
        sparse: set[str] = set()
        for fraction, used, name in sorted(covered):
            if fraction < PACK_LIVE_FLOOR:
                sparse.add(name)
            elif fraction < PACK_LIVE_TARGET and used <= budget:
                sparse.add(name)
                budget -= used
        return sparse

    def _place_rows(
        self, arr: _PlannedArray, delta: TableDelta, layout: _PackLayout, timings: _Timings
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Encode a table's rows that it does not reuse (on the pool, in runs of BATCH_BYTES) and
        place them in ``layout``: (rows, pack index, offset, stored size) of each, in row order."""
        rows, distinct, inverse = delta.fresh_chunks()
        pipe = pipeline(arr.codecs)

        def encode(part: np.ndarray) -> list[Any]:
            t0 = time.perf_counter()
            try:
                return [pipe.encode(row_view(arr.flat, arr.chunk_len, r)) for r in part.tolist()]
            finally:
                timings.add(encode=time.perf_counter() - t0)

        per_task = max(1, BATCH_BYTES // arr.chunk_len)
        futures = [self._pool.submit(encode, distinct[i : i + per_task]) for i in range(0, distinct.size, per_task)]
        try:
            stored = [data for fut in futures for data in fut.result()]
        except BaseException:
            for fut in futures:
                fut.cancel()
            wait(futures)  # the writer idle when the error reaches the caller
            raise
        pack_of, offset_of, size_of = layout.place_run(stored)
        return rows, pack_of[inverse], offset_of[inverse], size_of[inverse]

    def _write_packs(self, layout: _PackLayout, timings: _Timings, pending: list[PendingWrite]) -> list[str]:
        """Write the packs ``layout`` holds, in parallel; their names, in pack order."""

        def write_pack(parts: list[Any]) -> tuple[str, PendingWrite | None]:
            data = b"".join(parts)
            t0 = time.perf_counter()
            name = digest(data)
            t1 = time.perf_counter()
            handle = self.store.storage.write_pending(object_key(name), data)
            timings.add(hash=t1 - t0, write=time.perf_counter() - t1)
            return name, handle

        futures = [self._pool.submit(write_pack, parts) for parts in layout.packs]
        wait(futures)  # every pack's temp file known to ``pending`` before an error propagates
        for fut in futures:
            handle = fut.result()[1] if fut.exception() is None else None
            if handle is not None:
                pending.append(handle)
        names = [fut.result()[0] for fut in futures]
        self._pack_sizes.update(zip(names, layout.fill, strict=True))
        return names

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
            return _PlannedArray(path, dtype, (), (), codecs, flat, 1, 0, dtype.itemsize, arr.nbytes)
        tail = tuple(max(1, d) for d in shape[1:])
        chunk_len = rows * math.prod(shape[1:]) * dtype.itemsize
        count = math.ceil(arr.nbytes / chunk_len) if arr.size else 0
        whole = first == 0 and arr.shape[0] == shape[0]  # not a shard: the table covers the grid
        table = self.tables and whole and count >= TABLE_MIN_CHUNKS and chunk_len < PACK_MAX_CHUNK_BYTES
        return _PlannedArray(path, dtype, shape, (rows, *tail), codecs, flat, count, first, chunk_len, arr.nbytes,
                             table)


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


def hashed_chunk_len(shape: tuple[int, ...], itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                     rows: int | None = None) -> int | None:
    """The bytes of each chunk of an array of this shape (an :class:`ArrayShard`'s local rows:
    ``rows`` is its ``chunk_rows``) that :meth:`StepWriter.commit` hashes chunk by chunk and
    looks up in ``known`` (chunks from offset 0, the last one padded to this length); None
    where it does not: 0-d and empty arrays, chunks under
    :data:`~ravex.format.objects.hashing.KNOWN_MIN_BYTES` (chunk tables among them)."""
    if not shape or not all(shape):
        return None
    rows = rows or rows_per_chunk(shape, itemsize, chunk_bytes)
    chunk_len = rows * math.prod(shape[1:]) * itemsize
    return chunk_len if chunk_len >= KNOWN_MIN_BYTES else None


def _address(raw: memoryview) -> int:
    """Where ``raw``'s first byte is in memory (the key of a known digest)."""
    return int(np.frombuffer(raw, dtype=np.uint8).ctypes.data)


def _batches(arr: _PlannedArray) -> Iterator[list[tuple[str, memoryview]]]:
    """An array's chunks in runs of about BATCH_BYTES (one chunk per run when larger)."""
    chunks = arr.chunk_list()
    n = max(1, BATCH_BYTES // max(1, arr.chunk_len))
    for i in range(0, len(chunks), n):
        yield chunks[i : i + n]


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
    pipe = pipeline(arr.codecs)
    return _Small(ref.raw, pipe.codecs_json, bytes(pipe.encode(pad(raw, arr.chunk_len))))


class _PackLayout:
    """New small chunks laid out into packs of about PACK_TARGET_BYTES. The order of the calls
    is the tree's, so the same state packs the same way."""

    def __init__(self) -> None:
        self.packs: list[list[Any]] = []  # per pack, its chunks' stored bytes in order
        self.fill: list[int] = []
        self.placed: dict[tuple[str, str], tuple[int, int]] = {}  # identity -> (pack, offset)
        self.total = 0

    def place(self, identity: tuple[str, str], data: Any) -> tuple[int, int]:
        """One chunk of a map array; an identical chunk (same codec chain and raw digest) is
        placed once."""
        where = self.placed.get(identity)
        if where is None:
            size = memoryview(data).nbytes
            if not self.packs or (self.fill[-1] and self.fill[-1] + size > PACK_TARGET_BYTES):
                self.packs.append([])
                self.fill.append(0)
            where = self.placed[identity] = (len(self.packs) - 1, self.fill[-1])
            self.packs[-1].append(data)
            self.fill[-1] += size
            self.total += size
        return where

    def place_run(self, stored: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A run of a table's distinct new chunks (the table deduplicated them), placed with
        numpy: (pack, offset, size) of each. A pack takes chunks while it holds less than
        PACK_TARGET_BYTES, so it may end one chunk past it."""
        sizes = np.fromiter((memoryview(d).nbytes for d in stored), np.int64, len(stored))
        if not sizes.size:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        if not self.packs or self.fill[-1] >= PACK_TARGET_BYTES:
            self.packs.append([])
            self.fill.append(0)
        starts = self.fill[-1] + np.cumsum(sizes) - sizes  # as if the current pack had no end
        group = starts // PACK_TARGET_BYTES  # 0: the current pack; k: the k-th one opened after it
        bounds = (np.flatnonzero(np.diff(group)) + 1).tolist()
        packs = np.empty(sizes.size, np.int64)
        offsets = np.empty(sizes.size, np.int64)
        for i, (lo, hi) in enumerate(zip([0, *bounds], [*bounds, sizes.size], strict=True)):
            if i:
                self.packs.append([])
                self.fill.append(0)
            offsets[lo:hi] = starts[lo:hi] - (int(starts[lo]) if i else 0)
            packs[lo:hi] = len(self.packs) - 1
            self.packs[-1].append(b"".join(stored[lo:hi]))
            self.fill[-1] = int(offsets[hi - 1] + sizes[hi - 1])
        self.total += int(sizes.sum())
        return packs, offsets, sizes


def _live_by_pack(reused: Iterator[ChunkRef | _Small]) -> dict[str, int]:
    """Bytes of each pack that ``reused`` entries read (a chunk used twice counts once)."""
    used: dict[str, dict[int, int]] = {}
    for ref in reused:
        if isinstance(ref, ChunkRef) and ref.object is not None and ref.offset is not None:
            used.setdefault(ref.object, {})[ref.offset] = ref.size
    return {name: sum(ranges.values()) for name, ranges in used.items()}


def _reuse_index(
    manifest: Manifest, tables_wanted: bool = True
) -> tuple[dict[str, dict[str, ChunkRef]], dict[str, dict[str, ChunkTable]], dict[str, tuple[int, int]]]:
    """What a commit may reuse of a step: its map arrays' chunks by codec chain, then by raw
    digest (two levels, so that a lookup builds no tuple); its tables (§5.1) by array path, then
    codec chain, compared row by row; and per pack object it names, the bytes its chunk entries
    cover and where the last of them ends.

    With ``tables_wanted``, a map array of the base large enough to be written as a table (a
    store from before tables, or an array that grew past TABLE_MIN_CHUNKS) becomes its table
    here, once, so that the first commit after the switch still reuses every unchanged chunk."""
    index: dict[str, dict[str, ChunkRef]] = {}
    tables: dict[str, dict[str, ChunkTable]] = {}
    ranges: dict[str, dict[int, int]] = {}
    packs: dict[str, tuple[int, int]] = {}
    for path, entry in manifest.arrays.items():
        codecs_json = json.dumps(entry.codecs, sort_keys=True)
        if isinstance(entry.chunks, ChunkTable):
            table = entry.chunks
            tables[path] = {codecs_json: table}
            obj, offset, size = table.pack_ranges()
            live = np.bincount(obj, weights=size, minlength=len(table.objects))
            end = np.zeros(len(table.objects), np.int64)
            np.maximum.at(end, obj, offset + size)
            for i in np.flatnonzero(live).tolist():
                have = packs.get(table.objects[i], (0, 0))
                packs[table.objects[i]] = (have[0] + int(live[i]), max(have[1], int(end[i])))
            continue
        by_raw = index.setdefault(codecs_json, {})
        by_raw.update({ref.raw: ref for ref in entry.chunks.values()})
        if tables_wanted and len(entry.chunks) >= TABLE_MIN_CHUNKS:
            as_table = table_of(entry.chunks, entry.grid)
            if as_table is not None:
                tables[path] = {codecs_json: as_table}
        for ref in entry.chunks.values():
            if ref.offset is not None and ref.object is not None:
                ranges.setdefault(ref.object, {})[ref.offset] = ref.size
    for name, r in ranges.items():
        have = packs.get(name, (0, 0))
        packs[name] = (have[0] + sum(r.values()), max(have[1], max(o + n for o, n in r.items())))
    return index, tables, packs


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
