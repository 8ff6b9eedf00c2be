"""DataLoader workers resume where they stood: a run killed by SIGKILL and rerun ends bitwise
equal to an uninterrupted run on plain torch, though its workers augment every sample from
their own RNG streams (workers_trainee.py). With persistent workers the uninterrupted run
resets its iterator each epoch (no new base seed, the workers' streams go on) while the rerun
makes a new one; with any workers the rerun's first batch is the epoch's k-th, which the first
run dealt to worker ``k % num_workers`` after that worker had loaded its earlier batches.

Kill points: mid-epoch in epoch 0 (the iterator was made there), mid-epoch in a later epoch
(made by a reset, for persistent workers), and a checkpoint at the end of an epoch (the next
epoch's iterator).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from . import harness

TRAINEE = Path(__file__).with_name("workers_trainee.py")
PER_EPOCH = 8
STEPS = 3 * PER_EPOCH
EVERY = 3

_references: dict[tuple[tuple[str, str], ...], tuple[harness.Result, dict]] = {}


def _reference(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> tuple[harness.Result, dict]:
    key = tuple(sorted(env.items()))
    if key not in _references:
        cwd = tmp_path_factory.mktemp("workers-reference")
        out = cwd / "final.pt"
        result = harness.run([harness.PYTHON, str(TRAINEE)], cwd,
                             harness.child_env(T_ENTRY="none", T_OUT=str(out), **env))
        assert result.returncode == 0, result.explain()
        assert len(result.losses) == STEPS
        _references[key] = (result, torch.load(out, weights_only=False))
    return _references[key]


def kill_then_resume(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str],
                     block_at: str, every: int) -> harness.Result:
    """SIGKILL the trainee at ``block_at``, rerun it: the rerun ends bitwise equal to plain torch.
    The rerun's result."""
    ref, ref_state = _reference(tmp_path_factory, env)
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {every}\n")
    argv = [harness.PYTHON, str(TRAINEE)]
    first = harness.run(argv, tmp_path, harness.child_env(T_ENTRY="activate", T_BLOCK_AT=block_at, **env),
                        kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL and not first.timed_out, first.explain()
    assert first.losses == ref.losses[: len(first.losses)], "Ravex changed the first run"
    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(T_ENTRY="activate", T_OUT=str(out), **env))
    assert second.returncode == 0, second.explain()
    resumed = second.resumed_from
    assert resumed is not None and resumed > 0, second.explain()
    assert second.losses == ref.losses[resumed:], f"the losses after resuming from step {resumed} differ"
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)
    return second


def _mid_epoch(tmp_path, tmp_path_factory, env, first_step: int, last_step: int) -> None:
    kill = harness.kill_points().randrange(first_step, last_step + 1)
    second = kill_then_resume(tmp_path, tmp_path_factory, env, f"step:{kill}", EVERY)
    assert second.resumed_from == (kill - 1) // EVERY * EVERY
    second.assert_verified()  # a step after the checkpoint ran before the kill: the witness has it


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_persistent_workers_resume_mid_epoch_after_a_reset(tmp_path, tmp_path_factory, workers):
    """A checkpoint in epoch 1 or 2, whose iterator the first run reset rather than made."""
    env = {"T_WORKERS": str(workers), "T_PERSISTENT": "1"}
    # steps 10..23: the checkpoint (every 3rd step, taken at the next batch) falls in epoch 1 or 2
    _mid_epoch(tmp_path, tmp_path_factory, env, PER_EPOCH + 2, STEPS - 1)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_persistent_workers_resume_after_an_epoch_end(tmp_path, tmp_path_factory, workers):
    """The checkpoint at the end of epoch 1: the rerun's epoch 2 makes the iterator the first
    run reset, with its workers as they stood."""
    env = {"T_WORKERS": str(workers), "T_PERSISTENT": "1"}
    assert kill_then_resume(tmp_path, tmp_path_factory, env, "epoch:1", PER_EPOCH).resumed_from == 2 * PER_EPOCH


@pytest.mark.parametrize("generator", ["0", "1"])
def test_persistent_workers_resume_mid_epoch_0(tmp_path, tmp_path_factory, generator):
    """A checkpoint in the epoch whose iterator was made, with the global RNG or a generator."""
    env = {"T_WORKERS": "2", "T_PERSISTENT": "1", "T_GENERATOR": generator}
    _mid_epoch(tmp_path, tmp_path_factory, env, EVERY + 1, PER_EPOCH)


def test_persistent_workers_resume_after_epoch_0(tmp_path, tmp_path_factory):
    env = {"T_WORKERS": "2", "T_PERSISTENT": "1", "T_GENERATOR": "1"}
    assert kill_then_resume(tmp_path, tmp_path_factory, env, "epoch:0", PER_EPOCH).resumed_from == PER_EPOCH


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_resume_mid_epoch_where_they_stood(tmp_path, tmp_path_factory, workers):
    """Workers that are not persistent: the rerun's first batch goes to the worker the first
    run dealt it to, which starts where its streams stood."""
    _mid_epoch(tmp_path, tmp_path_factory, {"T_WORKERS": str(workers)}, EVERY + 1, STEPS - 1)
