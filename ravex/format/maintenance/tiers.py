"""Copying a step from one store to another: a fast local tier to a durable one (spec/FORMAT.md §11.1).

:func:`copy_step` writes into the destination what a commit would have, in the commit's order:
the timeline documents first (so that GC there reads the step's folder as a timeline's), then
the objects the destination lacks, then one manifest per rank, each byte-identical to the
source's. A reader of the destination therefore never sees a manifest whose objects are
missing, and a step appears there only when its last manifest lands (§10).

It lives beside GC because the objects it may leave out are exactly those GC would keep: what
the destination already holds it trusts only where §14's proof still covers it (see
:func:`_objects_to_send`), so a GC of the destination running meanwhile stays safe.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ManifestError, NameTakenError, StepNotFoundError
from ..history.runs import run_key
from ..history.timelines import MAIN, Timeline, create_timeline, lineage, read_timelines
from ..objects.names import manifest_ranks, object_key
from ..steps.catalog import StoreCatalog
from ..steps.manifest import Manifest
from ..steps.refs import refs_key
from .gc import DEFAULT_GRACE_SECONDS

if TYPE_CHECKING:
    from ..storage import PendingWrite

__all__ = ["COPY_THREADS", "CopyReport", "copy_step", "ensure_timelines"]

#: Objects copied at once: an object store answers each in ~20-50 ms, so a few in flight keep
#: the link busy; memory holds at most this many objects (a pack or a chunk each, <= ~16 MiB).
COPY_THREADS = 8


@dataclass
class CopyReport:
    """What one :func:`copy_step` did."""

    step: int
    timeline: str
    objects_copied: int = 0
    bytes_copied: int = 0
    objects_present: int = 0  # needed by the copied manifests, left out because dst has them
    manifests_copied: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def copy_step(src: StoreCatalog, dst: StoreCatalog, step: int, ranks: Iterable[int] | None = None) -> CopyReport:
    """Copy complete step ``step`` of ``src``'s timeline (a step up to its fork: the parent's)
    into ``dst``, onto the timeline of the same name, creating it and its ancestors there as
    ``src`` has them (same parent, fork step and run). ``ranks``: whose manifests to copy (all
    by default); ``src`` needs only theirs (each rank of a job copies its own as it commits, not
    waiting for the others), and the step is complete in ``dst`` once every rank's has landed.

    Requests on an object store, per call: ``src``: one LIST of ``timelines/`` and a GET per
    timeline document, the step's folder listed and its manifests read (twice: the completeness
    check, then the bytes copied), a GET per object sent; ``dst``: one LIST of ``timelines/`` and
    its documents, a LIST of the step's folder before the copy (and one after it: is the step
    complete now?), a GET per manifest already there (it is compared), one listing of
    ``objects/`` (a LIST per 1000 objects: cheaper than a HEAD per object the step names unless
    ``dst`` holds over 1000 times as many objects as one step names), the listing and manifests
    of its newest complete step when some needed object is older than ``G/2``, a HEAD of the
    run's record (``runs/<run>.json``, §20) when rank 0's manifest is copied and ``src`` has one,
    then one PUT per object sent, for the record where ``dst`` lacks it, per manifest and for
    ``refs.json``. A step ``dst`` holds already costs only the checks up to its manifests: no
    object is listed or sent.

    GC of ``dst`` stays safe (spec §14, §11.1): every object sent is a fresh PUT, so it is younger
    than the grace period ``G`` until its manifest lands, provided the copy finishes within ``G``
    (as a commit must, A2; checked: GC's phase 4 skips an unreferenced object younger than ``G``,
    and checks its age again at the delete); an object ``dst`` has is left out only if it was
    stored less than ``G/2`` before the listing (the manifests must then land within ``G/2``), or
    is named by a step GC keeps whatever its policy (the target timeline's newest complete step,
    or its head). ``G`` is GC's default, which ``dst``'s GC must not undercut (a grace of 0 means
    no copy runs). Like a writer, a copy assumes no other run writes that timeline of ``dst``
    meanwhile (A1).

    A step ``src`` lacks, or holds without a manifest of ``ranks``, is a
    :class:`StepNotFoundError`; a manifest ``dst`` holds for that step from another run is a
    :class:`ManifestError` (nothing copied).
    """
    started = time.perf_counter()
    src_timelines = read_timelines(src.storage)
    chain = lineage(src_timelines, src.timeline.name)
    owner = _view(src, next(t for t in chain if t.fork_step is None or step > t.fork_step))
    info = owner.step_info(step)
    wanted = sorted(set(range(info.world_size or 0) if ranks is None else ranks))
    if info.world_size is not None and not all(0 <= r < info.world_size for r in wanted):
        raise ValueError(f"ranks {wanted} are not all ranks of step {_ref(owner, step)} (world_size {info.world_size})")
    if info.world_size is None or info.unreadable or not (info.complete or set(wanted) <= set(info.ranks)):
        has = owner.complete_steps()
        raise StepNotFoundError(
            f"{src.url!r} has no complete step {_ref(owner, step)} to copy ({info.problem or 'incomplete'}); "
            f"complete steps of timeline {owner.timeline.name!r}: {has[-8:] if has else 'none'}")
    target = _view(dst, ensure_timelines(dst, reversed(chain))[owner.timeline.name])
    report = CopyReport(step, owner.timeline.name)
    present = set(manifest_ranks(dst.storage.list_dir(target.step_dir(step))))
    todo: dict[int, bytes] = {}
    for r in wanted:
        data = src.storage.read(owner.manifest_key(step, r))
        if r not in present or not _same_manifest(target, step, r, data):
            todo[r] = data
    if not todo:
        report.seconds = time.perf_counter() - started
        return report
    needed: set[str] = set()
    runs: set[str] = set()
    for r, data in todo.items():
        manifest = Manifest.from_bytes(data, f"{src.url} {_ref(owner, step)} rank {r}")
        for entry in manifest.arrays.values():
            needed |= entry.object_names()
        if r == 0 and manifest.run:  # rank 0 wrote the run's record: whoever copies its manifest copies it
            runs.add(manifest.run)
    send = _objects_to_send(target, needed)
    report.objects_present = len(needed) - len(send)
    _send(src, dst, send, report)
    for run in runs:
        _copy_run_record(src, dst, run)
    for r, data in todo.items():  # last: the step is complete in dst only once its objects are there
        dst.storage.write(target.manifest_key(step, r), data)
        report.manifests_copied += 1
    dst.storage.sync()
    landed = set(manifest_ranks(dst.storage.list_dir(target.step_dir(step))))  # other ranks' copies too
    if landed >= set(range(info.world_size)):  # complete now: its refs.json too, if src has one
        try:
            refs = src.storage.read(refs_key(step, owner.steps_prefix))
        except FileNotFoundError:
            pass
        else:
            dst.storage.write(refs_key(step, target.steps_prefix), refs)
            dst.storage.sync()
    report.seconds = time.perf_counter() - started
    return report


def _copy_run_record(src: StoreCatalog, dst: StoreCatalog, run: str) -> None:
    """The record of ``run`` (§20), byte for byte, where ``dst`` has none and ``src`` has one:
    the step copied names its run, and a reader of ``dst`` looks for the record there."""
    key = run_key(run)
    try:
        data = src.storage.read(key)
    except FileNotFoundError:  # a run whose record write failed, or a 1.0 store
        return
    if not dst.storage.exists(key):
        dst.storage.write(key, data)


def _view(store: StoreCatalog, timeline: Timeline) -> StoreCatalog:
    """``store``'s catalog of ``timeline`` (``store`` itself when it is that timeline's)."""
    return store if store.timeline.name == timeline.name else StoreCatalog(store.storage, store.root, timeline)


def _ref(view: StoreCatalog, step: int) -> str:
    return str(step) if view.timeline.name == MAIN else f"{view.timeline.name}@{step}"


def ensure_timelines(dst: StoreCatalog, chain: Iterable[Timeline]) -> dict[str, Timeline]:
    """``dst``'s timelines, with those of ``chain`` (oldest ancestor first) created where missing,
    as the source has them; one that exists with another parent or fork step is a
    :class:`ManifestError` (two histories under one name). A step's copy makes its timelines so;
    so does a rank that finds the timeline its run forked in another machine's store, not its own."""
    have = read_timelines(dst.storage)
    for t in chain:
        if t.name not in have:
            try:
                have[t.name] = create_timeline(dst.storage, t.name, t.parent, t.fork_step, t.run)
            except NameTakenError:  # another copy created it meanwhile: check it like one found
                have = read_timelines(dst.storage)
        got = have[t.name]
        if (got.parent, got.fork_step) != (t.parent, t.fork_step):
            raise ManifestError(
                f"timeline {t.name!r} of {dst.url!r} forks from {got.parent!r} at {got.fork_step}, the source's "
                f"from {t.parent!r} at {t.fork_step}: another history under that name; nothing copied")
    return have


