"""Where the training loop stood: the one room of the runtime that reads and re-enters the
user's own loops.

A checkpoint records where the loops of the user's code stood (:mod:`.capture`, over the
loops and live variables read from the source by :mod:`.source`, and the frames read by
:mod:`.frames`); with no DataLoader to mark the step boundary, :mod:`.headwatch` takes it at
the head of the loop. A rerun goes back there (:mod:`.reentry`). Loops wrapped in
``ravex.loop`` save their own positions (:mod:`.loops`). The runtime
(:mod:`ravex.runtime.counting.cadence`, :mod:`ravex.runtime.restoring.resume`) holds one :class:`LoopPosition`
(:mod:`.tracker`), its handle on all of this, and uses only the names below.
"""

from __future__ import annotations

from .capture import describe, drawn_explicitly, innermost_frame, live_frames, put_variables
from .frames import main_file
from .loops import Entry, Loop, advice, main_loop_site
from .reentry import Reentry
from .tracker import LoopPosition

__all__ = [
    "Entry",
    "Loop",
    "LoopPosition",
    "Reentry",
    "advice",
    "describe",
    "drawn_explicitly",
    "innermost_frame",
    "live_frames",
    "main_file",
    "main_loop_site",
    "put_variables",
]
