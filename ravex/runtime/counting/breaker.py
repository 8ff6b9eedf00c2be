"""A circuit breaker for checkpoints: stop paying for storage that is down.

During a persistent outage every checkpoint costs the whole retry budget of
:class:`~ravex.format.storage.RetryPolicy` (5-10 s) on the writer thread, and since one
write is in flight at most, the training loop waits for it at the next checkpoint (the
``wait`` phase of the stall). After :data:`THRESHOLD` consecutive failed checkpoints the
breaker *opens*: due checkpoints are skipped, at no cost, for a cool-down that starts at
:data:`FIRST_COOLDOWN` and doubles on each failed trial up to :data:`MAX_COOLDOWN`. The
first checkpoint due after the cool-down is a trial (*half-open*); while it is in flight
further due checkpoints are skipped too, so nothing waits on it. A written checkpoint
closes the breaker. Opening and closing each log one line.

The states and times are kept here, apart from the runtime, so they can be tested with an
injected clock; the runtime asks :meth:`CircuitBreaker.allow` before a checkpoint and
reports each outcome (the writer thread reports the background ones).

With several ranks the decision is shared: each rank's breaker says whether it would let the
checkpoint through, and one MIN all-reduce (``agree``, passed to :meth:`CircuitBreaker.allow`)
makes every rank skip when any rank would. Per-rank decisions would let a rank that tries
while another skips enter the checkpoint's collectives alone and hang the job; and a step
is only complete with every rank's manifest, so one rank whose storage is down makes every
rank's checkpoint useless anyway.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("ravex")

#: Consecutive failed checkpoints that open the breaker.
THRESHOLD = 3
#: The first cool-down, in seconds; it doubles after each failed trial ...
FIRST_COOLDOWN = 30.0
#: ... up to this many seconds.
MAX_COOLDOWN = 600.0

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


def duration(seconds: float) -> str:
    """``30 s``, ``1 min``, ``2.5 min``: how a cool-down reads in a log line."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.3g} min"


@dataclasses.dataclass(eq=False)
class CircuitBreaker:
    """Closed -> open after ``threshold`` consecutive failures -> half-open after the
    cool-down -> closed on a success, or open again with twice the cool-down on a failure.

    Thread-safe: outcomes arrive from the writer thread while the training thread asks.
    ``clock`` returns seconds (monotonic); tests pass their own.
    """

    threshold: int = THRESHOLD
    first_cooldown: float = FIRST_COOLDOWN
    max_cooldown: float = MAX_COOLDOWN
    clock: Callable[[], float] = time.monotonic
    #: what the log lines call the storage (the runtime sets the store's URL)
    where: str = "storage"
    state: str = dataclasses.field(default=CLOSED, init=False)
    consecutive_failures: int = dataclasses.field(default=0, init=False)
    cooldown: float = dataclasses.field(default=0.0, init=False)
    retry_at: float | None = dataclasses.field(default=None, init=False)
    #: due checkpoints skipped while open or half-open
    skipped: int = dataclasses.field(default=0, init=False)
    #: times the breaker opened from closed
    opened: int = dataclasses.field(default=0, init=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        threshold, first_cooldown, max_cooldown = self.threshold, self.first_cooldown, self.max_cooldown
        if threshold < 1 or first_cooldown < 0 or max_cooldown < first_cooldown:
            raise ValueError(f"CircuitBreaker: bad settings {threshold=}, {first_cooldown=}, {max_cooldown=}")

    def allow(self, agree: Callable[[bool], bool] | None = None) -> bool:
        """Whether a due checkpoint may be attempted now.

        Open and cooled down: let this one through as the trial (half-open). A skipped
        checkpoint is counted; the caller simply goes on training. ``agree`` turns this
        breaker's answer into the answer of all ranks (every rank calls it at the same
        checkpoint); only a checkpoint all let through starts a trial here.
        """
        with self._lock:
            cooled = self.state == OPEN and self.retry_at is not None and self.clock() >= self.retry_at
            would = self.state == CLOSED or cooled
        go = agree(would) if agree is not None else would  # a collective: outside the lock
        with self._lock:
            if go:
                if self.state == OPEN:
                    self.state = HALF_OPEN
                return True
            self.skipped += 1
            return False

    def failed(self, step: int | None = None) -> None:
        """A checkpoint failed (before writing or on the writer thread)."""
        with self._lock:
            self.consecutive_failures += 1
            if self.state == HALF_OPEN:
                self._open(min(self.max_cooldown, max(self.first_cooldown, self.cooldown * 2)))
                logger.warning(
                    "ravex: %s still unreachable (trial checkpoint%s failed); next attempt in %s "
                    "— training continues", self.where, "" if step is None else f" of step {step}",
                    duration(self.cooldown))
            elif self.state == CLOSED and self.consecutive_failures >= self.threshold:
                self.opened += 1
                self._open(self.first_cooldown)
                logger.warning(
                    "ravex: %s unreachable after %d failed checkpoints; next attempt in %s — training continues",
                    self.where, self.consecutive_failures, duration(self.cooldown))

    def succeeded(self, step: int | None = None) -> None:
        """A checkpoint was written: close."""
        with self._lock:
            if self.state != CLOSED:
                logger.warning(
                    "ravex: %s reachable again%s after %d failed checkpoints; checkpointing resumes",
                    self.where, "" if step is None else f" (step {step} written)", self.consecutive_failures)
            self.state = CLOSED
            self.consecutive_failures = 0
            self.cooldown = 0.0
            self.retry_at = None

    def _open(self, cooldown: float) -> None:
        self.state = OPEN
        self.cooldown = cooldown
        self.retry_at = self.clock() + cooldown

    def status(self) -> dict[str, Any]:
        """For ``ravex.status()``: state, failures in a row, and when the next attempt is."""
        with self._lock:
            left = None
            if self.state == OPEN and self.retry_at is not None:
                left = round(max(0.0, self.retry_at - self.clock()), 3)
            return {
                "state": self.state,
                "consecutive_failures": self.consecutive_failures,
                "cooldown_seconds": self.cooldown if self.state in (OPEN, HALF_OPEN) else None,
                "next_attempt_in_seconds": left,
                "skipped_checkpoints": self.skipped,
                "opened": self.opened,
            }
