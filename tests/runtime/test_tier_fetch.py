"""The ranks of one machine share its local tier. They fetch a durable step into it at once: one
of them copies it, under the tier's lock, with every rank's witness, and says so; the others find
it there (``ravex.saving.steps.tiers.fetch``). Without the lock a rank could find the step
copied by another and the rerun's line saying where it came from went missing. And each rank
persists its own part of a step without waiting for the others (``Persister``), while the local
retention goes on around the copies."""

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


def test_rank_0_refreshes_its_witness_while_another_rank_has_not_committed_the_step(tmp_path, caplog):
    """Under torchrun each rank persists its own manifest; rank 0's next commit refreshes the
    durable copy of its witness of the persisted step, which rank 1 may not have committed
    locally yet. Its own witness is all it copies: nothing fails, nothing is said."""
    from ravex.saving.steps.tiers import Persister

    local = open_store(str(tmp_path / "local"), create=True)
    durable = open_store(str(tmp_path / "durable"), create=True)
    writer = local.writer(rank=0, world_size=2, run="r")
    writer.commit(8, {"w0": np.zeros(1 << 14, dtype=np.float32)})  # rank 1 lags: step 8 is incomplete
    entry = WitnessEntry(step=9, loss="1.0", batch="ab" * 16, calls=1)
    write_witness(local.storage, local.steps_prefix, Witness(step=8, rank=0, run="r", entries=(entry,)))
    persister = Persister(durable, every=1, keep_last=None, rank=0)
    with caplog.at_level(logging.INFO, logger="ravex"):
        persister.committed(local, 8)
        persister.flush()
        persister.refresh_witness()
        persister.flush()
        persister.close()
    failed = [r.getMessage() for r in caplog.records if "FAILED" in r.getMessage()]
    assert failed == [] and persister.last_error is None, failed
    witness = read_witness(durable.storage, durable.steps_prefix, 8, 0)
    assert witness is not None and witness.entries == (entry,)


def test_a_durable_tier_unreachable_at_start_is_opened_by_the_first_copy_that_reaches_it(tmp_path, caplog):
    """The copies of a run that started without its durable tier (``Unopened``) fail, said, while
    it stays unreachable; the first after it came back opens it and copies the step there."""
    from ravex.format import RavexError
    from ravex.saving.steps.tiers import Persister, Unopened

    local = open_store(str(tmp_path / "local"), create=True)
    writer = local.writer(rank=0, world_size=1, run="r")
    reachable = threading.Event()

    def reopen():
        if not reachable.is_set():
            raise RavexError("store 'durable': endpoint down")
        return open_store(str(tmp_path / "durable"), create=True)

    persister = Persister(Unopened(str(tmp_path / "durable"), reopen, "endpoint down"), every=1, keep_last=None)
    assert persister.last_error == "endpoint down"  # what ravex.status() says before any copy
    with caplog.at_level(logging.INFO, logger="ravex"):
        for step, reach in ((8, False), (9, True)):
            writer.commit(step, {"w": np.full(1 << 14, step, dtype=np.float32)})
            if reach:
                reachable.set()
            persister.committed(local, step)
            persister.flush()
        persister.close()
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("ravex: copying step 8 to") and "FAILED" in m for m in said), said
    assert any(m.endswith("is reachable: copies of the local steps to it resume") for m in said), said
    assert persister.persisted_step == 9 and persister.last_error is None
    assert open_store(str(tmp_path / "durable")).complete_steps() == [9]


def test_local_retention_runs_while_a_copy_is_always_underway_and_keeps_what_it_reads(tmp_path, monkeypatch):
    """The copy of each step to the durable tier is still underway when the next step commits (a
    slow link): the local ``keep_last`` must not wait for an idle moment that never comes, nor
    take the step being copied. Each copy here returns only once the next step was committed."""
    import ravex.format
    from ravex.runtime.config import RavexConfig
    from ravex.saving.plan import SavePlan
    from ravex.saving.selection import get_backend

    entered = {step: threading.Event() for step in range(1, 9)}
    release = {step: threading.Event() for step in range(1, 9)}
    real_copy = ravex.format.copy_step

    def slow_copy(src, dst, step, ranks=None):
        entered[step].set()
        assert release[step].wait(30)
        return real_copy(src, dst, step, ranks=ranks)

    monkeypatch.setattr(ravex.format, "copy_step", slow_copy)
    monkeypatch.chdir(tmp_path)
    config = RavexConfig.load({"storage": str(tmp_path / "durable"), "local": str(tmp_path / "local"),
                               "keep_last": 2, "persist_keep_last": None}, environ={})
    backend = get_backend(config, rank=0, world_size=1)
    try:
        for step in range(1, 8):
            backend.save(SavePlan(step, {"w": np.full(1 << 12, step, dtype=np.float32)}, {"step": step}))
            if step > 1:
                release[step - 1].set()
            assert entered[step].wait(30)  # committed (its copy is queued only then), and its copy underway
        # step 6's retention ran (the writer committed 7 after it) while step 5 or 6 was being copied
        held = open_store(str(tmp_path / "local")).complete_steps()
        assert held[0] >= 5 and len(held) <= 3, held
    finally:
        for event in release.values():
            event.set()
        backend.close()
    assert open_store(str(tmp_path / "local")).complete_steps() == [6, 7]
    assert open_store(str(tmp_path / "durable")).complete_steps() == list(range(1, 8))


