"""The stale-result guard's counter for the questions that take long (a diff, a validation).

The app and the validate pane share one: each new question, or a move to another timeline,
bumps it, and a worker's answer lands only while the counter still reads what it read when the
worker started. So a diff started during a validation drops the validation's answer, as before
the pane ran its own worker.
"""

from __future__ import annotations


class Generation:
    """A counter bumped by every new question; :meth:`current` says whether an answer is wanted."""

    def __init__(self) -> None:
        self.value = 0

    def next(self) -> int:
        self.value += 1
        return self.value

    def current(self, generation: int) -> bool:
        return generation == self.value
