"""``ravex.loop``: a training loop that declares itself, so that its position is saved.

A loop over ``range`` or hand-sliced batches keeps its position in locals Ravex cannot
see. Wrapping its iterable (``for epoch in ravex.loop(range(E)):``) makes that position
part of every checkpoint: which iteration of each wrapped loop was running. Nested
wrapped loops are told apart by their depth in the nest and their call site
(``file:line``), so a rerun of the same script finds them again.

Each iteration start of a wrapped loop is a step boundary: a checkpoint that became due
during the previous iteration (an optimizer step, the interval, a signal) is taken there,
before the next item is fetched and before the body runs. A script with no
``torch.optim`` optimizer gets its steps counted here instead: one per iteration of the
innermost wrapped loop.

Where a rerun resumes. A checkpoint taken at the start of iteration ``k`` of the loop
being iterated records ``k`` for it (the iterations before it are done) and, for each
loop around it, the iteration in progress. The rerun skips the done iterations of each
loop without running their bodies (the items are drawn from the iterable and dropped;
a DataLoader skips at its sampler instead), restores the checkpoint right there, and
runs iteration ``k`` as its first. Code of finished iterations never runs again, and
nothing of the resumed iteration runs on unrestored state except what precedes the
inner loop in the outer loops' bodies, which the restore then overwrites.

Wrap the whole iterable of the ``for`` statement: ``ravex.loop(enumerate(batches))``,
not ``enumerate(ravex.loop(batches))``, whose index would restart at 0.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from ..state.registry import Registry
from . import frames


@dataclass(frozen=True)
class Entry:
    """How a rerun enters one wrapped loop: iterations to skip, then restore or not."""

    skip: int = 0
    restore: bool = False


class LoopRuntime(Protocol):
    """What a wrapped loop asks of the runtime (:class:`~ravex.runtime.counting.cadence.Cadence`)."""

    def enter_loop(self, loop: Loop) -> Entry: ...

    def restore_in_loop(self) -> None: ...

    def loop_boundary(self, loop: Loop, ran: bool) -> None: ...

    def leave_loop(self, loop: Loop, finished: bool) -> None: ...


class Loop:
    """One wrapped iterable. ``yielded`` counts the items handed out by the running ``for``
    (skipped ones included); ``nested`` says whether the current iteration ran another
    wrapped loop, which makes this one not the innermost."""

    def __init__(self, runtime: LoopRuntime, iterable: Iterable[Any], site: str) -> None:
        self.runtime = runtime
        self.iterable = iterable
        self.site = site
        self.depth = 0
        self.yielded = 0
        self.nested = False
        #: a DataLoader is put back at its position by the resume itself (at its sampler)
        self.positions_itself = (hasattr(iterable, "__dict__")
                                 and Registry.state_of(iterable) is not None)

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return self._run()

    def _run(self) -> Iterator[Any]:
        runtime = self.runtime
        self.yielded, self.nested = 0, False
        entry = runtime.enter_loop(self)
        finished = False
        try:
            items = iter(self.iterable)
            if entry.skip:
                if self.positions_itself:
                    self.yielded = entry.skip
                else:
                    for _ in range(entry.skip):
                        if next(items, _END) is _END:
                            break
                        self.yielded += 1
            if entry.restore:
                runtime.restore_in_loop()
            ran = False
            while True:
                runtime.loop_boundary(self, ran)
                item = next(items, _END)
                if item is _END:
                    finished = True
                    return
                self.yielded += 1
                self.nested = False
                yield item
                ran = True
        finally:
            runtime.leave_loop(self, finished)


_END = object()


def call_site(frame: FrameType) -> str:
    """``file:line`` of a frame: the base name, so that a rerun from elsewhere matches."""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def main_loop_site(frame: FrameType | None = None) -> str | None:
    """``file:line`` of the loop the user's code is running, found from the frame stack:
    the innermost frame of the user's code (:func:`.frames.is_user`) whose current line
    lies inside a ``for`` or ``while`` statement; None where there is no such frame."""
    found = _innermost_loop(frame if frame is not None else sys._getframe(1))
    return f"{found[0]}:{found[1]}" if found is not None else None


def advice(frame: FrameType | None = None) -> str:
    """The one-line fix for a loop whose position a rerun could not find, fitting the loop
    the user's code is running (a ``while`` is not told to wrap a ``range``)."""
    found = _innermost_loop(frame if frame is not None else sys._getframe(1))
    where = f" at {found[0]}:{found[1]}" if found is not None else ""
    if found is not None and found[2] == "while":
        return (f"the while loop{where} starts over on the restored state; `for _ in "
                "ravex.loop(itertools.count()):` in its place (its condition as `if not ...: break`) "
                "makes the resume exact")
    return f"the loop{where} starts over on the restored state; `{ADVICE}` around its iterable makes the resume exact"


def _innermost_loop(frame: FrameType | None) -> tuple[str, int, str] | None:
    current = frame
    while current is not None:
        if frames.is_user(current) and frames.has_loop(current.f_code):
            filename = current.f_code.co_filename
            for first, last, kind in _loop_spans(filename):
                if first <= current.f_lineno <= last:
                    return os.path.basename(filename), first, kind
        current = current.f_back
    return None


@functools.lru_cache(maxsize=8)
def _loop_spans(filename: str) -> tuple[tuple[int, int, str], ...]:
    """The ``(first, last, kind)`` of every loop statement of a file, innermost first."""
    try:
        with open(filename, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return ()
    spans = [(node.lineno, node.end_lineno or node.lineno, "while" if isinstance(node, ast.While) else "for")
             for node in ast.walk(tree) if isinstance(node, (ast.For, ast.AsyncFor, ast.While))]
    return tuple(sorted(spans, key=lambda s: -s[0]))


ADVICE = "for i in ravex.loop(range(...)):"
