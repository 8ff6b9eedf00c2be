"""``collectives.Poll``'s schedule, in one process (the all-reduce is then the identity):
rank 0 spaces polls ~``POLL_SECONDS`` apart by its step time, the interval at most doubles per
poll, shrinks at once when steps slow down, and a caught signal rides the next exchange."""

from __future__ import annotations

import itertools

import pytest

from ravex.runtime.distributed import collectives


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(collectives.time, "monotonic", lambda: now[0])
    return now


def _run(poll: collectives.Poll, clock: list[float], steps: range, step_s: float) -> list[int]:
    polled = []
    for step in steps:
        clock[0] += step_s
        if poll.due(step):
            poll.exchange(step, 0, False)
            polled.append(step)
    return polled


def test_fast_steps_poll_about_once_a_second_after_a_doubling_start(clock):
    poll = collectives.Poll(None)
    polled = _run(poll, clock, range(1, 3000), 1 / 128)  # 128 steps per second (exact in binary)
    assert polled[:8] == [1, 2, 4, 8, 16, 32, 64, 128]
    gaps = {b - a for a, b in itertools.pairwise(polled[7:])}
    assert gaps == {int(collectives.POLL_SECONDS * 128)}


def test_slow_steps_shrink_the_interval_at_once_and_time_checkpoints_poll_four_times_per_period(clock):
    poll = collectives.Poll(None)
    _run(poll, clock, range(1, 1000), 1 / 128)
    assert poll.interval == 128
    _run(poll, clock, range(1000, 1000 + poll.interval), 0.5)  # steps now take 0.5 s
    assert poll.interval == 2
    timed = collectives.Poll(2.0)  # checkpoint_every_seconds: 2 -> a poll every 0.5 s
    polled = _run(timed, clock, range(1, 500), 1 / 128)
    assert polled[-1] - polled[-2] == 64


def test_a_caught_signal_and_rank_zeros_clock_come_back_from_the_exchange(clock):
    poll = collectives.Poll(None)
    assert poll.exchange(1, 0, False) == (False, 0)
    poll.pending = 15
    assert poll.exchange(2, 0, True) == (True, 15)
