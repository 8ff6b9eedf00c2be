"""Retention and garbage collection, safe against a concurrent writer.

Order (spec/FORMAT.md, "Garbage collection"): decide which steps to keep; delete
the manifests of the others; list the manifests again; delete objects that no
listed manifest names *and* that are older than the grace period.

Why a writer committing at the same time is safe: a writer reuses chunks only
from its delta base, which is always a step at least as new as the newest
complete step until that writer's next manifest lands; GC keeps the newest
complete step and every newer one, so the base's manifest (and so every object it
names) survives. Objects the writer stores anew are younger than the grace
period until its manifest names them (a commit must finish within the grace),
and an object a writer stores anew is always rewritten, never skipped because it
exists, so its age restarts.

GC deletes whole objects only. The bytes of a pack that no kept step reads go with the pack,
once no kept manifest names it; the writer's pack-liveness rule (spec/FORMAT.md §13) keeps
a pack from being named for a few of its chunks, which bounds them at half a pack, and GC's
repack (:mod:`.repack`, spec §14 phase 3b) copies the live chunks of the sparsest packs into new
ones and replaces the manifests naming them, down to a tenth of the object bytes once no writer
runs (grace 0). A repacked pack has a retirement record; phase 4 deletes it only once no manifest
names it, twice the grace has passed since its record was written and no manifest a writer may
hold as its delta base was rewritten away from it (:func:`.repack.may_delete_retired`).

Requests (an object store bills and delays each): one recursive listing of ``steps/``
gives every step's files, ranks and age at once; completeness is read only for the
steps the policy has to look at (from the newest down; a step below the newest complete
one that no policy could keep is deleted unread); the doomed steps' files go in one
``delete`` call; ``steps/`` is listed a second time only when something was deleted
(phase 3 of the spec; when nothing was, the first listing, taken after ``t0``, is that
listing); then one listing of ``objects/``, and one of ``repack/`` when some object is
unreferenced. With ``keep_last`` over S3 that is 3 LIST requests per call for the steps and
objects, where listing each step's folder cost ~3 per step (the timelines and tags add theirs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RavexError, TimelineBusyError
from ..history.leases import active_holders
from ..history.tags import Tag, read_tags
from ..history.timelines import MAIN, read_timelines
from ..objects.names import object_key
from ..steps.catalog import StepFiles, StoreCatalog
from ..steps.refs import REFS_NAME
from .repack import (
    RETIRED_PREFIX,
    PresentManifest,
    RepackReport,
    may_delete_retired,
    read_retirements,
    refresh_refs,
    repack,
    retirement_key,
)

if TYPE_CHECKING:
    from ..steps.catalog import StepInfo

#: The grace period ``G`` (spec/FORMAT.md, "Garbage collection"), in seconds: GC deletes an
#: unreferenced object only once it is older than this. A writer's safety depends on it: the
#: objects a commit stores stay unreferenced until its manifest lands, so a commit must finish
#: within ``G`` (assumption A2), and a writer trusts a delta base that is not yet complete only
#: for ``G / 2`` (A3: after that GC may be collecting it). Writer and GC must agree on ``G``: both
#: default to this one value.
DEFAULT_GRACE_SECONDS = 3600.0


@dataclass
class GCReport:
    """What GC deleted (or, with ``dry_run``, would delete)."""

    #: steps by number on ``main``, as ``timeline@step`` on another timeline
    kept_steps: list[int | str] = field(default_factory=list)
    deleted_steps: list[int | str] = field(default_factory=list)
    deleted_objects: int = 0
    deleted_bytes: int = 0
    kept_objects: int = 0
    young_unreferenced: int = 0  # unreferenced but within the grace period
    dry_run: bool = False
    #: set when a manifest could not be read: then no object is deleted at all
    skipped_objects_because: str | None = None
    #: steps kept because a manifest of theirs is there but unreadable (a newer format, damage)
    unreadable_steps: list[int | str] = field(default_factory=list)
    #: what repacking did (spec §14): packs whose live chunks were copied, manifests rewritten,
    #: and the dead share of the referenced object bytes before and after
    repack: RepackReport | None = None
    #: repacked packs no manifest names, waiting for the grace (or a writer's next step) to go
    retired_waiting: int = 0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["repack"] = self.repack.to_json() if self.repack is not None else None
        return out


def retained_steps(
    steps: list[int],
    is_complete: Callable[[int], bool],
    keep_last: int | None,
    keep_every: int | None,
    grace_seconds: float,
    now: float,
    ages: dict[int, float],
) -> set[int]:
    """The steps a retention policy keeps, of ascending ``steps`` (``None`` for both policies
    keeps every complete step). ``is_complete`` is asked only about the steps whose fate
    depends on it: from the newest down to the newest complete one, then the ones a policy
    could keep. A step with no age in ``ages`` counts as young (just created)."""
    newest = next((s for s in reversed(steps) if is_complete(s)), None)
    if newest is None:
        below: list[int] = []
        above = steps
        keep: set[int] = set()
    else:
        i = steps.index(newest)
        below, above = steps[:i], steps[i + 1 :]
        keep = {newest}
    for step in above:  # incomplete, and newer than the newest complete step: may be in flight
        if now - ages.get(step, now) < grace_seconds:
            keep.add(step)
    if keep_last is None and keep_every is None:
        keep.update(s for s in below if is_complete(s))
    if keep_last and keep_last > 1:
        wanted = keep_last - 1  # the newest is the first
        for step in reversed(below):
            if wanted == 0:
                break
            if is_complete(step):
                keep.add(step)
                wanted -= 1
    if keep_every:
        keep.update(s for s in below if s % keep_every == 0 and is_complete(s))
    return keep


def gc(
    store: StoreCatalog,
    keep_last: int | None = None,
    keep_every: int | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    dry_run: bool = False,
    repack_packs: bool = True,
) -> GCReport:
    """Apply retention to every timeline of ``store`` and collect unreferenced objects. See the
    module doc. Retention counts each timeline's own steps; tagged steps, and the fork step of
    a timeline that has no complete step of its own yet, are kept whatever the policy."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last={keep_last}: keep at least the newest step (keep_last >= 1)")
    if keep_every is not None and keep_every < 1:
        raise ValueError(f"keep_every={keep_every} must be a positive number of steps")
    if not (isinstance(grace_seconds, (int, float)) and grace_seconds >= 0):  # NaN fails this too
        # a negative or NaN grace would delete a concurrent writer's objects before its manifest lands
        raise ValueError(f"grace_seconds={grace_seconds!r} must be a number of seconds >= 0")
    if grace_seconds == 0 and not dry_run:
        _no_writer(store)
    now = time.time()  # t0, taken before the listings
    report = GCReport(dry_run=dry_run)
    views = _timeline_catalogs(store)
    tags = read_tags(store.storage)  # after t0: a tag that exists at t0 is seen
    listings = {name: view.list_steps() for name, view in views.items()}
    pinned = _pinned_steps(views, listings, tags)
    deleted: dict[str, dict[int, tuple[str, ...] | list[str]]] = {}
    for name, view in views.items():
        listing = listings[name]
        infos: dict[int, StepInfo] = {}

        def is_complete(step: int, view: StoreCatalog = view, listing: dict[int, StepFiles] = listing,
                        infos: dict[int, StepInfo] = infos) -> bool:
            if step not in infos:
                infos[step] = view.step_info(step, listing[step].ranks)
            return infos[step].complete

        ages = {s: f.mtime for s, f in listing.items() if f.mtime is not None}
        keep = retained_steps(list(listing), is_complete, keep_last, keep_every, grace_seconds, now, ages)
        keep |= pinned.get(name, set()) & set(listing)
        # A step the policy dropped as incomplete because a manifest of it is there but unreadable
        # is no crashed write (manifests land atomically): kept. Steps the policy never asked about
        # (older than what it keeps) go by the policy, unread.
        for step in sorted(set(infos) - keep):
            if not infos[step].complete and infos[step].unreadable:
                keep.add(step)
                report.unreadable_steps.append(_ref(name, step))
        for step in listing:
            (report.kept_steps if step in keep else report.deleted_steps).append(_ref(name, step))
            if step not in keep:
                deleted.setdefault(name, {})[step] = listing[step].files
    if deleted and not dry_run:
        for name, doomed in deleted.items():
            views[name].delete_steps(doomed)
        # Phase 3 lists again: whatever landed since the first listing is read too, in every
        # timeline (one forked since is among them).
        views = _timeline_catalogs(store)
        listings = {name: view.list_steps() for name, view in views.items()}

    referenced: set[str] = set()
    present: list[PresentManifest] = []
    candidates = _base_candidates(views, listings)
    for name, view in views.items():
        for step, files in listings[name].items():
            if dry_run and step in deleted.get(name, {}):
                continue
            complete = view.step_info(step, files.ranks).complete if files.ranks else False
            for manifest_name, rank in _manifest_names(files):
                try:
                    if rank is None:
                        raise ValueError("not a manifest name the layout writes (rank-<r>.json)")
                    m = view.manifest(step, rank)
                except (RavexError, OSError, ValueError) as exc:
                    # A manifest we cannot read may still name objects (a transient read error,
                    # a manifest from a newer writer): collecting now could delete a kept step.
                    report.skipped_objects_because = f"step {_ref(name, step)} {manifest_name}: {exc}"
                    return report
                for entry in m.arrays.values():
                    referenced |= entry.object_names()
                present.append(PresentManifest(view, step, rank, m, complete, (name, step) in candidates,
                                               REFS_NAME in files.files))

    listed = list(store.storage.walk("objects"))
    sizes = {o.key.rsplit("/", 1)[-1]: o.size for o in listed if o.key == object_key(o.key.rsplit("/", 1)[-1])}
    if repack_packs:
        # Phase 3b (spec §14): copy the live chunks of the sparsest packs into new ones and rewrite
        # the manifests naming them. While the grace is not zero a writer may be committing: the
        # packs a delta base may name are left to the writer's own liveness rule (§13).
        report.repack, retired, new_packs = repack(store.storage, present, sizes, protect_bases=grace_seconds > 0,
                                                   dry_run=dry_run)
        referenced = (referenced - retired) | new_packs
    refreshed: set[tuple[str, int]] = set()
    dropped_records = 0
    cutoff = now - grace_seconds
    # Retirement records are listed only when some object is unreferenced (one LIST request more).
    unreferenced = any(o.key.rsplit("/", 1)[-1] not in referenced for o in listed)
    records, unreadable = read_retirements(store.storage) if unreferenced else ({}, set())
    for obj in listed:
        name = obj.key.rsplit("/", 1)[-1]
        if name in referenced and obj.key == object_key(name):
            report.kept_objects += 1
        elif name in unreadable:
            report.retired_waiting += 1
        elif name in records and obj.key == object_key(name):
            if not may_delete_retired(records[name], now, grace_seconds, candidates):
                report.retired_waiting += 1
            elif dry_run:
                report.deleted_objects += 1
                report.deleted_bytes += obj.size
            else:
                # a crash between the rewrite of a step's manifests and of its refs.json left the
                # latter naming this pack: written again from the manifests before the pack goes
                for timeline, step, _ in records[name].manifests:
                    if (timeline, step) in refreshed or timeline not in views:
                        continue
                    refreshed.add((timeline, step))
                    if REFS_NAME in listings[timeline].get(step, _NO_FILES).files:
                        refresh_refs(views[timeline], step)
                if store.storage.delete_if_older(obj.key, now if grace_seconds == 0 else cutoff):
                    report.deleted_objects += 1
                    report.deleted_bytes += obj.size
                    store.storage.delete([retirement_key(name)])
                    del records[name]
                    dropped_records += 1
                else:
                    report.retired_waiting += 1
        elif obj.mtime >= cutoff:
            report.young_unreferenced += 1
        elif dry_run or store.storage.delete_if_older(obj.key, cutoff):  # age checked again at the delete
            report.deleted_objects += 1
            report.deleted_bytes += obj.size
        else:
            report.young_unreferenced += 1
    if not dry_run:
        # records of packs that are gone (a GC stopped between deleting a pack and its record)
        gone = [retirement_key(n) for n in records if n not in sizes and n not in referenced]
        if gone:
            store.storage.delete(gone)
        if gone or dropped_records:
            store.storage.remove_empty_dir(RETIRED_PREFIX)
    return report


