"""``resume: never`` asks for a fresh run. Where the storage already holds the steps of the
timeline this run would write, a fresh run's checkpoints would collide with them (steps are
immutable). It writes a root timeline of its own beside them (spec §19): it trains from the
start, its history holds none of their steps, those are left as they were and still resumable
by name, and a plain rerun continues the new timeline. On an empty storage ``never`` is a
fresh run like any other."""

from __future__ import annotations

import shutil
from pathlib import Path

from ravex.format import open_store

from . import harness

SHAPES = Path(__file__).with_name("shapes")


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_never_on_a_store_with_steps_trains_afresh_on_a_timeline_of_its_own(tmp_path):
    shutil.copy(SHAPES / "probe.py", tmp_path)
    shutil.copy(SHAPES / "while_globals.py", tmp_path)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    first = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert first.returncode == 0, first.explain()
    store = open_store(tmp_path / "ckpt")
    steps = store.complete_steps()
    assert steps, first.explain()
    before = _files(tmp_path / "ckpt" / "steps")

    again = harness.run([harness.PYTHON, "while_globals.py"], tmp_path,
                        harness.child_env(T_ENTRY="activate", RAVEX_RESUME="never"))
    assert again.returncode == 0 and again.resumed_from is None, again.explain()
    assert again.losses == first.losses, again.explain()  # every step again, from the start
    said = [line for line in again.stderr.splitlines() if line.startswith("ravex: `resume: never`")]
    assert len(said) == 1, again.explain()
    assert f"holds steps {steps[0]}-{steps[-1]} of timeline 'main'" in said[0], said
    assert "new timeline 'fresh'" in said[0] and f"`resume: main@{steps[-1]}` goes back" in said[0], said
    assert _files(tmp_path / "ckpt" / "steps") == before  # main's steps as they were

    store = open_store(tmp_path / "ckpt")
    fresh = store.timelines()["fresh"]
    assert fresh.parent is None and fresh.fork_step is None
    assert store.current().timeline.name == "fresh"
    assert store.on_timeline("fresh").complete_steps() == steps  # the same training, its own steps
    assert store.on_timeline("main").complete_steps() == steps
    listed = harness.run([harness.PYTHON, "-m", "ravex", "ls", "ckpt"], tmp_path, harness.child_env())
    assert "timeline fresh (a history of its own, no parent)" in "\n".join(listed.stdout), listed.explain()
    valid = harness.run([harness.PYTHON, "-m", "ravex", "validate", "ckpt"], tmp_path, harness.child_env())
    assert valid.returncode == 0, valid.explain()

    # a plain rerun continues the new timeline (finished: nothing trains); main stays resumable
    plain = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert plain.returncode == 0 and plain.resumed_from == steps[-1] and not plain.losses, plain.explain()
    back = harness.run([harness.PYTHON, "while_globals.py"], tmp_path,
                       harness.child_env(T_ENTRY="activate", RAVEX_RESUME=f"main@{steps[-1]}"))
    assert back.returncode == 0 and back.resumed_from == steps[-1], back.explain()


def test_resume_never_on_an_empty_storage_is_a_fresh_run(tmp_path):
    shutil.copy(SHAPES / "probe.py", tmp_path)
    shutil.copy(SHAPES / "while_globals.py", tmp_path)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\nresume: never\n")
    run = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert run.returncode == 0 and "FAILED" not in run.stderr, run.explain()
    assert open_store(tmp_path / "ckpt").complete_steps()[-1] >= 35, run.explain()
