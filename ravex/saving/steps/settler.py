"""Rank 0, several ranks: which of the steps it wrote every rank has completed.

A step of several ranks completes when its slowest rank commits, after rank 0's own commit has
returned. :class:`Settler` keeps rank 0's steps not yet seen complete and checks them after each
write (and at close): for a complete one, ``refs.json`` and the job's one log line
(:func:`~ravex.saving.logline.job_line`, from the ranks' manifest headers: no collective on the
training thread); for one that never will be, the line naming its missing ranks. It is the
zarr backend's (:class:`ravex.saving.zarr.ZarrBackend`), apart because it keeps its own state
and asks only the timeline.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ravex.format.reports.summary import read_manifest_header
from ravex.format.steps.refs import refs_worth_writing, write_refs

from ..logline import failed_line, job_line

logger = logging.getLogger("ravex")

#: Multi-rank steps rank 0 keeps checking for completeness (the newest ones): an older one still
#: incomplete is reported failed on its missing ranks.
PENDING_STEPS = 8
#: Seconds rank 0 waits at close for the other ranks' last manifests (they flush at exit too):
#: long enough for a write that ends with the job, short enough that a rank whose write failed
#: delays the exit little.
CLOSE_WAIT_S = 5.0


class Settler:
    """Rank 0's steps not yet seen complete on the timeline, of a job of ``world_size`` ranks
    writing the store at ``url`` (for the log lines)."""

    def __init__(self, world_size: int, url: str) -> None:
        self.world_size = world_size
        self.url = url
        self.pending: list[int] = []
        #: the job's line for the newest complete step
        self.last_job_line: str | None = None

    def settle(self, timeline: Any, step: int | None = None) -> None:
        """For each step it wrote that is now complete on ``timeline`` (``step``: one just
        written), ``refs.json`` and the job's line. A step still incomplete is checked again
        after the next write (and at :meth:`close`). Each rank writes its steps in order, one at
        a time, so a rank that wrote a later complete step finished this one: an incomplete step
        older than a complete one, or beyond the newest :data:`PENDING_STEPS`, failed on its
        missing ranks."""
        if step is not None:
            self.pending.append(step)
        newest = -1
        for pending in list(self.pending):
            try:
                complete = timeline.step_info(pending).complete
            except Exception as exc:
                logger.warning("ravex: step %d: whether every rank wrote it is unknown: %s", pending, exc)
                self.pending.remove(pending)
                continue
            if complete:
                self.pending.remove(pending)
                newest = max(newest, pending)
                self._complete(timeline, pending)
        for pending in list(self.pending):
            if pending < newest:
                self._failed(timeline, pending, f"step {newest} is complete")
            elif len(self.pending) > PENDING_STEPS:
                self._failed(timeline, pending, f"{PENDING_STEPS} newer checkpoints were written since")

    def close(self, timeline: Any) -> None:
        """The last steps' lines, once the other ranks finish (at most :data:`CLOSE_WAIT_S`)."""
        if not self.pending:
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        self.settle(timeline)
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.05)  # polling storage: the other ranks' manifests have no other signal
            self.settle(timeline)
        for step in list(self.pending):
            self._failed(timeline, step, f"not complete {CLOSE_WAIT_S:.0f} s after rank 0's last write")

    def _complete(self, timeline: Any, step: int) -> None:
        try:
            if refs_worth_writing(timeline, step):
                write_refs(timeline, step)
        except Exception as exc:  # the step is readable without it
            logger.warning("ravex: refs.json of step %d not written: %s", step, exc)
        try:
            headers = [read_manifest_header(timeline, step, r) for r in range(self.world_size)]
        except Exception as exc:  # informative only
            logger.info("ravex: checkpoint step %d (%d ranks) complete -> %s (figures unread: %s)",
                        step, self.world_size, self.url, exc)
            return
        self.last_job_line = job_line(step, headers, self.url)
        logger.info("%s", self.last_job_line)

    def _failed(self, timeline: Any, step: int, why: str) -> None:
        self.pending.remove(step)
        try:
            ranks = set(timeline.step_info(step).ranks)
        except Exception:
            ranks = set()
        missing = sorted(set(range(self.world_size)) - ranks)
        logger.warning("%s", failed_line(step, self.world_size, missing, self.url, why))
