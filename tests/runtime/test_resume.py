"""The bar: kill a real training run with SIGKILL, rerun it unchanged, and it ends bitwise
identical to a run that was never interrupted (losses after the resume, final parameters,
optimizer and scheduler state). Both entry points, DataLoader workers 0 and 2, killed at a
random step, at an epoch boundary and in the middle of a checkpoint write.

The reference run has no Ravex at all, so these tests also show Ravex does not perturb
training.
"""

from __future__ import annotations

import json
import os
import random
import signal

import pytest
import torch

from ravex.format import open_store
from ravex.format.history.leases import read_holder

from . import harness

EVERY = 5
STEPS = 36  # 3 epochs x 12 batches


def _seed() -> int:
    seed = int(os.environ.get("RAVEX_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"kill-point seed {seed} (rerun with RAVEX_TEST_SEED={seed})")
    return seed


def _workdir(tmp_path, **config: object):
    lines = {"storage": "./ckpt", "checkpoint_every": EVERY, "keep_last": 3, **config}
    (tmp_path / "ravex.yaml").write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return tmp_path


def _argv(entry: str, enabled_python: str | None) -> list[str]:
    python = enabled_python if entry == "enable" else harness.PYTHON
    return [python, str(harness.TRAINEE)]


def _kill_then_resume(tmp_path, entry, workers, reference, enabled_python, block_env, kill_on):
    ref, ref_state = reference(workers)
    argv = _argv(entry, enabled_python)
    env = dict(T_ENTRY=entry, T_WORKERS=str(workers))

    first = harness.run(argv, tmp_path, harness.child_env(**env, **block_env), kill_on=kill_on)
    assert first.returncode == -signal.SIGKILL and not first.timed_out, first.explain()
    assert first.losses == ref.losses[: len(first.losses)], "the killed run diverged from the reference"

    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(**env, T_OUT=str(out)))
    assert second.returncode == 0, second.explain()
    resumed = second.resumed_from
    assert resumed is not None and resumed > 0, second.explain()
    assert resumed <= len(first.losses)
    assert second.losses == ref.losses[resumed:], (
        f"losses after resuming from step {resumed} differ from the uninterrupted run"
    )
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)
    return first, second


@pytest.mark.parametrize("entry,workers", [("activate", 0), ("enable", 2)])
def test_sigkill_at_random_step_resumes_bitwise(tmp_path, entry, workers, reference, request):
    rng = random.Random(_seed())
    kill_step = rng.randrange(EVERY + 1, STEPS - 1)
    enabled = request.getfixturevalue("enabled_python") if entry == "enable" else None
    _workdir(tmp_path)
    _, second = _kill_then_resume(tmp_path, entry, workers, reference, enabled,
                                      {"T_BLOCK_AT": f"step:{kill_step}"}, "BLOCKED")
    # step k's checkpoint is taken at the next batch's next(), after the block point
    assert second.resumed_from == (kill_step - 1) // EVERY * EVERY


@pytest.mark.parametrize("entry,workers", [("activate", 2), ("enable", 0)])
def test_sigkill_at_epoch_boundary_resumes_bitwise(tmp_path, entry, workers, reference, request):
    """Checkpoint exactly at the end of epoch 0 (step 12); the rerun's epoch 0 passes empty."""
    enabled = request.getfixturevalue("enabled_python") if entry == "enable" else None
    _workdir(tmp_path, checkpoint_every=12)
    _, second = _kill_then_resume(tmp_path, entry, workers, reference, enabled,
                                      {"T_BLOCK_AT": "epoch:0"}, "BLOCKED")
    assert second.resumed_from == 12
    assert "EPOCH 0 DONE" in second.stdout  # the outer loop ran on, through an empty epoch
    assert second.stdout.index("EPOCH 0 DONE") == 0


@pytest.mark.parametrize("entry,workers", [("enable", 0), ("activate", 2)])
def test_sigkill_during_a_write_resumes_from_previous_step(tmp_path, entry, workers, reference, request):
    """Killed with the 3rd checkpoint's objects half written: that step is ignored."""
    enabled = request.getfixturevalue("enabled_python") if entry == "enable" else None
    _workdir(tmp_path)
    _, second = _kill_then_resume(tmp_path, entry, workers, reference, enabled,
                                      {"T_BLOCK_IN_WRITE": "3"}, "IN-WRITE")
    assert second.resumed_from == 2 * EVERY


