"""A rerun that finds a checkpoint and exits without restoring it says so, once, at exit, and
``ravex status`` shows it; a normal resume and a fresh run say nothing of the sort."""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import harness

SCRIPT = Path(__file__).with_name("loopless_trainee.py")
NOT_RESTORED = "NOT restored"


def _train(cwd: Path, *args: str) -> harness.Result:
    result = harness.run([harness.PYTHON, str(SCRIPT), *args], cwd, harness.child_env())
    assert result.returncode == 0, result.explain()
    return result


def _status(cwd: Path) -> str:
    done = subprocess.run([harness.PYTHON, "-m", "ravex", "status"], cwd=cwd,
                          env=harness.child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _workdir(tmp_path: Path, yaml: str = "storage: ./ck\ncheckpoint_every: 3\n") -> Path:
    (tmp_path / "ravex.yaml").write_text(yaml)
    return tmp_path


def test_a_rerun_that_never_runs_a_step_says_so_once_and_in_status(tmp_path):
    cwd = _workdir(tmp_path)
    first = _train(cwd, "train", "1", "4")  # step 3 checkpointed, then "killed" after step 4
    assert NOT_RESTORED not in first.stderr
    second = _train(cwd, "noforward")
    lines = [line for line in second.stderr.splitlines() if NOT_RESTORED in line]
    assert len(lines) == 1, second.explain()
    assert "step 3" in lines[0] and str(cwd / "ck") in lines[0], lines[0]
    assert "no forward pass or optimizer step" in lines[0], lines[0]
    assert "resume: never" in lines[0], lines[0]  # the fix for a deliberate fresh start
    assert second.returncode == 0  # the script's exit status stays the script's
    assert second.stdout[-1] == "RESUME {'found': 3, 'restored': None}", second.explain()
    status = _status(cwd)
    assert "resume: found step 3, not restored" in status, status
    assert "0 optimizer steps" in status, status
    assert (cwd / ".ravex" / ".gitignore").read_text().endswith("*\n")  # never versioned


def test_a_framework_loop_stopping_on_a_finished_epoch_says_so(tmp_path):
    """HF Trainer's shape: the rerun's finished first epoch yields nothing, its own loop takes
    that for empty data and saves the untrained model: the line names the finished epochs."""
    cwd = _workdir(tmp_path)
    _train(cwd, "framework", "2", "7")  # killed in the second epoch, after step 6's checkpoint
    second = _train(cwd, "framework", "2")
    assert "EMPTY EPOCH: stopping" in second.stdout, second.explain()
    lines = [line for line in second.stderr.splitlines() if NOT_RESTORED in line]
    assert len(lines) == 1 and "step 6" in lines[0], second.explain()
    assert "had finished before the checkpoint" in lines[0], lines[0]
    assert "resume: found step 6, not restored" in _status(cwd)


def test_a_normal_resume_says_nothing_of_the_sort(tmp_path):
    cwd = _workdir(tmp_path)
    _train(cwd, "train", "2", "7")
    second = _train(cwd, "train", "2")
    assert second.resumed_from == 6, second.explain()
    assert sum(line.startswith("STEP") for line in second.stdout) == 2, second.explain()
    assert second.stdout[-1] == "RESUME {'found': 6, 'restored': 6}", second.explain()
    assert NOT_RESTORED not in second.stderr, second.stderr
    status = _status(cwd)
    assert "resume: restored step 6" in status and "2 optimizer steps" in status, status


def test_a_fresh_run_and_one_that_never_reached_a_checkpoint_say_nothing(tmp_path):
    """Steps counted, ``checkpoint_every`` never reached, no exit checkpoint: nothing to
    resume from, so the rerun is fresh too, and neither says anything of a resume."""
    cwd = _workdir(tmp_path, "storage: ./ck\ncheckpoint_every: 100\ncheckpoint_on_exit: false\n")
    for _ in range(2):
        run = _train(cwd, "train", "1")
        assert run.resumed_from is None and NOT_RESTORED not in run.stderr, run.explain()
        assert "STEP 4" in run.stdout and run.stdout[-1] == "RESUME {'found': None, 'restored': None}"
        status = _status(cwd)
        assert "resume: no checkpoint found" in status and "4 optimizer steps" in status, status


def test_status_without_a_record_says_none_recorded(tmp_path):
    assert "last run: none recorded for this store" in _status(_workdir(tmp_path))
