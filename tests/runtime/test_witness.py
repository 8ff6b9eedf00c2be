"""Every resume checks itself (spec §22): a loop whose data Ravex cannot put back (an open file)
resumes 'diverged' and says why, once; the same loop made exact says 'verified'; the verdict is in
the run's record, as ``ravex show`` prints it."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from ravex.format import open_store
from ravex.format.history.runs import read_run

from . import harness

TRAINEE = Path(__file__).with_name("witness_trainee.py")


@pytest.mark.parametrize(("seek", "verdict"), [("", "diverged"), ("1", "verified")])
def test_the_witness_tells_a_resume_that_trains_on_other_data(tmp_path: Path, seek: str, verdict: str) -> None:
    kill_at = harness.kill_points().randrange(11, 14)  # within the witness of step 10
    env = harness.child_env(T_SEEK=seek)
    first = harness.run([harness.PYTHON, str(TRAINEE)], tmp_path, {**env, "T_KILL_AT": str(kill_at)},
                        kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL, first.explain()
    second = harness.run([harness.PYTHON, str(TRAINEE)], tmp_path, env)
    assert second.returncode == 0 and second.resumed_from == 10, second.explain()
    line = second.witness
    assert line is not None, second.explain()
    if verdict == "diverged":
        assert line.startswith("ravex: resume diverged at step 11 (resumed from step 10): the input batch "
                               "differs"), line
    else:
        span = "step 11 matches" if kill_at == 11 else f"steps 11-{min(kill_at, 13)} match"
        assert line.startswith(f"ravex: resume verified: after step 10, {span} the run that wrote it"), line
    store = open_store(tmp_path / "ckpt")
    runs = {store.open_step(s).manifests[0].run for s in store.complete_steps()}
    checks = [r.resume for r in (read_run(store.storage, run) for run in runs) if r is not None and r.resume]
    assert [(c.from_step, c.verdict) for c in checks] == [(10, verdict)], checks
    listed = subprocess.run([harness.PYTHON, "-m", "ravex", "ls", "ckpt", "--json"], cwd=tmp_path,
                            env=harness.child_env(), capture_output=True, text=True, check=True)
    assert [(c["from_step"], c["verdict"]) for c in json.loads(listed.stdout)["resumes"]] == [(10, verdict)]


@pytest.mark.parametrize("world", [2, 3])
def test_another_loss_at_three_ranks_names_ddps_summation_order_too(world: int, caplog) -> None:
    """At 3+ ranks a resumed default DDP matches an uninterrupted run only to rounding (said at
    restore): a loss that differs there names that cause beside the others, and only there."""
    import logging

    from ravex.runtime.config import RavexConfig
    from ravex.runtime.recording.witness import LOSS, ResumeWitness, _Check

    witness = ResumeWitness(RavexConfig.load(overrides={"storage": "unused"}, environ={}), 0, world, None)
    with caplog.at_level(logging.WARNING, logger="ravex"):
        verdict = witness._say(_Check(170, (), 3), (3, LOSS, 2), "", 0.0, ())
    assert verdict.verdict == "diverged" and "the same input batch gave another loss" in verdict.detail
    assert ("DDP rebuilds its buckets" in verdict.detail) == (world >= 3), verdict.detail
    assert [r.getMessage() for r in caplog.records] == [
        f"ravex: resume diverged at step 173 (resumed from step 170, rank 2): {verdict.detail}"]
