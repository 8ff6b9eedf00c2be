"""The storage circuit breaker: its states on an injected clock, then a real training loop
through a fault proxy that takes the S3 server down and brings it back.

The clock is the test's: time moves only when the test says so, so a cool-down is
"over" by assignment, never by waiting. Outcomes of background writes are awaited with
``ravex.flush()`` (the writer reports to the breaker before it goes idle).
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from rhelpers import KEY, SECRET
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ravex
import ravex.format.storage.fsspec_store
from ravex.format import open_store
from ravex.format.storage import RetryPolicy
from ravex.runtime.counting.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, duration


class Clock:
    """Seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    """The ravex logger's lines (it does not propagate to pytest's capture)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def matching(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


@pytest.fixture
def lines():
    handler = Lines()
    log = logging.getLogger("ravex")
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)


# ---- the state machine ---------------------------------------------------------------------


def test_opens_after_threshold_then_doubles_to_the_cap_and_closes_on_success(lines):
    clock = Clock()
    b = CircuitBreaker(threshold=3, first_cooldown=30, max_cooldown=600, clock=clock, where="s3://b/p")
    for step in (10, 20):
        assert b.allow()
        b.failed(step)
    assert b.state == CLOSED and lines.lines == []  # two failures: still trying every interval
    assert b.allow()
    b.failed(30)
    assert b.state == OPEN and b.status()["next_attempt_in_seconds"] == 30
    assert lines.lines == [
        "ravex: s3://b/p unreachable after 3 failed checkpoints; next attempt in 30 s — training continues"]

    cooldowns = []
    for _ in range(7):
        assert not b.allow()  # cooling down: skipped
        clock.now = b.retry_at - 0.001
        assert not b.allow()
        clock.now = b.retry_at
        assert b.allow() and b.state == HALF_OPEN  # the trial
        assert not b.allow(), "a second checkpoint must not pile onto the trial in flight"
        b.failed()
        cooldowns.append(b.cooldown)
    assert cooldowns == [60, 120, 240, 480, 600, 600, 600]
    assert "still unreachable" in lines.lines[1] and "next attempt in 1 min" in lines.lines[1]
    assert lines.lines[-1].endswith("next attempt in 10 min — training continues")
    status = b.status()
    assert status["state"] == OPEN and status["opened"] == 1 and status["skipped_checkpoints"] == 3 * 7
    assert status["consecutive_failures"] == 10 and status["cooldown_seconds"] == 600

    clock.now = b.retry_at
    assert b.allow()
    b.succeeded(120)
    assert b.state == CLOSED and b.status()["cooldown_seconds"] is None
    assert lines.lines[-1] == "ravex: s3://b/p reachable again (step 120 written) after 10 failed checkpoints; " \
                              "checkpointing resumes"
    # closed again: a new outage starts from the first cool-down
    for step in (130, 140, 150):
        assert b.allow()
        b.failed(step)
    assert b.state == OPEN and b.cooldown == 30 and b.status()["opened"] == 2


def test_a_success_resets_the_count_and_bad_settings_are_refused():
    b = CircuitBreaker(threshold=2, clock=Clock())
    b.failed()
    b.succeeded()
    b.failed()
    assert b.state == CLOSED  # not two in a row
    with pytest.raises(ValueError, match="threshold=0"):
        CircuitBreaker(threshold=0)
    assert [duration(s) for s in (30, 59.6, 60, 150, 600)] == ["30 s", "60 s", "1 min", "2.5 min", "10 min"]


def test_with_several_ranks_all_skip_when_any_rank_would(lines):
    """``agree`` stands for the ranks' MIN all-reduce: a breaker that would let a checkpoint
    through skips it when another rank's would not, and starts no trial of its own then."""
    clock = Clock()
    b = CircuitBreaker(threshold=2, first_cooldown=30, clock=clock)
    others = [True]
    asked: list[bool] = []

    def agree(mine: bool) -> bool:
        asked.append(mine)
        return mine and others[0]

    assert b.allow(agree) and asked == [True]
    others[0] = False  # another rank's breaker is open
    assert not b.allow(agree) and b.state == CLOSED and b.status()["skipped_checkpoints"] == 1
    b.failed()
    b.failed()  # this rank opens too
    assert b.state == OPEN
    clock.now += 31  # cooled down here, but the other rank still skips: no trial starts
    assert not b.allow(agree) and asked[-1] is True and b.state == OPEN
    others[0] = True
    assert b.allow(agree) and b.state == HALF_OPEN  # all agree: this is the trial
    assert not b.allow(agree) and asked[-1] is False  # a trial in flight: this rank says skip
    b.succeeded()
    assert b.state == CLOSED and b.allow(agree)


# ---- a real training loop, S3 down and back ------------------------------------------------


