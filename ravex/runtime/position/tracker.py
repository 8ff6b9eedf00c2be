"""The runtime's one handle on where the user's loops stand: :class:`LoopPosition`.

The runtime (:mod:`ravex.runtime.counting.cadence`, :mod:`ravex.runtime.restoring.resume`) decides *when* a
checkpoint is taken and *what* is restored; this object holds everything about *where* in the
loops that happens: on the first run the watch that takes a due checkpoint at a loop's head,
what each checkpoint records of the loops (and a finished run's way past them), and on the
rerun the re-entry back to the recorded position. It calls the runtime back only through the
functions it is handed (take a checkpoint here, restore here, the position is lost).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from . import frames, source
from .capture import (
    capture,
    capture_after,
    capture_end,
    capture_past,
    capture_variables,
    changed,
    describe,
    feeding_loop,
    innermost_frame,
)
from .headwatch import HeadWatch
from .reentry import EnumerateFrom, Reentry

logger = logging.getLogger("ravex")


class LoopPosition:
    """Where the user's loops stand, for one runtime (see the module docstring)."""

    def __init__(self, wanted: str | list[str]) -> None:
        self.wanted = wanted  #: ``script_variables``: what of the loops' variables is saved
        self.watch: HeadWatch | None = None  # taking a due checkpoint at the next loop head
        self.head_frame: FrameType | None = None  # the frame at its loop head, while its checkpoint is taken
        #: the position of this run's last checkpoint in a loop (or the one it resumed), with
        #: the main script's file: a finished run's way past its training is read from it
        self.last: tuple[dict[str, Any], str] | None = None
        #: the frames of :attr:`last`, outermost first: a function's frame keeps its variables
        #: once it has returned, so a finished run's loop is recorded as it ended (:meth:`finish`)
        self.last_frames: list[FrameType] = []
        self.after: dict[str, Any] | None = None  # a finished run's position past its training
        self.reentry: Reentry | None = None  # the rerun going back to the recorded position
        self.enumerate: EnumerateFrom | None = None  # enumerate's count in the resumed epoch
        #: the user's code on the stack at the optimizer step that made the pending checkpoint
        #: due (:meth:`note_due`): a generator not among it only feeds the loop that steps
        self.stepping: frozenset[CodeType] = frozenset()
        self._unsaved_said = False
        self._start_over_said = False

    # ── the first run ──────────────────────────────────────────────────

    def watching(self) -> bool:
        return self.watch is not None and not self.watch.done

    def watch_from(self, frame: FrameType | None, take: Callable[[FrameType], None],
                   left: Callable[[FrameType | None], None]) -> bool:
        """Watch the innermost frame of the user's code at or outside ``frame`` that is in a
        loop, to ``take`` the checkpoint at its head (``left`` when it leaves the loop first);
        False where no frame can be watched."""
        self.watch = None
        frame = innermost_frame(frame)
        while frame is not None:
            self.watch = HeadWatch.arm(frame, take, left)
            if self.watch is not None:
                return True
            frame = innermost_frame(frame.f_back)
        return False

    def stop_watch(self) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.stop()

    def note_due(self, frame: FrameType | None) -> None:
        """The optimizer step that makes a checkpoint due, with ``frame`` its innermost user frame."""
        self.stepping = frozenset(f.f_code for f in frames.user_frames(frame))

    def record(self, frame: FrameType | None, mode: str) -> dict[str, Any] | None:
        """What a checkpoint taken with ``frame`` (the innermost frame of the user's code) at
        ``mode`` records of the loops (:func:`.capture.capture`; ``"loop"``: only the variables,
        ``ravex.loop`` saves the positions); said once when a carried variable cannot be saved.
        A batch drawn inside a generator of the user's that only feeds a loop (its code was not
        on the stack when the checkpoint fell due) is that loop's header: the position is the
        loop's, waiting on its ``for``, and a rerun makes the generator anew."""
        if frame is None:
            return None
        if mode == "header":
            frame = feeding_loop(frame, self.stepping)
        script, unsaved = (capture_variables(frame, self.wanted) if mode == "loop"
                           else capture(frame, mode, self.wanted))
        main_file = frames.main_file()
        if script is not None and mode != "loop" and main_file:
            self.last = (script, main_file)
            self.last_frames = frames.user_frames(frame)
        if script is None and mode == "header":
            self._say_loops_start_over(frame)
        if unsaved and not self._unsaved_said and script is not None:
            self._unsaved_said = True
            logger.warning("ravex: the loop in %s carries %s from one iteration to the next, "
                           "which a checkpoint cannot hold (only tensors, numbers, strings and "
                           "lists/tuples/dicts of them): a resumed run has them as the code before "
                           "the loop sets them; `script_variables: none` in ravex.yaml silences this",
                           frame.f_code.co_filename, ", ".join(unsaved))
        return script

    def _say_loops_start_over(self, frame: FrameType) -> None:
        """Once: a checkpoint taken at a DataLoader's ``next()`` that no loop of the user's draws
        itself (a helper that prefetches, called from a loop's body) records no loop position: a
        rerun resumes the state and the data, and the loops around it start over."""
        if self._start_over_said:
            return
        loops = []
        for f in frames.user_frames(frame):
            code = f.f_code
            place = source.place(code.co_filename, code.co_name, code.co_firstlineno, f.f_lineno, "call")
            if place is not None and place.loops:
                if f is frame:
                    return  # a loop of its own draws: the position failed for another reason, said where it did
                loops.append(f"{os.path.basename(code.co_filename)}:{place.loops[-1].line}")
        if not loops:
            return
        self._start_over_said = True
        code = frame.f_code
        logger.warning("ravex: this run's checkpoints are taken at a DataLoader's next() in %s (%s:%d), which "
                       "no loop draws itself: a rerun resumes the state and the data exactly, but the loop "
                       "at %s starts over, with its variables (counters, meters, lists) as the code before "
                       "it sets them; a loop whose `for` or `while` draws the batches is resumed with them",
                       code.co_name, os.path.basename(code.co_filename), frame.f_lineno, loops[-1])

    def past_loop(self, frame: FrameType | None) -> dict[str, Any] | None:
        """The watched loop ended and ``frame``, alive, stands right past the outermost loop of
        this run's last position (at the line after it, or after the call that ran it), in no
        other loop: the position there, as a finished run's (mode ``"after"``), with what the
        code after it reads of the frame's variables. A checkpoint due at the last step is
        taken here, so that a rerun skips the training. None where ``frame`` is elsewhere or
        a variable needed cannot be saved."""
        frame = innermost_frame(frame)
        if frame is None or self.last is None:
            return None
        script, main_file = self.last
        self.after = capture_past(script, main_file, frame, self.wanted)
        if self.after is not None:  # the loop as it ended, where it can decide again on a rerun
            self.after = capture_end(script, main_file, self.last_frames, self.wanted) or self.after
        return self.after

    def finish(self) -> bool:
        """The run ended normally: record its training loop as it ended (:attr:`after`, the
        exit checkpoint's position; :func:`.capture.capture_end`), so that a rerun lets the
        loop decide whether it trains on, or where that loop cannot decide again, its way past
        the training (:func:`.capture.capture_after`). False where its loops' position was
        known but neither can be recorded: then no exit checkpoint may be taken (the last one
        in the loop stays the resume point, and a rerun replays the steps after it exactly)."""
        if self.last is None or frames.user_frames(sys._getframe()):
            return True
        self.after = (capture_end(*self.last, self.last_frames, self.wanted)
                      or capture_after(*self.last, self.wanted))
        return self.after is not None

    def last_place(self) -> str:
        """``file:line`` of the loop of this run's last position."""
        return describe(self.last[0]) if self.last is not None else "?"

    # ── the rerun ──────────────────────────────────────────────────────

    def reenter(self, script: dict[str, Any], step: int, restore: Callable[[list[FrameType]], None],
                lost: Callable[[str], None], caller: FrameType | None) -> bool:
        """Go back to ``script``, the position step ``step`` recorded: trace the rerun there
        (:class:`.reentry.Reentry`), calling ``restore`` with the live frames when it gets
        there and ``lost`` when it cannot. False, said once, where this interpreter or this
        script (edited, renamed) cannot be re-entered: the caller restores the usual way."""
        if not frames.supported():
            logger.warning("ravex: checkpoint step %s was taken in the loop at %s, but this "
                           "interpreter's frames cannot be re-entered (CPython 3.11/3.12 without "
                           "another trace function can): the checkpoint is restored at the first "
                           "forward pass and the loop starts over", step, describe(script))
            return False
        main_file = frames.main_file()
        moved = changed(script, main_file) if main_file else "the main script has no file"
        if moved is not None:
            logger.warning("ravex: checkpoint step %s was taken in the loop at %s, but %s: the "
                           "checkpoint is restored at the first forward pass and the loop starts "
                           "over (a new `storage` starts afresh)", step, describe(script), moved)
            return False
        self.reentry = Reentry(script, restore, lost)
        if script["mode"] == "header":
            self.enumerate = EnumerateFrom()
            self.enumerate.install()
        self.reentry.start(caller)
        return True

    def drop_enumerate(self) -> None:
        """The resumed epoch is running: ``enumerate`` is the builtin again."""
        shim, self.enumerate = self.enumerate, None
        if shim is not None:
            shim.uninstall()

    def give_up(self) -> Reentry | None:
        """The recorded position cannot be reached: stop going back there; the re-entry it was."""
        reentry, self.reentry = self.reentry, None
        if reentry is not None:
            reentry.stop()
            self.drop_enumerate()
        return reentry

    def stop(self) -> None:
        """Shutdown: no trace function, no ``enumerate`` of ours left behind, and no frame held
        (a returned function's frame keeps its model and loader alive)."""
        self.last_frames = []
        self.head_frame = None
        self.stop_watch()
        if self.reentry is not None:
            self.reentry.stop()
        self.drop_enumerate()
