"""Where the main script's loops stood at a checkpoint, and a rerun that goes back there.

A checkpoint is taken between two iterations of the script's training loop: at the
DataLoader's ``next()`` (the loop's header, ``"header"``) or, for a loop without one, at the
first line of its body (``"head"``, found by watching the frame for a moment after the
optimizer step that made the checkpoint due: :class:`HeadWatch`). :func:`capture` records,
for every frame of the main script on the stack, the loops around its line (from the
source, :mod:`.source`), the values a ``for`` of each outer loop had bound (``epoch = 3``)
and the variables the loops carry (:func:`.source.place`'s live set).

The rerun (:class:`Reentry`) watches the same frames from the start. At the body of each
recorded ``for`` it draws from the statement's own iterator (:mod:`.frames`) until the
loop variables equal the recorded ones, so the iterations already done never run again
(no ``scheduler.step()`` of a finished epoch, no ``torch.save`` of stale weights, no
printed line). A ``while`` needs no drawing: its position is its variables. Once every
loop around the checkpoint is positioned, the checkpoint is restored right there, with the
script's variables, before the resumed iteration's body runs; a DataLoader loop instead
restores at the loader's ``iter()`` and skips the consumed batches at its sampler.

A run that finished records, at exit, the line after its outermost loop (``"after"``,
:func:`capture_after`): a rerun jumps past that loop and restores there, so it runs only
what followed the training.

Tracing costs a Python call per function call while it is on, so it is on only between
activation and the restore of a rerun, and between a due checkpoint and the loop head.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from . import frames, source

logger = logging.getLogger("ravex")

_Tracer = Callable[[FrameType, str, Any], Any]

#: a ``for`` is not redrawn more often than this looking for its recorded position
_MAX_DRAW = 10_000_000


def capture(frame: FrameType, mode: str, wanted: str | list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """The script's position with ``frame`` (the innermost main-script frame) at ``mode``
    (``"head"`` or ``"header"``): the subtree a checkpoint stores, or None where the loops
    cannot be re-entered; and the loop variables that could not be saved."""
    stack = frames.main_frames(frame)
    if not stack or stack[-1] is not frame:
        return None, []
    recorded = []
    unsaved: list[str] = []
    for f in stack:
        at = mode if f is frame else "call"
        code = f.f_code
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, f.f_lineno, at)
        if place is None or not place.exact:
            return None, []
        loops = []
        for i, site in enumerate(place.loops):
            targets = None
            if site.kind == "for" and not (at == "header" and i == len(place.loops) - 1):
                targets = frames.read_variables(f, frozenset(site.targets))
                if len(targets) != len(site.targets) or not all(map(_comparable, targets.values())):
                    return None, []
            loops.append({"line": site.line, "body": site.body, "kind": site.kind, "targets": targets})
        recorded.append({"code": frames.code_key(code), "line": f.f_lineno, "loops": loops,
                         "variables": _variables(f, place.live, wanted, unsaved)})
    if not any(r["loops"] for r in recorded):
        return None, []
    return {"mode": mode, "frames": recorded}, unsaved


def capture_variables(frame: FrameType, wanted: str | list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """Only the variables the main script's loops carry, with ``frame`` (the innermost
    main-script frame) at the ``for`` of a loop wrapped in ``ravex.loop``, which saves the
    loops' positions itself (mode ``"loop"``): a hidden state or a running total carried
    across the iterations of a function's loop is restored with them."""
    recorded: list[dict[str, Any]] = []
    unsaved: list[str] = []
    for f in frames.main_frames(frame):
        code = f.f_code
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, f.f_lineno,
                             "header" if f is frame else "call")
        if place is None or not place.loops or not place.exact:
            continue
        recorded.append({"code": frames.code_key(code), "line": f.f_lineno, "loops": [],
                         "variables": _variables(f, place.live, wanted, unsaved)})
    if not recorded:
        return None, []
    return {"mode": "loop", "frames": recorded}, unsaved


def _variables(frame: FrameType, live: frozenset[str], wanted: str | list[str], unsaved: list[str]) -> dict[str, Any]:
    """``frame``'s variables to save: ``live`` (``wanted == "auto"``) or the names asked
    for, encoded; those that cannot be saved are named in ``unsaved``."""
    names = live if wanted == "auto" else frozenset(() if wanted == "none" else wanted)
    variables = {}
    for name, value in frames.read_variables(frame, names).items():
        encoded = _encode(value)
        if encoded is _UNSAVEABLE:
            if not callable(value) and not isinstance(value, type(sys)):
                unsaved.append(f"{name} ({type(value).__name__})")
            continue
        variables[name] = encoded
    return variables


def live_frames(script: dict[str, Any], frame: FrameType | None) -> list[FrameType]:
    """The running frames from ``frame`` outward that match ``script``'s recorded ones,
    outermost first."""
    found = {frames.code_key(f.f_code): f for f in frames.main_frames(frame)}
    return [found[r["code"]] for r in script["frames"] if r["code"] in found]


