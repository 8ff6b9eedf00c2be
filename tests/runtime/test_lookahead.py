"""A loop fed through a wrapper that fetches ahead resumes at the batch the loop consumed, not at
the one the wrapper fetched (:mod:`ravex.runtime.state.lookahead`): a generator of the script's one
batch ahead, a queue of two in one, a prefetcher object drawn with ``next()`` in a ``while``
loop, and Accelerate's prepared DataLoader, with two workers that augment from their own RNG
streams (a wrapper ahead of a loader that augments in the main process interleaves those draws
with the training's: no rerun can replay that order). SIGKILLed mid-epoch, at an epoch's end,
and in the tail a queue drains after its loader ran out; each rerun ends bitwise equal to plain
torch and its witness says ``resume verified``. With the rule turned off, the witness must say
the resume diverged.
"""

from __future__ import annotations

import signal

import pytest

from . import harness
from .test_workers import EVERY, PER_EPOCH, STEPS, TRAINEE, kill_then_resume

pytest.importorskip("accelerate")


@pytest.mark.parametrize("ahead", ["1", "2", "next", "accelerate"])
def test_a_loop_behind_a_look_ahead_resumes_mid_epoch_at_the_batch_it_consumed(tmp_path, tmp_path_factory, ahead):
    """``1`` and ``2``: a generator of the script's feeds the loop, which waits on its ``for``
    while the generator draws the batch ahead: the position is the loop's, with its counter."""
    # "next" says its line at a checkpoint the rerun takes inside the prefetcher: one before the last step's
    top = STEPS - EVERY + 1 if ahead == "next" else STEPS
    kill = harness.kill_points().randrange(EVERY + 1, top)
    second = kill_then_resume(tmp_path, tmp_path_factory, {"T_AHEAD": ahead}, f"step:{kill}", EVERY)
    assert second.resumed_from == (kill - 1) // EVERY * EVERY
    second.assert_verified()
    if ahead == "next":  # drawn inside the prefetcher's method: the loop's counter starts over, said once
        assert second.stderr.count("which no loop draws itself") == 1, second.explain()
        assert "the loop at workers_trainee.py:127 starts over" in second.stderr, second.explain()
    else:
        assert f"STEPS {STEPS}" in second.stdout, second.explain()


@pytest.mark.parametrize("ahead", ["1", "2", "accelerate"])
def test_a_look_ahead_resumes_after_an_epoch_end(tmp_path, tmp_path_factory, ahead):
    """The checkpoint of an epoch's last step: the loader ran out before that step (the wrapper
    held the last batches), so it is taken where the next epoch begins."""
    second = kill_then_resume(tmp_path, tmp_path_factory, {"T_AHEAD": ahead}, f"step:{PER_EPOCH + 2}", PER_EPOCH)
    assert second.resumed_from == PER_EPOCH
    second.assert_verified()


def test_a_queue_resumes_from_a_checkpoint_taken_while_it_drains(tmp_path, tmp_path_factory):
    """Epoch 1's loader runs out when the queue hands out its 7th batch (step 15's); the
    checkpoint of step 15, taken where the loop has drawn the 8th from the draining queue,
    holds 7 consumed and the loop waiting on its ``for``: the rerun's queue yields the 8th."""
    env = {"T_AHEAD": "2"}
    second = kill_then_resume(tmp_path, tmp_path_factory, env, f"step:{2 * PER_EPOCH}", EVERY)
    assert second.resumed_from == 15
    second.assert_verified()
    assert f"STEPS {STEPS}" in second.stdout, second.explain()  # the loop's counter, carried


@pytest.mark.parametrize("ahead", ["2", "accelerate"])
def test_the_witness_catches_a_look_ahead_with_the_rule_off(tmp_path, ahead):
    """The rule turned off, the checkpoint counts the batch the wrapper held as consumed: the
    rerun trains on the batch after it, and the witness says so at its first step."""
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\n")
    env = harness.child_env(T_ENTRY="activate", T_AHEAD=ahead, T_NO_LOOKAHEAD="1")
    argv = [harness.PYTHON, str(TRAINEE)]
    first = harness.run(argv, tmp_path, {**env, "T_BLOCK_AT": f"step:{EVERY + 2}"}, kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL, first.explain()
    second = harness.run(argv, tmp_path, env)
    assert second.returncode == 0 and second.resumed_from == EVERY, second.explain()
    assert (second.witness or "").startswith(
        f"ravex: resume diverged at step {EVERY + 1} (resumed from step {EVERY}): the input batch differs"
    ), second.explain()
