"""Two tiers: every checkpoint lands in a fast store on this machine (``local:``), and every
``persist_every``-th one is copied in the background to the durable store (``storage:``).

Both tiers are Ravex stores of one format, so the copy is :func:`ravex.format.copy_step`: only
the objects the durable tier lacks travel, and the step's manifests go last, so a step appears
there only complete. The copy runs on a thread of its own: the writer thread (and so training)
never waits for it; a copy still running when the next one is due is overtaken by it (the
newer step is the one worth having). Retention applies per tier: the local tier's ``keep_last``
after each commit (deferred while a copy reads from it), ``persist_keep_last`` here after each
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

from ravex.format import CheckpointStore
from ravex.format.history.witness import read_witness, write_witness
from ravex.format.objects.names import manifest_ranks

from ..logline import mib, ms

logger = logging.getLogger("ravex")

#: what the persister's thread does with a step: copy it, or copy its (grown) witness
COPY, WITNESS = "copy", "witness"


class Persister:
    """The background copy of local steps to the durable tier, one at a time, newest wins.

    ``ranks``: the ranks whose manifests this process copies (its own: every rank copies what
    it wrote, so ranks never wait on each other); rank 0 also applies the durable retention."""

    def __init__(self, durable: CheckpointStore, every: int, keep_last: int | None,
                 rank: int = 0) -> None:
        self.durable = durable
        self.every = every
        self.keep_last = keep_last
        self.rank = rank
        self.commits = 0
        self.persisted_step: int | None = None
        self.last_error: str | None = None
        self._newest_local: tuple[CheckpointStore, int] | None = None
        self._persisted: tuple[CheckpointStore, int] | None = None  # the newest step copied, and whence
        self._cv = threading.Condition()
        self._pending: tuple[str, CheckpointStore, int] | None = None
        self._copying = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ravex-persist", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return str(self.durable.url)

    def committed(self, timeline: CheckpointStore, step: int) -> bool:
        """The writer thread committed ``step`` on the local ``timeline``: queue its copy when it
        is an ``every``-th checkpoint, else bring the durable tier's newest step's witness up to
        date (:meth:`refresh_witness`). Whether the step's copy was queued."""
        self.commits += 1
        self._newest_local = (timeline, step)
        if self.commits % self.every:
            self.refresh_witness()
            return False
        self._offer((COPY, timeline, step))
        return True

    def refresh_witness(self) -> None:
        """Queue the copy of the local witness of the newest step copied (spec §22): it grows as
        the steps after it run, and a rerun that resumes that step from the durable tier checks
        itself against it. One small write; nothing when a copy is queued."""
        if self._persisted is not None and self._pending is None:
            self._offer((WITNESS, *self._persisted))

    @property
    def copying(self) -> bool:
        """A copy is queued or reading from the local tier (its retention waits)."""
        return self._copying or self._pending is not None

    def _offer(self, job: tuple[str, CheckpointStore, int]) -> None:
        with self._cv:
            self._pending = job
            self._cv.notify_all()

    def flush(self) -> None:
        """Wait until no copy is queued or running."""
        with self._cv:
            while self._pending is not None or self._copying:
                self._cv.wait()

    def close(self) -> None:
        """Copy the newest local step if it is not in the durable tier yet, wait for it, stop."""
        newest = self._newest_local
        if newest is not None and newest[1] != self.persisted_step:
            self._offer((COPY, *newest))
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._pending is None:
                    return
                (kind, timeline, step), self._pending = self._pending, None
                self._copying = True
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
            with self._cv:
                self._copying = False
                self._cv.notify_all()

    def _copy(self, timeline: CheckpointStore, step: int) -> None:
        from ravex.format import copy_step

        started = time.perf_counter()
        report = copy_step(timeline, self.durable, step, ranks=[self.rank])
        self.persisted_step = step
        self._persisted = (timeline, step)
        self.last_error = None
        collected = ""
        if self.rank == 0 and self.keep_last is not None:
            gc_started = time.perf_counter()
            try:
                self.durable.gc(keep_last=self.keep_last)
                collected = f", gc {ms(time.perf_counter() - gc_started)} ms"
            except Exception as exc:
                logger.warning("ravex: retention (gc) of %s failed after step %d: %s", self.url, step, exc)
        logger.info("ravex: step %d persisted: tiers local + storage | %d objects (%s) sent, %d already "
                    "there%s | in background %s ms -> %s", step, report.objects_copied,
                    mib(report.bytes_copied), report.objects_present, collected,
                    ms(time.perf_counter() - started), self.url)

    def _copy_witness(self, timeline: CheckpointStore, step: int) -> None:
        # unchecked: under torchrun another rank may not have committed the step here yet, and
        # this rank's own witness is all that is copied
        owner, number = timeline.locate(step, check=False)
        witness = read_witness(owner.storage, owner.steps_prefix, number, self.rank)
        if witness is not None and witness.entries:
            there = self.durable.on_timeline(owner.timeline.name)
            write_witness(there.storage, there.steps_prefix, witness)


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


def fetch(local: CheckpointStore, durable: CheckpointStore) -> int | None:
    """Copy the durable tier's newer step into the local tier (:func:`newer_in_durable`): every
    rank's manifests and witnesses (the resume checks itself against them, spec §22). The ranks of
    one machine share the local tier and each calls this: one of them copies, under the tier's
    lock, and says so; the others find the step there. The step fetched, or None."""
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
    logger.info("ravex: step %d came from the durable tier %s (the local tier %s had no step as new): "
                "%d objects (%s) in %s ms", step, durable.url, local.url, report.objects_copied,
                mib(report.bytes_copied), ms(time.perf_counter() - started))
    return step


def describe(queued: bool) -> str:
    """The tiers half of a checkpoint's line: the local tier holds it; the durable one will
    once a queued copy ends (its own line says so)."""
    return " | tiers: local, to storage in background" if queued else " | tiers: local"
