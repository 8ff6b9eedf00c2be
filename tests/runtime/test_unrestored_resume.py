"""A rerun that finds a checkpoint and exits without restoring it says so, once, at exit, and
``ravex status`` shows it; a normal resume and a fresh run say nothing of the sort. Found but
not restorable is never a fresh start: the run stops before its first step, in one line; and
a script that saves before anything restored saves the checkpoint's state, not its own."""

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
    assert "point `storage` at a new location" in lines[0], lines[0]  # the fix for a deliberate fresh start
    assert second.returncode == 0  # the script's exit status stays the script's
    assert second.stdout[-1] == "RESUME {'found': 3, 'restored': None}", second.explain()
    status = _status(cwd)
    assert "resume: found step 3, not restored" in status, status
    assert "0 optimizer steps" in status, status
    assert (cwd / ".ravex" / ".gitignore").read_text().endswith("*\n")  # never versioned


def test_a_framework_shaped_loop_in_the_users_module_resumes_where_it_was(tmp_path):
    """HF Trainer's shape (``framework_loop.fit``: an epoch that yields no batch is taken for
    empty data and stops the loop) in a module of the user's own: its loop is re-entered like
    the script's, so the rerun runs exactly the steps after the checkpoint, not an empty epoch."""
    cwd = _workdir(tmp_path)
    _train(cwd, "framework", "2", "7")  # killed in the second epoch, after step 6's checkpoint
    second = _train(cwd, "framework", "2")
    assert "EMPTY EPOCH: stopping" not in second.stdout, second.explain()
    assert [line for line in second.stdout if line.startswith("STEP")] == ["STEP 7", "STEP 8"], second.explain()
    assert second.stdout[-1] == "RESUME {'found': 6, 'restored': 6}", second.explain()
    assert NOT_RESTORED not in second.stderr, second.explain()


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


def test_a_checkpoint_that_does_not_fit_stops_the_run_before_its_first_step_in_one_line(tmp_path):
    cwd = _workdir(tmp_path)
    _train(cwd, "train", "1", "4")
    changed = harness.run([harness.PYTHON, str(SCRIPT), "train", "1"], cwd, harness.child_env(T_OUT_FEATURES="2"))
    assert changed.returncode != 0, changed.explain()
    assert not any(line.startswith("STEP") for line in changed.stdout), changed.explain()
    assert "Traceback" not in changed.stderr, changed.explain()
    told = [line for line in changed.stderr.splitlines() if line.startswith("ravex: checkpoint step 3")]
    assert len(told) == 1 and "point `storage` at a new location" in told[0], changed.explain()


def test_a_script_saving_before_any_step_saves_the_checkpoints_state(tmp_path):
    """A rerun that saves the model before any forward pass or step (a finished job's script
    going straight to its final save): the checkpoint is restored first, so the file holds
    the trained weights, never the freshly initialised ones."""
    import torch

    import ravex

    cwd = _workdir(tmp_path)
    _train(cwd, "train", "1", "4")
    saved = _train(cwd, "save")
    assert saved.stdout[-1] == "RESUME {'found': 3, 'restored': 3}", saved.explain()
    assert NOT_RESTORED not in saved.stderr, saved.explain()
    written = torch.load(cwd / "model.pt", weights_only=True)
    trained = ravex.load(str(cwd / "ck"), 3)["models"][0]["state"]
    assert written.keys() == trained.keys()
    assert all(torch.equal(written[k], trained[k]) for k in written)
