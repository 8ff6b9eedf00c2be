"""``replicas: 1`` in one process, without torchrun: backends (one rank per "machine") meet
through a rendezvous store of their own, as torchrun's ranks do; the one whose local tier is
empty takes the other's newest step at start; ``status()`` names the replica; closing waits for
the partner's bye, so neither leaves the other without its tier. On three machines each tier
takes the newest step any other tier holds (the torchrun case, tests/remote/test_replicas_s3.py,
checks that each step written lands in all three)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from datetime import timedelta

import numpy as np
import pytest
from torch.distributed import TCPStore

from ravex.format import open_store
from ravex.runtime.config import RavexConfig
from ravex.saving.selection import get_backend
from ravex.saving.steps.replicas import BYE_TIMEOUT_S


@pytest.fixture
def rendezvous(monkeypatch):
    """A rendezvous store on 127.0.0.1 and torchrun's environment naming it (two machines of one rank)."""
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "replica-link-test")
    yield store


def _both(make, ranks: int = 2):
    """``make(rank)`` on ``ranks`` threads at once (each waits for the others at the rendezvous)."""
    out: dict[int, object] = {}
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            out[rank] = make(rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return out


def test_an_empty_tier_takes_the_other_machines_newest_step(tmp_path, rendezvous, caplog):
    tiers = [tmp_path / "local-0", tmp_path / "local-1"]
    with open_store(tiers[0], create=True).writer() as w:
        w.commit(5, {"w": np.arange(1000, dtype="float32"), "step": 5})

    def backend(rank: int):
        config = RavexConfig.load(overrides={"storage": str(tmp_path / "durable"), "local": str(tiers[rank]),
                                             "replicas": 1}, environ={})
        return get_backend(config, rank=rank, world_size=2)

    with caplog.at_level(logging.INFO, logger="ravex"):
        backends = _both(backend)
    assert open_store(tiers[1]).complete_steps() == [5]
    assert np.array_equal(open_store(tiers[1]).read(5)["w"], np.arange(1000, dtype="float32"))
    said = [r.getMessage() for r in caplog.records if "came from rank 0's machine" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("ravex: step 5 came from"), said
    status = backends[1].durable_tier()
    assert status is not None and len(status["replicas"]) == 1
    assert "rank 0's local tier" in status["replicas"][0]["url"] and status["replicas"][0]["last_error"] is None
    started = time.monotonic()
    _both(lambda rank: backends[rank].close())
    assert time.monotonic() - started < BYE_TIMEOUT_S / 2  # each waited for the other's bye, not its timeout


def test_three_machines_take_the_newest_step_of_any_tier_and_keep_each_step_in_all(tmp_path, rendezvous):
    """Tier 0 holds steps 5 and 7, tier 2 only 5, tier 1 nothing (a new machine): at start tiers 1
    and 2 take step 7, whichever partner each asks first; each names its partners nearest first."""
    tiers = [tmp_path / f"local-{rank}" for rank in range(3)]
    for tier, steps in ((tiers[0], (5, 7)), (tiers[2], (5,))):
        with open_store(tier, create=True).writer() as w:
            for step in steps:
                w.commit(step, {"w": np.full(1000, step, dtype="float32"), "step": step})

    def backend(rank: int):
        config = RavexConfig.load(overrides={"storage": str(tmp_path / "durable"), "local": str(tiers[rank]),
                                             "replicas": 1}, environ={})
        return get_backend(config, rank=rank, world_size=3)

    backends = _both(backend, ranks=3)
    for tier in tiers:
        assert open_store(tier).complete_steps()[-1] == 7, tier
        assert np.array_equal(open_store(tier).read(7)["w"], np.full(1000, 7, dtype="float32"))
    status = backends[1].durable_tier()
    assert status is not None and [r["url"].split("(")[1] for r in status["replicas"]] == [
        "rank 2's local tier)", "rank 0's local tier)"]
    _both(lambda rank: backends[rank].close(), ranks=3)


def test_rank_0_drops_a_crashed_runs_partial_step_in_every_machines_tier(tmp_path, rendezvous):
    """Step 9 of a crashed run reached machines 1 and 2 for ranks 1 and 2 only (machine 0, which
    held it whole, is lost): rank 0 of the rerun drops it there too, so this run's copies of its
    own step 9 do not meet the crashed run's manifests (refused as another step)."""
    tiers = [tmp_path / f"local-{rank}" for rank in range(3)]
    for tier in tiers:
        store = open_store(tier, create=True)
        for rank in range(3):
            with store.writer(rank=rank, world_size=3, run="crashed") as w:
                w.commit(7, {f"w{rank}": np.full(100, rank, dtype="float32")})
        if tier != tiers[0]:
            for rank in (1, 2):
                with store.writer(rank=rank, world_size=3, run="crashed") as w:
                    w.commit(9, {f"w{rank}": np.full(100, 9, dtype="float32")})
    shutil.rmtree(tiers[0])  # machine 0 lost: its new tier takes step 7 from another machine's

    def backend(rank: int):
        config = RavexConfig.load(overrides={"storage": str(tmp_path / "durable"), "local": str(tiers[rank]),
                                             "replicas": 1}, environ={})
        return get_backend(config, rank=rank, world_size=3)

    backends = _both(backend, ranks=3)
    assert [open_store(tier).step_numbers() for tier in tiers[1:]] == [[7, 9], [7, 9]]
    assert backends[0].discard_incomplete_above(backends[0].latest_step()) == [9]  # said by the caller
    for tier in tiers:
        assert open_store(tier).step_numbers() == [7], tier
    _both(lambda rank: backends[rank].close(), ranks=3)
