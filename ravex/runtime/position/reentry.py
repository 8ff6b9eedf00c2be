"""The rerun: back to the loop position a checkpoint recorded (:mod:`.position`).

:class:`Reentry` watches the recorded frames from activation on. At the body of each
recorded ``for`` it draws from the statement's own iterator (:mod:`.frames`) until the loop
variables equal the recorded ones, so the iterations already done never run again (no
``scheduler.step()`` of a finished epoch, no ``torch.save`` of stale weights, no printed
line). A ``while`` needs no drawing: its position is its variables. Once every loop around
the checkpoint is positioned, the checkpoint is restored right there, with the script's
variables, before the resumed iteration's body runs; a DataLoader loop instead restores at
the loader's ``iter()`` and skips the consumed batches at its sampler, with ``enumerate``'s
count carried on (:class:`EnumerateFrom`). A run that finished recorded its outermost loop as
it ended: the rerun goes back into it and lets it decide whether it runs on (:mod:`.ending`);
where the loop cannot decide again, it recorded the line after the loop, and the rerun jumps
past it (a line trace function may set ``f_lineno``).

Tracing costs a Python call per function call while it is on: it is on only between
activation and the restore.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterator
from types import FrameType, GeneratorType
from typing import Any

from ravex.errors import RestoreError

from . import frames, source
from .capture import innermost_frame, iterating, live_frames
from .ending import Ending, RangeAt, ending, next_line

_Tracer = Callable[[FrameType, str, Any], Any]

#: a ``for`` is not redrawn more often than this looking for its recorded position
_MAX_DRAW = 10_000_000


class ResumedElsewhere(LookupError):
    """The script's own loop does not pass the recorded item (its ``range`` starts past it, or
    it ends first): the script resumed itself, from a file of its own, somewhere else."""


class Reentry:
    """Drives a rerun back to a recorded position (see the module docstring).

    ``restore(frames)`` is called once every recorded loop is positioned (for a ``"head"``
    position; a ``"header"`` one is restored by the DataLoader, see :meth:`at_loader`), with
    the live frames matching the recorded ones, outermost first; ``lost(why)`` when the run
    cannot reach the position (then nothing of the run has been skipped that it needed)."""

    def __init__(self, script: dict[str, Any], restore: Callable[[list[FrameType]], None],
                 lost: Callable[[str], None]) -> None:
        self.script = script
        self.restore_at = restore
        self.lost = lost
        #: the position was given up because the script resumed its loop elsewhere itself
        self.elsewhere = False
        self.mode = script["mode"]
        self.records: list[dict[str, Any]] = script["frames"]
        self.keys = {r["code"] for r in self.records}
        self.heads = {(key.split(":")[1], int(key.split(":")[2])) for key in self.keys}
        #: the recorded loops in order, outermost first: (frame record index, loop index)
        self.order = [(i, j) for i, r in enumerate(self.records) for j in range(len(r["loops"]))]
        self.next = 0
        self.active = False
        self._traced: list[FrameType] = []
        self._range: RangeAt | None = None  # a finished run's ``for``: its range, handed over positioned

    def start(self, caller: FrameType | None) -> None:
        """Trace from now on: new calls of the recorded code, and the recorded frames already
        running (activation happens inside the script, at ``import torch``)."""
        self.active = True
        frame = caller
        while frame is not None:
            if self._wanted(frame):
                frame.f_trace = self._local
                frame.f_trace_lines = True
                self._traced.append(frame)
            frame = frame.f_back
        sys.settrace(self._global)

    def stop(self) -> None:
        self._drop_range()
        if not self.active:
            return
        self.active = False
        if sys.gettrace() == self._global:
            sys.settrace(None)
        for frame in self._traced:
            frame.f_trace = None
        self._traced.clear()

    def _wanted(self, frame: FrameType) -> bool:
        code = frame.f_code
        return ((code.co_name, code.co_firstlineno) in self.heads and frames.is_user(frame)
                and frames.code_key(code) in self.keys)

    def _global(self, frame: FrameType, event: str, arg: Any) -> _Tracer | None:
        if event == "call" and self.active and self._wanted(frame):
            self._traced.append(frame)
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> _Tracer | None:
        if not self.active:
            return None
        if event == "line" and (self.next < len(self.order) or self.mode == "after"):
            try:
                self._line(frame)
            except RestoreError:
                self.stop()
                raise  # the checkpoint does not fit this run: the script stops here, never trains on
            except Exception as exc:  # never break the script: give the position up instead
                self.stop()
                self.elsewhere = isinstance(exc, ResumedElsewhere)
                self.lost(f"{type(exc).__name__}: {exc}")
                return None
        return self._local if self.active else None

    def _line(self, frame: FrameType) -> None:
        if self.mode == "after":
            self._jump_past(frame)
            return
        if self.mode == "end":
            self._back_at_end(frame)
            return
        i, j = self.order[self.next]
        record = self.records[i]
        if frames.code_key(frame.f_code) != record["code"]:
            return
        loop = record["loops"][j]
        if frame.f_lineno != loop["body"]:
            return
        innermost = self.next == len(self.order) - 1
        if innermost and self.mode == "header":
            return  # the DataLoader's iter() restores (at_loader)
        if loop["kind"] == "for":
            if not self._draw_to(frame, record, loop):
                return
        self.next += 1
        if innermost:
            self.stop()
            self.restore_at(self.live_frames(frame))

    def _jump_past(self, frame: FrameType) -> None:
        """A finished run: at the recorded loop's statement, jump to the line after it (a
        line trace function may set ``f_lineno``) and restore there."""
        record = self.records[-1]
        if frames.code_key(frame.f_code) != record["code"] or frame.f_lineno != record["after"]["loop"]:
            return
        target = record["after"]["line"]
        if target is not None:
            setattr(frame, "f_lineno", target)  # noqa: B010 - typeshed has it read-only
        self.stop()
        self.restore_at(self.live_frames(frame))
        if target is None:  # nothing of the script follows its training: it ends here
            raise SystemExit(0)

    def _back_at_end(self, frame: FrameType) -> None:
        """A finished run's loop (:mod:`.ending`): a ``for`` is handed its ``range`` positioned
        past the recorded item as its statement builds it; a ``while``, at its body's first
        line, is restored and sent where its ``break`` tests and its condition lead now."""
        record = self.records[-1]
        loop = record["loops"][0]
        if frames.code_key(frame.f_code) != record["code"] or frame.f_lineno not in (loop["line"], loop["body"]):
            return
        end = self._ending(frame, loop)
        if end.kind == "for" and frame.f_lineno == end.line and self._range is None:
            last = int(loop["targets"][end.target])
            self._range = RangeAt(frame, end, last, lambda: self._restore_end(frame), self._give_up)
            if not self._range.installed:
                raise LookupError("the script defines a name `range` of its own")
            return
        if frame.f_lineno != end.body:
            return
        if end.kind == "for":  # the statement did not call our range: the loop is not where it was
            self._drop_range()
            raise LookupError(f"the loop at line {end.line} did not build its range where recorded")
        self.next += 1
        self.stop()
        frame.f_trace = self._local  # only a traced frame's line may be set
        try:
            self.restore_at(self.live_frames(frame))
            target = next_line(end, frame)
            if target != frame.f_lineno:
                setattr(frame, "f_lineno", target)  # noqa: B010 - typeshed has it read-only
        finally:
            frame.f_trace = None

    def _ending(self, frame: FrameType, loop: dict[str, Any]) -> Ending:
        code = frame.f_code
        end = ending(code.co_filename, code.co_name, code.co_firstlineno, loop["line"])
        if end is None:
            raise LookupError(f"the loop at line {loop['line']} no longer ends where a rerun can test it again")
        return end

    def _restore_end(self, frame: FrameType) -> None:
        """The finished run's ``range`` is being handed to its ``for``: restore now."""
        self.next += 1
        self.stop()
        self.restore_at(self.live_frames(frame))

    def _give_up(self, why: str) -> None:
        self.stop()
        self.elsewhere = True
        self.lost(why)

    def _drop_range(self) -> None:
        if self._range is not None:
            self._range.uninstall()

    def _draw_to(self, frame: FrameType, record: dict[str, Any], loop: dict[str, Any]) -> bool:
        """Draw from the ``for``'s iterator until its variables are the recorded ones."""
        code = frame.f_code
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno, "head")
        site = next((s for s in place.loops if s.line == loop["line"]), None) if place else None
        if place is None or site is None or site.kind != "for":
            raise LookupError(f"the loop at line {loop['line']} is no longer a for statement")
        wanted = dict(loop["targets"])
        current = frames.read_variables(frame, frozenset(site.targets))
        if current == wanted:
            return True
        iterator = frames.loop_iterator(frame, place.stacked, site.line)
        if iterator is None:
            raise LookupError("this interpreter's frame does not hold the loop's iterator where expected")
        if _skip_range(iterator, site.targets, wanted, loop["line"]):
            frames.write_variables(frame, wanted)
            return True
        for _ in range(_MAX_DRAW):
            try:
                item = next(iterator)
            except StopIteration:
                raise ResumedElsewhere(f"the loop at line {loop['line']} ended before reaching "
                                  f"{_show(wanted)}") from None
            bound = source.bind(site.target, item)
            if bound is None:
                raise LookupError(f"the loop at line {loop['line']} binds something other than names")
            if bound == wanted:
                frames.write_variables(frame, bound)
                return True
        raise LookupError(f"the loop at line {loop['line']} did not reach {_show(wanted)}")

    def at_loader(self) -> bool:
        """A DataLoader's ``iter()`` is called: is it the loop the checkpoint was taken in?
        (Every outer loop positioned, called from the recorded frame at the loop's line, or
        from a generator that the loop's ``for`` runs, :func:`.capture.feeding_loop`.)"""
        if not self.active or self.mode != "header" or self.next != len(self.order) - 1:
            return False
        frame = innermost_frame(sys._getframe(1))
        i, j = self.order[self.next]
        record = self.records[i]
        while frame is not None and frames.code_key(frame.f_code) != record["code"]:
            frame = iterating(frame)
        if frame is None:
            return False
        if frame.f_lineno != record["loops"][j]["line"]:
            return False
        self.next += 1
        self.stop()
        return True

    def holds(self, frame: FrameType | None) -> bool:
        """Whether ``frame`` runs code the recorded position is in."""
        return frame is not None and frames.code_key(frame.f_code) in self.keys

    def live_frames(self, frame: FrameType | None) -> list[FrameType]:
        """The running frames matching the recorded ones, outermost first."""
        return live_frames(self.script, frame)


