"""Rank 0 hands a step's manifests to the other ranks (:mod:`ravex.format.steps.handoff`): what a
rank other than 0 asks of storage to find and read its resume step does not grow with the
world size (issue 24), and a payload that is not one complete step of one run is refused."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

from ravex.format import open_store
from ravex.format.errors import ManifestError
from ravex.format.steps.handoff import adopt_step, newest_own_step, pack_step
from ravex.format.steps.reader import RankReader
from ravex.format.writing.reshard import read_rows, shard_of, shard_rows


class Counting:
    """Storage calls as an object store bills them (GET, LIST per 1000 names)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.ops = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> bytes:
        self.ops["GET"] += 1
        data: bytes = self.inner.read(key)
        return data

    def list_dir(self, prefix: str) -> list[str]:
        names: list[str] = self.inner.list_dir(prefix)
        self.ops["LIST"] += max(1, math.ceil(len(names) / 1000))
        return names


def _write(path: str, world: int, steps: int = 2) -> None:
    store = open_store(path, create=True)
    for rank in range(world):
        mine = shard_rows(4 * world, world, rank)
        local = np.full((mine.stop - mine.start, 3), rank, dtype=np.float32)
        tree = {"w": shard_of(local, (4 * world, 3), world, rank, 4), f"rank-{rank}": {"seen": rank}}
        with store.writer(rank=rank, world_size=world, run="r") as w:
            for s in range(steps):
                w.commit(10 * (s + 1), tree)


def _other_rank(path: str, payload: bytes, rank: int) -> tuple[Counter[str], Any]:
    store = open_store(path)
    counting = Counting(store.storage)
    store.storage = counting  # type: ignore[assignment]
    step = newest_own_step(store, rank)
    assert step == 20
    assert RankReader(store, step, rank).tree(rank)[f"rank-{rank}"] == {"seen": rank}
    assert adopt_step(store, payload) == step
    reader = store.open_step(step)
    return counting.ops, reader


@pytest.mark.parametrize("world", [2, 12])
def test_a_rank_other_than_0_reads_its_own_manifest_and_no_other(tmp_path, world):
    path = str(tmp_path / "s")
    _write(path, world)
    payload = pack_step(open_store(path), 20)
    ops, reader = _other_rank(path, payload, world - 1)
    # steps/ and the step's folder listed, its own manifest read twice (guess, position): never W
    assert dict(ops) == {"LIST": 2, "GET": 2}, ops
    rows = read_rows(reader, "w", world, world - 1)
    assert np.all(rows == world - 1)


def test_a_payload_of_mixed_runs_or_wrong_ranks_is_refused(tmp_path):
    path = str(tmp_path / "s")
    _write(path, 2)
    store = open_store(path)
    payload = pack_step(store, 20)
    with pytest.raises(ManifestError):
        adopt_step(open_store(path), b"junk")
    with pytest.raises(ManifestError):
        adopt_step(open_store(path), payload.replace(b'"step": 20', b'"step": 10'))
    with pytest.raises(ManifestError):
        adopt_step(open_store(path), payload.replace(b'"run":"r"', b'"run":"x"', 1))


def test_the_guess_skips_a_partial_step(tmp_path):
    path = str(tmp_path / "s")
    _write(path, 3)
    store = open_store(path)
    with store.writer(rank=1, world_size=3, run="r") as w:  # a crashed run: rank 1 alone wrote 30
        w.commit(30, {f"rank-{1}": {"seen": 1}})
    assert newest_own_step(open_store(path), 1) == 20


def test_a_rank_beyond_the_steps_world_guesses_from_rank_0s_manifest(tmp_path):
    path = str(tmp_path / "s")
    _write(path, 2)  # the job now runs on 4 ranks: ranks 2 and 3 wrote nothing
    store = open_store(path)
    with store.writer(rank=0, world_size=2, run="r") as w:  # a partial step: rank 0 alone wrote 30
        w.commit(30, {"rank-0": {"seen": 0}})
    assert newest_own_step(open_store(path), 3) == 20
    assert newest_own_step(open_store(path), 1) == 20


