"""The first run: a checkpoint due without a DataLoader to mark the step boundary is taken
where the script's loop starts its next iteration, a point a rerun can come back to.

Tracing costs a Python call per function call while it is on: it is on only between the
optimizer step that made the checkpoint due and the loop head.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from . import frames, source

_Tracer = Callable[[FrameType, str, Any], Any]


@dataclass(eq=False)
class HeadWatch:
    """Watches the main script's innermost frame until it reaches the first line of the loop
    around the optimizer step that made a checkpoint due, and takes it there (``take``).
    When the loop ends first, or the frame returns, ``left`` is called with the frame to
    look at next (the same one, now in an outer loop, or the caller), which the caller of
    :meth:`arm` watches in turn: the next head to come may be an outer loop's."""

    frame: FrameType
    body: int
    span: tuple[int, int]
    take: Callable[[FrameType], None]
    left: Callable[[FrameType | None], None]
    done: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.frame.f_trace = self._local
        self.frame.f_trace_lines = True
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
