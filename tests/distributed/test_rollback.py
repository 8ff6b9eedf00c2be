"""Rolling back under torchrun (issue 24): a 2-rank DDP job checkpointing every 4 steps is
SIGKILLed after step 14 (steps 4, 8, 12 complete); a rerun told ``RAVEX_RESUME=8`` forks one new
timeline (rank 0 creates it under the run id the ranks agreed on, rank 1 follows it), resumes step
8 on both ranks, writes its steps 12 and 16 there and ends bitwise equal to the uninterrupted
run; main's steps, 12 included, read back exactly as before, as ``main@12``.
"""

from __future__ import annotations

import numpy as np
import torch

import ravex
from ravex.format import open_store
from ravex.format.history.leases import read_holder

from . import dharness as h


def _snapshot(store, refs):
    """Every array of each step, as bytes: what 'reads back exactly' is compared against."""
    out = {}
    for ref in refs:
        reader = store.open_step(ref)
        out[ref] = {p: np.ascontiguousarray(reader.read_array(p)).tobytes() for p in reader.arrays}
    return out


def test_roll_back_two_ranks_fork_one_timeline_and_resume_bitwise(tmp_path, ddp_reference):
    ref, ref_state = ddp_reference
    cwd = h.workdir(tmp_path, every=4, keep_last=100)
    first = h.run(2, cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="14"), kill_when=h.all_ranks("BLOCKED", 2))
    assert first.killed, first.explain()
    store = open_store(cwd / "ckpt")
    assert store.complete_steps() == [4, 8, 12]
    before = _snapshot(store, [8, 12])

    out = tmp_path / "final.pt"
    second = h.run(2, cwd, h.env(T_ENTRY="activate", T_OUT=str(out), RAVEX_RESUME="8"))
    assert second.returncode == 0, second.explain()
    for rank in (0, 1):
        assert second.restored(rank) == 8, second.explain()
        after = {s: v for s, v in ref.losses(rank).items() if s > 8}
        assert second.losses(rank) == after, f"rank {rank}: losses after the rollback differ"
    h.assert_same_state(torch.load(out, weights_only=False), ref_state)

    timelines = store.timelines()
    assert set(timelines) == {"main", "main-8"}, second.explain()
    fork = timelines["main-8"]
    assert (fork.parent, fork.fork_step) == ("main", 8)
    branch = store.on_timeline("main-8")
    assert branch.complete_steps() == [12, 16]
    for step in (12, 16):  # both ranks wrote there, under the run that forked it
        reader = branch.open_step(step)
        assert reader.world_size == 2 and {m.run for m in reader.manifests} == {fork.run}
    assert [s for _, s in branch.lineage_steps()] == [4, 8, 12, 16]
    assert store.complete_steps() == [4, 8, 12]  # main untouched
    assert _snapshot(store, [8, 12]) == before
    assert store.current().timeline.name == "main-8"
    assert ravex.load(str(cwd / "ckpt"), "main@12")["ravex"]["step"] == 12
    # rank 0 held the new timeline's lease and released it; main's is still the killed job's
    lease = read_holder(store.storage, "main-8")
    assert lease.generation == 1 and lease.released
    assert read_holder(store.storage, "main").generation == 1 and not read_holder(store.storage, "main").released


def test_resume_never_two_ranks_start_one_root_timeline_and_train_afresh(tmp_path, ddp_reference):
    """``RAVEX_RESUME=never`` on a store with steps: rank 0 starts one root timeline under the run
    the ranks agreed on, rank 1 follows it; both train from step 0, bitwise as the reference, and
    write every step there; main's steps read back exactly as before."""
    ref, ref_state = ddp_reference
    cwd = h.workdir(tmp_path, every=4, keep_last=100)
    first = h.run(2, cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="14"), kill_when=h.all_ranks("BLOCKED", 2))
    assert first.killed, first.explain()
    store = open_store(cwd / "ckpt")
    before = _snapshot(store, [4, 8, 12])

    out = tmp_path / "final.pt"
    second = h.run(2, cwd, h.env(T_ENTRY="activate", T_OUT=str(out), RAVEX_RESUME="never"))
    assert second.returncode == 0, second.explain()
    for rank in (0, 1):
        assert second.restored(rank) is None, second.explain()
        assert second.losses(rank) == ref.losses(rank), f"rank {rank}: a fresh run's losses differ"
    h.assert_same_state(torch.load(out, weights_only=False), ref_state)

    timelines = store.timelines()
    assert set(timelines) == {"main", "fresh"}, second.explain()
    fresh = timelines["fresh"]
    assert (fresh.parent, fresh.fork_step) == (None, None) and fresh.run is not None
    own = store.on_timeline("fresh")
    assert own.complete_steps()[:3] == [4, 8, 12]
    reader = own.open_step(4)
    assert reader.world_size == 2 and {m.run for m in reader.manifests} == {fresh.run}
    assert [s for v, s in own.lineage_steps() if v.timeline.name != "fresh"] == []
    assert store.complete_steps() == [4, 8, 12] and _snapshot(store, [4, 8, 12]) == before
    assert store.current().timeline.name == "fresh"


def test_a_step_named_that_is_not_there_stops_both_ranks_at_once(tmp_path):
    """``RAVEX_RESUME=6``, a step never written: rank 0 stops with the one-line error, and rank 1,
    which leaves the full check to rank 0, stops with the same error instead of waiting in a
    collective for a rank 0 that is gone (torchrun then SIGKILLs it after 30 s)."""
    cwd = h.workdir(tmp_path, every=4, keep_last=100)
    first = h.run(2, cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="9"), kill_when=h.all_ranks("BLOCKED", 2))
    assert first.killed and open_store(cwd / "ckpt").complete_steps() == [4, 8], first.explain()
    second = h.run(2, cwd, h.env(T_ENTRY="activate", RAVEX_RESUME="6"))
    assert second.returncode != 0, second.explain()
    assert second.stderr.count("step 6 in ") == 2 and "not readable (no manifest)" in second.stderr, second.explain()
    assert "forcefully exiting" not in second.stderr, second.explain()
    assert not second.losses(0) and not second.losses(1), "a rank trained"
