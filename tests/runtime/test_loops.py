"""``ravex.loop`` and the loops Ravex cannot save (issue 14 items 4 and 5), with a trainee
of word_language_model's shape (lm_trainee.py): loops inside a function over hand-sliced
batches, with an optimizer or with parameters updated by hand.

Killed with SIGKILL at random steps and rerun, the wrapped script ends bitwise equal to an
uninterrupted run without Ravex; unwrapped, it is told so once at resume (with an
optimizer) or within its first steps (without one).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from . import harness

LM = Path(__file__).with_name("lm_trainee.py")
EVERY = 5
STEPS = 72  # 3 epochs x 24 batches
ADVICE = "ravex.loop(range(...))"


def _inner_loop_line() -> int:
    lines = LM.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.rstrip().endswith("# the inner loop"))


def _workdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\nkeep_last: 3\n")
    return path


@pytest.fixture(scope="module")
def lm_reference(tmp_path_factory):
    """The uninterrupted run without Ravex, with an optimizer (``sgd=False``) or without."""
    cache: dict[bool, tuple[harness.Result, dict]] = {}

    def get(sgd: bool) -> tuple[harness.Result, dict]:
        if sgd not in cache:
            cwd = tmp_path_factory.mktemp(f"lm-reference-{'sgd' if sgd else 'opt'}")
            out = cwd / "final.pt"
            env = harness.child_env(T_ENTRY="none", T_LOOP="1", T_SGD="1" if sgd else "0",
                                    T_OUT=str(out))
            result = harness.run([harness.PYTHON, str(LM)], cwd, env)
            assert result.returncode == 0, result.explain()
            cache[sgd] = (result, torch.load(out, weights_only=False))
        return cache[sgd]

    return get


def _kill_and_rerun(cwd: Path, kill_step: int, **env: str) -> tuple[harness.Result, harness.Result, dict]:
    argv = [harness.PYTHON, str(LM)]
    base = dict(T_ENTRY="activate", **env)
    first = harness.run(argv, cwd, harness.child_env(**base, T_BLOCK_AT=f"step:{kill_step}"),
                        kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL and not first.timed_out, first.explain()
    out = cwd / "final.pt"
    second = harness.run(argv, cwd, harness.child_env(**base, T_OUT=str(out)))
    assert second.returncode == 0, second.explain()
    return first, second, torch.load(out, weights_only=False)


@pytest.mark.parametrize("sgd", [False, True], ids=["optimizer", "hand-sgd"])
def test_wrapped_loops_resume_bitwise_after_sigkill(tmp_path, sgd, lm_reference):
    """Several trials: each kill point resumes at the step its last checkpoint holds, runs
    only the steps after it (printed batch numbers continue) and ends bitwise equal."""
    ref, ref_state = lm_reference(sgd)
    rng = harness.kill_points()
    for trial in range(3):
        kill_step = rng.randrange(EVERY + 1, STEPS - 1)
        cwd = _workdir(tmp_path / f"trial-{trial}")
        first, second, state = _kill_and_rerun(cwd, kill_step, T_LOOP="1", T_SGD=str(int(sgd)))
        assert first.losses == ref.losses[:kill_step]
        # a checkpoint due after step k is taken at the start of step k + 1
        resumed = (kill_step - 1) // EVERY * EVERY
        assert second.resumed_from == resumed, second.explain()
        loss_lines = [line for line in ref.stdout if line.startswith("LOSS ")]
        assert [line for line in second.stdout if line.startswith("LOSS ")] == loss_lines[resumed:], (
            f"trial {trial}: killed at step {kill_step}, the rerun did not run exactly steps "
            f"{resumed + 1}..{STEPS}")
        epochs_after = [line for line in ref.stdout if line.startswith("EPOCH ")][(resumed - 1) // 24:]
        assert [line for line in second.stdout if line.startswith("EPOCH ")] == epochs_after
        harness.assert_same_state(state, ref_state)
        assert "where the loop stood is unknown" not in second.stderr and "each backward pass counts" not in (
            first.stderr + second.stderr)


def test_unwrapped_loop_over_sliced_batches_resumes_bitwise_by_itself(tmp_path, lm_reference):
    """Hand-sliced batches, an optimizer, no ravex.loop: the rerun finds the loops' position
    from the script's frames (``batch, i`` of ``enumerate(range(...))``) and runs only the
    steps after the checkpoint, with nothing to say."""
    ref, ref_state = lm_reference(False)
    _, second, state = _kill_and_rerun(_workdir(tmp_path), 13, T_LOOP="0")
    assert second.resumed_from == 10, second.explain()
    assert second.losses == ref.losses[10:]
    harness.assert_same_state(state, ref_state)
    assert ADVICE not in second.stderr, second.explain()


def test_hand_sgd_without_loop_counts_backward_passes_and_resumes_bitwise(tmp_path, lm_reference):
    """No optimizer, no ravex.loop (word_language_model's default): each backward pass is a
    step, checkpoints are taken at the loop's head, and a rerun after SIGKILL runs only the
    steps after the checkpoint and ends bitwise equal; it is said once, as information."""
    ref, ref_state = lm_reference(True)
    first, second, state = _kill_and_rerun(_workdir(tmp_path), 13, T_LOOP="0", T_SGD="1")
    assert second.resumed_from == 10, second.explain()
    assert second.losses == ref.losses[10:]
    harness.assert_same_state(state, ref_state)
    counted = [line for line in first.stderr.splitlines() if "each backward pass counts" in line]
    assert len(counted) == 1 and f"lm_trainee.py:{_inner_loop_line()}" in counted[0], first.explain()
    assert ADVICE not in second.stderr, second.explain()
    # updates through .data bump no version counter: such a tree is copied whole, not probed
    assert "without bumping" not in first.stderr + second.stderr, first.explain()
