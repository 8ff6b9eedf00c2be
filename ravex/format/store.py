"""A checkpoint store and the verbs that act on it: :func:`open_store`, :class:`CheckpointStore`.

:class:`CheckpointStore` is the :class:`~ravex.format.steps.catalog.StoreCatalog` (steps,
manifests, completeness) with the verbs that open a writer, a reader or a collection
(:mod:`.writing.writer`, :mod:`.steps.reader`, :mod:`.maintenance.gc`). Those modules work on the catalog and never
import this one, so the import graph has no cycle.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from ._version import FORMAT_NAME, SPEC_VERSION, check_version
from .errors import ManifestError, StepNotFoundError, StoreNotFoundError
from .history import clock
from .history.jsondoc import load_document
from .history.tags import Tag, create_tag, delete_tag, read_tags, tag_key
from .history.timelines import (
    MAIN,
    TIMELINES,
    Timeline,
    create_timeline,
    fork_name,
    in_span,
    lineage,
    read_timelines,
    split_ref,
    timeline_key,
)
from .maintenance.gc import DEFAULT_GRACE_SECONDS, GCReport, gc
from .objects.hashing import HASH_NAME
from .objects.names import check_label, is_decimal, manifest_ranks, no_rank_missing
from .steps.catalog import StepFiles, StepInfo, StoreCatalog
from .steps.reader import StepReader
from .storage import RetryPolicy, Storage, open_storage
from .writing.writer import StepWriter

__all__ = ["ROOT_KEY", "CheckpointStore", "StepFiles", "StepInfo", "open_store"]

ROOT_KEY = "ravex.json"


class CheckpointStore(StoreCatalog):
    """One Ravex store. Open with :func:`open_store`."""

    def writer(self, *args: Any, **options: Any) -> StepWriter:
        """A writer for one rank (arguments: :class:`~ravex.format.writing.writer.StepWriter`'s after the
        store); it keeps the delta base between commits (``delta=False`` stores every chunk anew
        each time)."""
        return StepWriter(self, *args, **options)

    def open_step(self, step: int | str = "latest") -> StepReader:
        """A reader over one complete step (all ranks' manifests merged). ``step`` may name a
        timeline (``exp@60``, spec §19) and may be a step of this timeline's lineage (a step
        up to the fork, read from the parent)."""
        owner, number = self.locate(step)
        return StepReader(owner, number)

    # ---- timelines (spec §19) ------------------------------------------------------------

    def timelines(self) -> dict[str, Timeline]:
        """Every timeline of the store, ``main`` first."""
        return read_timelines(self.storage)

    def on_timeline(self, name: str, timelines: dict[str, Timeline] | None = None) -> CheckpointStore:
        """This store seen from timeline ``name``: its steps, readers and writers are that
        timeline's (one that does not exist is a :class:`StepNotFoundError`)."""
        if name == self.timeline.name:
            return self
        timelines = timelines if timelines is not None else self.timelines()
        if name not in timelines:
            check_label(name, "timeline")
            raise StepNotFoundError(
                f"{self.url!r} has no timeline {name!r}; timelines: {', '.join(sorted(timelines))}")
        return CheckpointStore(self.storage, self.root, timelines[name])

    def lineage(self, timelines: dict[str, Timeline] | None = None) -> list[tuple[CheckpointStore, int | None]]:
        """This timeline, its parent, ... up to ``main``, each with the highest step it lends
        to the one below it (None for this timeline itself: all of its steps)."""
        timelines = timelines if timelines is not None else self.timelines()
        chain = lineage(timelines, self.timeline.name)
        out: list[tuple[CheckpointStore, int | None]] = [(self, None)]
        for child, parent in itertools.pairwise(chain):
            out.append((self.on_timeline(parent.name, timelines), child.fork_step))
        return out

    def lineage_spans(self) -> list[tuple[CheckpointStore, int | None, int | None]]:
        """:meth:`lineage` with the share of each timeline in this one's history, newest
        timeline first: ``(view, floor, ceiling)``, its steps ``floor < step <= ceiling`` (None:
        no bound). A forked timeline's steps start above its fork; a parent's end at the lowest
        fork step of the timelines below it."""
        spans: list[tuple[CheckpointStore, int | None, int | None]] = []
        ceiling: int | None = None
        for view, upto in self.lineage():
            if upto is not None:
                ceiling = upto if ceiling is None else min(ceiling, upto)
            spans.append((view, view.timeline.fork_step if view.timeline.parent is not None else None, ceiling))
        return spans

    def lineage_steps(self) -> list[tuple[CheckpointStore, int]]:
        """The complete steps of this timeline's history, oldest first: the parent's up to the
        fork step (and its parent's before that), then this timeline's own."""
        found: list[tuple[CheckpointStore, int]] = []
        for view, floor, ceiling in self.lineage_spans():
            found[:0] = [(view, s) for s in view.complete_steps() if in_span(s, floor, ceiling)]
        return found

    def resume_steps(self, limit: int = 64, pin: bool = False) -> list[tuple[CheckpointStore, int]]:
        """The steps a resume may go back to, newest first, at most ``limit``, found for the
        cost of one step's manifests whatever the number of steps kept: the newest complete
        step of this timeline's history (what :meth:`lineage_steps` ends with), then the older
        steps whose folder lists every rank's manifest.

        Steps are tried newest first, each timeline of the lineage in turn (a parent's up to
        the fork). A folder whose ``rank-<r>.json`` names are not ``0 .. n-1`` misses a rank:
        incomplete, known from its listing. The first one that has them all is checked as
        :meth:`~.catalog.StoreCatalog.step_info` checks it (every manifest read,
        :data:`~.catalog.MANIFEST_READ_THREADS` at a time; one world size, one run, ranks that
        agree); an incomplete one moves the walk down. The older ones are named from their
        listing only (no manifest read): their completeness is checked if a resume falls back
        to one (reading it checks it, and an incomplete one is passed over as an unreadable
        one is). ``pin``: the newest one's manifests are pinned in its timeline's view
        (:meth:`~.catalog.StoreCatalog.pin_step`), so that reading and handing it over asks
        for none of them again, however many ranks outgrow the cache."""
        found: list[tuple[CheckpointStore, int]] = []
        for view, floor, ceiling in self.lineage_spans():
            for step in reversed(view.step_numbers()):
                if not in_span(step, floor, ceiling):
                    continue
                ranks = manifest_ranks(view.storage.list_dir(view.step_dir(step)))
                if not no_rank_missing(ranks):
                    continue  # a rank's manifest is missing: incomplete whatever the others say
                if not found:
                    info, manifests = view.check_step(step, ranks)
                    if not info.complete:
                        continue
                    if pin:
                        view.pin_step(step, manifests)
                found.append((view, step))
                if len(found) >= limit:
                    return found
        return found

    def locate(self, step: int | str, check: bool = True) -> tuple[CheckpointStore, int]:
        """Which timeline holds ``step`` (``60``, ``step_60``, ``latest``, ``exp@60``) and its
        number: a step up to a timeline's fork belongs to its parent. The step is checked
        complete (its manifests read); ``check=False`` reads none for a number (the fork steps
        say which timeline holds it; whether it is there is the caller's to learn)."""
        name, text = split_ref(step) if isinstance(step, str) else (None, step)
        view = self if name is None else self.on_timeline(name)
        if view.timeline.parent is None and (check or text == "latest"):  # main: as spec 1.0 reads them
            return view, view.resolve_step(text)
        if text == "latest":
            steps = view.lineage_steps()
            if not steps:
                raise StepNotFoundError(f"timeline {view.timeline.name!r} of {self.url!r} has no complete step yet")
            return steps[-1]
        number = _step_number(text)
        for owner, floor, _ in view.lineage_spans():
            if floor is None or number > floor:
                return owner, owner.resolve_step(number) if check else number
        raise StepNotFoundError(f"step {number} is not in timeline {view.timeline.name!r} of {self.url!r}")

    def fork(self, step: int, name: str | None = None, run: str | None = None) -> CheckpointStore:
        """Start a new timeline from complete ``step`` of this timeline's lineage (``name``:
        :func:`~.timelines.fork_name`'s when None); the new timeline's view. Its document is
        created exclusively: a name another run took is a :class:`NameTakenError`."""
        number = self.locate(step)[1]
        existing = self.timelines()
        name = name if name is not None else fork_name(existing, self.timeline.name, number)
        timeline = create_timeline(self.storage, name, self.timeline.name, number, run)
        return CheckpointStore(self.storage, self.root, timeline)

    def start_root(self, run: str | None = None) -> CheckpointStore:
        """Start a root timeline (spec §19, since 1.5): a fresh run's own history beside the
        store's others, none of their steps in it; named :func:`~.timelines.fork_name`'s way.
        Its view; its document is created exclusively, as a fork's."""
        timeline = create_timeline(self.storage, fork_name(self.timelines(), None, None), None, None, run)
        return CheckpointStore(self.storage, self.root, timeline)

    def current(self) -> CheckpointStore:
        """The timeline a plain rerun continues: the one whose newest event, its newest
        complete step or its creation, is the newest by the storage's clock (main when the
        store has no other timeline; of two at the same time, the one created last). Nothing
        shared is written to know it. Every rank of a job asks this at start: each timeline's
        steps are listed by name, then its newest step's folder, its completeness judged from
        that listing and rank 0's manifest (:meth:`~.catalog.StoreCatalog.looks_complete`): not
        every manifest, not every folder; the resume checks the step it reads in full."""
        timelines = self.timelines()
        if len(timelines) == 1:
            return self.on_timeline(MAIN, timelines)
        created = {o.key: o.mtime for o in self.storage.walk(TIMELINES) if o.key.count("/") == 1}
        best, best_time = MAIN, float("-inf")
        # oldest document first, so that a tie (a storage clock coarser than two events: a fork in
        # the same tick as its parent's last step, S3's whole seconds) goes to the newer timeline
        for name in sorted(timelines, key=lambda n: (n != MAIN, timelines[n].created_at or "")):
            view = self.on_timeline(name, timelines)
            when = created.get(timeline_key(name), float("-inf"))
            for number in reversed(view.step_numbers()):  # newest first, one folder listed at a time
                files = view.step_files(number)
                if view.looks_complete(number, files.ranks):
                    when = max(when, files.mtime or when)
                    break
            if when >= best_time:
                best, best_time = name, when
        return self.on_timeline(best, timelines)

    # ---- tags (spec §19) -----------------------------------------------------------------

    def tags(self) -> dict[str, Tag]:
        """Every tag, by name."""
        return read_tags(self.storage)

    def tag(self, name: str, step: int | str = "latest") -> Tag:
        """Name complete ``step`` (``exp@60`` names a timeline's) so that GC never collects it.
        A missing step, a bad name or a name already taken is an error and writes nothing."""
        check_label(name, "tag")
        owner, number = self.locate(step)
        tag = create_tag(self.storage, name, owner.timeline.name, number)
        if not owner.step_info(number).complete:  # collected between the check and the tag
            self.storage.delete([tag_key(name)])
            raise StepNotFoundError(f"step {tag.ref} was collected while it was being tagged; nothing tagged")
        return tag

    def untag(self, name: str) -> Tag:
        """Delete tag ``name``; the tag it was."""
        return delete_tag(self.storage, name)

    def read(self, step: int | str = "latest", rank: int = 0, subtree: Any = None) -> Any:
        """The state tree of a step with numpy arrays at the leaves."""
        return self.open_step(step).read(rank=rank, subtree=subtree)

    def gc(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        dry_run: bool = False,
    ) -> GCReport:
        """Apply retention, then delete unreferenced objects older than the grace period."""
        return gc(self, keep_last=keep_last, keep_every=keep_every, grace_seconds=grace_seconds, dry_run=dry_run)