def _skip_range(iterator: Any, targets: tuple[str, ...], wanted: dict[str, Any], line: int) -> bool:
    """A ``for`` over a ``range``: move its iterator just past the recorded item without
    drawing the items between, or, where the range does not hold it (the script's own resume
    started the loop past it), leave the iterator as it is and say so: the loop then runs
    from where this run's range starts, never skipped to its end. False for other iterators."""
    if type(iterator).__name__ != "range_iterator" or len(targets) != 1:
        return False
    _, (span,), index = iterator.__reduce__()
    value = wanted.get(targets[0])
    rest = span[index:]
    if isinstance(value, bool) or not isinstance(value, int) or value not in rest:
        raise ResumedElsewhere(f"the loop at line {line} runs over {rest}, which does not hold "
                          f"{_show(wanted)} (the script started it elsewhere itself)")
    iterator.__setstate__(index + rest.index(value) + 1)
    return True


def _show(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in values.items())


class EnumerateFrom:
    """``enumerate`` counting on from a resumed epoch's skipped batches.

    ``for i, batch in enumerate(loader)`` starts ``i`` at 0 in every epoch, and scripts
    branch on it (``if i % 100 == 0``). A rerun resuming the epoch at batch ``k`` must have
    ``i`` start at ``k``. While a rerun returns to a DataLoader loop, ``builtins.enumerate``
    is this class's subclass of it: when the iterator it wraps is the resumed loader's (handed
    over by :meth:`expect` as the loader's ``iter()`` runs inside ``enumerate(...)``), the count
    starts that many batches further; then the builtin is put back. It returns a genuine
    ``enumerate``, but for a generator of the user's code (a prefetcher that feeds the loop,
    :func:`.capture.feeding_loop`): that one makes the loader's iterator only when the loop
    first advances it, so its count is an iterator of pairs that starts further where the
    resumed loader's ``iter()`` ran inside that first advance.
    """

    def __init__(self) -> None:
        import builtins

        self._builtins = builtins
        self._original: type[enumerate[Any]] = builtins.enumerate
        self._target: Any = None
        self._offset = 0
        self._handovers = 0  # how many resumed iterators were handed over (:meth:`expect`)
        self.installed = False

    def expect(self, iterator: Any, offset: int) -> None:
        """The resumed epoch's iterator, whose count starts at ``offset``."""
        self._target, self._offset = iterator, offset
        self._handovers += 1

    def install(self) -> None:
        original, shim = self._original, self

        class enumerate(original):  # type: ignore[valid-type,misc]
            def __new__(cls, iterable: Any, start: int = 0) -> Any:
                iterator = iter(iterable)
                if shim._target is None and isinstance(iterator, GeneratorType) and frames.user_code(
                        iterator.gi_code):
                    return shim._counted(iterator, start)
                if shim._target is None or iterator is not shim._target:
                    return original(iterator, start)
                shim.uninstall()
                return original(iterator, start + shim._offset)

        enumerate.__doc__ = original.__doc__
        setattr(self._builtins, "enumerate", enumerate)  # noqa: B010 - a builtin is replaced on purpose
        self.installed = True

    def _counted(self, generator: Generator[Any, Any, Any], start: int) -> Iterator[tuple[int, Any]]:
        """``enumerate(generator, start)``, its count further by the resumed epoch's skipped
        batches where the resumed loader's ``iter()`` runs within the generator's first step."""
        handovers = self._handovers
        try:
            first = next(generator)
        except StopIteration:
            return
        count = start
        if self._handovers != handovers:  # the resumed loader's iterator was made inside that step
            count += self._offset
            self.uninstall()
        yield count, first
        for item in generator:
            count += 1
            yield count, item

    def uninstall(self) -> None:
        self._target = None
        if self.installed:
            self.installed = False
            setattr(self._builtins, "enumerate", self._original)  # noqa: B010