def _loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    loader = DataLoader(TensorDataset(torch.randn(4000, 8, generator=g), torch.randn(4000, 1, generator=g)),
                        batch_size=4, shuffle=True)
    batches = iter(loader)

    def train(n: int) -> None:
        """``n`` optimizer steps; a due checkpoint is taken at the next batch's ``next()``."""
        for _ in range(n):
            x, y = next(batches)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    return train


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith(("RAVEX_", "AWS_")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no stray ravex.yaml
    # Still retried, but an outage costs a failed checkpoint ~0.05 s, not 5-10 s.
    quick = RetryPolicy(tries=3, base_delay=0.01, max_delay=0.02)
    monkeypatch.setattr(ravex.format.storage.fsspec_store, "DEFAULT_RETRY", quick)
    yield
    ravex.deactivate()


def test_outage_opens_the_breaker_training_continues_and_recovers(clean_env, moto_server, proxy, s3_url, lines):
    storage = {"url": s3_url, "endpoint": proxy.url, "region": "us-east-1", "path_style": True,
               "access_key": KEY, "secret_key": SECRET}
    runtime = ravex.activate(storage=storage, checkpoint_every=2, keep_last=None, checkpoint_on_exit=False)
    clock = Clock()
    runtime.breaker = CircuitBreaker(threshold=3, first_cooldown=30, max_cooldown=600, clock=clock, where=s3_url)
    train = _loop()

    train(5)  # healthy: steps 2 and 4 written
    ravex.flush()
    assert ravex.status()["last_written_step"] == 4

    proxy.configure(outage="reset")  # the server is gone: every connection is reset
    proxy.reset_counts()
    train(6)  # checkpoints of 6, 8 and 10 fail (each after its retries)
    ravex.flush()
    assert runtime.step == 11
    assert len(lines.matching("FAILED")) == 3
    assert lines.matching("unreachable after 3 failed checkpoints; next attempt in 30 s — training continues")
    status = ravex.status()
    assert status["breaker"]["state"] == OPEN and status["breaker"]["next_attempt_in_seconds"] == 30
    assert "step 10" in status["last_error"] and status["last_written_step"] == 4

    proxy.reset_counts()
    train(40)  # 20 checkpoints due while cooling down: none is attempted, nothing waits
    ravex.flush()
    assert runtime.step == 51
    assert sum(proxy.counts.values()) == 0, proxy.counts
    assert ravex.status()["breaker"]["skipped_checkpoints"] == 20

    clock.now += 30  # cooled down: the next due checkpoint is one trial, still failing
    train(2)
    ravex.flush()
    assert sum(proxy.counts.values()) > 0
    assert lines.matching("still unreachable (trial checkpoint of step 52 failed); next attempt in 1 min")
    assert ravex.status()["breaker"]["cooldown_seconds"] == 60
    proxy.reset_counts()
    train(10)
    assert sum(proxy.counts.values()) == 0, proxy.counts

    proxy.configure()  # back
    clock.now += 60
    train(2)  # the trial at step 64 is written and closes the breaker
    ravex.flush()
    assert lines.matching("reachable again (step 64 written) after 4 failed checkpoints; checkpointing resumes")
    train(4)  # every interval again
    ravex.flush()
    status = ravex.status()
    assert status["breaker"]["state"] == CLOSED and status["last_error"] is None
    assert status["last_written_step"] == 68 and status["step"] == 69
    store = open_store(s3_url, storage_options=runtime.config.storage.storage_options())
    assert store.complete_steps() == [2, 4, 64, 66, 68]  # nothing written before the outage was lost
    assert store.read(4)["ravex"]["step"] == 4


def test_storage_down_from_the_start_costs_three_attempts_then_none(clean_env, moto_server, proxy, s3_url, lines):
    """Opening the store is retried on the training thread at each due checkpoint: the breaker
    bounds that too, and the first checkpoint after the outage opens the store and writes."""
    proxy.configure(outage=503)
    storage = {"url": s3_url, "endpoint": proxy.url, "region": "us-east-1", "access_key": KEY, "secret_key": SECRET}
    runtime = ravex.activate(storage=storage, checkpoint_every=1, keep_last=None, checkpoint_on_exit=False)
    clock = Clock()
    runtime.breaker = CircuitBreaker(threshold=3, clock=clock, where=s3_url)
    assert ravex.status()["backend"] is None and lines.matching("cannot open storage")
    train = _loop()
    proxy.reset_counts()
    train(4)  # checkpoints of 1, 2, 3 cannot open the store
    assert ravex.status()["breaker"]["state"] == OPEN
    attempts = sum(proxy.counts.values())
    assert attempts > 0
    train(30)
    assert sum(proxy.counts.values()) == attempts, "no request while cooling down"
    assert runtime.step == 34 and ravex.status()["breaker"]["skipped_checkpoints"] == 30

    proxy.configure()
    clock.now += 30
    train(2)  # the checkpoint of 34 (taken at batch 35's next()) is the trial; 35 waits for no trial
    ravex.flush()
    status = ravex.status()
    assert status["breaker"]["state"] == CLOSED and status["last_written_step"] == 34, status
    assert status["breaker"]["skipped_checkpoints"] == 31
    train(1)  # closed: every interval again
    ravex.flush()
    assert ravex.status()["last_written_step"] == 36
    assert open_store(s3_url, storage_options=runtime.config.storage.storage_options()).complete_steps() == [34, 36]