def put_variables(script: dict[str, Any], live: list[FrameType]) -> None:
    """Write ``script``'s recorded variables into the matching ``live`` frames."""
    by_key = {frames.code_key(f.f_code): f for f in live}
    for record in script["frames"]:
        frame = by_key.get(record["code"])
        if frame is not None and record["variables"]:
            frames.write_variables(frame, {k: decode(v) for k, v in record["variables"].items()})


def capture_after(last: dict[str, Any], filename: str, wanted: str | list[str]) -> dict[str, Any] | None:
    """The script ran to its end: its position just after the outermost loop of ``last``
    (the position of this run's last checkpoint in a loop, in the main script ``filename``:
    the interpreter has removed ``__main__.__file__`` by exit), mode ``"after"``, so that a
    rerun of a finished run skips that loop instead of training again. Taken at exit, when
    no frame of the script is left: only a loop at module level qualifies (its variables are
    the main module's globals), or one in a function whose loop assigns nothing that the
    code after it reads. None where neither holds."""
    main = sys.modules.get("__main__")
    records = [r for r in last["frames"] if r["loops"]]
    if main is None or not records:
        return None
    outer = last["frames"].index(records[0])
    record = records[0]
    _, name, first = record["code"].rsplit(":", 2)
    loop_line = record["loops"][0]["line"]
    after = source.after_loop(filename, name, int(first), loop_line)
    if after is None:
        return None
    line, live = after
    scope = vars(main)
    module_live = live if name == "<module>" else live & frozenset(scope)
    if name != "<module>" and live - module_live:
        return None  # the function's own variables died with its frame
    names = module_live if wanted == "auto" else frozenset(() if wanted == "none" else wanted)
    variables = {}
    for key in sorted(names & frozenset(scope)):
        encoded = _encode(scope[key])
        if encoded is not _UNSAVEABLE:
            variables[key] = encoded
    frames_out = [dict(r, loops=[], variables={}) for r in last["frames"][:outer + 1]]
    frames_out[0]["variables"] = variables if frames_out[0]["code"].split(":")[1] == "<module>" else {}
    frames_out[-1]["after"] = {"loop": loop_line, "line": line}
    return {"mode": "after", "frames": frames_out}


def describe(script: dict[str, Any]) -> str:
    """``train.py:255`` for a recorded position: the innermost loop's file and line (the
    line after the loop, for a finished run)."""
    if script["mode"] == "after":
        record = script["frames"][-1]
        return f"{record['code'].split(':')[0]}:{record['after']['line']}"
    inner = [r for r in script["frames"] if r["loops"]][-1]
    return f"{inner['code'].split(':')[0]}:{inner['loops'][-1]['line']}"


def innermost_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost main-script frame at or outside ``frame``."""
    while frame is not None and not frames.is_main(frame):
        frame = frame.f_back
    return frame


# ── values ──────────────────────────────────────────────────────────────

_UNSAVEABLE = object()
_PLAIN = (type(None), bool, int, float, str, bytes)


def _comparable(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, tuple) and all(map(_comparable, value))


def _encode(value: Any) -> Any:
    """A variable as state-tree values: plain values and containers as they are, a tensor
    detached with its device; anything else cannot be saved."""
    if isinstance(value, _PLAIN):
        return value
    if type(value) is torch.Tensor and value.layout == torch.strided:
        return {"ravex_tensor": value.detach(), "device": str(value.device),
                "requires_grad": value.requires_grad}
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        items = [_encode(v) for v in value]
        if any(i is _UNSAVEABLE for i in items):
            return _UNSAVEABLE
        return tuple(items) if isinstance(value, tuple) else items
    if type(value) is dict and all(isinstance(k, str) for k in value):
        out = {k: _encode(v) for k, v in value.items()}
        if "ravex_tensor" in out or any(v is _UNSAVEABLE for v in out.values()):
            return _UNSAVEABLE
        return out
    return _UNSAVEABLE


def decode(value: Any) -> Any:
    """The inverse of :func:`_encode` on a read tree (arrays as numpy or tensors)."""
    from ravex.saving.dtypes import as_tensor

    if isinstance(value, dict) and "ravex_tensor" in value:
        data = value["ravex_tensor"]
        tensor = data if isinstance(data, torch.Tensor) else as_tensor(data)
        tensor = tensor.to(value["device"])
        return tensor.requires_grad_(bool(value["requires_grad"]))
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    return value


# ── the first run: a checkpoint at the loop head ────────────────────────


class HeadWatch:
    """Watches the main script's innermost frame until it reaches the first line of the loop
    around the optimizer step that made a checkpoint due, and takes it there (``take``).
    When the loop ends first, or the frame returns, ``left`` is called with the frame to
    look at next (the same one, now in an outer loop, or the caller), which the caller of
    :meth:`arm` watches in turn: the next head to come may be an outer loop's."""

    def __init__(self, frame: FrameType, body: int, span: tuple[int, int],
                 take: Callable[[FrameType], None], left: Callable[[FrameType | None], None]) -> None:
        self.frame = frame
        self.body = body
        self.span = span
        self.take = take
        self.left = left
        self.done = False
        frame.f_trace = self._local
        frame.f_trace_lines = True
        sys.settrace(_no_calls)

    @staticmethod
    def arm(frame: FrameType, take: Callable[[FrameType], None],
            left: Callable[[FrameType | None], None]) -> HeadWatch | None:
        """A watch on ``frame``'s innermost loop, or None where there is none to watch."""
        if not frames.supported():
            return None
        code = frame.f_code
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno, "call")
        if place is None or not place.loops or not place.exact:
            return None
        loop = place.loops[-1]
        return HeadWatch(frame, loop.body, (loop.line, loop.end), take, left)

    def _local(self, frame: FrameType, event: str, arg: Any) -> _Tracer | None:
        if self.done:
            return None
        if event == "line" and frame.f_lineno == self.body:
            self.stop()
            self.take(frame)
            return None
        if event == "return":
            self.stop()
            self.left(frame.f_back)
            return None
        if event == "line" and not self.span[0] <= frame.f_lineno <= self.span[1]:
            self.stop()
            self.left(frame)
            return None
        return self._local

    def stop(self) -> None:
        if self.done:
            return
        self.done = True
        self.frame.f_trace = None
        if sys.gettrace() is _no_calls:
            sys.settrace(None)