def _same_manifest(target: StoreCatalog, step: int, rank: int, data: bytes) -> bool:
    """Whether ``dst``'s manifest of ``step`` and ``rank`` is the source's ``data``: the same bytes,
    or the same run's (GC repacked one of the two, §14 3b). Another run's is an error: its step
    is not the one being copied, and a complete step is never written into (§10)."""
    key = target.manifest_key(step, rank)
    try:
        have = target.storage.read(key)
    except FileNotFoundError:
        return False  # deleted since the listing
    if have == data:
        return True
    mine, theirs = Manifest.from_bytes(data, key), Manifest.from_bytes(have, f"{target.url} {key}")
    if (mine.run, mine.world_size) != (theirs.run, theirs.world_size):
        raise ManifestError(
            f"{target.url!r} holds {key} from run {theirs.run!r} (world size {theirs.world_size}), the source's "
            f"is from run {mine.run!r} (world size {mine.world_size}): another step under that number; nothing copied")
    return True


def _objects_to_send(target: StoreCatalog, needed: set[str]) -> list[str]:
    """The objects of ``needed`` to store in ``target``'s store: those it lacks, and those it has
    that §14 does not cover until the manifests land. An object stored less than ``G/2`` before
    this listing outlives the copy (GC deletes only objects older than ``G``); one named by the
    target timeline's newest complete step, or by its head while it has none, is in every GC's
    kept set until the copied step lands (proof step 4: the copy is the timeline's one writer).
    Any other is stored again, which restarts its age (A4), as a writer does (§11.5)."""
    now = time.time()
    ages = {o.key.rsplit("/", 1)[-1]: now - o.mtime for o in target.storage.walk("objects")}
    old = {n for n in needed if n in ages and ages[n] >= DEFAULT_GRACE_SECONDS / 2}
    kept = _kept_objects(target) if old else set()
    return sorted(n for n in needed if n not in ages or (n in old and n not in kept))