_NO_FILES = StepFiles(-1, (), (), None)


def _base_candidates(views: dict[str, StoreCatalog], listings: dict[str, dict[int, StepFiles]]) -> set[tuple[str, int]]:
    """``(timeline, step)`` of every step a writer may hold as its delta base (spec §14, proof
    step 4): each timeline's newest complete step, the steps above it (in flight), and the fork
    step of a timeline with no complete step of its own (a writer of it starts from there)."""
    out: set[tuple[str, int]] = set()
    for name, view in views.items():
        listing = listings[name]
        newest = None
        for step in reversed(list(listing)):
            if view.step_info(step, listing[step].ranks).complete:
                newest = step
                break
            out.add((name, step))
        if newest is not None:
            out.add((name, newest))
        elif view.timeline.parent is not None and view.timeline.fork_step is not None:
            out.add((view.timeline.parent, view.timeline.fork_step))
    return out


def _no_writer(store: StoreCatalog) -> None:
    """A grace of 0 assumes no writer runs (spec §14, A2, A8); a run whose lease (§21) may be
    alive is one: refused, naming it. This process's own lease does not count (its caller knows)."""
    holders = active_holders(store.storage)
    if holders:
        now = time.time()
        holder = holders[0]
        raise TimelineBusyError(
            f"gc with grace 0 needs no run writing {store.storage.url!r}, but timeline {holder.timeline!r} is "
            f"held by a run ({holder.describe(now)}): let it finish, or collect with the default grace")


