"""Repacking: GC copies the live chunks of mostly-dead packs into new packs (spec/FORMAT.md §14).

Small chunks share pack objects (§11.4). A pack goes only once no manifest names it, so a step
that reuses one chunk of it (a frozen bias, a fixed RNG state) keeps all of it; the writer's
pack-liveness rule (§13) bounds that at 50% of pack bytes, and 10% where a commit's new bytes pay
for it, but a table in small chunks, or a store written without the rule, keeps more. GC repacks
what is worth it: sparsest packs first, until at most :data:`DEAD_BOUND` of the referenced object
bytes are read by no manifest present.

Why rewriting a kept manifest is safe, in order (every step is a storage call that may be the
last one; §14 holds the proof):

1. each live chunk of a chosen pack is read and checked against its ``raw`` digest, then the
   new packs are written, atomically and durably: until a manifest names them they are young
   garbage, which GC collects only after the grace period;
2. a *retirement record* ``repack/<pack>.json`` is written for each chosen pack, durably: when
   the pack was retired and which manifests were rewritten away from it;
3. each manifest naming a chosen pack is rewritten in place, atomically: the same document
   (tree, arrays, digests, unknown members included) with only the packed entries' ``object``
   and ``offset`` changed, so a reader of any 1.x version reads the same step from it;
4. the retired pack is deleted later, by phase 4 of a GC that finds no manifest naming it, once
   its record is older than twice the grace period and no manifest a writer may hold as its delta
   base (each timeline's newest complete step, the incomplete steps above it, the heads of
   timelines with no step of their own) is one that was rewritten away from it; with a grace of
   zero, GC runs alone (§14, A8), and it goes at once. Then its record goes.

A crash between any two steps leaves every manifest naming bytes that exist: the old pack stays
until the record that lets it go is complete and its conditions hold.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RavexError
from ..objects.chunkref import ChunkRef
from ..objects.chunktable import ChunkTable, compact_table
from ..objects.codecs import pipeline
from ..objects.dtypes import data_type
from ..objects.hashing import digest
from ..objects.names import check_object_name, object_key
from ..steps.manifest import ArrayEntry
from ..steps.refs import REFS_NAME, write_refs

if TYPE_CHECKING:
    from ..steps.catalog import StoreCatalog
    from ..steps.manifest import Manifest
    from ..storage import Storage

logger = logging.getLogger("ravex.format")

#: After GC at most this fraction of the bytes of the objects kept manifests name is read by none
#: of them (the bound GC repacks to; spec/FORMAT.md §14).
DEAD_BOUND = 0.10
#: Where retirement records live: ``repack/<pack>.json``. Readers ignore the prefix (§2).
RETIRED_PREFIX = "repack"
RETIRED_FORMAT = "ravex-retired-pack"
#: While a writer may be running (a grace above zero), only packs at least this dead are repacked:
#: copying their live chunks costs fewer bytes than it frees. The packs such a GC may repack are
#: named only by older kept steps, which retention mostly collects soon anyway (the writer's own
#: rule, §13, looks after the packs its base names); a GC with no writer (grace zero) repacks down
#: to :data:`DEAD_BOUND`.
WHILE_WRITING_MIN_DEAD = 0.5
#: New packs are filled to about this size (as the writer's, §11.4).
REPACK_TARGET_BYTES = 4 << 20
#: Manifest versions whose chunk entries this code knows all the members of: only those are
#: rewritten (a newer minor might add a member tied to where the bytes are).
REWRITABLE_VERSIONS = frozenset({"1.0", "1.1", "1.2"})
_PACKED_MEMBERS = frozenset({"object", "offset", "size", "raw"})

#: A manifest as GC knows it: (timeline, step, rank).
ManifestId = tuple[str, int, int]
#: Who names which byte range of a pack: per ``(offset, size)``, (manifest, array path, chunk key).
Users = dict[tuple[int, int], list[tuple["PresentManifest", str, str]]]


@dataclass(frozen=True)
class PresentManifest:
    """A manifest phase 3 of GC read, with what repacking needs to know of it."""

    view: StoreCatalog  # the catalog of its timeline
    step: int
    rank: int
    manifest: Manifest
    #: its step is complete (only those are rewritten; an incomplete step's packs are left)
    complete: bool
    #: a writer may hold it as its delta base: its packs are left while the grace is not zero
    base_candidate: bool
    #: its step folder holds a refs.json, rewritten with it
    has_refs: bool = False

    @property
    def id(self) -> ManifestId:
        return (self.view.timeline.name, self.step, self.rank)


@dataclass
class RepackReport:
    """What repacking did (or, in a dry run, would do)."""

    packs: int = 0  # packs retired (their live chunks copied)
    new_packs: int = 0
    copied_bytes: int = 0
    manifests_rewritten: int = 0
    #: bytes of the referenced objects, and of them those no manifest reads, before and after
    total_bytes: int = 0
    dead_bytes_before: int = 0
    dead_bytes_after: int = 0
    #: packs left as they are because a live chunk did not match its digest (validate names it)
    damaged: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Retirement:
    """A retirement record: ``object`` was repacked at ``retired_at`` (epoch seconds), and the
    manifests in ``manifests`` were rewritten away from it."""

    object: str
    retired_at: float
    manifests: frozenset[ManifestId]

    def to_bytes(self) -> bytes:
        doc = {"format": RETIRED_FORMAT, "object": self.object, "retired_at": self.retired_at,
               "manifests": sorted([t, s, r] for t, s, r in self.manifests)}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Retirement:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != RETIRED_FORMAT:
                raise ValueError(f"not a {RETIRED_FORMAT} document")
            name = check_object_name(doc.get("object"), where)
            at = doc["retired_at"]
            if not isinstance(at, (int, float)) or isinstance(at, bool):
                raise ValueError("retired_at is not a number")
            ids = frozenset((str(t), int(s), int(r)) for t, s, r in doc["manifests"])
        except (ValueError, KeyError, TypeError, RavexError) as exc:
            raise RavexError(f"{where}: unreadable retirement record ({exc}); delete it only by hand "
                             "once no manifest names its pack") from None
        return cls(name, float(at), ids)


def retirement_key(name: str) -> str:
    return f"{RETIRED_PREFIX}/{name}.json"


def read_retirements(storage: Storage) -> tuple[dict[str, Retirement], set[str]]:
    """Every retirement record by pack name, and the packs whose record cannot be read (GC keeps
    those packs: it cannot tell what the record protects)."""
    found: dict[str, Retirement] = {}
    unreadable: set[str] = set()
    for entry in storage.list_dir(RETIRED_PREFIX):
        name = entry.removesuffix(".json")
        if entry == name:
            continue
        try:
            check_object_name(name, entry)
        except RavexError:
            continue  # a temp file
        key = retirement_key(name)
        try:
            found[name] = Retirement.from_bytes(storage.read(key), key)
        except FileNotFoundError:
            continue
        except RavexError as exc:
            logger.warning("ravex: %s", exc)
            unreadable.add(name)
    return found, unreadable


def may_delete_retired(
    record: Retirement, now: float, grace_seconds: float, base_candidates: set[tuple[str, int]]
) -> bool:
    """Whether a retired pack that no manifest present names may go (§14, phase 4): twice the grace
    has passed since its record was written (the rewrites end within one grace of it, A9, and a
    reader that read a manifest before its rewrite, or a writer that loaded its base before it, is
    done within the next, A7 and A2), and no manifest a writer may hold as its base was rewritten
    away from it (that writer may still copy an entry naming it). A grace of zero means GC runs
    alone: nothing can hold an old manifest."""
    if grace_seconds == 0:
        return True
    rewritten = {(timeline, step) for timeline, step, _ in record.manifests}
    return now - record.retired_at >= 2 * grace_seconds and not (rewritten & base_candidates)


@dataclass
class _Scan:
    """One pass over the chunk entries of every manifest present (a table in small chunks has
    hundreds of thousands per manifest, and GC runs after every checkpoint: one cheap pass)."""

    ranges: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # per pack, ranges named
    #: per pack, the (offset, size) ranges chunk tables name (§5.1), as arrays: a table names
    #: ~100k ranges, which GC after every commit must not turn into Python tuples
    table_ranges: dict[str, list[np.ndarray]] = field(default_factory=dict)
    whole: set[str] = field(default_factory=set)  # objects named whole
    #: packs a manifest names that GC must not rewrite now (incomplete step, a version it does not
    #: know in full, or a base step while a writer may run)
    blocked: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, present: Iterable[PresentManifest], protect_bases: bool) -> _Scan:
        scan = cls()
        ranges, whole, blocked = scan.ranges, scan.whole, scan.blocked
        for pm in present:
            stuck = (not pm.complete or pm.manifest.version not in REWRITABLE_VERSIONS
                     or (protect_bases and pm.base_candidate))
            for entry in pm.manifest.arrays.values():
                if isinstance(entry.chunks, ChunkTable):
                    for pack, pairs in _table_ranges(entry.chunks):
                        scan.table_ranges.setdefault(pack, []).append(pairs)
                        ranges.setdefault(pack, set())
                        if stuck:
                            blocked.add(pack)
                    continue
                for ref in entry.chunks.values():
                    name = ref.object
                    if name is None:
                        continue
                    if ref.offset is None:
                        whole.add(name)
                        continue
                    named = ranges.get(name)
                    if named is None:
                        ranges[name] = named = set()
                    named.add((ref.offset, ref.size))
                    if stuck:
                        blocked.add(name)
        return scan

    def dead(self, name: str, size: int) -> int:
        if name in self.whole:
            return 0
        return max(0, size - _live_bytes(self.ranges.get(name, ()), self.table_ranges.get(name, ())))

    def totals(self, sizes: dict[str, int]) -> tuple[int, int]:
        """(bytes no manifest reads, all bytes) of the named objects that ``sizes`` lists."""
        dead = total = 0
        for name in self.whole | self.ranges.keys():
            if name in sizes:
                total += sizes[name]
                dead += self.dead(name, sizes[name])
        return dead, total


def _users(present: Iterable[PresentManifest], packs: set[str]) -> dict[str, Users]:
    """Per pack of ``packs``, each byte range manifests name, with who names it (manifest, array
    path, chunk key)."""
    users: dict[str, Users] = {}
    for pm in present:
        for path, entry in pm.manifest.arrays.items():
            refs: Iterable[tuple[str, ChunkRef]] = entry.chunks.items()
            if isinstance(entry.chunks, ChunkTable):
                refs = _table_refs_in(entry.chunks, packs)
            for key, ref in refs:
                if ref.object in packs and ref.offset is not None:
                    users.setdefault(ref.object, {}).setdefault((ref.offset, ref.size), []).append((pm, path, key))
    return users


def _live_bytes(ranges: Iterable[tuple[int, int]], arrays: Iterable[np.ndarray] = ()) -> int:
    """Bytes of the union of ``(offset, size)`` ranges, given as tuples and as (n, 2) arrays."""
    parts = [np.asarray(sorted(ranges), dtype=np.int64).reshape(-1, 2), *arrays]
    pairs = np.concatenate(parts)
    if not pairs.size:
        return 0
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    starts, ends = pairs[:, 0], pairs[:, 0] + pairs[:, 1]
    reach = np.maximum.accumulate(ends)  # the furthest any range up to this one ends
    before = np.concatenate(([0], reach[:-1]))
    return int(np.maximum(0, ends - np.maximum(starts, before)).sum())


def _table_ranges(table: ChunkTable) -> list[tuple[str, np.ndarray]]:
    """Per pack a table names, the distinct (offset, size) ranges its rows read, as (n, 2) arrays."""
    obj, offset, size = table.pack_ranges()  # sorted by object, then offset
    cuts = np.flatnonzero(np.diff(obj)) + 1
    pairs = np.stack([offset, size], axis=1)
    return [(table.objects[int(o[0])], p) for o, p in zip(np.split(obj, cuts), np.split(pairs, cuts), strict=True)
            if o.size]


def _table_refs_in(table: ChunkTable, packs: set[str]) -> list[tuple[str, ChunkRef]]:
    """(chunk key, entry) of the rows of ``table`` whose bytes are in one of ``packs``."""
    return [(table.key(row), table.ref(row)) for row in np.flatnonzero(table.reads_from(packs)).tolist()]


def dead_bytes(present: Iterable[PresentManifest], sizes: dict[str, int]) -> tuple[int, int]:
    """(bytes no manifest reads, all bytes) of the objects of ``sizes`` that ``present`` names."""
    return _Scan.of(present, protect_bases=False).totals(sizes)


def plan(
    present: list[PresentManifest], sizes: dict[str, int], protect_bases: bool, bound: float = DEAD_BOUND
) -> tuple[list[str], RepackReport]:
    """The packs to repack, sparsest first, until at most ``bound`` of the named object bytes
    are dead. A pack is a candidate only when every manifest naming it is of a complete step, of
    a version whose entries this code knows, and (``protect_bases``: a writer may be running) none
    a writer may hold as its delta base, and the pack is at least :data:`WHILE_WRITING_MIN_DEAD`
    dead."""
    report = RepackReport()
    scan = _Scan.of(present, protect_bases)
    report.dead_bytes_before, report.total_bytes = scan.totals(sizes)
    dead, total = report.dead_bytes_before, report.total_bytes
    if dead <= bound * total:
        report.dead_bytes_after = dead
        return [], report
    candidates: list[tuple[float, str, int]] = []
    for name in scan.ranges.keys() - scan.blocked - scan.whole:
        if name not in sizes:
            continue
        pack_dead = scan.dead(name, sizes[name])
        if pack_dead > 0 and (not protect_bases or pack_dead >= WHILE_WRITING_MIN_DEAD * sizes[name]):
            candidates.append((pack_dead / sizes[name], name, pack_dead))
    candidates.sort(reverse=True)
    chosen = []
    for _, name, pack_dead in candidates:
        if dead <= bound * total:
            break
        chosen.append(name)
        dead -= pack_dead
        total -= pack_dead
        report.copied_bytes += sizes[name] - pack_dead
    report.dead_bytes_after = dead
    report.packs = len(chosen)
    users = _users(present, set(chosen))
    report.manifests_rewritten = len({id(pm) for u in users.values() for us in u.values() for pm, _, _ in us})
    return chosen, report


def repack(
    storage: Storage,
    present: list[PresentManifest],
    sizes: dict[str, int],
    protect_bases: bool,
    dry_run: bool = False,
) -> tuple[RepackReport, set[str], set[str]]:
    """Repack (module doc); returns the report, the packs no manifest names any more (retired),
    and the new packs (now named by the rewritten manifests)."""
    chosen, report = plan(present, sizes, protect_bases)
    if dry_run or not chosen:
        return report, set(), set()
    report.copied_bytes = report.manifests_rewritten = 0  # what was planned; now what is done
    planned = list(chosen)
    cover = _users(present, set(chosen))
    # 1. read and check every live chunk, then write the new packs
    copies: dict[str, list[tuple[int, int, bytes]]] = {}
    for name in chosen:
        try:
            copies[name] = _live_chunks(storage, name, cover[name])
        except (RavexError, OSError, ValueError) as exc:
            logger.warning("ravex: pack %s left as it is: %s", name, exc)
            report.damaged.append(name)
    chosen = [n for n in chosen if n in copies]
    moved: dict[tuple[str, int, int], tuple[str, int]] = {}
    buf = bytearray()
    placed: list[tuple[str, int, int, int]] = []  # (old pack, old offset, size, offset in buf)
    new_packs: set[str] = set()

    def flush() -> None:
        if not buf:
            return
        name = digest(buf)
        storage.write(object_key(name), bytes(buf))
        new_packs.add(name)
        for old, offset, size, at in placed:
            moved[(old, offset, size)] = (name, at)
        report.new_packs += 1
        buf.clear()
        placed.clear()

    for name in chosen:
        for offset, size, data in copies[name]:
            if buf and len(buf) + size > REPACK_TARGET_BYTES:
                flush()
            placed.append((name, offset, size, len(buf)))
            buf += data
            report.copied_bytes += size
    flush()
    storage.sync()
    # 2. the retirement records, before any manifest stops naming the packs
    now = time.time()  # when the records are written: the rewrites all come after it
    holders: dict[str, set[ManifestId]] = {}
    for name in chosen:
        holders[name] = {pm.id for users in cover[name].values() for pm, _, _ in users}
    old_records, _ = read_retirements(storage)
    for name in chosen:
        earlier = old_records[name].manifests if name in old_records else frozenset()
        storage.write(retirement_key(name), Retirement(name, now, earlier | holders[name]).to_bytes())
    storage.sync()
    # 3. rewrite every manifest naming a chosen pack; then its refs.json
    chosen_set = set(chosen)
    rewritten_steps: dict[tuple[str, int], PresentManifest] = {}
    failed: set[str] = set()
    for pm in present:
        named = {name for e in pm.manifest.arrays.values() for name in e.object_names()} & chosen_set
        if not named:
            continue
        try:
            _rewrite(storage, pm, moved, chosen_set)
        except (RavexError, OSError, ValueError) as exc:
            logger.warning("ravex: %s@%d rank %d not repacked: %s", pm.view.timeline.name, pm.step, pm.rank, exc)
            failed |= named
            continue
        report.manifests_rewritten += 1
        pm.view.forget(pm.step)
        rewritten_steps[(pm.view.timeline.name, pm.step)] = pm
    storage.sync()
    for pm in rewritten_steps.values():
        if pm.has_refs:
            refresh_refs(pm.view, pm.step)
    report.packs = len(chosen)
    for name in set(planned) - (chosen_set - failed):  # left as they were: their dead bytes stay
        report.dead_bytes_after += sizes[name] - _live_bytes(cover[name])
    return report, chosen_set - failed, new_packs


def refresh_refs(view: StoreCatalog, step: int) -> None:
    """Write ``refs.json`` of a step again from its manifests as they are now; when that fails,
    delete it (it is derived and optional, and must not name a pack that goes)."""
    key = f"{view.step_dir(step)}/{REFS_NAME}"
    try:
        write_refs(view, step)
    except (RavexError, OSError) as exc:
        logger.warning("ravex: %s rewritten from its manifests failed (%s): deleted", key, exc)
        storage = view.storage
        storage.delete([key])


def _live_chunks(
    storage: Storage, name: str, ranges: Users
) -> list[tuple[int, int, bytes]]:
    """The stored bytes of each range of pack ``name`` a manifest names, each checked to decode
    to its chunk's ``raw`` digest (so repacking never copies damage into a new pack)."""
    data = storage.read(object_key(name))
    out = []
    for (offset, size), users in sorted(ranges.items()):
        stored = data[offset : offset + size]
        if len(stored) != size:
            raise ValueError(f"object {name} is shorter than {offset + size} bytes")
        pm, path, key = users[0]
        entry = pm.manifest.arrays[path]
        ref = entry.chunks[key]
        chunk = 1
        for n in entry.chunk_shape:
            chunk *= n
        decoded = pipeline(entry.codecs, path).decode(stored, chunk * data_type(entry.data_type).itemsize)
        if digest(decoded) != ref.raw:
            raise ValueError(f"chunk {path}/{key} at [{offset}, {offset + size}) does not match its digest")
        out.append((offset, size, stored))
    return out


