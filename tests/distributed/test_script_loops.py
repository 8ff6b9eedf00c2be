"""Loops of the script itself under torchrun: every rank takes the checkpoint at the same
place in the loop and goes back there on the rerun, with its own globals (nanoGPT's shape:
a module-level ``while True:``, gradient accumulation with ``no_sync`` micro-steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import dharness as h

SCRIPT = Path(__file__).with_name("loop_trainee.py")


def test_a_while_loop_resumes_on_every_rank_with_its_counter(tmp_path):
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref = h.run(2, ref_dir, h.env(T_ENTRY="none", T_OUT=str(ref_dir / "final.pt")), script=SCRIPT)
    assert ref.returncode == 0, ref.explain()
    cwd = h.workdir(tmp_path / "run", every=5) if (tmp_path / "run").mkdir() is None else None
    assert cwd is not None
    first = h.run(2, cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="12"), kill_when=h.all_ranks("BLOCKED", 2),
                  script=SCRIPT)
    assert first.killed, first.explain()
    out = cwd / "final.pt"
    second = h.run(2, cwd, h.env(T_ENTRY="activate", T_OUT=str(out)), script=SCRIPT)
    assert second.returncode == 0, second.explain()
    for rank in (0, 1):
        # the checkpoint due after iteration 9 (step 10) is taken at the head of iteration 10
        resumed = second.losses(rank)
        assert min(resumed) == 10, second.explain()
        assert resumed == {s: v for s, v in ref.losses(rank).items() if s >= 10}, f"rank {rank}\n{second.explain()}"
    assert "where the loop stood is unknown" not in second.stderr, second.explain()
    # one line each for the job, from rank 0, naming the ranks; each rank's own at DEBUG
    said = [ln for ln in second.stderr.splitlines() if ln.startswith("ravex: ") and "checkpoint step" not in ln]
    assert len([ln for ln in said if "resumed from step 10 " in ln and "(2 ranks" in ln]) == 1, second.stderr
    assert len([ln for ln in said if "back in the loop at " in ln]) == 1, said
    h.assert_same_state(torch.load(out, weights_only=False), torch.load(ref_dir / "final.pt", weights_only=False))


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_while_loop_rerun_at_another_world_size_goes_on_from_its_counter(tmp_path, before, after):
    """Every rank of the rerun goes back into the loop at the checkpoint's iteration, a new
    rank with rank 0's counter: none starts over (a silent replay before), and none runs
    iterations the others do not (it would wait for them in an all-reduce forever)."""
    cwd = h.workdir(tmp_path, every=5)
    first = h.run(before, cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="12"), kill_when=h.all_ranks("BLOCKED", before),
                  script=SCRIPT)
    assert first.killed, first.explain()
    second = h.run(after, cwd, h.env(T_ENTRY="activate"), script=SCRIPT)
    assert second.returncode == 0, second.explain()
    for rank in range(after):
        assert sorted(second.losses(rank)) == list(range(10, 22)), f"rank {rank}\n{second.explain()}"
    assert f"written by {before} rank(s), this run has {after}" in second.stderr