def _no_calls(frame: FrameType, event: str, arg: Any) -> None:
    return None


# ── the rerun: back to the recorded position ────────────────────────────


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
        self.mode = script["mode"]
        self.records: list[dict[str, Any]] = script["frames"]
        self.keys = {r["code"] for r in self.records}
        self.heads = {(key.split(":")[1], int(key.split(":")[2])) for key in self.keys}
        #: the recorded loops in order, outermost first: (frame record index, loop index)
        self.order = [(i, j) for i, r in enumerate(self.records) for j in range(len(r["loops"]))]
        self.next = 0
        self.active = False
        self._traced: list[FrameType] = []

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
        return ((code.co_name, code.co_firstlineno) in self.heads and frames.is_main(frame)
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
            except Exception as exc:  # never break the script: give the position up instead
                self.stop()
                self.lost(f"{type(exc).__name__}: {exc}")
                return None
        return self._local if self.active else None

    def _line(self, frame: FrameType) -> None:
        if self.mode == "after":
            self._jump_past(frame)
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
        setattr(frame, "f_lineno", record["after"]["line"])  # noqa: B010 - typeshed has it read-only
        self.stop()
        self.restore_at(self.live_frames(frame))

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
        for _ in range(_MAX_DRAW):
            try:
                item = next(iterator)
            except StopIteration:
                raise LookupError(f"the loop at line {loop['line']} ended before reaching "
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
        (Every outer loop positioned, called from the recorded frame at the loop's line.)"""
        if not self.active or self.mode != "header" or self.next != len(self.order) - 1:
            return False
        frame = innermost_frame(sys._getframe(1))
        i, j = self.order[self.next]
        record = self.records[i]
        if frame is None or frames.code_key(frame.f_code) != record["code"]:
            return False
        if frame.f_lineno != record["loops"][j]["line"]:
            return False
        self.next += 1
        self.stop()
        return True

    def live_frames(self, frame: FrameType | None) -> list[FrameType]:
        """The running frames matching the recorded ones, outermost first."""
        return live_frames(self.script, frame)


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
    ``enumerate``.
    """

    def __init__(self) -> None:
        import builtins

        self._builtins = builtins
        self._original: type[enumerate[Any]] = builtins.enumerate
        self._target: Any = None
        self._offset = 0
        self.installed = False

    def expect(self, iterator: Any, offset: int) -> None:
        """The resumed epoch's iterator, whose count starts at ``offset``."""
        self._target, self._offset = iterator, offset

    def install(self) -> None:
        original, shim = self._original, self

        class enumerate(original):  # type: ignore[valid-type,misc]
            def __new__(cls, iterable: Any, start: int = 0) -> Any:
                iterator = iter(iterable)
                if shim._target is None or iterator is not shim._target:
                    return original(iterator, start)
                shim.uninstall()
                return original(iterator, start + shim._offset)

        enumerate.__doc__ = original.__doc__
        setattr(self._builtins, "enumerate", enumerate)  # noqa: B010 - a builtin is replaced on purpose
        self.installed = True

    def uninstall(self) -> None:
        self._target = None
        if self.installed:
            self.installed = False
            setattr(self._builtins, "enumerate", self._original)  # noqa: B010
