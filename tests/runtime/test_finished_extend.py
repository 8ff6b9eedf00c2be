"""A finished run, rerun: the training loop's own condition decides whether it trains on.

Each shape (tests/runtime/shapes/extend_*.py) takes its bound from ``T_BOUND``: nanoGPT's
``max_iters``, a ``range(N)``, a number of epochs. It runs to the end with bound ``B``, then
runs again: with ``B`` it trains nothing, rewrites none of the files its loop wrote, and
the code after its loop prints the first run's result from the restored state; with
``B + k`` it trains exactly the ``k`` added iterations (their printed lines are those of an
uninterrupted run to ``B + k``) and ends bitwise equal to that run on plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from . import harness

SHAPES = Path(__file__).with_name("shapes")
TRAINING = ("STEP ", "EVAL ", "EPOCH ")


@dataclass(frozen=True)
class Extend:
    script: str
    bound: int
    more: int
    steps: int  #: optimizer steps of a run to ``bound``
    every: int  #: checkpoint_every


CASES = {
    # 17 steps, every 5: the exit checkpoint holds the loop as it ended
    "while-max-iters": Extend("extend_while.py", 16, 7, 17, 5),
    # 20 steps, every 5: the last step's checkpoint falls due as the loop ends
    "while-max-iters-due-at-end": Extend("extend_while.py", 19, 5, 20, 5),
    "range-n": Extend("extend_range.py", 17, 6, 17, 5),
    "epochs-in-function": Extend("extend_epochs.py", 2, 2, 20, 6),
    # minGPT: one iterator over an endless sampler, mid-epoch when the run finishes
    "endless-iterator": Extend("extend_endless_iter.py", 13, 6, 13, 5),
    # pytorch-template: its early-stopping break in an if nested in another
    "nested-early-stop": Extend("extend_early_stop.py", 3, 2, 15, 4),
}


def _run(script: str, cwd: Path, bound: int, **env: str) -> harness.Result:
    return harness.run([harness.PYTHON, str(SHAPES / script)], cwd,
                       harness.child_env(T_BOUND=str(bound), **env))


def _lines(result: harness.Result, prefixes: tuple[str, ...]) -> list[str]:
    return [line for line in result.stdout if line.startswith(prefixes)]


def _files(cwd: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in cwd.iterdir()
            if p.suffix in (".pt", ".pth") and not p.name.startswith("out-")}


@pytest.mark.parametrize("name", list(CASES))
def test_finished_run_rerun_with_the_same_bound_trains_nothing_and_runs_what_follows(name, tmp_path):
    case = CASES[name]
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {case.every}\n")
    first = _run(case.script, tmp_path, case.bound, T_ENTRY="activate", T_OUT=str(tmp_path / "out-first.pt"))
    assert first.returncode == 0, first.explain()
    before = _files(tmp_path)
    again = _run(case.script, tmp_path, case.bound, T_ENTRY="activate", T_OUT=str(tmp_path / "out-again.pt"))
    assert again.returncode == 0 and again.resumed_from == case.steps, again.explain()
    assert _lines(again, TRAINING) == [], again.explain()
    assert _lines(again, ("RESULT ",)) == _lines(first, ("RESULT ",)) != [], again.explain()
    assert "training is not run again" not in again.stderr, again.explain()
    assert again.witness is None, again.explain()  # nothing trained: nothing to verify, nothing said
    harness.assert_same_state(torch.load(tmp_path / "out-again.pt", weights_only=False),
                              torch.load(tmp_path / "out-first.pt", weights_only=False))
    assert _files(tmp_path) == before


@pytest.mark.parametrize("name", list(CASES))
def test_finished_run_rerun_with_a_larger_bound_trains_exactly_the_added_steps(name, tmp_path):
    case = CASES[name]
    longer = case.bound + case.more
    reference = tmp_path / "reference"
    reference.mkdir()
    ref = _run(case.script, reference, longer, T_OUT=str(reference / "out-ref.pt"))
    assert ref.returncode == 0, ref.explain()
    (tmp_path / "short").mkdir()
    short = _run(case.script, tmp_path / "short", case.bound)
    assert short.returncode == 0, short.explain()
    assert len(_lines(short, ("STEP ",))) == case.steps, short.explain()
    added = _lines(ref, TRAINING)[len(_lines(short, TRAINING)):]
    assert any(line.startswith("STEP ") for line in added)

    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {case.every}\n")
    first = _run(case.script, tmp_path, case.bound, T_ENTRY="activate")
    assert first.returncode == 0, first.explain()
    assert _lines(first, TRAINING) == _lines(short, TRAINING), first.explain()
    more = _run(case.script, tmp_path, longer, T_ENTRY="activate", T_OUT=str(tmp_path / "out-more.pt"))
    assert more.returncode == 0 and more.resumed_from == case.steps, more.explain()
    assert _lines(more, TRAINING) == added, more.explain()
    # no step followed the finished run's last: the witness says it had nothing to compare
    assert (more.witness or "").startswith(f"ravex: resume not verified (resumed from step {case.steps}): "
                                           f"step {case.steps} is where the run that wrote it finished"), more.explain()
    assert _lines(more, ("RESULT ",)) == _lines(ref, ("RESULT ",)), more.explain()
    harness.assert_same_state(torch.load(tmp_path / "out-more.pt", weights_only=False),
                              torch.load(reference / "out-ref.pt", weights_only=False))
    ref_files = {k: v[1] for k, v in _files(reference).items()}
    assert {k: v[1] for k, v in _files(tmp_path).items()} == ref_files


def test_a_schedule_built_for_the_larger_bound_is_said_to_go_on_as_the_first_run_set_it(tmp_path):
    """``T_max`` is the bound: extending the finished run restores the scheduler with the first
    run's length, and the rerun says so, naming the number; the same bound says nothing."""
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 4\n")
    first = _run("extend_cosine.py", tmp_path, 10, T_ENTRY="activate")
    assert first.returncode == 0, first.explain()
    again = _run("extend_cosine.py", tmp_path, 10, T_ENTRY="activate")
    assert again.returncode == 0 and "restores LR scheduler" not in again.stderr, again.explain()
    more = _run("extend_cosine.py", tmp_path, 14, T_ENTRY="activate")
    assert more.returncode == 0 and len(_lines(more, ("STEP ",))) == 4, more.explain()
    assert ("restores LR scheduler #0 (CosineAnnealingLR) T_max=10 (built with 14 by this run): the schedule "
            "goes on as the run that wrote it set it") in more.stderr, more.explain()
