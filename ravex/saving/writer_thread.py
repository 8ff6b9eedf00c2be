"""The writer thread: one checkpoint in flight, written while training goes on.

Everything after staging (hashing, encoding, writing, the manifest, the steps after a
commit) runs on this one background thread; a failure there is logged and kept for
``status()``, and never reaches the training loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .plan import Outcomes, SavePlan

logger = logging.getLogger("ravex")


@dataclass
class Job:
    """One checkpoint on its way to storage."""

    plan: SavePlan  # its tree is the staged copy
    stall: dict[str, float]  # wait, stage: what the training loop paid
    nbytes: int
    outcomes: Outcomes | None = None
    submitted: float = field(default_factory=time.perf_counter)
    #: set once the writer no longer reads the job's tree (its bytes are read, or the write
    #: ended): a tree holding live tensors (over ``staging_max_bytes``) keeps training waiting
    #: until then
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def step(self) -> int:
        return self.plan.step


class AsyncSaver:
    """One background thread, one job in flight; failures are kept, never raised.

    ``write(job)`` runs on the thread and returns a dict of results (timings, bytes)
    for ``on_done(job, result, error)``, which the backend uses for its log line.
    """

    def __init__(
        self,
        write: Callable[[Job], dict[str, Any]],
        on_done: Callable[[Job, dict[str, Any] | None, BaseException | None], None],
        name: str = "ravex-writer",
    ) -> None:
        self._write = write
        self._on_done = on_done
        self._cv = threading.Condition()
        self._job: Job | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wait_idle(self) -> float:
        """Block until nothing is in flight; return how long that took (backpressure)."""
        started = time.perf_counter()
        with self._cv:
            while self._busy:
                self._cv.wait()
        return time.perf_counter() - started

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the thread. The caller has waited for idle (buffers are shared)."""
        with self._cv:
            if self._closed:
                raise RuntimeError("saver is closed")
            while self._busy:
                self._cv.wait()
            self._job = job
            self._busy = True
            self._cv.notify_all()

    def flush(self) -> None:
        self.wait_idle()

    def close(self) -> None:
        with self._cv:
            while self._busy:
                self._cv.wait()
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    @property
    def busy(self) -> bool:
        return self._busy

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            result: dict[str, Any] | None = None
            error: BaseException | None = None
            try:
                result = self._write(job)
            except BaseException as exc:  # a storage error must never reach training
                error = exc
            job.released.set()  # (the write ended: nothing reads the tree any more)
            try:
                self._on_done(job, result, error)
            except Exception:  # pragma: no cover - logging must not kill the thread
                logger.exception("ravex: checkpoint completion handler failed")
            with self._cv:
                self._job = None
                self._busy = False
                self._cv.notify_all()