def _kept_objects(target: StoreCatalog) -> set[str]:
    """The objects every GC keeps until a newer step of ``target``'s timeline is complete: those of
    its newest complete step, or, while it has none, of the step it forked from (its head)."""
    view, step = target, target.latest_step()
    parent, fork = target.timeline.parent, target.timeline.fork_step
    if step is None and parent is not None and fork is not None:
        timelines = read_timelines(target.storage)
        if parent in timelines:
            view, step = StoreCatalog(target.storage, target.root, timelines[parent]), fork
    info = view.step_info(step) if step is not None else None
    if step is None or info is None or not info.complete:
        return set()
    return {n for r in info.ranks for e in view.manifest(step, r).arrays.values() for n in e.object_names()}


def _send(src: StoreCatalog, dst: StoreCatalog, names: list[str], report: CopyReport) -> None:
    """Copy objects ``names`` as the writer stores them (``write_pending``, then one ``publish`` and
    ``sync``), byte for byte: a name is its content's hash. A failure discards what is pending."""

    def one(name: str) -> tuple[int, PendingWrite | None]:
        data = src.storage.read(object_key(name))
        return len(data), dst.storage.write_pending(object_key(name), data)

    with ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="ravex-copy") as pool:
        futures = [pool.submit(one, name) for name in names]
        try:
            done = [fut.result() for fut in futures]
            dst.storage.publish([handle for _, handle in done if handle is not None])
        except BaseException:
            for fut in futures:
                fut.cancel()
            wait(futures)  # the running ones: their temp files go too
            dst.storage.discard([h for f in futures if not f.cancelled() and f.exception() is None
                                 for h in [f.result()[1]] if h is not None])
            raise
    report.objects_copied += len(done)
    report.bytes_copied += sum(size for size, _ in done)
    dst.storage.sync()  # every object durable before a manifest names it
