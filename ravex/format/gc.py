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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import RavexError
from .names import is_decimal, object_key

if TYPE_CHECKING:
    from .store import CheckpointStore


@dataclass
class GCReport:
    """What GC deleted (or, with ``dry_run``, would delete)."""

    kept_steps: list[int] = field(default_factory=list)
    deleted_steps: list[int] = field(default_factory=list)
    deleted_objects: int = 0
    deleted_bytes: int = 0
    kept_objects: int = 0
    young_unreferenced: int = 0  # unreferenced but within the grace period
    dry_run: bool = False
    #: set when a manifest could not be read: then no object is deleted at all
    skipped_objects_because: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def retained_steps(
    infos: list, keep_last: int | None, keep_every: int | None, grace_seconds: float, now: float, ages: dict[int, float]
) -> set[int]:
    """The steps a retention policy keeps. ``None`` for both policies keeps every complete step."""
    complete = [i.step for i in infos if i.complete]
    newest = complete[-1] if complete else -1
    keep: set[int] = set()
    if keep_last is None and keep_every is None:
        keep.update(complete)
    if keep_last:
        keep.update(complete[-keep_last:])
    if keep_every:
        keep.update(s for s in complete if s % keep_every == 0)
    if newest >= 0:
        keep.add(newest)
    for info in infos:
        # steps newer than the newest complete one may be in flight: kept until stale
        if not info.complete and info.step > newest and now - ages.get(info.step, now) < grace_seconds:
            keep.add(info.step)
    return keep


def gc(
    store: CheckpointStore,
    keep_last: int | None = None,
    keep_every: int | None = None,
    grace_seconds: float = 3600.0,
    dry_run: bool = False,
) -> GCReport:
    """Apply retention to ``store`` and collect unreferenced objects. See the module doc."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last={keep_last}: keep at least the newest step (keep_last >= 1)")
    if keep_every is not None and keep_every < 1:
        raise ValueError(f"keep_every={keep_every} must be a positive number of steps")
    if not (isinstance(grace_seconds, (int, float)) and grace_seconds >= 0):  # NaN fails this too
        # a negative or NaN grace would delete a concurrent writer's objects before its manifest lands
        raise ValueError(f"grace_seconds={grace_seconds!r} must be a number of seconds >= 0")
    now = time.time()
    report = GCReport(dry_run=dry_run)
    infos = store.steps()
    ages = _step_mtimes(store)
    keep = retained_steps(infos, keep_last, keep_every, grace_seconds, now, ages)
    for info in infos:
        if info.step in keep:
            report.kept_steps.append(info.step)
        else:
            report.deleted_steps.append(info.step)
            if not dry_run:
                store.delete_step(info.step)

    referenced: set[str] = set()
    for step in store.step_numbers():  # listed again, after the deletions
        if dry_run and step in report.deleted_steps:
            continue
        for name in store.storage.list_dir(f"steps/{step}"):
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            try:
                m = store.manifest(step, int(name[5:-5]))
            except (RavexError, OSError, ValueError) as exc:
                # A manifest we cannot read may still name objects (a transient read error,
                # a manifest from a newer writer): collecting now could delete a kept step.
                report.skipped_objects_because = f"step {step} {name}: {exc}"
                return report
            for entry in m.arrays.values():
                referenced.update(c.object for c in entry.chunks.values() if c.object)

    cutoff = now - grace_seconds
    for obj in store.storage.walk("objects"):
        name = obj.key.rsplit("/", 1)[-1]
        if name in referenced and obj.key == object_key(name):
            report.kept_objects += 1
        elif obj.mtime >= cutoff:
            report.young_unreferenced += 1
        elif dry_run or store.storage.delete_if_older(obj.key, cutoff):  # age checked again at the delete
            report.deleted_objects += 1
            report.deleted_bytes += obj.size
        else:
            report.young_unreferenced += 1
    return report


def _step_mtimes(store: CheckpointStore) -> dict[int, float]:
    """Newest manifest mtime per step (how long ago a step last saw a writer)."""
    ages: dict[int, float] = {}
    for obj in store.storage.walk("steps"):
        parts = obj.key.split("/")
        if len(parts) == 3 and is_decimal(parts[1]):
            step = int(parts[1])
            ages[step] = max(ages.get(step, 0.0), obj.mtime)
    return ages
