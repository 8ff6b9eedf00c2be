"""The step readers the inspector keeps: the last few complete steps it opened, parsed.

Every pane's worker reads through it, from any thread; a step of 10,000 tensors holds its parsed
manifests, so only :data:`READER_CACHE` stay, and the store forgets an evicted step's manifests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ravex.format import CheckpointStore, StepReader

from . import heap

#: Step readers kept in memory (a step of 10,000 tensors holds its parsed manifests).
READER_CACHE = 4


class StepReaders:
    """Readers by (timeline listed, step), least recently used evicted first."""

    def __init__(self) -> None:
        self._readers: OrderedDict[tuple[str, int], StepReader] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: CheckpointStore, step: int) -> StepReader:
        """A reader of complete ``step`` of the timeline ``store`` (any thread)."""
        key = (store.timeline.name, step)
        with self._lock:
            r = self._readers.get(key)
            if r is not None:
                self._readers.move_to_end(key)
                return r
        with heap.parsing():  # megabytes of JSON: parsed in pieces, no GC pause on what it builds
            r = store.open_step(step)  # a step the lineage lends is read from its own timeline
        with self._lock:
            self._readers[key] = r
            while len(self._readers) > READER_CACHE:
                _, old = self._readers.popitem(last=False)
                old.store.forget(old.step)  # the store would keep its manifests too (and the GC walk them)
        return r
