"""Keep CPython's cyclic garbage collector from freezing the inspector.

A step of 10,000 tensors parses into a few hundred thousand small objects (dicts, entries,
chunk refs), and the inspector keeps a few steps. A full collection walks every one of them
while holding the GIL: 0.2-0.3 s during which the UI does not move, and the collector runs
one whenever a new step has been parsed. Manifests hold no reference cycles (refcounting
frees them), so the collector has nothing to find in them: :func:`parsing` pauses it while
a worker builds a step and then moves what exists (:func:`gc.freeze`) out of its sight.
:func:`release` hands everything back when the app exits. The price: garbage the UI made
(cycles among its caches) while a worker parsed is frozen too, not collected until exit
(measured: ~3,500 objects, Textual line caches mostly, per step loaded).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_busy = 0  # workers inside parsing()
_was_enabled = True
_froze = False


@contextmanager
def parsing() -> Iterator[None]:
    """Around a worker's parse of a big step (or another burst of acyclic objects: a diff's rows):
    no collection meanwhile, the result frozen after. Keep it short: the whole process goes
    without the collector while it lasts."""
    global _busy, _was_enabled, _froze
    with _lock:
        if _busy == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _busy += 1
    try:
        yield
    finally:
        with _lock:
            _busy -= 1
            if _busy == 0:
                gc.freeze()  # also resets the young generation's count: no collection right away
                _froze = True
                if _was_enabled:
                    gc.enable()


def release() -> None:
    """Give the frozen objects back to the collector (the app is closing)."""
    global _froze
    with _lock:
        if _froze and _busy == 0:
            gc.unfreeze()
            _froze = False
