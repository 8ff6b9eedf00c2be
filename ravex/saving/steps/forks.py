"""Which timeline a run's steps go to: ``resume: <step>`` of a step older than its timeline's
newest forks a new timeline (``<timeline>-<step>``) for the steps this run writes, so that they
never collide with the steps after it; ``resume: never`` on a timeline that holds steps starts a
root timeline of the run's own (spec §19). One process forks at once; several ranks fork once
they agree on the run id: rank 0 forks, votes so, and the others find the timeline by that id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ravex.format import CheckpointStore, RavexError
from ravex.format.history.timelines import lineage, split_ref
from ravex.format.maintenance.tiers import ensure_timelines

logger = logging.getLogger("ravex")


class TimelineForks:
    """The timeline choice of :class:`~ravex.saving.zarr.ZarrBackend`, over its store, its
    current timeline view and its run id."""

    store: CheckpointStore
    timeline: CheckpointStore
    world_size: int
    url: str
    _run_id: str | None
    #: several ranks: the fork to make once they agree, ``(owner view, step)`` (``(None, None)``:
    #: a root timeline); None when nothing is to be forked
    _fork_from: tuple[Any, int | None] | None
    _handed: tuple[int, Any] | None  # (step, its view): checked and pinned, read and handed over from here
    _drop_writer: Callable[[], None]  # the backend's: the next write opens a writer on the timeline chosen
    #: ``replicas: 1``: rank 0's machine's local tier, where rank 0 forks, when this rank's tier is
    #: another machine's (:meth:`fork_agreed` takes the timeline from there)
    fork_peer: CheckpointStore | None = None

    def resume_point(self, resume: int | str, follow: bool = False) -> int:
        """``60`` or ``exp@60``: resuming the newest step of a timeline continues that timeline;
        any older step forks a new one (``<timeline>-<step>``) for the steps this run writes, so
        they never collide with the steps after it. The newest step of the history is found
        (:meth:`~ravex.format.CheckpointStore.resume_steps`), then the step named checked complete,
        its manifests pinned for the read and the hand-over: ``2W`` manifest GETs.
        ``follow``: a rank other than 0 of several checks only that the step looks complete (its
        folder listed, rank 0's manifest read: a step that is not there stops every rank, not
        rank 0 alone); rank 0 checks it in full, hands its manifests over and tells the others
        whether it forked (:meth:`fork_agreed`)."""
        name, text = split_ref(str(resume))
        view = self.timeline if name is None else self.store.on_timeline(name)
        self.timeline = view
        owner, step = view.locate(text, check=False)
        if follow:
            if not owner.looks_complete(step):  # rank 0 stops on it: this rank too, with its error
                owner.complete_manifests(step)
            self._fork_from = (owner, step)  # if rank 0 forks
            self._drop_writer()
            return step
        history = view.resume_steps(limit=1)
        newest = (history[0][0].timeline.name, history[0][1]) if history else None
        owner.pin_step(step, owner.complete_manifests(step))  # checked: read and handed over from here
        self._handed = (step, owner)
        if newest != (owner.timeline.name, step):
            if self.world_size > 1:  # forked once the ranks agree on the run (fork_agreed)
                self._fork_from = (owner, step)
            else:
                self._fork(owner, step)
        self._drop_writer()
        return step

    def start_fresh(self) -> str | None:
        # docstring: CheckpointBackend's
        if self.world_size > 1:
            self._fork_from = (None, None)
            return None
        self._fork(None, None)
        self._drop_writer()
        return self.timeline_name

    def _fork(self, owner: Any, step: int | None) -> None:
        resumed = self.timeline.timeline.name
        if owner is None:
            self.timeline = self.store.start_root(run=self._run_id)
            return
        self.timeline = owner.fork(step, run=self._run_id)
        logger.info("ravex: step %s is not the newest of timeline %r: this run writes the new timeline %r",
                    step, resumed, self.timeline.timeline.name)

    @property
    def timeline_name(self) -> str:
        # docstring: CheckpointBackend's
        return str(self.timeline.timeline.name)

    @property
    def fork_pending(self) -> bool:
        # docstring: CheckpointBackend's
        return self._fork_from is not None

    def _forked_by_run(self, store: CheckpointStore, parent: str | None, step: int | None) -> list[Any]:
        """The timelines of ``store`` this run started from ``parent`` at ``step``."""
        return [t for t in store.timelines().values() if t.run == self._run_id and
                t.parent == parent and t.fork_step == step]

    def _adopt_fork(self, peer: CheckpointStore, parent: str | None, step: int | None) -> list[Any]:
        """This run's fork as ``peer`` holds it, created in this rank's store too (with its
        ancestors, as a step's copy would): [it], or what ``peer`` holds if not exactly one."""
        theirs = self._forked_by_run(peer, parent, step)
        if len(theirs) != 1:
            return theirs
        chain = lineage(peer.timelines(), theirs[0].name)
        made = ensure_timelines(self.store, reversed(chain))
        logger.debug("ravex: timeline %r of this run taken from %s", theirs[0].name, peer.url)
        return [made[theirs[0].name]]

    def fork_agreed(self, rank: int, agree: Callable[[bool], bool]) -> None:
        """Several ranks rolling back, after they agreed on the run id (``set_run``): rank 0
        forks the timeline, once, its document naming that run; ``agree(ok)`` (every rank, True
        when it holds on all) tells the others it exists, and each finds it by the run id. A
        failed fork fails every rank, before any writes."""
        pending, self._fork_from = self._fork_from, None
        # rank 0 decided whether to fork; a rank that took a named step unchecked learns it here
        if not agree(rank != 0 or pending is not None) or pending is None:
            self._drop_writer()
            return
        owner, step = pending
        failed: Exception | None = None
        if rank == 0:
            try:
                self._fork(owner, step)
            except Exception as exc:
                failed = exc
        asked = "resume: never" if owner is None else f"resume: {step}"
        if not agree(failed is None):
            raise RavexError(f"{asked}: rank 0 could not start this run's timeline in {self.url!r}"
                             + (f" ({type(failed).__name__}: {failed})" if failed is not None else
                                " (its error is in rank 0's output)"))
        if rank != 0:
            parent = None if owner is None else owner.timeline.name
            found = self._forked_by_run(self.store, parent, step)
            if not found and self.fork_peer is not None:  # rank 0 forked on its machine's tier
                found = self._adopt_fork(self.fork_peer, parent, step)
            if len(found) != 1:
                raise RavexError(f"{asked}: rank 0 started this run's timeline, but this rank finds "
                                 f"{len(found)} timelines started by run {self._run_id} in {self.url!r}")
            self.timeline = self.store.on_timeline(found[0].name)
        self._drop_writer()
