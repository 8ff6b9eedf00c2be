"""Writing a step: plan chunks, hash, reuse unchanged chunks, encode, write, then the manifest.

The pipeline is one task per chunk on a thread pool. xxhash, numcodecs and file
I/O release the GIL, so a 2-core machine overlaps hashing, encoding and writing.
A chunk whose raw digest (and codec chain) matches a chunk of the delta base is
reused as it is: no encoding, no write, no storage round trip, unless it sits in a
pack the commit would otherwise cover too little of (:func:`.packs.sparse_packs`): then it is
stored afresh, so that no pack stays alive for a few chunks once GC collects the steps that read
the rest of it.

This module runs the pipeline and owns its thresholds; what each array's chunks are comes from
:mod:`.planning`, how small chunks are packed and which packs stay alive from :mod:`.packs`, and
the commit's figures are :mod:`.stats`'.

The delta base is the previous manifest this writer committed, or, before its
first commit, the newest complete step's manifest for this rank. Either one is
at least as new as the store's newest complete step until this writer commits
again, and GC never deletes such a step (spec/FORMAT.md, "Garbage collection").
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import SPEC_VERSION, TABLE_SPEC_VERSION
from ..errors import RavexError, UnsupportedValueError
from ..history import clock
from ..maintenance.gc import DEFAULT_GRACE_SECONDS
from ..objects.chunkref import ChunkRef
from ..objects.chunktable import ChunkTable
from ..objects.codecs import parse_compression, pipeline
from ..objects.hashing import KNOWN_MIN_BYTES, KnownDigests, digest
from ..objects.names import array_name, object_key
from ..objects.tabledelta import TableDelta, hash_rows, pad, row_batches
from ..objects.values import encode_value
from ..steps.manifest import ArrayEntry, Manifest
from ..steps.refs import refs_worth_writing, write_refs
from .packs import PackLayout, Small, encode_again, live_by_pack, place_rows, reuse_index, sparse_packs
from .planning import (
    BATCH_BYTES,
    DEFAULT_CHUNK_BYTES,
    ArrayShard,
    PlannedArray,
    batches,
    check_chunk_bytes,
    hashed_chunk_len,
    plan,
    rows_per_chunk,
    zarr_json,
)
from .stats import CommitStats, Timings
from .threads import DEFAULT_THREADS, writer_threads

if TYPE_CHECKING:
    from ..steps.catalog import StoreCatalog
    from ..storage import PendingWrite

logger = logging.getLogger("ravex.format")

#: Chunks whose encoded bytes are at most this size live inline in the manifest.
INLINE_MAX_BYTES = 512
#: New chunks whose encoded size is below this are packed together into shared objects
#: of about PACK_TARGET_BYTES (:mod:`.packs`; a chunk entry then carries an ``offset``).
PACK_MAX_CHUNK_BYTES = 256 << 10
#: Pack liveness (spec/FORMAT.md §13). A commit stores afresh the chunks it would reuse from a
#: pack it covers less than PACK_LIVE_FLOOR of (re-storing them costs fewer bytes than the pack
#: then frees), and from a pack it covers less than PACK_LIVE_TARGET of while the bytes so
#: re-stored stay within the commit's own new packed bytes (sparsest packs first). So every manifest
#: covers at least the floor of each pack it names, and the target where most of its state
#: changed, as in training, which leaves at most ``1 - PACK_LIVE_TARGET`` of a pack dead after GC.
PACK_LIVE_TARGET = 0.9
PACK_LIVE_FLOOR = 0.5

#: importable from here as before the planning and the figures had modules of their own
__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_THREADS",
    "INLINE_MAX_BYTES",
    "PACK_LIVE_FLOOR",
    "PACK_LIVE_TARGET",
    "PACK_MAX_CHUNK_BYTES",
    "ArrayShard",
    "CommitStats",
    "StepWriter",
    "hashed_chunk_len",
    "rows_per_chunk",
]


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
        threads = threads or writer_threads(store.storage.is_local_filesystem)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ravex-write")
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

    def start_from(self, step: int, manifest: Manifest) -> None:
        """Take complete ``step`` as the delta base of the next commit, as if this writer had
        committed ``manifest`` (this rank's of it): the step a resume read, known complete.
        Without it the first commit finds its base by checking the newest step, every rank's
        manifest read: ``W`` GETs on each rank, ``W^2`` for the job at its first checkpoint."""
        if self.delta:
            self._base, self._tables, self._base_packs = reuse_index(manifest, self.tables)
            self._base_step, self._base_at = step, time.monotonic()

    def _load_base(self) -> tuple[dict[str, dict[str, ChunkRef]], dict[str, dict[str, ChunkTable]],
                                  dict[str, tuple[int, int]]]:
        latest = self.store.latest_step()
        if latest is None:
            return {}, {}, {}
        try:
            return reuse_index(self.store.manifest(latest, self.rank), self.tables)
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
        sizes = check_chunk_bytes(chunk_bytes)
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
        planned: dict[str, PlannedArray] = {}

        def on_array(value: Any, path: tuple[Any, ...]) -> str:
            name = array_name(path)
            if name in planned:
                raise UnsupportedValueError(
                    f"two keys at {name!r} map to the same tensor name (e.g. 0 and '0' in one dict); rename one"
                )
            planned[name] = plan(name, value, sizes.get(name, self.chunk_bytes), self.compression, self.tables,
                                 PACK_MAX_CHUNK_BYTES)
            return name

        tree_doc = encode_value(tree, on_array)
        stats = CommitStats(step=step, arrays=len(planned))
        base = self._base
        timings = Timings()
        written: set[str] = set()
        pending: list[PendingWrite] = []  # objects durable and visible only once published
        lock = threading.Lock()

        def run_chunk(
            arr: PlannedArray, pipe: Any, raw: memoryview, raw_digest: str, t: list[float]
        ) -> tuple[ChunkRef | Small, bool]:
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
                return Small(raw_digest, pipe.codecs_json, bytes(stored)), True
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

        def run_batch(arr: PlannedArray, batch: list[tuple[str, memoryview]]) -> list[tuple[ChunkRef | Small, bool]]:
            """Several chunks of one array in one task: thousands of small chunks would otherwise
            spend more time in the pool than in hashing. Every chunk is hashed and looked up
            here, in one tight loop; a chunk not found goes to ``run_chunk``."""
            pipe = pipeline(arr.codecs)
            reusable = base.get(pipe.codecs_json, {})
            full = arr.chunk_len
            looked_up = known if known and full >= KNOWN_MIN_BYTES else None
            t = [0.0, 0.0, 0.0]
            out: list[tuple[ChunkRef | Small, bool]] = []
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

        def hash_table(arr: PlannedArray, lo: int, hi: int) -> bytes:
            t0 = time.perf_counter()
            try:
                return hash_rows(arr.flat, arr.chunk_len, lo, hi)
            finally:
                timings.add(hash=time.perf_counter() - t0)

        tables = [arr for arr in planned.values() if arr.table]
        jobs: list[Future[Any]] = []
        try:
            map_jobs = [(arr, batch, self._pool.submit(run_batch, arr, batch))
                        for arr in planned.values() if not arr.table for batch in batches(arr)]
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
        packed = sum(len(r.data) for r in {r.identity: r for _, _, (r, _) in results if isinstance(r, Small)}.values())
        live = live_by_pack(ref for _, _, (ref, fresh) in results if not fresh)
        for d in deltas:
            for name, n in d.live_by_pack().items():
                live[name] = live.get(name, 0) + n
        sparse = sparse_packs(live, packed, self._base_packs, self._pack_sizes, PACK_LIVE_FLOOR, PACK_LIVE_TARGET)
        if sparse:
            raws: dict[str, dict[str, memoryview]] = {}
            for i, (arr, key, (ref, fresh)) in enumerate(results):
                if not fresh and isinstance(ref, ChunkRef) and ref.object in sparse:
                    by_key = raws.get(arr.path)
                    if by_key is None:
                        by_key = raws[arr.path] = dict(arr.chunk_list())
                    again = encode_again(arr, by_key[key], ref)
                    results[i] = (arr, key, (again, True))
                    stats.rewritten_chunks += 1
                    stats.rewritten_bytes += len(again.data)
            for d in deltas:
                rows, nbytes = d.drop_packs(sparse)
                stats.rewritten_chunks += rows
                stats.rewritten_bytes += nbytes
        chunk_maps: dict[str, dict[str, ChunkRef]] = {path: {} for path, arr in planned.items() if not arr.table}
        small: list[tuple[str, str, Small]] = []
        for arr, key, (ref, fresh) in results:
            stats.chunks += 1
            if isinstance(ref, Small):
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
        layout = PackLayout()
        for _path, _key, s in small:
            layout.place(s.identity, s.data)
        fresh_rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        try:
            for arr, d in zip(tables, deltas, strict=True):
                fresh_rows[arr.path] = place_rows(self._pool, arr, d, layout, timings)
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
            arrays={p: ArrayEntry(zarr=zarr_json(a), chunks=entries[p]) for p, a in planned.items()},
            metadata={str(k): str(v) for k, v in (metadata or {}).items()},
            stats=stats.to_json(),
            version=TABLE_SPEC_VERSION if tables else SPEC_VERSION,
        )
        data = manifest.to_bytes()
        stats.manifest_bytes = len(data)
        self.store.storage.write(self.store.manifest_key(step, self.rank), data)
        self.store.storage.sync()
        self.start_from(step, manifest)
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

    def _write_packs(self, layout: PackLayout, timings: Timings, pending: list[PendingWrite]) -> list[str]:
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


def _address(raw: memoryview) -> int:
    """Where ``raw``'s first byte is in memory (the key of a known digest)."""
    return int(np.frombuffer(raw, dtype=np.uint8).ctypes.data)