def _ref(timeline: str, step: int) -> int | str:
    """How a report names a step: its number on ``main``, ``timeline@step`` elsewhere."""
    return step if timeline == MAIN else f"{timeline}@{step}"


def _timeline_catalogs(store: StoreCatalog) -> dict[str, StoreCatalog]:
    """A catalog of every timeline's steps (``store``'s own one as it is)."""
    out: dict[str, StoreCatalog] = {}
    for name, timeline in read_timelines(store.storage).items():
        out[name] = store if name == store.timeline.name else StoreCatalog(store.storage, store.root, timeline)
    return out


def _pinned_steps(
    views: dict[str, StoreCatalog], listings: dict[str, dict[int, StepFiles]], tags: dict[str, Tag]
) -> dict[str, set[int]]:
    """Steps kept whatever the policy: every tagged step, and for each timeline that has no
    complete step of its own yet, the step it forked from (its head: what a resume of it reads,
    spec §19)."""
    pinned: dict[str, set[int]] = {}
    for tag in tags.values():
        pinned.setdefault(tag.timeline, set()).add(tag.step)
    for name, view in views.items():
        timeline = view.timeline
        if timeline.parent is None or timeline.fork_step is None or timeline.parent not in views:
            continue
        listing = listings[name]
        if any(view.step_info(s, listing[s].ranks).complete for s in listing):
            continue
        pinned.setdefault(timeline.parent, set()).add(timeline.fork_step)
    return pinned


def _manifest_names(files: StepFiles) -> list[tuple[str, int | None]]:
    """``(name, rank)`` of every ``rank-*.json`` in a step folder; rank None where the name is not
    one the layout writes (``rank-01.json``): GC must not guess what such a file names."""
    valid = {f"rank-{r}.json": r for r in files.ranks}
    return [(n, valid.get(n)) for n in files.files if n.startswith("rank-") and n.endswith(".json")]
