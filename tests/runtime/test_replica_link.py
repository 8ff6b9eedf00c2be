"""``replicas: 1`` in one process, without torchrun: two backends (ranks 0 and 1, one per
"machine") meet through a rendezvous store of their own, as torchrun's ranks do; the one whose
local tier is empty takes the other's newest step at start; ``status()`` names the replica;
closing waits for the partner's bye, so neither leaves the other without its tier."""

from __future__ import annotations

import logging
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


def _both(make):
    """``make(rank)`` on two threads at once (each waits for the other at the rendezvous)."""
    out: dict[int, object] = {}
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            out[rank] = make(rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(rank,)) for rank in (0, 1)]
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
