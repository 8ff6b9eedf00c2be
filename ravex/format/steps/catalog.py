"""What a checkpoint store holds: the root document, its steps, and which of them are complete.

Layout (spec/FORMAT.md)::

    ravex.json                      root document
    objects/ab/abcdef...            immutable chunk objects, named by content hash
    steps/<step>/rank-<r>.json      one manifest per rank per step, written last

A step is complete exactly when ``rank-0.json`` .. ``rank-<W-1>.json`` all exist,
``W`` being the ``world_size`` every one of them declares, with the same ``run``.

:class:`StoreCatalog` lists steps, parses and caches manifests and deletes steps; the
reader, the writer and GC work on it. :class:`~ravex.format.store.CheckpointStore` adds
the verbs that open them (``writer()``, ``open_step()``, ``gc()``), so this module imports
none of them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError, RavexError, StepNotFoundError
from ..history.timelines import MAIN, Timeline
from ..objects.chunktable import ChunkTable
from ..objects.names import is_decimal, manifest_key, manifest_ranks, no_rank_missing, step_dir
from ..storage import Storage
from .manifest import Manifest, merge_arrays

#: Parsed manifests kept per store: at most this many ...
MANIFEST_CACHE_SIZE = 256
#: ... and about this many bytes of them (estimated by :func:`_parsed_bytes`). A writer
#: remembers every manifest it commits: a 10,000-tensor manifest parses to ~30 MB, so a
#: count alone would let a long run hold gigabytes.
MANIFEST_CACHE_BYTES = 256 << 20
#: Manifest GETs in flight at once when one step's manifests are read together (its
#: completeness): at 10,000 ranks, sequential GETs of ~20 ms are ~3 minutes where 32 at a time
#: take seconds, and the step's prefix (5,500 GET/s on S3) stays the bound, not the client.
MANIFEST_READ_THREADS = 32
#: Fewer manifests than this are read one after another (a thread pool costs more than it saves).
PARALLEL_READS_FROM = 8


@dataclass(frozen=True)
class StepInfo:
    """What a listing knows about a step without reading its tensors."""

    step: int
    world_size: int | None  # None when no manifest could be read
    ranks: tuple[int, ...]  # ranks whose manifest exists
    complete: bool
    problem: str | None = None  # why it is not complete, for validate and ls
    #: a manifest is there but could not be read (a newer format, damage, a failed request):
    #: unlike a missing rank's, that is no crashed write, and nothing deletes such a step
    unreadable: bool = False


@dataclass(frozen=True)
class StepFiles:
    """One step's folder as a single listing of ``steps/`` saw it (:meth:`StoreCatalog.list_steps`)."""

    step: int
    files: tuple[str, ...]  # every name in the folder (manifests, refs.json, temp files), sorted
    ranks: tuple[int, ...]  # ranks whose manifest is among ``files``, ascending
    mtime: float | None  # the newest file's modification time; None for an empty folder


