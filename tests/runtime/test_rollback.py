"""Rolling back (issue 16): a store holds steps 5..35 of a real run; a rerun told
``RAVEX_RESUME=20`` forks a new timeline, checkpoints over steps the old timeline holds, is
SIGKILLed; a plain rerun continues the new timeline and ends bitwise equal to the run that never
diverged (same seeds). The old timeline's steps read back exactly as before.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
import torch
from torch import nn

import ravex
from ravex.format import open_store
from ravex.format.errors import BadNameError, NameTakenError

from . import harness

ARGV = [harness.PYTHON, str(harness.TRAINEE)]


def _snapshot(store, steps):
    """Every array of each step, as bytes: what 'reads back exactly' is compared against."""
    out = {}
    for step in steps:
        reader = store.open_step(step)
        out[step] = {p: np.ascontiguousarray(reader.read_array(p)).tobytes() for p in reader.arrays}
    return out


def test_roll_back_fork_kill_rerun_continues_the_new_timeline_bitwise(tmp_path, reference):
    ref, ref_state = reference(0)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\nkeep_last: 100\n")
    env = dict(T_ENTRY="activate", T_WORKERS="0")

    first = harness.run(ARGV, tmp_path, harness.child_env(**env))
    assert first.returncode == 0, first.explain()
    store = open_store(tmp_path / "ckpt")
    assert store.complete_steps() == [5, 10, 15, 20, 25, 30, 35, 36]
    before = _snapshot(store, [25, 30, 35, 36])

    # Roll back to 20: checkpoint 25 lands in a new timeline; killed at step 27 (25 flushed). The
    # script's own step counter continues from 20 (issue 14), so it is 27 there.
    rolled = harness.run(ARGV, tmp_path, harness.child_env(**env, RAVEX_RESUME="20", T_BLOCK_AT="step:27"),
                         kill_on=r"BLOCKED")
    assert rolled.returncode == -signal.SIGKILL and not rolled.timed_out, rolled.explain()
    assert rolled.resumed_from == 20, rolled.explain()
    assert rolled.losses == ref.losses[20:27]
    assert "steps are immutable" not in rolled.stderr
    timelines = store.timelines()
    assert set(timelines) == {"main", "main-20"}
    assert (timelines["main-20"].parent, timelines["main-20"].fork_step) == ("main", 20)
    assert store.on_timeline("main-20").complete_steps() == [25]
    # ravex.load reads the timeline a rerun continues, as the CLI does; main's by name
    assert ravex.load(str(tmp_path / "ckpt"))["ravex"]["step"] == 25
    assert ravex.load(str(tmp_path / "ckpt"), "main@latest")["ravex"]["step"] == 36

    # A plain rerun continues main-20 from its step 25 and ends where the undiverged run ended.
    out = tmp_path / "final.pt"
    rerun = harness.run(ARGV, tmp_path, harness.child_env(**env, T_OUT=str(out)))
    assert rerun.returncode == 0, rerun.explain()
    assert rerun.resumed_from == 25, rerun.explain()
    assert rerun.losses == ref.losses[25:]
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)

    branch = store.on_timeline("main-20")
    assert branch.complete_steps() == [25, 30, 35, 36]
    assert [s for _, s in branch.lineage_steps()] == [5, 10, 15, 20, 25, 30, 35, 36]
    assert store.complete_steps() == [5, 10, 15, 20, 25, 30, 35, 36]  # main untouched
    assert _snapshot(store, [25, 30, 35, 36]) == before
    assert store.current().timeline.name == "main-20"


def test_ravex_tag_names_the_last_checkpoint_and_retention_keeps_it(ravex_clean, tmp_path):
    with pytest.raises(RuntimeError, match="needs an active run"):
        ravex.tag("early")
    ravex.activate(storage=str(tmp_path / "ckpt"), checkpoint_every=2, keep_last=1)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(steps: int) -> None:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()

    train(3)
    assert ravex.checkpoint()
    tagged = ravex.tag("before-spike")
    want = {k: v.clone() for k, v in model.state_dict().items()}
    assert tagged == "3"
    with pytest.raises(NameTakenError, match="already exists"):
        ravex.tag("before-spike")
    with pytest.raises(BadNameError, match="empty"):
        ravex.tag("")
    for _ in range(3):  # keep_last 1 collects every untagged older step
        train(2)
        assert ravex.checkpoint()
    ravex.flush()
    store = open_store(tmp_path / "ckpt")
    assert store.complete_steps() == [3, 9]  # 5 and 7 collected; 3 only because it is tagged
    assert store.tags()["before-spike"].ref == "3"
    got = ravex.load(str(tmp_path / "ckpt"), step=3)["models"][0]["state"]
    harness.assert_same_state({k: got[k] for k in want}, want)
