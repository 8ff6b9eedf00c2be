"""A rank other than 0 resuming a forked timeline (``resume: auto``) guesses its step and reads its
loop position from listings and its own manifest, as on ``main``: no other rank's manifest
(issue 33 item 4; SCALE.md "Not done" 5). Rank 0 hands the step's manifests over as on main."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import ravex.format.store as store_module
from ravex.format import open_store
from ravex.format.errors import StepNotFoundError
from ravex.format.storage import LocalStorage
from ravex.saving.zarr import ZarrBackend

WORLD = 6


class Counting(LocalStorage):
    counts: ClassVar[Counter[str]] = Counter()
    manifests_read: ClassVar[list[str]] = []

    def read(self, key: str) -> bytes:
        self.counts["GET manifest" if "/rank-" in key else "GET other"] += 1
        if "/rank-" in key:
            self.manifests_read.append(key)
        return super().read(key)


def _settings(url: str, delta: bool = False) -> Any:
    return SimpleNamespace(storage=SimpleNamespace(url=url, storage_options=dict), backend="zarr",
                           compression="none", delta=delta, chunk_tables=False, keep_last=None,
                           keep_every=None, skip_unchanged=False, full_stage_every=1, local=None)


def _commit(store: Any, step: int, ranks: range) -> None:
    for rank in ranks:
        with store.writer(rank=rank, world_size=WORLD, run=f"run{step}", threads=1) as w:
            w.commit(step, {"w": np.ones(3, dtype=np.float32), f"rank-{rank}": {"seen": rank, "step": step}})


@pytest.fixture
def backend(monkeypatch: Any) -> Iterator[Callable[..., ZarrBackend]]:
    """Opens a rank's backend over request-counting storage; every one is closed at the end."""
    opened: list[ZarrBackend] = []
    monkeypatch.setattr(store_module, "open_storage", lambda url, *a, **k: Counting(url))

    def open_backend(path: str, rank: int, delta: bool = False) -> ZarrBackend:
        opened.append(ZarrBackend(_settings(path, delta), rank, WORLD))  # type: ignore[arg-type]
        return opened[-1]

    yield open_backend
    for one in opened:
        one.close()


def test_a_follower_on_a_fork_reads_only_its_own_manifest(tmp_path, backend):
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step in (10, 20, 30):
        _commit(store, step, range(WORLD))
    fork = store.fork(20, name="exp", run="f")
    _commit(fork, 25, range(WORLD))
    _commit(fork, 27, range(2))  # a crashed run's partial step on the fork

    zero = backend(path, 0)
    follower = backend(path, WORLD - 1)
    assert zero.timeline_name == follower.timeline_name == "exp"
    assert zero.resume_candidates() == [25, 20, 10]  # the fork's own, then main's up to the fork
    payload = zero.hand_over(25)
    Counting.counts.clear()
    assert follower.newest_step_guess(WORLD - 1) == 25
    peeked = follower.peek_step(25, WORLD - 1, WORLD)
    assert peeked is not None and peeked.tree["step"] == 25
    follower.take_over(payload)
    loaded = follower.read_step(25, WORLD - 1, WORLD)
    assert loaded is not None and loaded.tree["seen"] == WORLD - 1
    # rank 0's of the partial step 27 (its world size: the folder lists ranks 0 and 1), then its
    # own of 25 twice (guess, position); none of the other ranks' (W - 1 of them before)
    assert Counting.counts["GET manifest"] == 3, Counting.counts


def test_a_follower_on_a_fork_without_steps_goes_to_the_fork_step(tmp_path, backend):
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step in (10, 20, 30):
        _commit(store, step, range(WORLD))
    store.fork(20, name="exp", run="f")
    follower = backend(path, 3)
    assert follower.timeline_name == "exp"
    assert follower.newest_step_guess(3) == 20  # main's 30 is after the fork: not this history
    peeked = follower.peek_step(20, 3, WORLD)
    assert peeked is not None and peeked.tree["seen"] == 3


