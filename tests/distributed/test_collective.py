"""Decisions every rank must share, under real ``torchrun`` (2 ranks, gloo, CPU): a time-based
checkpoint (rank 0's clock decides, the ranks' clocks are skewed) lands on the same steps on
both ranks, and SIGTERM to the launcher or to one rank alone ends the job with one complete
final step (both ranks stop after the same step) that a rerun resumes from, bitwise. The old
per-rank decisions fail these: skewed clocks checkpoint different steps (incomplete steps),
and a signal to one rank checkpoints that rank alone while the other blocks in DDP.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from ravex.format import open_store

from . import dharness as h

STEPS = 16
WAIT_AT = 3


@pytest.fixture
def reference(ddp_reference):
    return ddp_reference


def _steps(cwd: Path) -> dict[int, set[int]]:
    """Every step folder in the store -> the ranks whose manifest it holds."""
    store = open_store(cwd / "ckpt")
    return {int(s): set(store.step_info(int(s)).ranks) for s in os.listdir(cwd / "ckpt" / "steps")}


def test_time_based_checkpoints_land_on_the_same_steps_on_every_rank(tmp_path):
    # Rank 1 starts its clock 0.5 s after rank 0: per-rank clocks would checkpoint ~5 steps apart.
    cwd = h.workdir(tmp_path, every=0, checkpoint_every_seconds=1.0, keep_last=0)
    run = h.run(2, cwd, h.env(T_ENTRY="activate", T_EPOCHS="4", T_STEP_SECONDS="0.1", T_SKEW="0.5"))
    assert run.returncode == 0, run.explain()
    steps = _steps(cwd)
    assert {s: r for s, r in steps.items() if r != {0, 1}} == {}, f"steps not written by both ranks: {steps}"
    timed = sorted(s for s in steps if s != 2 * STEPS)  # the last one is the exit checkpoint
    assert timed, f"no time-based checkpoint in {2 * STEPS} steps of >= 100 ms: {steps}"
    store = open_store(cwd / "ckpt")
    assert all(store.step_info(s).complete for s in steps)


def test_auto_cadence_checkpoints_land_on_the_same_steps_on_every_rank(tmp_path):
    """``checkpoint_every: auto``: the first checkpoints, ten steps apart, are counted alike on
    both ranks; the timed ones after them follow rank 0's clock through the poll, so every step
    is written by both, rank 1's late start notwithstanding; rank 0 alone says the interval."""
    cwd = h.workdir(tmp_path, every="auto", mtbf="2s", max_overhead="50%", keep_last=0)
    run = h.run(2, cwd, h.env(T_ENTRY="activate", T_EPOCHS="4", T_STEP_SECONDS="0.1", T_SKEW="0.5"))
    assert run.returncode == 0, run.explain()
    steps = _steps(cwd)
    assert {s: r for s, r in steps.items() if r != {0, 1}} == {}, f"steps not written by both ranks: {steps}"
    assert {10, 20, 2 * STEPS} <= set(steps), steps
    said = [line for line in run.stderr.splitlines() if "checkpoint_every: auto" in line]
    assert len(said) == 1 and "MTBF 2 s" in said[0], run.explain()


def _signal_when_waiting(ranks: list[int], target: str):
    """Send SIGTERM once every rank in ``ranks`` waits: to the launcher or to one rank's pid."""
    sent: list[int] = []

    def act(lines: list[str], launcher: int) -> None:
        waiting = {int(ln.split()[1]): int(ln.split()[2]) for ln in lines if ln.startswith("WAITING ")}
        if sent or not set(ranks) <= set(waiting):
            return
        pid = launcher if target == "launcher" else waiting[int(target)]
        os.kill(pid, signal.SIGTERM)
        sent.append(pid)
    return act


@pytest.mark.parametrize(("waiters", "target"), [("0,1", "launcher"), ("1", "1")])
def test_sigterm_ends_every_rank_at_one_complete_step_and_resume_is_bitwise(tmp_path, reference, waiters, target):
    ref, ref_state = reference
    cwd = h.workdir(tmp_path, every=0)
    ranks = [int(r) for r in waiters.split(",")]
    first = h.run(2, cwd, h.env(T_ENTRY="activate", T_WAIT_SIGNAL_AT=str(WAIT_AT), T_WAIT_SIGNAL_RANKS=waiters),
                  on_line=_signal_when_waiting(ranks, target))
    assert first.returncode != 0 and not any(ln.startswith("FINISHED") for ln in first.stdout), first.explain()
    store = open_store(cwd / "ckpt")
    complete = store.complete_steps()
    assert len(complete) == 1 and WAIT_AT < complete[0] <= STEPS, first.explain()
    final = complete[0]
    assert _steps(cwd) == {final: {0, 1}}
    for rank in (0, 1):  # both ranks trained up to the agreed step and no further
        assert max(first.losses(rank)) == final, first.explain()
    assert first.stderr.count(f"checkpoint of step {final} flushed; exiting with status 143") == 2, first.explain()
    if target == "launcher":
        return  # the store is in the same state either way: one resume (below) covers both

    out = tmp_path / "final.pt"
    second = h.run(2, cwd, h.env(T_ENTRY="activate", T_OUT=str(out)))
    assert second.returncode == 0, second.explain()
    for rank in (0, 1):
        if final < STEPS:
            assert second.restored(rank) == final, second.explain()
        assert second.losses(rank) == {s: v for s, v in ref.losses(rank).items() if s > final}
    h.assert_same_state(torch.load(out, weights_only=False), ref_state)


def test_one_ranks_broken_storage_makes_every_rank_skip_checkpoints(tmp_path):
    """Rank 1's disk fails every write: after the breaker's threshold of failed checkpoints
    every rank skips the due ones together (a step needs all ranks' manifests, and a rank
    that tried alone would enter the checkpoint's collectives alone). Per-rank breakers, or
    none, make rank 0 write a useless manifest at every step; the job still ends cleanly."""
    import json

    cwd = h.workdir(tmp_path, every=1, keep_last=0)
    run = h.run(2, cwd, h.env(T_ENTRY="activate", T_EPOCHS="2", T_FAIL_RANK="1"))
    assert run.returncode == 0, run.explain()
    breakers = {int(ln.split()[1]): json.loads(ln.split(" ", 2)[2]) for ln in run.stdout if ln.startswith("BREAKER ")}
    assert breakers[1]["state"] == "open" and breakers[1]["consecutive_failures"] >= 3, breakers
    assert breakers[0]["state"] == "closed" and breakers[0]["skipped_checkpoints"] >= 8, breakers
    assert breakers[1]["skipped_checkpoints"] == breakers[0]["skipped_checkpoints"], breakers
    steps = _steps(cwd)
    assert all(ranks == {0} for ranks in steps.values()), steps  # rank 1 wrote nothing
    assert len(steps) <= 6, f"rank 0 kept writing while rank 1 could not: {sorted(steps)}"  # ~4 tries + exit
    # rank 0's one line per checkpoint names the rank that failed it, and no step as written
    failed = [ln for ln in run.stderr.splitlines()
              if ln.startswith("ravex: checkpoint step ")
              and ("FAILED on ranks [1]" in ln or "NOT COMPLETE when rank 0 exited: no manifest from ranks [1]" in ln)]
    assert sorted(int(ln.split()[3]) for ln in failed) == sorted(steps), run.stderr[-3000:]
    assert "(2 ranks): stall" not in run.stderr