def open_store(
    url: str | os.PathLike[str],
    create: bool = False,
    storage_options: dict[str, Any] | None = None,
    created_by: str | None = None,
    retry: RetryPolicy | None = None,
) -> CheckpointStore:
    """Open (or with ``create=True``, create) the store at a path or fsspec URL.

    ``retry`` bounds how remote calls are retried (:class:`~ravex.format.storage.RetryPolicy`).
    """
    return store_on(open_storage(os.fspath(url), storage_options, retry), create, created_by)


def store_on(storage: Storage, create: bool = False, created_by: str | None = None) -> CheckpointStore:
    """The store whose root is ``storage`` (:func:`open_store` for a :class:`Storage` made
    elsewhere, such as :class:`~ravex.format.storage.peer.PeerStorage`, another machine's tier)."""
    try:
        data = storage.read(ROOT_KEY)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: the path is a file
        if not create:
            raise StoreNotFoundError(
                f"{storage.url!r} is not a Ravex store (no {ROOT_KEY}); check the path, "
                "or pass create=True to start a new one"
            ) from None
        root = {
            "format": FORMAT_NAME,
            "version": SPEC_VERSION,
            "hash": HASH_NAME,
            "created_by": created_by or _creator(),
            "created_at": clock.now_iso(),
        }
        storage.write(ROOT_KEY, json.dumps(root, indent=2).encode() + b"\n")
        storage.sync()
        return CheckpointStore(storage, root)
    where = f"{storage.url}/{ROOT_KEY}"
    root = load_document(data, where, detail=True)
    if not isinstance(root, dict) or root.get("format") != FORMAT_NAME:
        raise ManifestError(f"{where}: not a Ravex root document (format != {FORMAT_NAME!r})")
    check_version(root.get("version"), where)
    if root.get("hash") != HASH_NAME:
        raise ManifestError(f"{where}: hash {root.get('hash')!r} is unknown; expected {HASH_NAME!r}")
    return CheckpointStore(storage, root)


def _step_number(text: str | int) -> int:
    """A step number from ``60`` or ``step_60``; anything else is a :class:`StepNotFoundError`."""
    digits = str(text).removeprefix("step_")
    if not is_decimal(digits):
        shown = text if len(str(text)) <= 40 else f"{str(text)[:40]}..."
        raise StepNotFoundError(f"{shown!r} is not a step; use a number, 'step_100', 'latest' or 'TIMELINE@100'")
    return int(digits)


def _creator() -> str:
    try:
        from importlib.metadata import version

        return f"ravex {version('ravex')}"
    except Exception:
        return "ravex"
