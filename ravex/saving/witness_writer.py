"""Writing witnesses (spec §22) beside the checkpoint writes, never in the training loop's way.

A witness grows by one entry per step after its checkpoint and is rewritten each time. It must
not land before its step's own manifest (a folder holding only a witness would look like a
crashed write), and it must not make training wait: each one is queued to a thread of its own,
which waits until no checkpoint write is in flight and then writes it, if its step was written.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from ravex.format.history.witness import Witness

logger = logging.getLogger("ravex")


class WitnessWriter:
    """One thread writing the witnesses handed to :meth:`put`, in order.

    ``wait_idle`` blocks while a checkpoint write is in flight, ``written(step)`` says whether
    that step's own write succeeded, ``write`` writes a witness to storage."""

    def __init__(self, write: Callable[[Witness], object], wait_idle: Callable[[], object],
                 written: Callable[[int], bool]) -> None:
        self._write = write
        self._wait_idle = wait_idle
        self._written = written
        self._queue: queue.Queue[Witness | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failed: set[int] = set()  # steps whose witness failed to write: said once each

    def put(self, witness: Witness) -> None:
        """Queue ``witness`` (a longer one replaces its step's earlier one on storage)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ravex-witness", daemon=True)
            self._thread.start()
        self._queue.put(witness)

    def flush(self) -> None:
        """Block until every witness queued so far is written (or given up)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        self.flush()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while True:
            witness = self._queue.get()
            try:
                if witness is None:
                    return
                self._wait_idle()
                if self._written(witness.step):
                    self._write(witness)
            except Exception as exc:  # informative: never a failed checkpoint
                if witness is not None and witness.step not in self._failed:
                    self._failed.add(witness.step)
                    logger.warning("ravex: the witness of step %d was not written (%s: %s); a resume from it "
                                   "cannot check itself", witness.step, type(exc).__name__, exc)
            finally:
                self._queue.task_done()
