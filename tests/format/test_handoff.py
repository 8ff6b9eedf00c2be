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