def _rewrite(storage: Storage, pm: PresentManifest, moved: dict[tuple[str, int, int], tuple[str, int]],
             chosen: set[str]) -> None:
    """Rewrite one manifest in place: its bytes as they are on storage, with the packed entries
    of ``chosen`` packs pointing where ``moved`` says. Refuses (leaving the manifest as it is) if
    an entry is not the plain packed form or names a range that was not copied."""
    key = pm.view.manifest_key(pm.step, pm.rank)
    doc = json.loads(storage.read(key))
    if doc.get("version") not in REWRITABLE_VERSIONS:
        raise ValueError(f"manifest version {doc.get('version')!r} is not one this GC rewrites")
    for path, array in doc["arrays"].items():
        if "table" in array and "chunks" not in array:
            grid = ArrayEntry(zarr=array["zarr"], chunks={}).grid
            table = ChunkTable.from_json(array["table"], grid, f"{key} tensor {path!r}", set())
            array["table"] = _moved_table(table, moved, chosen).to_json()
            continue
        for entry in array["chunks"].values():
            name = entry.get("object")
            if name not in chosen:
                continue
            if set(entry) != _PACKED_MEMBERS:
                raise ValueError(f"chunk entry {sorted(entry)} is not the plain packed form")
            target = moved.get((name, entry["offset"], entry["size"]))
            if target is None:
                raise ValueError(f"bytes [{entry['offset']}, +{entry['size']}) of {name} were not copied")
            entry["object"], entry["offset"] = target
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if not storage.exists(key):  # its step was deleted meanwhile: do not bring it back
        raise ValueError("the manifest is gone")
    storage.write(key, data)


def _moved_table(table: ChunkTable, moved: dict[tuple[str, int, int], tuple[str, int]],
                 chosen: set[str]) -> ChunkTable:
    """``table`` with its rows in ``chosen`` packs where ``moved`` says (refusing, as for a map
    entry, a range that was not copied); the objects no row reads any more are dropped."""
    names = list(table.objects)
    obj, offset = table.obj.astype(np.int64), table.offset.copy()
    for row in np.flatnonzero(table.reads_from(chosen)).tolist():
        name, at, size = table.objects[int(obj[row])], int(offset[row]), int(table.size[row])
        target = moved.get((name, at, size))
        if target is None:
            raise ValueError(f"bytes [{at}, +{size}) of {name} were not copied")
        obj[row] = len(names)
        names.append(target[0])
        offset[row] = target[1]
    return compact_table(table.grid, table.raw, names, obj, offset, table.size)
