"""When checkpoints are taken: step counting, the step boundary, time and signals, and the
taking itself (a typed plan handed to the backend).

Where a checkpoint is taken matters as much as what is in it. The optimizer step only
marks a checkpoint *due*; it is taken at the next step boundary, which is the next
``next()`` on a DataLoader iterator, before the batch is fetched. By then the whole loop
body of the finished step has run (``scheduler.step()``, logging, RNG draws after the
optimizer step), so the saved state is exactly "between two steps". Loops without a
DataLoader get theirs at the next forward pass (a loop that runs a forward between two
optimizers' steps is then checkpointed between them; give it a DataLoader for exactness),
and a loop wrapped in ``ravex.loop`` at the start of its next iteration (:mod:`.loops`),
which also counts the steps of a loop that has no ``torch.optim`` optimizer.

A script that runs backward passes but neither steps an optimizer nor wraps its loop
would never be checkpointed; it is told so once, within its first steps.

The jobs that keep state of their own are collaborators the cadence holds: counting backward
passes (:mod:`.backward`), the exit signals and the poll several ranks decide by
(:mod:`.signals`), what a checkpoint is handed to the backend as (:mod:`.contents`) and the
storage breaker (:mod:`.breaker`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import torch

from ravex.errors import LeaseLostError, RestoreError, TimelineBusyError
from ravex.saving.backend import CheckpointBackend
from ravex.saving.plan import SavePlan

from .. import position
from ..config import RavexConfig
from ..distributed import collectives
from ..position import Loop
from ..recording.loss import LastLoss
from ..recording.witness import ResumeWitness
from ..restoring.resume import Resume
from ..state.plan import collect, drained_ahead
from ..state.registry import LoaderState
from .autocadence import AutoInterval
from .backward import BackwardSteps
from .breaker import CircuitBreaker
from .contents import CheckpointContents
from .signals import ExitSignals

logger = logging.getLogger("ravex")


class Cadence(Resume):
    """The runtime's checkpointing half: counting, deciding where, taking."""

    def __init__(self, config: RavexConfig) -> None:
        super().__init__(config)
        self.pid = os.getpid()
        #: skips due checkpoints while the storage is down; a test may put its own here
        self.breaker = CircuitBreaker(where=config.storage.url)
        self.backend_error: str | None = None
        self.checkpoint_error: str | None = None
        self.last_stall: dict[str, float] | None = None
        self._due = False
        self._steps_here = 0
        self._last_time = time.monotonic()
        #: a signal ends the run after a checkpoint; several ranks decide together
        self.signals = ExitSignals(config, self)
        self._prepared_writes = False
        self._forward_hook: Any = None
        self._at_loop: Loop | None = None  # the wrapped loop whose boundary takes the checkpoint
        self._loop_ended: dict[str, Any] | None = None  # the last outermost loop that finished
        self._watch: BackwardSteps | None = None
        #: the tensor the last backward() ran on, read as each checkpoint's loss
        self.last_loss = LastLoss()
        #: records the steps after each checkpoint, and checks a resume against them
        self.witness = ResumeWitness(config, self.rank, self.world_size, self.last_loss)
        #: what each checkpoint is handed to the backend as
        self.contents = CheckpointContents(config, self.registry, self.rank, self.world_size, self.pid,
                                           self.last_loss, self.witness)
        #: ``checkpoint_every: auto``: the interval from the measured cost and the MTBF
        self.auto = AutoInterval(config.mtbf, config.max_overhead) if config.checkpoint_every == "auto" else None

    @property
    def steps_here(self) -> int:
        """Optimizer steps this process has taken (a resumed run counts from 0 again)."""
        return self._steps_here

    def _open_backend(self) -> bool:
        from ravex.saving.selection import get_backend

        if self.backend is not None:
            return True
        try:
            self.backend = get_backend(self.config, self.rank, self.world_size)
            self.backend_error = None
            return True
        except Exception as exc:
            self.backend_error = f"{type(exc).__name__}: {exc}"
            logger.error("ravex: cannot open storage %s (%s); training continues, "
                         "the next checkpoint interval retries", self.config.storage.url,
                         self.backend_error)
            return False

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global optimizer post-step hook: count, and checkpoint when due.

        With several optimizers stepping once per iteration each, the step count is the
        most any one of them has taken: one per iteration, not one per optimizer.
        """
        if not self.enabled:
            return
        n = self.registry.optimizer_steps(optimizer) + 1
        self.registry.set_optimizer_steps(optimizer, n)
        if n <= self.step:
            return
        self._step_done(n)

    def on_backward_step(self) -> None:
        """A backward pass of a loop without an optimizer (:class:`.backward.BackwardSteps`): a step."""
        if not self.enabled:
            return
        self._step_done(self.step + 1)

    def _step_done(self, n: int) -> None:
        """Step ``n`` is done; a checkpoint it makes due, in a loop that neither a DataLoader
        nor ``ravex.loop`` marks, is taken where the script's loop starts its next iteration."""
        self._count_step(n)
        if (self._due or self.signals.caught is not None) and not (self.loops or self._loader_active()):
            self._await_loop_head()

    def _count_step(self, n: int) -> None:
        """Step ``n`` is done: count it, and mark a checkpoint due on the interval or clock."""
        self.witness.step_done(n)
        self.lookahead.stepped()
        self.step = n
        self._steps_here += 1
        if self._steps_here == 1:
            self.contents.keep_alive()
            self.contents.prepare_staging(self.backend)
        every = self.config.fixed_every
        auto = self.auto
        if auto is not None:
            auto.stepped(time.monotonic())
        if (every and n % every == 0) or (auto is not None and auto.due_by_count(n - (self.last_checkpoint_step or 0))):
            self._due = True
            self.loop_position.note_due(position.innermost_frame(sys._getframe(1)))
        self._check_time()

    def loop_boundary(self, loop: Loop, ran: bool) -> None:
        """A wrapped loop is about to fetch its next item: the step boundary. ``ran``: an
        iteration of it has just finished, which is a step when it ran no nested wrapped
        loop and there is no optimizer to count steps."""
        if not self.enabled:
            return
        if ran:
            self._loops_pending(loop)
        if ran and not loop.nested and not self.registry.live("optimizers"):
            self._count_step(self.step + 1)
        elif not self._due:
            self._check_time()
        if self._due or self.signals.caught is not None:
            self._clear_forward_hook()
            self._at_loop = loop
            try:
                self._boundary(None)
            finally:
                self._at_loop = None

    def leave_loop(self, loop: Loop, finished: bool) -> None:
        """A wrapped loop ended (or was left by ``break``, an exception, the generator's close)."""
        if loop in self.loops:
            self.loops.remove(loop)
        if finished and self.enabled:
            self._loops_pending(loop)
            if not self.loops:
                self._loop_ended = {"site": loop.site, "at": loop.yielded, "boundary": True}

    def _loop_positions(self) -> list[dict[str, Any]]:
        """Where each running wrapped loop stands, outermost first (:mod:`.loops`): the loop
        taking the checkpoint at its boundary resumes at its next iteration, every other at
        the iteration in progress. With none running, the last outermost one that ended."""
        if not self.loops:
            return [self._loop_ended] if self._loop_ended is not None else []
        return [{"site": loop.site, "boundary": loop is self._at_loop,
                 "at": loop.yielded if loop is self._at_loop else max(loop.yielded - 1, 0)}
                for loop in self.loops]

    def _await_loop_head(self) -> None:
        """No DataLoader to mark the step boundary: take the checkpoint where the script's
        loop starts its next iteration (:class:`.position.headwatch.HeadWatch`), a point a rerun can
        come back to; where that loop cannot be watched, at the next forward pass."""
        if self.loop_position.watching():
            return
        self._watch_from(sys._getframe(1))

    def _watch_from(self, frame: FrameType | None) -> None:
        """Watch the innermost frame of the user's code at or outside ``frame`` that is in a loop."""
        self.loop_position.watch = None
        due = self.enabled and (self._due or self.signals.caught is not None)
        if due and self.loop_position.watch_from(frame, self._at_loop_head, self._watch_from):
            return
        if due and self.loop_position.past_loop(frame) is not None:
            self._clear_forward_hook()
            try:
                self._boundary(None)  # the training is over: taken here, past it (_script_position)
            finally:
                self.loop_position.after = None  # not left for a later checkpoint, if this one was skipped
            return
        self._await_next_forward()

    def _at_loop_head(self, frame: FrameType) -> None:
        self.loop_position.watch = None
        if not self.enabled or not (self._due or self.signals.caught is not None):
            return
        self._clear_forward_hook()
        self.loop_position.head_frame = frame
        try:
            self._boundary(drained_ahead(self.registry))
        finally:
            self.loop_position.head_frame = None

    def _await_next_forward(self) -> None:
        """No DataLoader to mark the step boundary: use the next forward pass instead.

        Right after ``optimizer.step()`` the iteration is not over (a second optimizer,
        ``scaler.update()``, ``scheduler.step()`` may follow); the next forward pass is the
        first point where it surely is. The hook exists only while a checkpoint is due.
        """
        if self._forward_hook is not None:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook

        def before_forward(module: Any, args: Any) -> None:
            self._clear_forward_hook()
            if self.enabled and (self._due or self.signals.caught is not None):
                self._boundary(None)

        self._forward_hook = register_module_forward_pre_hook(before_forward)

    def _clear_forward_hook(self) -> None:
        hook, self._forward_hook = self._forward_hook, None
        if hook is not None:
            hook.remove()

    def at_boundary(self, st: LoaderState) -> None:
        """``next()`` on a DataLoader iterator, before the batch is fetched."""
        if not self.enabled:
            return
        if self.loop_position.enumerate is not None:
            self.drop_enumerate()
        if st.explicit_next is None:
            st.explicit_next = position.drawn_explicitly(sys._getframe(2))
        if not self._due:
            self._check_time()
        if self.loop_position.watching() and (st.explicit_next or not torch.is_grad_enabled()):
            # the loop's head takes it, where a rerun can come back to; a loader drawn with
            # gradients off is an evaluation's between two epochs, not the training loop's
            return
        if self._due or self.signals.caught is not None:
            self._clear_forward_hook()
            self._boundary(st)

    def _check_time(self) -> None:
        """Time-based checkpoint due? With several ranks also: a signal caught by any rank?
        Several ranks decide both together (:meth:`.signals.ExitSignals.agree`)."""
        seconds = self.config.checkpoint_every_seconds or (self.auto.seconds if self.auto is not None else None)
        time_due = bool(seconds and self.step != self.last_checkpoint_step
                        and time.monotonic() - self._last_time >= seconds)
        if self.signals.agree(time_due):
            self._due = True

    def _boundary(self, st: LoaderState | None) -> None:
        if self.signals.caught is not None:
            self._checkpoint_now(st, reason=signal.Signals(self.signals.caught).name)
            if self.backend is not None:
                self.backend.flush()
            # Every rank is here at the same step (the signal was agreed on): wait until all
            # have flushed, or the first rank to exit makes torchrun SIGTERM the others
            # before their manifests are written, leaving the step incomplete.
            collectives.all_ok(True)
            code = 128 + self.signals.caught
            logger.warning("ravex: checkpoint of step %d flushed; exiting with status %d",
                           self.step, code)
            raise SystemExit(code)
        self._checkpoint_now(st, reason="interval")

    def _loader_active(self) -> bool:
        """A DataLoader epoch is under way whose ``next()`` marks the step boundary: one a
        ``for`` (the user's or a framework's) draws, not a ``next(it)`` in a loop's body."""
        for loader in self.registry.live("loaders"):
            st = self.registry.state_of(loader)
            if st is not None and st.epoch >= 0 and not st.exhausted and not st.explicit_next:
                return True
        return False

    def checkpoint(self, force: bool = True) -> bool:
        """``ravex.checkpoint()``: take one now. True if it was handed to the writer."""
        return self._checkpoint_now(None, reason="manual", force=force)

    def _checkpoint_now(self, st: LoaderState | None, reason: str, force: bool = False) -> bool:
        """Take a checkpoint unless the storage breaker is cooling down (:mod:`.breaker`):
        then a due or manual one is skipped (False). The exit and signal checkpoints are
        the last chance and always try. With several ranks all skip when any rank's
        breaker would (one small all-reduce per checkpoint).
        """
        self._due = False
        self._last_time = time.monotonic()
        self.loop_position.stop_watch()
        if not force and self.step == self.last_checkpoint_step:
            return False
        breaker = self.breaker
        agree = collectives.all_ok if self.world_size > 1 else None
        if not (reason == "exit" or self.signals.caught is not None or breaker.allow(agree)):
            return False  # storage down (here or on another rank): skipped at no cost, training goes on
        if not self._open_backend():
            self.checkpoint_error = self.backend_error
            breaker.failed(self.step)
            return False
        backend = self.backend
        assert backend is not None
        try:
            self.ensure_restored()
            if not self.enabled:  # it stood down instead (a Lightning step found, no Trainer)
                return False
            if not self._prepared_writes:
                self._prepare_writes(backend)
                self._prepared_writes = True
            backend.check_claim()
            self.last_stall = backend.save(self._plan(backend, st, reason), breaker)
        except (TimelineBusyError, LeaseLostError) as exc:
            if reason == "exit":  # said when the lease was lost; nothing to stop any more
                logger.error("ravex: no exit checkpoint: %s", exc)
                return False
            raise
        except RestoreError:
            raise
        except Exception as exc:
            self.checkpoint_error = f"step {self.step}: {type(exc).__name__}: {exc}"
            logger.error("ravex: checkpoint of step %d failed before writing, training "
                         "continues: %s", self.step, self.checkpoint_error)
            breaker.failed(self.step)
            return False
        self.checkpoint_error = None
        self.last_checkpoint_step = self.step
        if reason != "exit":
            self.witness.checkpoint_taken(self.step, backend)
            said = self.auto.checkpointed() if self.auto is not None else None
            if said is not None:
                self._say_for_job(logging.INFO, "%s", said)
        return True

    def _prepare_writes(self, backend: CheckpointBackend) -> None:
        """Once, before this process's first write: hold the timeline's lease (taken at
        activation unless the storage failed then, or a fork waited for the ranks), then drop
        a crashed run's partial steps. With several ranks that is part of their agreement (run
        without a resume, ``resume: never``, it runs here)."""
        if self.world_size > 1:
            if backend.multi_rank_steps and not self.reading.run_agreed:
                self.reading.agree_on_steps(backend, [])
            backend.claim()
            return
        backend.claim()
        latest = backend.latest_step()
        backend.discard_incomplete_above(max(s for s in (self.resumed_from, latest, -1) if s is not None))

    def _plan(self, backend: CheckpointBackend, st: LoaderState | None, reason: str) -> SavePlan:
        """The live objects as this checkpoint's :class:`~ravex.saving.plan.SavePlan`
        (:meth:`.contents.CheckpointContents.plan`), with where the loops stand."""
        tree = collect(self.registry, self.step, st, self._loop_positions(), self._script_position(st, reason))
        return self.contents.plan(backend, self.step, tree, reason)

    def _script_position(self, st: LoaderState | None, reason: str) -> dict[str, Any] | None:
        """Where the main script's loops stand (:mod:`.position`), for a checkpoint taken at
        the head of a loop or at a DataLoader loop's ``next()``, or only the variables its
        loops carry at a ``ravex.loop`` boundary (which saves the positions); None elsewhere.
        Under torchrun each rank records its own (every rank takes the checkpoint at the same
        step and so at the same place in the loop)."""
        frame: FrameType | None
        after, self.loop_position.after = self.loop_position.after, None
        if after is not None:  # past the training: at exit, or where its loop ended
            return after
        if self.loops:
            frame, mode = position.innermost_frame(sys._getframe(1)), "loop"
        elif self.loop_position.head_frame is not None:
            frame = self.loop_position.head_frame
            mode = "drawn" if st is not None else "head"
        elif st is not None:
            frame, mode = position.innermost_frame(sys._getframe(1)), "header"
        else:
            return None
        return self.loop_position.record(frame, mode)

    def exit_checkpoint(self) -> None:
        """The checkpoint of a run that ended normally, at its position past its training
        (:func:`.position.capture.capture_after`), so that a rerun runs only what follows the
        training. Where the loop's position was known but no way past it can be recorded,
        none is taken: the last checkpoint taken in the loop stays the resume point, and a
        rerun replays the steps after it exactly, rather than restoring the final state
        at the top of the loop and training on."""
        if not self.loop_position.finish():
            self._say_for_job(logging.INFO, "ravex: finished at step %d; the code after the training loop at %s "
                              "needs what no checkpoint holds, so step %s stays the resume point (a rerun "
                              "replays the steps after it exactly)", self.step, self.loop_position.last_place(),
                              self.last_checkpoint_step)
            return
        self._checkpoint_now(None, reason="exit")

    def flush(self) -> None:
        if self.backend is not None:
            self.backend.flush()

    def _start_watch(self) -> None:
        """Count backward passes as steps where no optimizer step or wrapped loop would."""
        self._watch = BackwardSteps(self)

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
