"""The ranks of one machine fetch a durable step into their shared local tier at once: one of
them copies it, under the tier's lock, with every rank's witness, and says so; the others find
it there (``ravex.saving.steps.tiers.fetch``). Without the lock a rank could find the step
copied by another and the rerun's line saying where it came from went missing."""

from __future__ import annotations

import logging
import threading

import numpy as np

from ravex.format import open_store
from ravex.format.history.witness import Witness, WitnessEntry, read_witness, write_witness
from ravex.saving.steps.tiers import fetch


def _durable_step(tmp_path, ranks: int = 2):
    durable = open_store(str(tmp_path / "durable"), create=True)
    writers = [durable.writer(rank=r, world_size=ranks, run="r") for r in range(ranks)]
    for r, writer in enumerate(writers):
        writer.commit(8, {f"w{r}": np.full(1 << 14, r, dtype=np.float32)})  # one tensor of its own per rank
        writer.close()
    for r in range(ranks):
        entry = WitnessEntry(step=9, loss="1.0", batch="ab" * 16, calls=1)
        write_witness(durable.storage, durable.steps_prefix, Witness(step=8, rank=r, run="r", entries=(entry,)))
    return durable


def test_ranks_fetching_at_once_copy_the_step_once_and_say_it_once(tmp_path, caplog):
    durable = _durable_step(tmp_path)
    local = [open_store(str(tmp_path / "local"), create=True) for _ in range(4)]
    start, got = threading.Barrier(4), [None] * 4

    def rank(i: int) -> None:
        start.wait()
        got[i] = fetch(local[i], open_store(str(tmp_path / "durable")))

    with caplog.at_level(logging.INFO, logger="ravex"):
        threads = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(got, key=str) == [8, None, None, None], got
    said = [r.getMessage() for r in caplog.records if "came from the durable tier" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("ravex: step 8 came from the durable tier"), said
    tier = open_store(str(tmp_path / "local"))
    assert tier.complete_steps() == [8]
    for r in range(2):
        witness = read_witness(tier.storage, tier.steps_prefix, 8, r)
        assert witness is not None and witness.entries, r
    assert fetch(tier, durable) is None  # as new as the durable tier: nothing to do
