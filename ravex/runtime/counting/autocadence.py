"""``checkpoint_every: auto``: how often to checkpoint, from what a checkpoint costs this run and a
stated failure rate.

A checkpoint every ``T`` seconds costs ``C / T`` of the training time (``C``: what one checkpoint
takes from the loop, its stall and the slowdown while it is written) and loses ``T / 2`` of work
per failure on average. With failures every ``M`` seconds (``mtbf``) the sum is least at Young's
``T = sqrt(2 C M)`` (Daly's first-order refinement adds ``C``, small beside ``T``); ``T`` is
raised to ``C / max_overhead`` where that bound is tighter.

``C`` is measured, not guessed: each step's duration is recorded, and a checkpoint's cost is
what the steps from it to the next one took beyond the run's plain step time (the 20th
percentile of the recent steps: most steps of an interval are plain ones). The first two
checkpoints are taken :data:`FIRST_STEPS` apart to measure it; from then on the interval is a
time, decided by rank 0's clock as ``checkpoint_every_seconds`` is (:mod:`.signals`), and
estimated again at every checkpoint. A change of a quarter or more is said in one line.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

#: steps between the first checkpoints, which measure what a checkpoint costs
FIRST_STEPS = 10
#: recent step durations kept for the plain step time
WINDOW = 64
#: a new estimate of the cost weighs this much against the ones before
WEIGHT = 0.5


@dataclass
class AutoInterval:
    """The interval ``checkpoint_every: auto`` keeps, and what it is estimated from."""

    mtbf: float
    max_overhead: float
    cost: float | None = None  #: seconds one checkpoint takes from the loop (a running estimate)
    seconds: float | None = None  #: the interval, once the cost is known
    _durations: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=WINDOW), init=False)
    _since: list[float] = field(default_factory=list, init=False)  #: the steps since the last checkpoint
    _last: float | None = field(default=None, init=False)  #: when the last step ended
    _checkpoints: int = field(default=0, init=False)
    _said: float | None = field(default=None, init=False)  #: the interval last said

    def stepped(self, now: float) -> None:
        """A step ended at ``now`` (monotonic seconds)."""
        if self._last is not None:
            took = now - self._last
            self._durations.append(took)
            self._since.append(took)
        self._last = now

    def due_by_count(self, steps_since: int) -> bool:
        """Before the cost is known, checkpoints fall :data:`FIRST_STEPS` steps apart."""
        return self.seconds is None and steps_since >= FIRST_STEPS

    @property
    def step_seconds(self) -> float | None:
        """The run's plain step time: the 20th percentile of the recent steps."""
        if not self._durations:
            return None
        ordered = sorted(self._durations)
        return ordered[int(0.2 * (len(ordered) - 1))]

    def checkpointed(self) -> str | None:
        """A checkpoint was taken: the one before it is measured by the steps between them, and
        the interval estimated again. The line to say, when the interval moved a quarter or more."""
        self._checkpoints += 1
        since, self._since = self._since, []
        plain = self.step_seconds
        if self._checkpoints < 2 or plain is None or not since:
            return None
        sample = sum(max(0.0, took - plain) for took in since)
        self.cost = sample if self.cost is None else WEIGHT * sample + (1 - WEIGHT) * self.cost
        self.seconds = interval(self.cost, self.mtbf, self.max_overhead)
        if self._said is not None and abs(self.seconds - self._said) < 0.25 * self._said:
            return None
        self._said = self.seconds
        return self.describe(plain)

    def describe(self, plain: float) -> str:
        assert self.cost is not None and self.seconds is not None
        steps = f"about {max(1, round(self.seconds / plain))} steps, " if plain > 0 else ""
        return (f"ravex: checkpoint every {_duration(self.seconds)} ({steps}checkpoint_every: auto): cost "
                f"{self.cost:.2f} s a checkpoint, MTBF {_duration(self.mtbf)}, expected loss per failure "
                f"{_duration(self.seconds / 2 + self.cost)}, overhead {100 * self.cost / self.seconds:.1f}%")


def interval(cost: float, mtbf: float, max_overhead: float) -> float:
    """Seconds between checkpoints: Young's optimum, no more often than ``max_overhead`` allows."""
    return max(math.sqrt(2 * cost * mtbf), cost / max_overhead)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"
