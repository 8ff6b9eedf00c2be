"""The interface the runtime writes checkpoints through and resumes from.

:meth:`CheckpointBackend.save` returns once the state has been *copied*, not once it has
been written, and reports how long each phase of that handoff took, so the log line can
say where a slow handoff went. Two implementations, one module each:

``zarr`` (default, :mod:`ravex.saving.zarr`)
    writes through :mod:`ravex.format`: content-addressed Zarr v3 chunks, unchanged
    chunks reused, no pickle on the way back.
``torch_save`` (:mod:`ravex.saving.torch_save`)
    one ``step_<n>.pt`` per checkpoint, ``torch.save`` on the writer thread. Used when
    asked for, or when the format backend cannot start on local storage.

Both share the stager (reused staging buffers) and the writer thread (one write in flight).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ravex.format.history.witness import Witness

from .logline import STALL_KEY, checkpoint_line, stall_ms, stall_text
from .plan import Outcomes, SavePlan, SavingSettings
from .stager import Stager
from .writer_thread import AsyncSaver, Job

logger = logging.getLogger("ravex")

#: The manifest metadata member that marks a step as a Lightning Trainer's checkpoint (what
#: :class:`ravex.integrations.lightning.RavexCheckpointIO` writes: Lightning's tree, the file name
#: Lightning gave it as value). The runtime never restores such a step as a tree of its own.
LIGHTNING_KEY = "lightning_path"


@dataclass
class LoadedStep:
    """A step read back for resuming. ``tree`` may hold :class:`~ravex.format.ArrayRef`
    leaves: tensors not read yet, for the runtime to read straight into the live ones."""

    tree: dict[str, Any]
    #: set when the tree is one rank's view of a multi-rank (or sharded) step: the
    #: replicated sections' tensors are left unread, for the runtime to read this rank's
    #: part of each (it knows the live DTensors)
    reader: Any = None
    #: how many ranks wrote the step, and whose per-rank state (RNG, loaders) ``tree`` holds
    saved_world_size: int = 1
    saved_rank: int = 0


class CheckpointBackend(ABC):
    """Storage the runtime checkpoints to.

    Call order (all on the training thread; the writes themselves on the writer thread):

    1. :meth:`complete_steps` and :meth:`read_step`, any number of times, before the
       first save (the resume), and :meth:`resume_point` once, for a run told its step;
    2. :meth:`claim` once the timeline this run writes is known (at activation, again before
       the first save: a no-op once held);
    3. :meth:`set_run` (several ranks: the run id they agreed on), then :meth:`fork_agreed`
       where :attr:`fork_pending`, and :meth:`discard_incomplete_above`, once, before the
       first save;
    4. :meth:`save`, any number of times: each waits for the previous write, stages the
       plan's tensors and hands the copy to the writer thread (:meth:`check_claim` first);
    5. :meth:`flush` to wait for the write in flight;
    6. :meth:`close`, once.
    """

    #: short name for status() and log lines
    name: ClassVar[str] = "?"
    #: several ranks write one step together: each its part of a rank layout
    #: (:class:`~ravex.saving.plan.RankLayout`), under one run id agreed before the first
    #: write. Without it each rank writes whole trees of its own.
    multi_rank_steps: ClassVar[bool] = False
    #: writes the plan's run record (:attr:`~ravex.saving.plan.SavePlan.run_record`), so the
    #: runtime gathers one
    records_runs: ClassVar[bool] = False

    def __init__(self, url: str, as_numpy: bool, config: SavingSettings | None = None) -> None:
        self.url = url
        self._stager = Stager.for_config(as_numpy, config)  # skip_unchanged, full_stage_every
        self._saver = AsyncSaver(self._write, self._done)
        self.last_error: str | None = None
        self.last_error_step: int | None = None
        self.failures = 0
        self.written = 0
        self.last_written_step: int | None = None
        self.last_line: str | None = None
        #: where the last written checkpoint's time went, in seconds: the training loop's
        #: ``wait`` and ``stage``, the writer thread's phases (:meth:`_phases`) and
        #: ``background`` (handoff to durable); ``status()["last_write_seconds"]``
        self.last_seconds: dict[str, float] | None = None

    # ── saving ──────────────────────────────────────────────────────────

    def prepare(self, sizes: list[int]) -> None:
        """Make staging memory for tensors of these byte sizes ready in the background, so
        that the first :meth:`save` does not fault it in while the loop waits
        (:meth:`~ravex.saving.stager.Stager.prepare`)."""
        self._stager.prepare(sizes)

    @property
    def prepared(self) -> dict[str, float] | None:
        """What :meth:`prepare` made ready (bytes, wall and CPU seconds), once it is done."""
        return self._stager.prepared

    def save(self, plan: SavePlan, outcomes: Outcomes | None = None) -> dict[str, float]:
        """Stage ``plan``'s tree and queue its write. Returns the blocking phases in seconds.

        ``wait`` is the previous write still running (backpressure); ``stage`` is the
        copy into reused buffers. Both block the training loop; nothing else does. How
        the write ends is reported to ``outcomes`` from the writer thread.

        Over ``staging_max_bytes`` the tensors left unstaged go to the writer live, and this
        returns only once the writer has read them (``live``, part of the stall; its figure
        in the manifest is ``wait`` + ``stage`` only, known before the write starts).
        """
        wait = self._saver.wait_idle()
        started = time.perf_counter()
        staged = self._stager.stage(plan.tree, plan.chunk_bytes)
        stage = time.perf_counter() - started
        stall = {"wait": wait, "stage": stage}
        # each rank's stall goes into its manifest: rank 0's line names the slowest rank from there
        metadata = {**plan.metadata, STALL_KEY: stall_ms(wait, stage)}
        job_plan = dataclasses.replace(plan, tree=staged, metadata=metadata, known_digests=self._stager.known)
        job = Job(job_plan, stall, self._stager.nbytes, outcomes)
        self._saver.submit(job)
        if self._stager.live_bytes:
            job.released.wait()  # the writer reads live tensors: training may not change them yet
            stall["live"] = time.perf_counter() - started - stage
        return stall

    @abstractmethod
    def _write(self, job: Job) -> dict[str, Any]:
        """Write ``job`` durably (writer thread). Returns figures for the log line."""

    @abstractmethod
    def _describe(self, job: Job, result: dict[str, Any]) -> str:
        """The write half of the log line."""

    def _phases(self, result: dict[str, Any]) -> dict[str, float]:
        """The writer thread's phases of a written checkpoint, in seconds (default: none known)."""
        return {}

    def _done(self, job: Job, result: dict[str, Any] | None, error: BaseException | None) -> None:
        """Writer thread: log the outcome and report it to the job's ``outcomes``."""
        # the stager's figures are this job's: the next stage waits until this returns
        stall = stall_text(job.stall["wait"], job.stall["stage"], self._stager.summary())
        if error is not None:
            self.failures += 1
            self.last_error = f"step {job.step}: {type(error).__name__}: {error}"
            self.last_error_step = job.step
            logger.error(
                "ravex: checkpoint of step %d to %s FAILED, training continues and the next "
                "interval retries: %s: %s",
                job.step, self.url, type(error).__name__, error,
            )
            if job.outcomes is not None:
                job.outcomes.failed(job.step)
            return
        self.written += 1
        self.last_written_step = job.step
        self.last_error = None
        total = time.perf_counter() - job.submitted
        self.last_seconds = {**job.stall, **self._phases(result or {}), "background": total}
        self.last_line = checkpoint_line(job.step, stall, self._describe(job, result or {}), total, self.url)
        self._log_line(self.last_line)
        if job.outcomes is not None:
            job.outcomes.succeeded(job.step)

    def _log_line(self, line: str) -> None:
        """Log this rank's line for a written checkpoint (a backend whose steps span ranks
        prints one line for the job instead: :meth:`ravex.saving.zarr.ZarrBackend._log_line`)."""
        logger.info("%s", line)

    def flush(self) -> None:
        """Block until every pending checkpoint write has completed (or failed)."""
        self._saver.flush()

    def close(self) -> None:
        self._saver.close()
        self._stager.release()

    @property
    def busy(self) -> bool:
        return self._saver.busy

    def set_run(self, run_id: str | None) -> None:  # noqa: B027 - only the format records runs
        """The run id every rank's manifests carry (several ranks; None: the writer's own)."""

    def discard_incomplete_above(self, floor: int | None) -> list[int]:
        """Drop the partial writes of steps newer than ``floor`` (a crashed run's); the
        steps dropped. A backend whose writes are atomic has none."""
        return []

    def claim(self) -> None:  # noqa: B027 - only the format leases timelines
        """Take what this run writes for this run alone, or raise
        :class:`~ravex.format.errors.TimelineBusyError` naming the run that has it (another
        run still writing the same timeline: spec §21). Default: nothing to take."""

    def check_claim(self) -> None:  # noqa: B027 - only the format leases timelines
        """Raise :class:`~ravex.format.errors.LeaseLostError` once another run took over what
        :meth:`claim` took. Default: nothing to lose."""

    def durable_tier(self) -> dict[str, Any] | None:
        """With two tiers (``local:``, :mod:`ravex.saving.steps.tiers`): the durable tier's URL, the
        newest step copied there and the last copy's error; with ``replicas: 1`` the same of each
        other machine's local tier, a list under ``replicas``. None with one tier."""
        return None

    @property
    def timeline_name(self) -> str | None:
        """The timeline this run resumes from and writes to; None for a backend without timelines."""
        return None

    @property
    def fork_pending(self) -> bool:
        """Several ranks resuming an older step: a new timeline is to be forked once they agree
        on the run (:meth:`fork_agreed`)."""
        return False

    def start_fresh(self) -> str | None:
        """``resume: never`` where this run's timeline holds steps: write a new history of
        this run's own beside them (a root timeline, spec §19), none of theirs in it; with
        several ranks, once they agree on the run (:meth:`fork_agreed`). The timeline's name
        where known now; None where this backend cannot (then the run's steps collide)."""
        return None

    def fork_agreed(self, rank: int, agree: Callable[[bool], bool]) -> None:  # noqa: B027
        """Several ranks, after :meth:`set_run`: fork the pending timeline once, together;
        ``agree(ok)`` is True when ``ok`` holds on every rank. Default: nothing pending."""

    # ── reading ─────────────────────────────────────────────────────────

    @abstractmethod
    def complete_steps(self) -> list[int]:
        """Steps that can be resumed from, oldest first."""

    @abstractmethod
    def load_step(self, step: int) -> dict[str, Any] | None:
        """The state tree written at ``step``; arrays or tensors at the leaves."""

    def read_step(self, step: int, rank: int = 0, world_size: int = 1) -> LoadedStep | None:
        """``step`` as this rank resumes from it; None if it is gone."""
        tree = self.load_step(step)
        return None if tree is None else LoadedStep(tree)

    def resume_candidates(self, limit: int = 64) -> list[int]:
        """Rank 0 of several, ``resume: auto``: the steps the ranks agree among, newest first
        (at most ``limit``), the newest one known complete. Default: :meth:`complete_steps`."""
        return sorted(self.complete_steps(), reverse=True)[:limit]

    def lightning_step(self, step: int) -> bool:
        """Whether ``step`` is a Lightning Trainer's checkpoint (:data:`LIGHTNING_KEY`), not a
        tree of the runtime's own. Default: never (Lightning writes through the format only)."""
        return False

    def newest_step_guess(self, rank: int) -> int | None:
        """A rank other than 0, before the ranks can talk: the step it will most likely resume
        (rank 0 decides when they agree), found cheaply. Default: the newest complete step."""
        return self.latest_step()

    def peek_step(self, step: int, rank: int, world_size: int) -> LoadedStep | None:
        """A rank other than 0: its own per-rank sections of ``step`` (its loop position),
        before the ranks agree. Default: :meth:`read_step`."""
        return self.read_step(step, rank, world_size)

    def hand_over(self, step: int) -> bytes:
        """Rank 0: what every other rank needs to read ``step`` without reading what the
        other ranks wrote (broadcast by the runtime, :meth:`take_over`). Default: nothing."""
        return b""

    def take_over(self, payload: bytes) -> None:  # noqa: B027 - only the format hands steps over
        """Every other rank: adopt rank 0's :meth:`hand_over` before :meth:`read_step`."""

    def latest_step(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def resume_point(self, resume: int | str, follow: bool = False) -> int:
        """The step a run told ``resume: <step>`` reads, once, before :meth:`complete_steps` is
        asked again; a backend with timelines may switch to (or fork) the timeline it writes
        (:meth:`ravex.saving.steps.forks.TimelineForks.resume_point`). ``follow``: a rank other than 0
        of several, which may leave the check to rank 0. Here: a complete step number, checked
        on every rank."""
        from ravex.format.errors import StepNotFoundError

        steps = self.complete_steps()
        if resume not in steps:
            named = "" if isinstance(resume, int) else " (timelines need the default zarr backend)"
            raise StepNotFoundError(
                f"resume: {resume} but {self.url!r} has no complete step {resume}{named}; "
                f"it has {steps[-5:]}{' (newest five)' if len(steps) > 5 else ''}"
            )
        return int(resume)

    def tag(self, name: str) -> str | None:
        """Name the newest complete step so that retention never collects it; what was tagged."""
        from ravex.format.errors import RavexError

        raise RavexError(f"the {type(self).__name__} backend has no tags; tags need the default zarr backend")

    # ── the resume witness (spec §22) ───────────────────────────────────

    def write_witness(self, witness: Witness) -> None:  # noqa: B027 - only the format keeps witnesses
        """Queue this rank's witness of a step it wrote, to be written once that step is, off the
        training thread (a longer one replaces the earlier). Default: kept nowhere."""

    def read_witness(self, step: int, rank: int) -> Witness | None:
        """Rank ``rank``'s witness of ``step``, None where there is none. Raises
        :class:`~ravex.format.errors.ManifestError` for a malformed one. Default: none kept."""
        return None

    def load_latest(self) -> dict[str, Any] | None:
        step = self.latest_step()
        return None if step is None else self.load_step(step)
