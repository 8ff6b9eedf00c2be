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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ravex.format.reports.summary import read_manifest_header
from ravex.format.steps.catalog import MANIFEST_READ_THREADS, PARALLEL_READS_FROM
from ravex.format.steps.refs import refs_worth_writing, write_refs

from ..logline import failed_line, job_line, unsettled_line

logger = logging.getLogger("ravex")

#: Multi-rank steps rank 0 keeps checking for completeness (the newest ones): an older one still
#: incomplete is reported failed on its missing ranks.
PENDING_STEPS = 8
#: Seconds rank 0 waits at close for the other ranks' last manifests (they flush at exit too):
#: long enough for a write that ends with the job, short enough that a rank whose write failed
#: delays the exit little.
CLOSE_WAIT_S = 5.0
#: Above this many ranks rank 0 writes no ``refs.json`` at each checkpoint: deciding whether it is
#: worth writing and writing it reads every rank's manifest of the step again (``W`` to ``2W``
#: GETs per checkpoint on its writer thread: ~20,000 at 10,000 ranks, minutes of sequential
#: requests that delay the next checkpoint's commit). The step is readable without it (readers
#: merge the manifests); ``ravex export STEP --format refs OUT`` writes one on demand. At or below
#: it (64 ranks: 64 to 128 small GETs) rank 0 writes it as before.
REFS_MAX_RANKS = 64


class Settler:
    """Rank 0's steps not yet seen complete on the timeline, of a job of ``world_size`` ranks
    writing the store at ``url`` (for the log lines)."""

    def __init__(self, world_size: int, url: str) -> None:
        self.world_size = world_size
        self.url = url
        self.pending: list[int] = []
        #: what the job's line of a step ends with: where the step goes besides this store (the
        #: tiers half, with ``local:``), set by the backend as it writes the step
        self.tiers: dict[int, str] = {}
        #: the job's line for the newest complete step
        self.last_job_line: str | None = None
        self._refs_skip_said = False  # above REFS_MAX_RANKS: said once, at the first complete step

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
        self.tiers = {s: text for s, text in self.tiers.items() if s in self.pending}  # said, or never will be

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
            self.pending.remove(step)
            logger.warning("%s", unsettled_line(step, self.world_size, self._missing(timeline, step),
                                                self.url, CLOSE_WAIT_S))

    def _complete(self, timeline: Any, step: int) -> None:
        try:
            if self.world_size > REFS_MAX_RANKS:
                self._say_no_refs(timeline, step)
            elif refs_worth_writing(timeline, step):
                write_refs(timeline, step)
        except Exception as exc:  # the step is readable without it
            logger.warning("ravex: refs.json of step %d not written: %s", step, exc)
        try:
            headers = _headers(timeline, step, self.world_size)
        except Exception as exc:  # informative only
            logger.info("ravex: checkpoint step %d (%d ranks) complete -> %s (figures unread: %s)",
                        step, self.world_size, self.url, exc)
            return
        self.last_job_line = job_line(step, headers, self.url) + self.tiers.get(step, "")
        logger.info("%s", self.last_job_line)

    def _say_no_refs(self, timeline: Any, step: int) -> None:
        if self._refs_skip_said:
            return
        name = getattr(getattr(timeline, "timeline", None), "name", "main")
        ref = f"step_{step}" if name == "main" else f"{name}@{step}"
        self._refs_skip_said = True
        logger.info("ravex: %d ranks: no refs.json is written with each checkpoint above %d ranks (it would "
                    "read every rank's manifest again, on rank 0, each time); the steps read as they are, and "
                    "`ravex export %s --format refs refs.json` writes one on demand (a zarr/kerchunk "
                    "reader's reference file)", self.world_size, REFS_MAX_RANKS, ref)

    def _failed(self, timeline: Any, step: int, why: str) -> None:
        self.pending.remove(step)
        logger.warning("%s", failed_line(step, self.world_size, self._missing(timeline, step), self.url, why))

    def _missing(self, timeline: Any, step: int) -> list[int]:
        """The ranks whose manifest of ``step`` is not there (every rank where unknown)."""
        try:
            ranks = set(timeline.step_info(step).ranks)
        except Exception:
            ranks = set()
        return sorted(set(range(self.world_size)) - ranks)


def _headers(timeline: Any, step: int, world_size: int) -> list[dict[str, Any]]:
    """Every rank's manifest header of ``step`` (one ranged GET each), rank 0 first, read
    :data:`~ravex.format.steps.catalog.MANIFEST_READ_THREADS` at a time from 8 ranks on."""
    if world_size < PARALLEL_READS_FROM:
        return [read_manifest_header(timeline, step, r) for r in range(world_size)]
    with ThreadPoolExecutor(max_workers=min(MANIFEST_READ_THREADS, world_size),
                            thread_name_prefix="ravex-headers") as pool:
        return list(pool.map(lambda r: read_manifest_header(timeline, step, r), range(world_size)))