def _agree_with(zero_says: bool):
    """``all_ok`` over two ranks, rank 0's vote fixed: what a follower's collective returns."""
    return lambda ok: ok and zero_says


def test_a_follower_told_a_step_reads_only_its_own_manifest_and_follows_rank_0s_fork(tmp_path, backend):
    """``resume: 20`` (older than the newest, 30: rank 0 forks): a rank other than 0 checks
    nothing itself; it reads its own manifest for its position, takes rank 0's manifests, and
    learns from rank 0's vote that the fork exists, which it then finds by the run id."""
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step in (10, 20, 30):
        _commit(store, step, range(WORLD))

    zero = backend(path, 0)
    follower = backend(path, WORLD - 1)
    assert zero.resume_point(20) == 20 and zero.fork_pending
    payload = zero.hand_over(20)
    Counting.counts.clear()
    Counting.manifests_read.clear()
    assert follower.resume_point(20, follow=True) == 20
    assert Counting.manifests_read == ["steps/20/rank-0.json"], Counting.manifests_read  # looks complete
    peeked = follower.peek_step(20, WORLD - 1, WORLD)
    assert peeked is not None and peeked.tree["seen"] == WORLD - 1
    follower.take_over(payload)
    for backend in (zero, follower):
        backend.set_run("rerun")
    zero.fork_agreed(0, lambda ok: ok)
    follower.fork_agreed(WORLD - 1, _agree_with(True))
    assert zero.timeline_name == follower.timeline_name == "main-20"
    loaded = follower.read_step(20, WORLD - 1, WORLD)
    assert loaded is not None and loaded.tree["seen"] == WORLD - 1
    assert Counting.counts["GET manifest"] == 2, Counting.counts  # and its own, for its position


def test_a_follower_told_the_newest_step_stays_on_its_timeline(tmp_path, backend):
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step in (10, 20):
        _commit(store, step, range(WORLD))
    zero = backend(path, 0)
    follower = backend(path, 2)
    assert zero.resume_point(20) == 20 and not zero.fork_pending
    assert follower.resume_point(20, follow=True) == 20 and follower.fork_pending  # not known yet
    follower.fork_agreed(2, _agree_with(False))  # rank 0 voted: no fork
    assert not follower.fork_pending and follower.timeline_name == "main"
    assert store.timelines().keys() == {"main"}


def test_the_first_checkpoint_after_a_resume_reads_no_other_ranks_manifest(tmp_path, backend):
    """The step handed over is the delta base of each rank's first commit (from its own pinned
    manifest): finding a base by checking the newest step would read all W manifests on every
    rank, W^2 GETs for the job at its first checkpoint."""
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step in (10, 20):
        _commit(store, step, range(WORLD))
    zero = backend(path, 0)
    follower = backend(path, 3, delta=True)
    assert zero.resume_candidates()[0] == 20
    payload = zero.hand_over(20)
    assert follower.newest_step_guess(3) == 20
    follower.take_over(payload)
    assert follower.read_step(20, 3, WORLD) is not None
    Counting.manifests_read.clear()
    writer = follower._make_writer()
    stats = writer.commit(30, {"w": np.ones(3, dtype=np.float32), "rank-3": {"seen": 3, "step": 30}})
    others = [k for k in Counting.manifests_read if not k.endswith("rank-3.json")]
    assert others == [], others
    assert stats.reused_chunks > 0  # the handed-over step was the base: "w" was not written again
    writer.close()


def test_a_step_named_that_is_not_there_stops_every_rank(tmp_path, backend):
    """``resume: 10`` where retention dropped step 10: rank 0 stops with the error, and so must
    every other rank, before any collective (one left behind waits for rank 0 forever)."""
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step in (20, 30):
        _commit(store, step, range(WORLD))
    _commit(store, 40, range(2))  # a partial step is no step to resume either
    for rank in (0, 3):
        opened = backend(path, rank)
        for missing in (10, 40):
            with pytest.raises(StepNotFoundError, match=f"step {missing} .* not readable"):
                opened.resume_point(missing, follow=rank != 0)

