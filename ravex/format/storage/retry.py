"""Retries of transient storage faults: one :class:`RetryPolicy`, one loop (:func:`call_with_retries`).

:class:`~.fsspec_store.FsspecStorage` retries transient faults (:func:`~.faults.is_transient`)
with exponential backoff and jitter under one policy, bounded in tries and in seconds, and
nothing else does: for ``s3://`` it turns off botocore's and s3fs's own retry loops, which
would otherwise multiply (botocore's 5 attempts inside each of s3fs's 5). Local disks do not
fail transiently, so :class:`~.local.LocalStorage` reports an error at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .faults import describe, is_transient, storage_error

log = logging.getLogger("ravex.format.storage")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How :class:`FsspecStorage` retries transient faults.

    At most ``tries`` attempts per operation; before attempt ``n + 1`` it sleeps a
    random time in ``[d/2, d]`` with ``d = min(max_delay, base_delay * 2**(n-1))``
    ("equal jitter": backoff grows, concurrent writers spread out). It gives up early
    rather than start a sleep that would end past ``budget_seconds`` after the first
    attempt began, so a persistent outage costs one operation at most about that long.
    ``RetryPolicy(tries=1)`` disables retries.
    """

    tries: int = 6
    base_delay: float = 0.2
    max_delay: float = 3.0
    budget_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.tries < 1:
            raise ValueError(f"RetryPolicy.tries={self.tries}: at least one attempt")
        if self.base_delay < 0 or self.max_delay < 0 or self.budget_seconds < 0:
            raise ValueError("RetryPolicy delays and budget must be >= 0")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep after failed attempt number ``attempt`` (1-based)."""
        d: float = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        jitter = rng.uniform(0, d / 2) if rng is not None else random.uniform(0, d / 2)
        return d / 2 + jitter


DEFAULT_RETRY = RetryPolicy()


def call_with_retries(
    policy: RetryPolicy,
    rng: random.Random,
    url: str,
    op: str,
    key: str,
    fn: Callable[[], T],
    absent_ok: bool = False,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """Run ``fn`` under ``policy``; a failure that ends the tries is raised as a
    :class:`~ravex.format.errors.StorageError` naming ``url``, ``op`` and ``key``.
    ``absent_ok``: ``FileNotFoundError`` is an answer (reads), passed through; otherwise it
    is a failure like any other. ``on_retry`` is called before each pause (counters)."""
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            if absent_ok and isinstance(exc, FileNotFoundError):
                raise
            elapsed = time.monotonic() - started
            transient = is_transient(exc)
            pause = policy.delay(attempt, rng) if transient else 0.0
            if not transient or attempt >= policy.tries or elapsed + pause > policy.budget_seconds:
                note = f" after {attempt} tries in {elapsed:.1f} s" if transient and attempt > 1 else ""
                if not transient and attempt > 1:
                    note = f" on try {attempt}"
                raise storage_error(url, op, key, exc, note) from exc
            log.debug("%s %s %r: %s; retry %d in %.2f s", url, op, key, describe(exc), attempt, pause)
            if on_retry is not None:
                on_retry()
            time.sleep(pause)
