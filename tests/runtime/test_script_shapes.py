"""Unchanged scripts of the shapes people run resume exactly, found by Ravex from the
frames and source of the user's code (ravex.runtime.position), without ravex.loop: loops
of the main script, and loops in a trainer class of the user's own module with their
counters on ``self``.

Each shape (tests/runtime/shapes/) is killed by SIGKILL at random steps, once its last
checkpoint is durable, and rerun unchanged. The rerun must run only the iterations after
the checkpoint (its own printed counters continue), never rewrite a user file an earlier
epoch finished, and end bitwise equal to an uninterrupted run on plain torch; the files it
writes hold what the uninterrupted run's hold, the ones it appends to (a log, a CSV) too: the
steps after the checkpoint append again, and each such file was cut back to its size there.
"""

from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from . import harness

SHAPES = Path(__file__).with_name("shapes")
OUTPUT = ("STEP ", "EVAL ", "TEST ", "EPOCH ", "SAMPLE ")


@dataclass(frozen=True)
class Shape:
    script: str
    iterations: int  #: loop iterations of a whole run (one STEP line each)
    every: int  #: checkpoint_every: Ravex counts an iteration that steps two optimizers as one step
    per_epoch: int = 0  #: iterations of an epoch, where the script writes a file per epoch
    files: tuple[str, ...] = ()  #: the per-epoch files, with {e} for the epoch as the script numbers it
    first_epoch: int = 0
    env: dict[str, str] = field(default_factory=dict)
    #: a kill point always tried: its checkpoint falls on the end of an epoch
    at_epoch_end: int | None = None


CASES = {
    "while-globals": (Shape("while_globals.py", 37, 5), 6),
    "epochs-in-function": (Shape("epochs_function.py", 30, 4, per_epoch=10, files=("model_epoch_{e}.pt",),
                                 first_epoch=1, at_epoch_end=22), 6),
    "enumerate-branch": (Shape("enumerate_branch.py", 24, 3, per_epoch=12,
                               files=("netG_epoch_{e}.pth", "netD_epoch_{e}.pth"), at_epoch_end=14), 6),
    "sliced-in-function": (Shape("sliced_function.py", 72, 6, at_epoch_end=27), 5),
    "class-trainer": (Shape("class_trainer.py", 34, 5), 4),
    "class-epochs": (Shape("class_epochs.py", 30, 4, at_epoch_end=25), 4),
    "class-snapshot": (Shape("class_snapshot.py", 48, 5, per_epoch=12, at_epoch_end=25), 4),
    "try-epochs": (Shape("try_epochs.py", 20, 3, at_epoch_end=10), 3),
    "prefetch-epochs": (Shape("prefetch_epochs.py", 36, 4, at_epoch_end=14), 4),
    "sharded-sampler": (Shape("sharded_sampler.py", 24, 4, at_epoch_end=14), 4),
}


def _output(result: harness.Result) -> list[str]:
    return [line for line in result.stdout if line.startswith(OUTPUT)]


def _after(lines: list[str], iterations: int) -> list[str]:
    """``lines`` after the ``iterations``-th STEP line."""
    seen = 0
    for n, line in enumerate(lines):
        if seen == iterations:
            return lines[n:]
        seen += line.startswith("STEP ")
    return [] if seen == iterations else lines


def _assert_continues(rerun: list[str], after: list[str], where: str) -> None:
    """The rerun printed what the uninterrupted run printed after the checkpoint's iteration;
    a checkpoint taken at an outer loop's head (after an epoch's closing lines) drops those."""
    dropped = after[:len(after) - len(rerun)] if len(rerun) <= len(after) else None
    assert dropped is not None and rerun == after[len(dropped):], f"{where}: not exactly the iterations after"
    assert not any(line.startswith("STEP ") for line in dropped), f"{where}: iterations skipped: {dropped}"