class StoreCatalog:
    """A store's steps and manifests over its :class:`~ravex.format.storage.Storage`."""

    #: Parsed manifests this store keeps (a subclass that reads steps once may keep fewer).
    manifest_cache_size = MANIFEST_CACHE_SIZE

    def __init__(self, storage: Storage, root: dict[str, Any], timeline: Timeline | None = None) -> None:
        self.storage = storage
        self.root = root
        #: the timeline whose steps this catalog lists (spec §19); ``main``'s are ``steps/``
        self.timeline = timeline or Timeline(MAIN)
        self.steps_prefix = self.timeline.steps_prefix
        # manifests of complete steps (immutable), most recently used last, bounded
        self._manifests: OrderedDict[tuple[int, int], Manifest] = OrderedDict()
        self._sizes: dict[tuple[int, int], int] = {}  # estimated bytes of each (see _parsed_bytes)
        self._cached_bytes = 0
        self._lock = threading.Lock()
        #: one step's manifests handed over by rank 0 (:mod:`.handoff`): answered without a request
        self._pinned: dict[int, dict[int, Manifest]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def url(self) -> str:
        return self.storage.url

    # ---- steps -------------------------------------------------------------------------

    def step_numbers(self) -> list[int]:
        """Every step with a folder, complete or not, ascending."""
        return sorted(int(n) for n in self.storage.list_dir(self.steps_prefix) if is_decimal(n))

    def list_steps(self) -> dict[int, StepFiles]:
        """Every step folder with its files, ranks and newest mtime, from one recursive listing
        of ``steps/`` (one LIST request per 1000 files on an object store, where listing each
        step's folder costs one per step). Nothing is read. GC uses it for all it decides."""
        found: dict[int, dict[str, float]] = {}
        depth = self.steps_prefix.count("/") + 1
        for obj in self.storage.walk(self.steps_prefix):
            parts = obj.key.rsplit("/", 2)
            if obj.key.count("/") == depth + 1 and parts[0] == self.steps_prefix and is_decimal(parts[1]):
                found.setdefault(int(parts[1]), {})[parts[2]] = obj.mtime
        if self.storage.is_local_filesystem:  # an empty folder holds no file for the walk to see
            for name in self.storage.list_dir(self.steps_prefix):
                if is_decimal(name):
                    found.setdefault(int(name), {})
        out = {}
        for step in sorted(found):
            files = found[step]
            newest = max(files.values(), default=None)
            out[step] = StepFiles(step, tuple(sorted(files)), tuple(manifest_ranks(files)), newest)
        return out

    def step_files(self, step: int) -> StepFiles:
        """One step folder's files, ranks and newest mtime, from a listing of that folder alone
        (one LIST request per 1000 files), where :meth:`list_steps` lists every step's."""
        prefix = self.step_dir(step)
        files = {obj.key.rsplit("/", 1)[-1]: obj.mtime for obj in self.storage.walk(prefix)
                 if obj.key.rsplit("/", 1)[0] == prefix}
        return StepFiles(step, tuple(sorted(files)), tuple(manifest_ranks(files)), max(files.values(), default=None))

    def looks_complete(self, step: int, ranks: tuple[int, ...] | list[int] | None = None) -> bool:
        """Whether a listing's ``ranks`` of ``step`` (None: its folder listed here) are every
        rank's: ``0 .. n-1`` with ``n`` rank 0's manifest's world size (one GET, whatever the world
        size). Not the full check of :meth:`step_info` (one run, every manifest readable): for
        choices every rank makes alike from the same listing, whose step is checked in full when
        it is read."""
        if ranks is None:
            ranks = manifest_ranks(self.storage.list_dir(self.step_dir(step)))
        if not no_rank_missing(ranks):
            return False
        try:
            return self.manifest(step, 0).world_size == len(ranks)
        except (RavexError, OSError):
            return False

    def step_info(self, step: int, ranks: tuple[int, ...] | list[int] | None = None) -> StepInfo:
        """Completeness of one step: lists its folder (unless ``ranks`` says which manifests a
        listing found there) and reads its manifests (cached once the step is complete; read
        :data:`MANIFEST_READ_THREADS` at a time)."""
        return self.check_step(step, ranks)[0]

    def check_step(self, step: int, ranks: tuple[int, ...] | list[int] | None = None
                   ) -> tuple[StepInfo, list[Manifest]]:
        """:meth:`step_info` and, for a complete step, every rank's manifest (rank 0 first):
        what a resume hands over (:mod:`.handoff`) without asking for them again, however many
        ranks outgrow the cache. ``[]`` for a step that is not complete."""
        pinned = self._pinned.get(step)
        if ranks is None and pinned is not None:
            ranks = list(pinned)
        ranks = sorted(ranks) if ranks is not None else manifest_ranks(self.storage.list_dir(self.step_dir(step)))
        if not ranks:
            return StepInfo(step, None, (), False, "no manifest"), []
        try:
            first = self.manifest(step, ranks[0])
        except (RavexError, OSError) as exc:
            return StepInfo(step, None, tuple(ranks), False, f"rank {ranks[0]}: {exc}", _unreadable(exc)), []
        world = first.world_size
        missing = _missing_ranks(ranks, world)
        if missing:
            return StepInfo(step, world, tuple(ranks), False, f"missing manifests of ranks {missing}"), []
        manifests = [first]
        for r, other in zip(ranks[1:], self._read_manifests(step, ranks[1:]), strict=True):
            if isinstance(other, BaseException):
                return StepInfo(step, world, tuple(ranks), False, f"rank {r}: {other}", _unreadable(other)), []
            if other.world_size != world or other.run != first.run:
                return StepInfo(
                    step, world, tuple(ranks), False,
                    f"rank {r} belongs to another run or world size (mixed writers)",
                ), []
            manifests.append(other)
        if ranks[-1] >= world:
            return StepInfo(step, world, tuple(ranks), False, f"rank {ranks[-1]} is beyond world_size {world}"), []
        if world > 1:
            try:  # ranks that stored different bytes under one tensor name: unreadable
                merge_arrays(manifests)
            except ManifestError as exc:
                return StepInfo(step, world, tuple(ranks), False, f"ranks disagree: {exc}"), []
        for m in manifests:  # a complete step is immutable: its manifests are read once
            self.cache_manifest(m)
        return StepInfo(step, world, tuple(ranks), True), manifests

    def _read_manifests(self, step: int, ranks: list[int]) -> list[Manifest | RavexError | OSError]:
        """``ranks``' manifests of ``step`` in rank order, each parsed or the error reading it
        raised; :data:`MANIFEST_READ_THREADS` GETs at a time for those neither pinned nor cached."""

        def one(rank: int) -> Manifest | RavexError | OSError:
            try:
                return self.manifest(step, rank)
            except (RavexError, OSError) as exc:
                return exc

        held = self._pinned.get(step, {})
        unread = [r for r in ranks if r not in held and (step, r) not in self._manifests]
        if len(unread) < PARALLEL_READS_FROM:
            return [one(r) for r in ranks]
        with ThreadPoolExecutor(max_workers=min(MANIFEST_READ_THREADS, len(unread)),
                                thread_name_prefix="ravex-manifests") as pool:
            return list(pool.map(one, ranks))

    def steps(self) -> list[StepInfo]:
        """Every step, complete or not, ascending."""
        return [self.step_info(s) for s in self.step_numbers()]

    def complete_steps(self) -> list[int]:
        """Steps that are complete, ascending."""
        return [i.step for i in self.steps() if i.complete]

    def latest_step(self) -> int | None:
        """The newest complete step, or None. Checks from the newest down."""
        for step in reversed(self.step_numbers()):
            if self.step_info(step).complete:
                return step
        return None

    def resolve_step(self, step: int | str) -> int:
        """``"latest"``, ``"step_100"``, ``"100"`` or ``100`` to a complete step number."""
        if step == "latest":
            latest = self.latest_step()
            if latest is None:
                raise StepNotFoundError(f"store {self.url!r} has no complete step yet")
            return latest
        text = str(step)
        if text.startswith("step_"):
            text = text[5:]
        if not (text.isascii() and text.isdigit()) or len(text) > 19:  # 19 digits: what a layout step holds
            shown = step if len(str(step)) <= 40 else f"{str(step)[:40]}..."
            raise StepNotFoundError(f"{shown!r} is not a step; use a number, 'step_100' or 'latest'")
        number = int(text)
        self.complete_manifests(number)
        return number

    def complete_manifests(self, step: int) -> list[Manifest]:
        """Every manifest of ``step``, read and checked as :meth:`check_step` does; a step that
        is not complete is a :class:`StepNotFoundError` naming the complete ones."""
        info, manifests = self.check_step(step)
        if not info.complete:
            known = self.complete_steps()
            main = self.timeline.name == MAIN
            of = "" if main else f" of timeline {self.timeline.name}"
            hint = f"complete steps{of}: {known[-5:]}" if known else f"the store{of} has no complete step"
            shown = step if main else f"{self.timeline.name}@{step}"
            why = info.problem or "incomplete"
            raise StepNotFoundError(f"step {shown} in {self.url!r} is not readable ({why}); {hint}")
        return manifests

    # ---- manifests ---------------------------------------------------------------------

    def manifest(self, step: int, rank: int) -> Manifest:
        """Parse one manifest (cached once its step is known to be immutable)."""
        cached = self._pinned.get(step, {}).get(rank) or self.cached_manifest(step, rank)
        if cached is not None:
            return cached
        where = f"step {step} rank {rank}" if self.timeline.name == MAIN else f"{self.timeline.name}@{step} rank {rank}"
        key = self.manifest_key(step, rank)
        try:
            data = self.storage.read(key)
        except FileNotFoundError:
            raise StepNotFoundError(f"{where}: manifest {key!r} not found") from None
        m = Manifest.from_bytes(data, where)
        if m.step != step or m.rank != rank:
            raise ManifestError(f"{where}: manifest says step {m.step} rank {m.rank}")
        return m

    def pin_step(self, step: int, manifests: list[Manifest]) -> None:
        """Hold every manifest of ``step`` as rank 0 read them (:func:`.handoff.adopt_step`):
        its completeness and its manifests then cost no request, whatever the world size, and
        none is evicted (a job of 10,000 ranks outgrows the cache). One step at a time: the
        one a resume is reading."""
        with self._lock:
            self._pinned = {step: {m.rank: m for m in manifests}}

    def cached_manifest(self, step: int, rank: int) -> Manifest | None:
        """The parsed manifest if this store holds it (marked recently used), else None."""
        key = (step, rank)
        with self._lock:
            cached = self._manifests.get(key)
            if cached is not None:
                self._manifests.move_to_end(key)
        return cached

    def cache_manifest(self, m: Manifest) -> None:
        """Cache a manifest of a complete step; the least recently used go first once the
        cache holds more than :attr:`manifest_cache_size` or :data:`MANIFEST_CACHE_BYTES`
        (the newest stays, however large)."""
        key, size = (m.step, m.rank), _parsed_bytes(m)
        with self._lock:
            self._manifests[key] = m
            self._manifests.move_to_end(key)
            self._cached_bytes += size - self._sizes.get(key, 0)
            self._sizes[key] = size
            while len(self._manifests) > 1 and (
                len(self._manifests) > self.manifest_cache_size or self._cached_bytes > MANIFEST_CACHE_BYTES
            ):
                self._drop(next(iter(self._manifests)))

    def pinned_ranks(self, step: int) -> list[int]:
        """The ranks whose manifest of ``step`` :meth:`pin_step` holds (none where it is not pinned)."""
        with self._lock:
            return sorted(self._pinned.get(step, {}))

    def forget(self, step: int) -> None:
        with self._lock:
            self._pinned.pop(step, None)
            for key in [k for k in self._manifests if k[0] == step]:
                self._drop(key)

    def _drop(self, key: tuple[int, int]) -> None:
        del self._manifests[key]
        self._cached_bytes -= self._sizes.pop(key, 0)

    # ---- deleting steps ----------------------------------------------------------------

    def discard_incomplete_above(self, step: int | None) -> list[int]:
        """Delete the manifests of incomplete steps newer than ``step`` (a crashed run's
        partial steps), so that a resumed run never mixes its manifests with theirs."""
        dropped = []
        for number in self.step_numbers():
            info = self.step_info(number) if step is None or number > step else None
            if info is not None and not info.complete and not info.unreadable:
                self.delete_step(number)
                dropped.append(number)
        return dropped

    def delete_step(self, step: int) -> None:
        """Delete every manifest (and leftover temp file) of a step. Objects stay for GC."""
        self.delete_steps({step: self.storage.list_dir(self.step_dir(step))})

    def delete_steps(self, files: dict[int, tuple[str, ...] | list[str]]) -> None:
        """Delete the named files of each step (as :meth:`list_steps` found them), in one
        ``delete`` call: one request per 1000 keys on S3, where a call per step costs one
        each. Objects stay for GC."""
        self.storage.delete(f"{self.step_dir(step)}/{n}" for step, names in files.items() for n in names)
        for step in files:
            self.forget(step)
            self.storage.remove_empty_dir(self.step_dir(step))

    # ---- keys ----------------------------------------------------------------------------

    def step_dir(self, step: int) -> str:
        """This timeline's folder of ``step``."""
        return step_dir(step, self.steps_prefix)

    def manifest_key(self, step: int, rank: int) -> str:
        """The key of rank ``rank``'s manifest of ``step`` in this timeline."""
        return manifest_key(step, rank, self.steps_prefix)


def _unreadable(exc: BaseException) -> bool:
    """Whether a manifest that failed to read is there (not one deleted since the listing)."""
    return not isinstance(exc, StepNotFoundError)


def _parsed_bytes(m: Manifest) -> int:
    """Rough memory of a parsed manifest: ~2 KiB per array (its zarr.json as dicts), ~350 bytes
    per chunk entry of a map (key, ChunkRef, digest string), ~100 per row of a chunk table (its
    columns, and the hex of its digests once a reader asks for one)."""
    return 4096 + sum(2048 + (100 if isinstance(entry.chunks, ChunkTable) else 350) * len(entry.chunks)
                      for entry in m.arrays.values())


def _missing_ranks(ranks: list[int], world: int, show: int = 8) -> str:
    """``"[1, 3]"``: the ranks below ``world`` without a manifest (the first ``show`` of them, and
    how many). Never walks ``range(world)`` whole: a hostile ``world_size`` of 10**18 is cheap."""
    present = set(ranks)
    missing: list[int] = []
    for r in range(world):
        if r not in present:
            missing.append(r)
            if len(missing) > show:
                break
    if not missing:
        return ""
    if len(missing) <= show:
        return str(missing)
    count = world - sum(1 for r in present if r < world)
    return f"[{', '.join(map(str, missing[:show]))}, ...] ({count} of {world})"