def _rank0(path: str) -> tuple[Counter[str], list[int], bytes]:
    """Rank 0 at a resume, counted: the steps it offers (newest first), then the payload of the
    newest (its reader's manifests, as the backend packs them)."""
    store = open_store(path)
    counting = Counting(store.storage)
    store.storage = counting  # type: ignore[assignment]
    found = store.resume_steps(limit=64, pin=True)
    view, step = found[0]
    payload = pack_step(view, step)
    view.open_step(step)
    return counting.ops, [s for _, s in found], payload


@pytest.mark.parametrize("kept", [2, 6])
def test_rank_0_reads_one_steps_manifests_whatever_the_steps_kept(tmp_path, kept):
    """Issue 33 item 4: rank 0 checks the newest step first (its W manifests, read once and
    pinned for the hand-over and the read) and names the older ones from their listing: W GETs
    at 16 ranks whether 2 or 6 steps are kept (it read every manifest of every step: S x W)."""
    world = 16
    path = str(tmp_path / "s")
    _write(path, world, steps=kept)
    ops, steps, payload = _rank0(path)
    assert steps == [10 * s for s in range(kept, 0, -1)]
    assert ops["GET"] == world, ops
    # timelines/ and steps/, then each step's folder (16 names: one page), for the steps offered
    assert ops["LIST"] == 2 + kept, ops
    old = open_store(path)  # the check before: every rank's manifest of every kept step
    old.storage = Counting(old.storage)  # type: ignore[assignment]
    assert old.lineage_steps()[-1][1] == steps[0]
    assert old.storage.ops["GET"] == kept * world  # type: ignore[attr-defined]
    ops1, reader = _other_rank_at(path, payload, world - 1, 10 * kept)
    assert ops1["GET"] == 2, ops1  # the other rank's count is what it was
    assert np.all(read_rows(reader, "w", world, world - 1) == world - 1)


def _other_rank_at(path: str, payload: bytes, rank: int, step: int) -> tuple[Counter[str], Any]:
    store = open_store(path)
    counting = Counting(store.storage)
    store.storage = counting  # type: ignore[assignment]
    assert newest_own_step(store, rank) == step
    assert RankReader(store, step, rank).tree(rank)[f"rank-{rank}"] == {"seen": rank}
    assert adopt_step(store, payload) == step
    return counting.ops, store.open_step(step)


def test_rank_0_walks_down_past_partial_and_mixed_steps_as_the_full_check_does(tmp_path):
    path = str(tmp_path / "s")
    _write(path, 3)
    store = open_store(path)
    with store.writer(rank=1, world_size=3, run="r") as w:  # a crashed run: rank 1 alone wrote 30
        w.commit(30, {"rank-1": {"seen": 1}})
    for rank in range(3):  # every name there, but rank 2's is another run's: not complete
        with store.writer(rank=rank, world_size=3, run="x" if rank == 2 else "r") as w:
            w.commit(40, {f"rank-{rank}": {"seen": rank}})
    fresh = open_store(path)
    counting = Counting(fresh.storage)
    fresh.storage = counting  # type: ignore[assignment]
    found = fresh.resume_steps()
    assert [s for _, s in found] == [20, 10]  # 40 checked and passed over, 30 from its listing
    assert found[0][1] == open_store(path).lineage_steps()[-1][1]
    assert counting.ops["GET"] == 3 + 3, counting.ops  # 40's manifests, then 20's; none of 30's
    assert [s for _, s in open_store(path).resume_steps(limit=1)] == [20]


def test_rank_0_on_a_forked_timeline_offers_its_lineage(tmp_path):
    path = str(tmp_path / "s")
    _write(path, 2, steps=3)  # main: 10, 20, 30
    store = open_store(path)
    fork = store.fork(10, name="exp", run="f")
    for rank in range(2):
        with fork.writer(rank=rank, world_size=2, run="f") as w:
            w.commit(15, {f"rank-{rank}": {"seen": rank}})
    view = open_store(path).on_timeline("exp")
    found = view.resume_steps()
    assert [(v.timeline.name, s) for v, s in found] == [("exp", 15), ("main", 10)]
    assert [(v.timeline.name, s) for v, s in view.lineage_steps()][::-1] == \
        [(v.timeline.name, s) for v, s in found]
