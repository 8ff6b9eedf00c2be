"""Ending a run on a signal (``checkpoint_on_signal``), and what several ranks must decide
together: a caught signal and the clock's due checkpoint go through one poll
(:class:`.collectives.Poll`), so every rank checkpoints, or exits after, the same step.

Apart from :class:`.cadence.Cadence` because a handler runs between two bytecodes and must
only set a flag, and because its state (the previous handlers, the signal caught, whether the
run crashed) outlives any one checkpoint; the cadence asks it whether a checkpoint is due and
whether the run is to end.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Protocol

from ..config import RavexConfig
from ..distributed import collectives

logger = logging.getLogger("ravex")


class Counted(Protocol):
    """What the signals ask of the cadence they serve: where the run stands."""

    step: int
    rank: int
    world_size: int
    pid: int

    @property
    def steps_here(self) -> int: ...


class ExitSignals:
    """The signals that end the run with a checkpoint, and the poll the ranks decide by."""

    def __init__(self, config: RavexConfig, run: Counted) -> None:
        self.config = config
        self.run = run
        #: the signal that ends the run after the checkpoint at the next step boundary
        self.caught: int | None = None
        #: an uncaught exception ended the training (the excepthook, :mod:`.lifecycle`)
        self.crashed = False
        self.poll: collectives.Poll | None = None  # several ranks: shared decisions
        self.previous: dict[int, Any] = {}  # the handlers ours replaced, by signal

    def install(self) -> None:
        if self.run.world_size > 1:  # decisions all ranks must share go through one poll
            self.poll = collectives.Poll(self.config.checkpoint_every_seconds)
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.config.checkpoint_on_signal:
            signum = getattr(signal, name)
            try:
                self.previous[signum] = signal.signal(signum, self.handle)
            except (ValueError, OSError) as exc:  # pragma: no cover
                logger.warning("ravex: cannot handle %s: %s", name, exc)

    def restore(self) -> None:
        for signum, previous in self.previous.items():
            try:
                if signal.getsignal(signum) == self.handle:
                    signal.signal(signum, previous)
            except (ValueError, OSError):  # pragma: no cover
                pass
        self.previous.clear()

    def agree(self, time_due: bool) -> bool:
        """Whether a checkpoint is due, the clock saying ``time_due`` here. With several ranks
        also: a signal caught by any rank?

        Under torchrun both are decided collectively: at a step every rank reaches, rank 0's
        clock and any rank's caught signal are exchanged in one tiny all-reduce, so every rank
        checkpoints (or exits after) the same step. The first call at a new step comes from the
        optimizer step hook; later calls at that step (DataLoader boundaries) find the poll done
        and change nothing.
        """
        poll = self.poll
        timed = self.config.checkpoint_every_seconds or self.config.checkpoint_every == "auto"
        if poll is None or not (timed or self.previous) or not collectives.can_agree():
            return time_due
        run = self.run
        if run.steps_here == 0 or not poll.due(run.step):
            return False
        due, signum = poll.exchange(run.step, run.rank, time_due)
        if signum and self.caught is None:
            self.caught = signum
            logger.warning("ravex: %s caught by a rank; every rank checkpoints step %d at the next "
                           "step boundary, then exits", signal.Signals(signum).name, run.step)
        return due

    def handle(self, signum: int, frame: Any) -> None:
        """Checkpoint at the next step boundary, then exit with 128+signum.

        The handler runs between two bytecodes, possibly halfway through
        ``optimizer.step()``, so it only sets a flag. Outside a training loop, or on a
        second signal, the signal gets its previous behaviour at once. With several ranks
        the flag waits for the next poll (:meth:`agree`), where every rank learns of
        it: a signal that reached one rank alone still stops all of them at the same step.

        After an uncaught exception no step boundary comes: the exit is under way (the flush
        of what is being written, the timeline's lease released), and the signal is let wait
        for it, saying so; a second one gets the previous behaviour. Under torchrun that is a
        failed node's agent stopping the ranks still running (a peer died, an all-reduce
        raised): they were told that every rank would checkpoint at the next agreed step.
        """
        run = self.run
        if self.crashed and self.caught is None and os.getpid() == run.pid:
            self.caught = signum  # a second signal does not wait
            logger.warning("ravex: %s received after the run crashed at step %d: exiting once what is "
                           "being written is flushed (no checkpoint of this step); a second %s exits at once",
                           signal.Signals(signum).name, run.step, signal.Signals(signum).name)
            return
        training = run.steps_here > 0
        poll = self.poll
        shared = poll is not None and collectives.can_agree()
        if (os.getpid() != run.pid or self.caught is not None or not training
                or (poll is not None and shared and poll.pending)):
            previous = self.previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        if poll is not None and shared:
            poll.pending = signum
            logger.warning("ravex: %s received at step %d on rank %d; all ranks checkpoint at "
                           "the step they next agree on, then exit", signal.Signals(signum).name,
                           run.step, run.rank)
            return
        self.caught = signum
        logger.warning("ravex: %s received at step %d; checkpointing at the next step "
                       "boundary, then exiting", signal.Signals(signum).name, run.step)
