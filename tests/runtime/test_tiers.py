"""Two tiers (``local:`` + ``storage:``): every checkpoint lands in the local tier, every
``persist_every``-th is copied to the durable one in the background, and a rerun resumes the
newest step either tier holds, bitwise, also when this machine's local tier is gone."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ravex.format import open_store

from . import harness

SHAPES = Path(__file__).with_name("shapes")
TIERS = ("storage: ./durable\nlocal: ./local\ncheckpoint_every: 5\npersist_every: 2\nkeep_last: 2\n"
         "persist_keep_last: 2\n")


def _script(tmp_path: Path) -> list[str]:
    shutil.copy(SHAPES / "probe.py", tmp_path)
    shutil.copy(SHAPES / "while_globals.py", tmp_path)
    (tmp_path / "ravex.yaml").write_text(TIERS)
    return [harness.PYTHON, "while_globals.py"]


def _reference(tmp_path: Path) -> tuple[harness.Result, dict]:
    where = tmp_path / "reference"
    where.mkdir()
    argv = _script(where)
    (where / "ravex.yaml").unlink()
    ref = harness.run(argv, where, harness.child_env(T_OUT=str(where / "final.pt")))
    assert ref.returncode == 0, ref.explain()
    return ref, torch.load(where / "final.pt", weights_only=False)


def _said(result: harness.Result) -> list[str]:
    """The script's ``STEP <n> <loss>`` lines."""
    return [line for line in result.stdout if line.startswith("STEP ")]


def _steps(url: Path) -> list[int]:
    return open_store(url).current().complete_steps()


def test_the_local_tier_lost_with_the_machine_resumes_from_storage_bitwise(tmp_path):
    ref, ref_state = _reference(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    argv = _script(run)
    at = harness.kill_points().randrange(21, 31)  # after step 20's copy, before 30's
    first = harness.run(argv, run, harness.child_env(T_ENTRY="activate", T_BLOCK_AT=str(at)), kill_on="BLOCKED")
    assert first.returncode < 0, first.explain()
    assert _steps(run / "local")[-1] == (at - 1) // 5 * 5, first.explain()  # every checkpoint is local
    assert _steps(run / "durable") == [10, 20], first.explain()  # every 2nd, keep 2
    lines = [line for line in first.stderr.splitlines() if line.startswith("ravex: checkpoint step")]
    assert lines and all("tiers: local" in line for line in lines), first.explain()
    assert any("tiers: local, to storage in background" in line for line in lines), first.explain()
    assert "ravex: step 20 persisted: tiers local + storage" in first.stderr, first.explain()

    shutil.rmtree(run / "local")  # the machine is gone; a new one runs the script again
    out = run / "final.pt"
    second = harness.run(argv, run, harness.child_env(T_ENTRY="activate", T_OUT=str(out)))
    assert second.returncode == 0, second.explain()
    assert "ravex: step 20 came from the durable tier" in second.stderr, second.explain()
    assert second.resumed_from == 20, second.explain()
    assert _said(second) == _said(ref)[20:], "the resumed run diverged"
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)
    second.assert_verified("the durable tier holds the witness of its newest step, as grown by then")
    # the finished run's last step is in both tiers (the exit copies it), each keeping its newest 2
    assert (_steps(run / "durable"), _steps(run / "local")) == ([30, 37], [35, 37]), second.explain()
    valid = harness.run([harness.PYTHON, "-m", "ravex", "validate", "durable"], run, harness.child_env())
    assert valid.returncode == 0, valid.explain()


def _killed_at_27(tmp_path: Path) -> tuple[harness.Result, dict, Path, list[str]]:
    """The reference run and a run killed at step 27: step 25 in the local tier, 20 in storage."""
    ref, ref_state = _reference(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    argv = _script(run)
    first = harness.run(argv, run, harness.child_env(T_ENTRY="activate", T_BLOCK_AT="27"), kill_on="BLOCKED")
    assert first.returncode < 0 and _steps(run / "durable")[-1] == 20, first.explain()
    return ref, ref_state, run, argv


def test_a_surviving_local_tier_resumes_its_newer_step_bitwise(tmp_path):
    ref, ref_state, run, argv = _killed_at_27(tmp_path)
    out = run / "final.pt"
    second = harness.run(argv, run, harness.child_env(T_ENTRY="activate", T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == 25, second.explain()
    assert _said(second) == _said(ref)[25:], "the resumed run diverged"
    assert "came from the durable tier" not in second.stderr, second.explain()
    second.assert_verified("a local step's witness is local")
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)


def test_an_unreachable_durable_tier_leaves_the_local_one_to_resume_and_checkpoint(tmp_path):
    """Storage down at the rerun: the local tier's step resumes bitwise and takes the checkpoints;
    the copies to storage fail, said, and leave the local steps as they are."""
    ref, ref_state, run, argv = _killed_at_27(tmp_path)
    (run / "durable").rename(run / "durable.away")
    (run / "durable").write_text("not a store")  # opening it fails as an unreachable bucket does
    out = run / "final.pt"
    second = harness.run(argv, run, harness.child_env(T_ENTRY="activate", T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == 25, second.explain()
    assert "ravex: storage ./durable is unreachable (" in second.stderr, second.explain()
    assert "resuming from the local tier" in second.stderr and "(newest step 25)" in second.stderr, second.explain()
    assert _said(second) == _said(ref)[25:], "the resumed run diverged"
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)
    assert _steps(run / "local")[-2:] == [35, 37], second.explain()  # every checkpoint still lands locally
    assert "ravex: copying step 37 to" in second.stderr and "FAILED" in second.stderr, second.explain()
    assert _steps(run / "durable.away") == [10, 20]  # untouched


def test_a_local_tier_without_a_step_does_not_start_without_the_durable_tier(tmp_path):
    """Nothing to resume locally and storage unreachable: storage may hold the step this run must
    resume, so the run does not start a timeline of its own there; it says so and retries."""
    run = tmp_path / "run"
    run.mkdir()
    argv = _script(run)
    (run / "durable").write_text("not a store")
    result = harness.run(argv, run, harness.child_env(T_ENTRY="activate"))
    assert result.returncode == 0, result.explain()
    assert "(the local tier" in result.stderr and "holds no step to resume from)" in result.stderr, result.explain()
    assert not (run / "local").exists() or _steps(run / "local") == [], result.explain()