def _files(cwd: Path) -> dict[str, tuple[int, bytes]]:
    """The script's own files: what it saves, logs and appends to."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in cwd.iterdir()
            if p.suffix in (".pt", ".pth", ".log", ".csv") and p.name != "final.pt"}


def _run(shape: Shape, cwd: Path, **env: str) -> harness.Result:
    return harness.run([harness.PYTHON, str(SHAPES / shape.script)], cwd,
                       harness.child_env(**shape.env, **env))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each shape's uninterrupted run on plain torch: its output, final state and files."""
    cache: dict[str, tuple[harness.Result, dict, dict[str, tuple[int, bytes]]]] = {}

    def get(name: str, shape: Shape):
        if name not in cache:
            cwd = tmp_path_factory.mktemp(f"reference-{name}")
            result = _run(shape, cwd, T_ENTRY="none", T_OUT=str(cwd / "final.pt"))
            assert result.returncode == 0, result.explain()
            assert len([line for line in result.stdout if line.startswith("STEP ")]) == shape.iterations
            cache[name] = (result, torch.load(cwd / "final.pt", weights_only=False), _files(cwd))
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_unchanged_script_resumes_bitwise_after_sigkill(name, tmp_path, reference):
    shape, trials = CASES[name]
    ref, ref_state, ref_files = reference(name, shape)
    per_checkpoint = shape.every
    rng = harness.kill_points()
    points = rng.sample(range(per_checkpoint + 1, shape.iterations), trials)
    if shape.at_epoch_end is not None and shape.at_epoch_end not in points:
        points[0] = shape.at_epoch_end
    for kill_at in points:
        cwd = tmp_path / f"killed-at-{kill_at}"
        cwd.mkdir()
        (cwd / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {shape.every}\nkeep_last: 2\n")
        first = harness.run([harness.PYTHON, str(SHAPES / shape.script)], cwd,
                            harness.child_env(**shape.env, T_ENTRY="activate", T_BLOCK_AT=str(kill_at)),
                            kill_on="BLOCKED")
        assert first.returncode == -signal.SIGKILL and not first.timed_out, first.explain()
        before = _files(cwd)
        second = _run(shape, cwd, T_ENTRY="activate", T_OUT=str(cwd / "final.pt"))
        where = f"{name}, killed after iteration {kill_at}"
        assert second.returncode == 0, f"{where}\n{second.explain()}"
        # a checkpoint due after iteration k is taken where iteration k + 1 starts
        resumed = (kill_at - 1) // per_checkpoint * per_checkpoint
        assert second.resumed_from == resumed, f"{where}\n{second.explain()}"
        second.assert_verified(where)
        _assert_continues(_output(second), _after(_output(ref), resumed), where)
        harness.assert_same_state(torch.load(cwd / "final.pt", weights_only=False), ref_state, where)
        after = _files(cwd)
        assert {k: v[1] for k, v in after.items()} == {k: v[1] for k, v in ref_files.items()}, where
        for e in range(resumed // shape.per_epoch if shape.per_epoch else 0):
            if (e + 1) * shape.per_epoch < resumed:  # finished before the checkpoint
                for pattern in shape.files:
                    f = pattern.format(e=e + shape.first_epoch)
                    assert after[f][0] == before[f][0], f"{where}: {f} of a finished epoch written again"
        for told in ("where the loop stood is unknown", "cannot return to the loop", "each backward pass counts",
                     "without bumping its version counter"):
            assert told not in first.stderr + second.stderr, f"{where}\n{second.explain()}"


def test_loop_over_prepared_batches_is_told_once_then_exact_with_ravex_loop(tmp_path, reference):
    """Batches prepared in a list: no variable of the script tells where its loop stood. The
    rerun says so once, naming the loop's line and the one-line fix; with it, exact."""
    shape = Shape("sliced_function.py", 72, 5, env={"T_PRESLICED": "1"})
    ref, ref_state, _ = reference("sliced-in-function", CASES["sliced-in-function"][0])
    line = next(n for n, text in enumerate((SHAPES / shape.script).read_text().splitlines(), 1)
                if text.rstrip().endswith("# the training loop"))
    for wrapped in ("0", "1"):
        cwd = tmp_path / f"loop-{wrapped}"
        cwd.mkdir()
        (cwd / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {shape.every}\n")
        env = dict(shape.env, T_ENTRY="activate", T_LOOP=wrapped)
        first = harness.run([harness.PYTHON, str(SHAPES / shape.script)], cwd,
                            harness.child_env(**env, T_BLOCK_AT="33"), kill_on="BLOCKED")
        assert first.returncode == -signal.SIGKILL, first.explain()
        second = harness.run([harness.PYTHON, str(SHAPES / shape.script)], cwd,
                             harness.child_env(**env, T_OUT=str(cwd / "final.pt")))
        assert second.returncode == 0 and second.resumed_from == 30, second.explain()
        told = [t for t in second.stderr.splitlines() if "where the loop stood is unknown" in t]
        if wrapped == "0":
            assert len(told) == 1 and f"sliced_function.py:{line}" in told[0], second.explain()
            # and the witness measures what the warning foresaw
            assert (second.witness or "").startswith("ravex: resume diverged at step 31"), second.explain()
        else:
            assert told == [], second.explain()
            second.assert_verified()
            _assert_continues(_output(second), _after(_output(ref), 30), "ravex.loop")
            harness.assert_same_state(torch.load(cwd / "final.pt", weights_only=False), ref_state)


@pytest.mark.parametrize("name", ["while-globals", "epochs-in-function", "class-snapshot", "try-epochs"])
def test_rerun_of_a_finished_run_trains_nothing_again(name, tmp_path, reference):
    """A run that ended normally, rerun unchanged: its exit checkpoint recorded the line after
    the training loop, so the rerun skips the loop, restores there and runs only what
    followed it; no user file of the training is written again."""
    shape, _ = CASES[name]
    _, ref_state, ref_files = reference(name, shape)
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {shape.every}\n")
    first = _run(shape, tmp_path, T_ENTRY="activate")
    assert first.returncode == 0, first.explain()
    before = _files(tmp_path)
    again = _run(shape, tmp_path, T_ENTRY="activate", T_OUT=str(tmp_path / "final.pt"))
    assert again.returncode == 0 and again.resumed_from == shape.iterations, again.explain()
    assert _output(again) == [], again.explain()
    harness.assert_same_state(torch.load(tmp_path / "final.pt", weights_only=False), ref_state)
    assert _files(tmp_path) == before and {k: v[1] for k, v in before.items()} == {
        k: v[1] for k, v in ref_files.items()}


def test_a_checkpoint_due_at_the_last_step_is_taken_past_the_loop(tmp_path, reference):
    """The last step's checkpoint falls due as the training loop ends (20 steps, every 5): no
    loop head comes, so it is taken where the loop ended, as the loop ended; the rerun of the
    finished run goes back there, its range is spent, and it trains nothing
    (word_language_model's ``try: for epoch`` shape)."""
    shape = Shape("try_epochs.py", 20, 5)
    _, ref_state, ref_files = reference("try-epochs", CASES["try-epochs"][0])
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    first = _run(shape, tmp_path, T_ENTRY="activate")
    assert first.returncode == 0, first.explain()
    before = _files(tmp_path)
    again = _run(shape, tmp_path, T_ENTRY="activate", T_OUT=str(tmp_path / "final.pt"))
    assert again.returncode == 0 and again.resumed_from == 20, again.explain()
    assert _output(again) == [] and "whose own condition decides" in again.stderr, again.explain()
    harness.assert_same_state(torch.load(tmp_path / "final.pt", weights_only=False), ref_state)
    assert _files(tmp_path) == before and {k: v[1] for k, v in before.items()} == {
        k: v[1] for k, v in ref_files.items()}


def test_finished_class_trainer_rerun_runs_nothing_and_keeps_the_users_model(tmp_path):
    """minGPT's ending: nothing follows ``trainer.run()``. Rerun after it finished, the script
    trains nothing, its callback never saves over the trained model, and it exits 0."""
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    shape = CASES["class-trainer"][0]
    first = _run(shape, tmp_path, T_ENTRY="activate")
    assert first.returncode == 0, first.explain()
    saved = tmp_path / "model.pt"
    before = (saved.stat().st_mtime_ns, saved.read_bytes())
    again = _run(shape, tmp_path, T_ENTRY="activate")
    assert again.returncode == 0, again.explain()
    assert _output(again) == [], again.explain()
    assert (saved.stat().st_mtime_ns, saved.read_bytes()) == before
    assert "whose own condition decides" in again.stderr, again.explain()


def test_finished_class_trainer_rerun_needing_the_trainer_runs_what_follows_from_the_restored_state(
        tmp_path, reference):
    """The code after ``trainer.fit()`` reads the trainer's optimizer, which no checkpoint
    holds as an object: the exit checkpoint holds ``fit()``'s ``while`` as it ended, the rerun
    makes the trainer anew, goes back into that loop, whose condition ends it at once, and
    the code after it runs on the restored state: the same bits and files, no step again."""
    shape = CASES["class-epochs"][0]
    _, ref_state, ref_files = reference("class-epochs", shape)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 4\n")
    first = _run(shape, tmp_path, T_ENTRY="activate")
    assert first.returncode == 0, first.explain()
    again = _run(shape, tmp_path, T_ENTRY="activate", T_OUT=str(tmp_path / "final.pt"))
    assert again.returncode == 0 and again.resumed_from == shape.iterations, again.explain()
    assert _output(again) == [], again.explain()
    harness.assert_same_state(torch.load(tmp_path / "final.pt", weights_only=False), ref_state)
    assert {k: v[1] for k, v in _files(tmp_path).items()} == {k: v[1] for k, v in ref_files.items()}


def test_a_script_edited_since_the_checkpoint_is_told_and_still_restored(tmp_path):
    """Lines added above the loop move it: the recorded position is no longer where the source
    says, so the rerun says so once and restores at the first forward pass, as without a
    recorded position, instead of waiting for a line that never comes."""
    shutil.copy(SHAPES / "probe.py", tmp_path)
    script = tmp_path / "while_globals.py"
    script.write_text((SHAPES / "while_globals.py").read_text())
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    argv = [harness.PYTHON, str(script)]
    first = harness.run(argv, tmp_path, harness.child_env(T_ENTRY="activate", T_BLOCK_AT="12"), kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL, first.explain()
    script.write_text("# edited\n\n" + script.read_text())
    second = harness.run(argv, tmp_path, harness.child_env(T_ENTRY="activate"))
    assert second.returncode == 0 and second.resumed_from == 10, second.explain()
    told = [line for line in second.stderr.splitlines() if "no longer there" in line]
    assert len(told) == 1 and "while loop of while_globals.py:<module> at line 56" in told[0], second.explain()


def test_a_script_that_resumed_itself_past_the_checkpoint_trains_every_epoch_left(tmp_path):
    """minGPT-ddp's own snapshot every two epochs: the checkpoint due at epoch 2's last step is
    taken in the evaluation after the script saved its snapshot, so the rerun's loop, resumed by
    the script to epoch 3, starts past the recorded position. It cannot go back there, says so
    once, and its DataLoaders run the epochs the script asks for; before, they passed the epochs
    the checkpoint had counted through empty, and the rerun trained nothing."""
    shape = Shape("class_snapshot.py", 48, 4, env={"T_OWN_SNAPSHOTS": "1"})
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 4\n")
    first = harness.run([harness.PYTHON, str(SHAPES / shape.script)], tmp_path,
                        harness.child_env(**shape.env, T_ENTRY="activate", T_BLOCK_AT="26"), kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL, first.explain()
    second = _run(shape, tmp_path, T_ENTRY="activate", T_OUT=str(tmp_path / "final.pt"))
    assert second.returncode == 0 and second.resumed_from == 24, second.explain()
    steps = [line.split()[1] for line in _output(second) if line.startswith("STEP ")]
    assert steps == ["3"] * 12 + ["4"] * 12, second.explain()
    told = [line for line in second.stderr.splitlines() if "cannot return to the loop" in line]
    assert len(told) == 1 and "its DataLoaders go on" in told[0], second.explain()
