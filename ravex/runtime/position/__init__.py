"""Where the training loop stood: the one room of the runtime that reads and re-enters the
user's own loops.

A checkpoint records where the script's loops stood (:mod:`.capture`, over the loops and
live variables read from the source by :mod:`.source`, and the frames read by
:mod:`.frames`); with no DataLoader to mark the step boundary, :mod:`.headwatch` takes it at
the head of the loop. A rerun goes back there (:mod:`.reentry`). Loops wrapped in
``ravex.loop`` save their own positions (:mod:`.loops`). The runtime
(:mod:`ravex.runtime.cadence`, :mod:`ravex.runtime.resume`) uses only the names below.
"""

from __future__ import annotations

from .capture import (
    capture,
    capture_after,
    capture_variables,
    changed,
    describe,
    drawn_explicitly,
    innermost_frame,
    live_frames,
    put_variables,
)
from .frames import main_file, supported, user_frames
from .headwatch import HeadWatch
from .loops import ADVICE, Entry, Loop, advice, main_loop_site
from .reentry import EnumerateFrom, Reentry

__all__ = [
    "ADVICE",
    "Entry",
    "EnumerateFrom",
    "HeadWatch",
    "Loop",
    "Reentry",
    "advice",
    "capture",
    "capture_after",
    "capture_variables",
    "changed",
    "describe",
    "drawn_explicitly",
    "innermost_frame",
    "live_frames",
    "main_file",
    "main_loop_site",
    "put_variables",
    "supported",
    "user_frames",
]
