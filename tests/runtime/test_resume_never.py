"""``resume: never`` asks for a fresh run. Where the storage already holds the steps of the
timeline this run would write, a fresh run's checkpoints would collide with them (steps are
immutable): every checkpoint failed, the breaker called the storage "unreachable", and the
run trained on with no checkpoint at all. It now stops at activation, before its first step,
in one line that names the store, its steps and the two fixes, and the store is left as it was.
On an empty storage ``never`` is a fresh run like any other."""

from __future__ import annotations

import shutil
from pathlib import Path

from ravex.format import open_store

from . import harness

SHAPES = Path(__file__).with_name("shapes")


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_never_on_a_store_with_steps_stops_before_training_and_leaves_it(tmp_path):
    shutil.copy(SHAPES / "probe.py", tmp_path)
    shutil.copy(SHAPES / "while_globals.py", tmp_path)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    first = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert first.returncode == 0, first.explain()
    steps = open_store(tmp_path / "ckpt").complete_steps()
    assert steps, first.explain()
    before = _files(tmp_path / "ckpt")

    again = harness.run([harness.PYTHON, "while_globals.py"], tmp_path,
                        harness.child_env(T_ENTRY="activate", RAVEX_RESUME="never"))
    assert again.returncode == 2, again.explain()
    assert not again.losses, again.explain()  # not one training step
    said = [line for line in again.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("ravex: `resume: never` "), again.explain()
    assert f"steps {steps[0]}-{steps[-1]}" in said[0] and "timeline 'main'" in said[0], said
    assert "Point `storage` at a new location" in said[0] and f"from step {steps[-1]}" in said[0], said
    assert _files(tmp_path / "ckpt") == before  # nothing written, nothing dropped

    # the store's own run goes on as before
    resumed = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert resumed.returncode == 0 and resumed.resumed_from == steps[-1], resumed.explain()


def test_resume_never_on_an_empty_storage_is_a_fresh_run(tmp_path):
    shutil.copy(SHAPES / "probe.py", tmp_path)
    shutil.copy(SHAPES / "while_globals.py", tmp_path)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\nresume: never\n")
    run = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert run.returncode == 0 and "FAILED" not in run.stderr, run.explain()
    assert open_store(tmp_path / "ckpt").complete_steps()[-1] >= 35, run.explain()