def test_sigterm_checkpoints_flushes_and_exits_143_then_resumes_bitwise(tmp_path, reference):
    """SIGTERM mid-epoch: checkpoint at the next step boundary, flush, exit 128+15."""
    ref, ref_state = reference(0)
    _workdir(tmp_path, checkpoint_every=100)
    argv = _argv("activate", None)
    env = dict(T_ENTRY="activate", T_WORKERS="0")
    first = harness.run(argv, tmp_path, harness.child_env(**env, T_BLOCK_AT="step:17"),
                        send_signal_on=("BLOCKED", signal.SIGTERM))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr
    assert "checkpoint step 17" in first.stderr and "exiting with status 143" in first.stderr
    assert len(first.losses) == 17

    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(**env, T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == 17, second.stderr
    assert second.losses == ref.losses[17:]
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)


CRASHED_THEN_SIGTERM = """
import os, signal, sys
import torch, ravex
ravex.activate()
w = torch.nn.Linear(2, 1)
o = torch.optim.SGD(w.parameters(), 0.1)
for _ in range(3):
    w(torch.ones(2)).sum().backward()
    o.step()
ravex_hook = sys.excepthook


def hook(*exc):
    ravex_hook(*exc)  # the run crashed; its exit (Ravex's shutdown) is still to come
    for _ in range(int(sys.argv[1])):
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's agent stopping a failed node's ranks


sys.excepthook = hook
raise RuntimeError("a peer died")  # what an all-reduce raises on a node whose peer died
"""


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_after_a_crash_promises_no_checkpoint_and_a_second_exits_at_once(tmp_path, signals):
    """Two nodes (tests/remote/test_two_nodes_s3.py): one dies, a rank of the other raises in its
    all-reduce, and its agent SIGTERMs the node's other ranks. The handler took that signal
    for a checkpoint at the next step boundary, which a crashed run never reaches ("all ranks
    checkpoint at the step they next agree on"). Now it says the exit is under way and lets it
    finish (flush, lease, the run's record); a second signal ends the process at once."""
    _workdir(tmp_path, checkpoint_every=2)
    done = harness.run([harness.PYTHON, "-c", CRASHED_THEN_SIGTERM, str(signals)], tmp_path, harness.child_env())
    assert "RuntimeError: a peer died" in done.stderr and "next step boundary" not in done.stderr, done.explain()
    assert "SIGTERM received after the run crashed at step 3" in done.stderr, done.explain()
    if signals == 2:
        assert done.returncode == -signal.SIGTERM, done.explain()
        return
    assert done.returncode == 1, done.explain()  # the exception's, after the exit ran to its end
    [record] = (tmp_path / ".ravex").glob("last-run-*.json")
    assert json.loads(record.read_text())["crashed"] is True
    assert read_holder(open_store(tmp_path / "ckpt").storage, "main").released


def test_finished_run_checkpoints_on_exit_and_a_rerun_passes_through(tmp_path, reference):
    """The model is a local of main(): gone by atexit, yet the exit checkpoint has it."""
    _, ref_state = reference(0)
    _workdir(tmp_path, checkpoint_every=100)
    argv = _argv("activate", None)
    env = dict(T_ENTRY="activate", T_WORKERS="0")
    first = harness.run(argv, tmp_path, harness.child_env(**env))
    assert first.returncode == 0 and "checkpoint step 36" in first.stderr, first.stderr
    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(**env, T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == STEPS, second.stderr
    assert second.losses == [] and second.stdout.count("EPOCH 2 DONE") == 1
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)


def test_capped_staging_memory_resumes_bitwise(tmp_path, reference):
    """``staging_max_bytes`` under the state's size (issue 26): the first weight is staged, every
    other tensor is read by the writer in place while the loop waits. Killed at a random step,
    the rerun (capped too) ends bitwise identical to the uninterrupted run."""
    rng = random.Random(_seed())
    kill_step = rng.randrange(EVERY + 1, STEPS - 1)
    _workdir(tmp_path, staging_max_bytes=4096)
    _, second = _kill_then_resume(tmp_path, "activate", 0, reference, None,
                                  {"T_BLOCK_AT": f"step:{kill_step}"}, "BLOCKED")
    assert second.resumed_from == (kill_step - 1) // EVERY * EVERY
