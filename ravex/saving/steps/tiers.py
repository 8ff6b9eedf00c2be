"""Two tiers: every checkpoint lands in a fast store on this machine (``local:``), and every
``persist_every``-th one is copied in the background to the durable store (``storage:``).

Both tiers are Ravex stores of one format, so the copy is :func:`ravex.format.copy_step`: only
the objects the durable tier lacks travel, and the step's manifests go last, so a step appears
there only complete. The copy runs on a thread of its own: the writer thread (and so training)
never waits for it; a copy still running when the next one is due is overtaken by it (the
newer step is the one worth having). Retention applies per tier: the local tier's ``keep_last``
after each commit (keeping every step a copy has yet to read), ``persist_keep_last`` here after each
copy. At exit the newest local step is copied before the process ends, so a finished run's
last state is durable.

At start, :func:`newer_in_durable` lets the backend fetch a step the durable tier holds and the
local one does not (this machine's local tier is new, or was lost with the machine): it is
copied into the local tier before the resume reads it, so the resume itself reads one tier.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ravex.format import CheckpointStore
from ravex.format.history.witness import read_witness, write_witness
from ravex.format.objects.names import manifest_ranks

from ..logline import mib, ms

logger = logging.getLogger("ravex")

#: what the persister's thread does with a step: copy it, or copy its (grown) witness
COPY, WITNESS = "copy", "witness"


class Persister:
    """The background copy of local steps to the durable tier, one at a time, newest wins.

    ``rank``: whose manifests this process copies (its own: every rank copies what it wrote, so
    ranks never wait on each other); rank 0 also applies ``keep_last`` to the destination (the
    durable tier's; another machine's tier is kept by that machine's first rank, locally).
    ``tier``: what the destination is, for the log lines (``storage``, or ``replica``: another
    machine's local tier, :mod:`.replicas`, which takes every step). ``in_order``: copy
    every queued step, oldest first, none overtaken: the replica's, because a step that reached
    the other tier for some ranks only is no step of that tier (the resume's agreement and a
    rollback there need each step the local tier holds); the queue holds step numbers only, and
    the local retention keeps every step from the oldest queued one (:attr:`oldest_needed`)."""

    def __init__(self, durable: CheckpointStore | Unopened, every: int, keep_last: int | None,
                 rank: int = 0, tier: str = "storage", in_order: bool = False) -> None:
        #: the destination; an :class:`Unopened` one is opened by the first copy that reaches it
        self.durable = durable
        self.every = every
        self.keep_last = keep_last
        self.rank = rank
        self.tier = tier
        self.commits = 0
        self.persisted_step: int | None = None
        #: the last copy's error; an unreachable destination's from the start
        self.last_error: str | None = durable.error if isinstance(durable, Unopened) else None
        self._newest_local: tuple[CheckpointStore, int] | None = None
        self._persisted: tuple[CheckpointStore, int] | None = None  # the newest step copied, and whence
        self._witness_due = False  # the witness of the newest step copied grew since it was copied
        self._cv = threading.Condition()
        self.in_order = in_order
        self._pending: deque[tuple[CheckpointStore, int]] = deque()  # steps to copy
        self._copying: int | None = None  # the step of the job underway
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ravex-persist", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return str(self.durable.url)

    def _destination(self) -> CheckpointStore:
        """The destination store, opened now if it was unreachable at start (raises while it
        still is: the copy fails, said, and the next one tries again)."""
        if isinstance(self.durable, Unopened):
            self.durable = self.durable.open()
            logger.warning("ravex: %s is reachable: copies of the local steps to it resume", self.url)
        return self.durable

    def committed(self, timeline: CheckpointStore, step: int) -> bool:
        """The writer thread committed ``step`` on the local ``timeline``: queue its copy when it
        is an ``every``-th checkpoint, else bring the durable tier's newest step's witness up to
        date (:meth:`refresh_witness`). Whether the step's copy was queued."""
        self.commits += 1
        self._newest_local = (timeline, step)
        if self.commits % self.every:
            self.refresh_witness()
            return False
        self._offer(timeline, step)
        return True

    def refresh_witness(self) -> None:
        """Copy the local witness of the newest step copied (spec §22) once no copy is queued:
        it grows as the steps after it run, and a rerun that resumes that step from the
        destination checks itself against it. One small write; one asked for while a copy runs
        is made after it, of the step that copy leaves newest (its witness may have grown
        meanwhile, and nothing else would copy it before the next checkpoint)."""
        with self._cv:
            self._witness_due = True
            self._cv.notify_all()

    def _witness_job(self) -> tuple[CheckpointStore, int] | None:
        """The step whose witness is due to be copied: the newest copied, once it grew."""
        return self._persisted if self._witness_due else None

    @property
    def copying(self) -> bool:
        """A copy is queued or reading from the local tier."""
        return self._copying is not None or bool(self._pending)

    @property
    def oldest_needed(self) -> int | None:
        """The oldest local step a job queued or underway still reads (its step and its
        witness: the local retention keeps it and every newer step)."""
        with self._cv:
            steps = [step for _, step in self._pending]
            if self._copying is not None:
                steps.append(self._copying)
            if (due := self._witness_job()) is not None:
                steps.append(due[1])
        return min(steps, default=None)

    def _offer(self, timeline: CheckpointStore, step: int) -> None:
        with self._cv:
            if not self.in_order:  # newest wins
                self._pending.clear()
            self._pending.append((timeline, step))
            self._cv.notify_all()

    def flush(self) -> None:
        """Wait until no copy is queued, running or due (a witness's)."""
        with self._cv:
            while self._pending or self._copying is not None or self._witness_job() is not None:
                self._cv.wait()

    def close(self) -> None:
        """Copy the newest local step if it is not in the durable tier yet, wait for it, stop."""
        newest = self._newest_local
        if newest is not None and newest[1] != self.persisted_step:
            self._offer(*newest)
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed and self._witness_job() is None:
                    self._cv.wait()
                due = self._witness_job()
                if self._pending:
                    kind, (timeline, step) = COPY, self._pending.popleft()
                elif due is not None:
                    self._witness_due = False
                    kind, (timeline, step) = WITNESS, due
                else:
                    return
                self._copying = step
            try:
                if kind == COPY:
                    self._copy(timeline, step)
                else:
                    self._copy_witness(timeline, step)
            except Exception as exc:  # the durable tier failing must never reach training
                self.last_error = f"step {step}: {type(exc).__name__}: {exc}"
                logger.error("ravex: copying %sstep %d to %s FAILED (it stays in the local tier; the "
                             "next copy retries): %s: %s", "the witness of " if kind == WITNESS else "",
                             step, self.url, type(exc).__name__, exc)
                with self._cv:  # a destination that fails gets the newest step next, not the backlog
                    while len(self._pending) > 1:
                        self._pending.popleft()
            with self._cv:
                self._copying = None
                self._cv.notify_all()

    def _copy(self, timeline: CheckpointStore, step: int) -> None:
        from ravex.format import copy_step

        durable = self._destination()
        started = time.perf_counter()
        report = copy_step(timeline, durable, step, ranks=[self.rank])
        previous = self._persisted
        # every step copied (the replica's): no commit between copies refreshes the witness of the
        # step copied before this one (refresh_witness), which grew up to this step: copy it now
        if self.every == 1 and previous is not None and previous[1] != step:
            try:
                self._copy_witness(*previous)
            except Exception as exc:  # collected by the local retention meanwhile: nothing to grow
                logger.debug("ravex: the witness of step %d was not copied to %s: %s", previous[1], self.url, exc)
        self.persisted_step = step
        self._persisted = (timeline, step)
        self.last_error = None
        collected = ""
        if self.rank == 0 and self.keep_last is not None:
            gc_started = time.perf_counter()
            try:
                durable.gc(keep_last=self.keep_last)
                collected = f", gc {ms(time.perf_counter() - gc_started)} ms"
            except Exception as exc:
                logger.warning("ravex: retention (gc) of %s failed after step %d: %s", self.url, step, exc)
        logger.info("ravex: step %d %s: tiers local + %s | %d objects (%s) sent, %d already "
                    "there%s | in background %s ms -> %s", step,
                    "persisted" if self.tier == "storage" else "replicated", self.tier, report.objects_copied,
                    mib(report.bytes_copied), report.objects_present, collected,
                    ms(time.perf_counter() - started), self.url)

    def _copy_witness(self, timeline: CheckpointStore, step: int) -> None:
        # this rank's own witness: the step need not be complete here yet (another rank of this
        # machine may not have committed it; with several machines the other ranks' manifests
        # land in the local tier later, with their replicas)
        owner, number = timeline.locate(step, check=False)
        witness = read_witness(owner.storage, owner.steps_prefix, number, self.rank)
        if witness is not None and witness.entries:
            there = self._destination().on_timeline(owner.timeline.name)
            write_witness(there.storage, there.steps_prefix, witness)


@dataclass(frozen=True)
class Unopened:
    """A durable tier that could not be opened at start (``error``): the run resumed from and
    checkpoints to the local tier, and each copy tries to open it again (:meth:`open`)."""

    url: str
    open: Callable[[], CheckpointStore]
    error: str


def newer_in_durable(local: CheckpointStore, durable: CheckpointStore) -> tuple[CheckpointStore, int] | None:
    """The durable tier's newest complete step on the timeline a plain rerun continues there,
    where the local tier's timeline of that name has no step as new: (its durable view, the
    step); None where the local tier is as new."""
    remote = durable.current()
    history = remote.lineage_steps()
    if not history:
        return None
    owner, step = history[-1]
    name = remote.timeline.name
    if name in local.timelines():
        mine = local.on_timeline(name).lineage_steps()
        if mine and mine[-1][1] >= step:
            return None
    return owner, step


def fetch(local: CheckpointStore, durable: CheckpointStore, source: str = "the durable tier") -> int | None:
    """Copy the durable tier's newer step into the local tier (:func:`newer_in_durable`): every
    rank's manifests and witnesses (the resume checks itself against them, spec §22). The ranks of
    one machine share the local tier and each calls this: one of them copies, under the tier's
    lock, and says so; the others find the step there. The step fetched, or None. ``source``
    names ``durable`` in the log line (the other machines' local tiers are fetched from too:
    :mod:`.replicas`)."""
    from ravex.format import copy_step

    with local.storage.exclusive():
        newer = newer_in_durable(local, durable)
        if newer is None:
            return None
        owner, step = newer
        started = time.perf_counter()
        report = copy_step(owner, local, step)
        there = local.on_timeline(owner.timeline.name)
        for rank in manifest_ranks(owner.storage.list_dir(owner.step_dir(step))):  # copied or already there
            witness = read_witness(owner.storage, owner.steps_prefix, step, rank)
            if witness is not None:
                write_witness(there.storage, there.steps_prefix, witness)
    logger.info("ravex: step %d came from %s %s (the local tier %s had no step as new): "
                "%d objects (%s) in %s ms", step, source, durable.url, local.url, report.objects_copied,
                mib(report.bytes_copied), ms(time.perf_counter() - started))
    return step


def gather_witnesses(local: CheckpointStore, others: list[CheckpointStore]) -> list[int]:
    """Bring the witnesses of the local tier's newest step up to the longest any other tier
    holds (the other machines' local tiers, :mod:`.replicas`): a machine lost between two
    checkpoints may have copied its rank's record of the steps after the newest one to some
    machines only, and the ranks of the rerun check themselves against it (spec §22). Under the
    tier's lock, as :func:`fetch`. The ranks whose witness came."""
    with local.storage.exclusive():
        history = local.current().lineage_steps()
        if not history:
            return []
        owner, step = history[-1]
        name = owner.timeline.name
        ranks = manifest_ranks(owner.storage.list_dir(owner.step_dir(step)))
        run = owner.manifest(step, ranks[0]).run  # a witness of that step by another run is another step's
        have = {rank: read_witness(owner.storage, owner.steps_prefix, step, rank) for rank in ranks}
        came: list[int] = []
        for other in others:
            if name not in other.timelines():
                continue
            there = other.on_timeline(name)
            for rank in ranks:
                theirs, mine = read_witness(there.storage, there.steps_prefix, step, rank), have[rank]
                if theirs is None or theirs.run not in (run, ""):  # "": a run without an id
                    continue
                if mine is None or len(theirs.entries) > len(mine.entries):
                    write_witness(owner.storage, owner.steps_prefix, theirs)
                    have[rank] = theirs
                    came.append(rank)
    if came:
        logger.info("ravex: the witnesses of step %d of ranks %s came from the other machines' local tiers",
                    step, sorted(set(came)))
    return sorted(set(came))


def describe(queued: bool, replicas: int = 0) -> str:
    """The tiers half of a checkpoint's line: the local tier holds it; the other machines'
    local tiers (``replicas`` of them) and the durable one will once their queued copies end
    (their own lines say so)."""
    copies = "replica" if replicas == 1 else f"{replicas} replicas"
    later = [name for name, yes in ((copies, replicas > 0), ("storage", queued)) if yes]
    return f" | tiers: local, to {' + '.join(later)} in background" if later else " | tiers: local"
