"""Rank 0's settling of a multi-rank step (:mod:`ravex.saving.steps.settler`): ``refs.json`` is
written with each checkpoint up to :data:`REFS_MAX_RANKS` ranks and not above (issue 33 item 4:
it reads every rank's manifest again), which the log says once with the command that writes it."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ravex.format import open_store
from ravex.saving.steps.settler import REFS_MAX_RANKS, Settler


def _write(path: str, world: int, steps: tuple[int, ...]) -> None:
    store = open_store(path, create=True)
    for rank in range(world):
        with store.writer(rank=rank, world_size=world, run="r", threads=1) as w:
            for step in steps:
                w.commit(step, {"w": np.ones(2, dtype=np.float32), f"rank-{rank}": {"seen": rank}})


@pytest.mark.parametrize("world", [4, REFS_MAX_RANKS + 1])
def test_refs_json_with_each_checkpoint_only_up_to_the_threshold(tmp_path, caplog, world):
    path = str(tmp_path / "s")
    _write(path, world, (10, 20))
    store = open_store(path)
    settler = Settler(world, path)
    with caplog.at_level(logging.INFO, logger="ravex"):
        settler.settle(store, 10)
        settler.settle(store, 20)
    said = [r.getMessage() for r in caplog.records if "--format refs" in r.getMessage()]
    refs = [(tmp_path / "s" / "steps" / str(s) / "refs.json").exists() for s in (10, 20)]
    lines = [r.getMessage() for r in caplog.records if f"({world} ranks)" in r.getMessage()]
    assert len(lines) == 2, lines  # the job's line for each step, as before
    if world <= REFS_MAX_RANKS:
        assert refs == [True, True] and said == []
    else:
        assert refs == [False, False]
        assert len(said) == 1 and "ravex export step_10 --format refs" in said[0], said


def test_a_step_without_every_manifest_at_close_is_not_complete_not_failed(tmp_path, caplog, monkeypatch):
    """At exit rank 0 cannot tell a late rank from a failed one: a step a rank has not written
    within the wait is said NOT COMPLETE (it may complete once rank 0 is gone), naming the ranks;
    a step older than a complete one is FAILED, as that rank went on past it."""
    import ravex.saving.steps.settler as settler_module

    monkeypatch.setattr(settler_module, "CLOSE_WAIT_S", 0.2)
    path = str(tmp_path / "s")
    store = open_store(path, create=True)
    for step, ranks in ((10, (0,)), (20, (0, 1)), (30, (0,))):
        for rank in ranks:
            with store.writer(rank=rank, world_size=2, run="r", threads=1) as w:
                w.commit(step, {"w": np.ones(2, dtype=np.float32), f"rank-{rank}": {"seen": rank}})
    settler = Settler(2, path)
    with caplog.at_level(logging.INFO, logger="ravex"):
        for step in (10, 20, 30):
            settler.settle(store, step)
        settler.close(store)
    said = [r.getMessage() for r in caplog.records]
    assert any("checkpoint step 10 (2 ranks) FAILED on ranks [1]" in m for m in said), said
    assert any("checkpoint step 30 (2 ranks) NOT COMPLETE when rank 0 exited: no manifest from ranks [1]" in m
               for m in said), said
    assert not any("step 30" in m and "FAILED" in m for m in said), said