def test_a_witness_grown_while_its_step_was_being_copied_is_copied_after_it(tmp_path, monkeypatch):
    """The witness of step 8 grows (steps 9 and 10 run) while step 8's copy is underway, and the
    refreshes asked for meanwhile find no step copied yet: the witness still reaches the
    destination once the copy ends, not only at the next checkpoint (a machine lost before it
    would take its record of those steps along)."""
    import ravex.format
    from ravex.saving.steps.tiers import Persister

    local = open_store(str(tmp_path / "local"), create=True)
    durable = open_store(str(tmp_path / "durable"), create=True)
    with local.writer(rank=0, world_size=1, run="r") as writer:
        writer.commit(8, {"w": np.zeros(1 << 12, dtype=np.float32)})
    entered, release = threading.Event(), threading.Event()
    real_copy = ravex.format.copy_step

    def slow_copy(src, dst, step, ranks=None):
        entered.set()
        assert release.wait(30)
        return real_copy(src, dst, step, ranks=ranks)

    monkeypatch.setattr(ravex.format, "copy_step", slow_copy)
    persister = Persister(durable, every=1, keep_last=None, rank=0, tier="replica", in_order=True)
    persister.committed(local, 8)
    assert entered.wait(30)
    entries = tuple(WitnessEntry(step=s, loss="1.0", batch="ab" * 16, calls=1) for s in (9, 10))
    for grown in (entries[:1], entries):
        write_witness(local.storage, local.steps_prefix, Witness(step=8, rank=0, run="r", entries=grown))
        persister.refresh_witness()
    release.set()
    persister.flush()
    witness = read_witness(durable.storage, durable.steps_prefix, 8, 0)
    assert witness is not None and witness.entries == entries
    persister.close()


def test_the_newest_steps_witnesses_come_from_whichever_other_tier_holds_the_longest(tmp_path):
    """Rank 1's record of the steps after step 7 reached one other machine in full and another in
    part, rank 2's only the second; the local tier takes the longest of each, and never one of
    another run's step 7."""
    from ravex.saving.steps.tiers import gather_witnesses

    tiers = [open_store(str(tmp_path / f"tier-{n}"), create=True) for n in range(4)]
    for tier in tiers:
        for rank in range(3):
            with tier.writer(rank=rank, world_size=3, run="r") as writer:
                writer.commit(7, {f"w{rank}": np.full(100, rank, dtype=np.float32)})
    entry = {s: WitnessEntry(step=s, loss="1.0", batch="ab" * 16, calls=1) for s in (8, 9, 10)}

    def put(tier, rank: int, steps: tuple[int, ...], run: str = "r") -> None:
        entries = tuple(entry[s] for s in steps)
        write_witness(tier.storage, tier.steps_prefix, Witness(step=7, rank=rank, run=run, entries=entries))

    put(tiers[0], 0, (8, 9, 10))
    put(tiers[1], 1, (8, 9, 10))
    put(tiers[2], 1, (8,))
    put(tiers[2], 2, (8, 9))
    put(tiers[3], 2, (8, 9, 10), run="another")
    assert gather_witnesses(tiers[0], tiers[1:]) == [1, 2]
    got = {r: read_witness(tiers[0].storage, tiers[0].steps_prefix, 7, r) for r in range(3)}
    assert {r: [e.step for e in w.entries] for r, w in got.items() if w} == {0: [8, 9, 10], 1: [8, 9, 10], 2: [8, 9]}
    assert gather_witnesses(tiers[0], tiers[1:]) == []  # nothing longer left
