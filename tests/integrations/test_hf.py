"""HuggingFace Trainer under ``ravex enable``, zero-code: a real Trainer script (tiny GPT-2,
random tokens, ``max_steps=60`` over two epochs, ``save_strategy="no"``) SIGKILLed in its first
or its second epoch and rerun unchanged ends bitwise equal to an uninterrupted run without
Ravex, with Trainer's own ``global_step`` and log history (step, epoch, loss, learning rate,
grad norm of every step) continuing as if never stopped. The same script run to its end and
rerun unchanged (a resubmitted job), as one process and under ``torchrun`` x2, trains nothing
and saves and evaluates the trained model, bitwise as the first run did."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from runtime import harness  # tests/runtime: the kill-and-rerun harness
from runtime.conftest import make_venv

TRAINEE = Path(__file__).with_name("hf_trainee.py")
STEPS, PER_EPOCH, EVERY = 60, 30, 4
ENV = {"OMP_NUM_THREADS": "1"}  # a tiny model: threads only contend on a small machine


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The script run once to the end, without Ravex."""
    cwd = tmp_path_factory.mktemp("hf-reference")
    env = harness.child_env(T_OUT=str(cwd / "final.pt"), **ENV)
    result = harness.run([sys.executable, str(TRAINEE)], cwd, env)
    assert result.returncode == 0, result.explain()
    final = torch.load(cwd / "final.pt", weights_only=True)
    assert final["global_step"] == STEPS and len(final["logs"]) == STEPS
    return final


@pytest.fixture(scope="module")
def enabled(tmp_path_factory) -> str:
    return make_venv(tmp_path_factory.mktemp("hf-venv"))


def _written_at_least(step: int) -> str:
    """A ``STEP`` line whose newest written checkpoint is ``step`` or later."""
    return rf"STEP \d+ \S+ W(?:{'|'.join(str(s) for s in range(step, STEPS + 1))})$"


@pytest.mark.parametrize("epoch", [0, 1])
def test_trainer_killed_in_either_epoch_resumes_bitwise(tmp_path, uninterrupted, enabled, epoch):
    # A random checkpoint of the epoch; the run is killed once that one is on storage. It is
    # taken as the next step starts, and that step's end waits for it to be written, so the
    # kill comes before the run ends however slowly this machine writes (56 at the latest: the
    # last one, 60, is never reported before the run ends).
    seed = random.randrange(10**6)
    first = epoch * PER_EPOCH + EVERY * random.Random(seed).randint(1, (PER_EPOCH - 2) // EVERY)
    first = min(first, STEPS - EVERY)
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\n")
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), **ENV)
    killed = harness.run([enabled, str(TRAINEE)], tmp_path, dict(env, T_FLUSH_AT=str(first + 1)),
                         kill_on=_written_at_least(first))
    assert killed.returncode == -9, f"seed {seed}: " + killed.explain()

    rerun = harness.run([enabled, str(TRAINEE)], tmp_path, env)
    assert rerun.returncode == 0, f"seed {seed}: " + rerun.explain()
    assert rerun.resumed_from is not None and first <= rerun.resumed_from < (epoch + 1) * PER_EPOCH, (
        f"seed {seed}, checkpoint {first}: " + rerun.explain())
    steps = [int(line.split()[1]) for line in rerun.stdout if line.startswith("STEP ")]
    assert steps == list(range(rerun.resumed_from + 1, STEPS + 1)), f"seed {seed}: {steps}"
    assert "single sample" not in rerun.stderr and "NOT restored" not in rerun.stderr, rerun.stderr

    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["global_step"] == STEPS
    assert final["logs"] == uninterrupted["logs"], f"seed {seed}: Trainer's log history differs"
    harness.assert_same_state(final["model"], uninterrupted["model"], "model")


def _launch(python: str, nproc: int) -> list[str]:
    torchrun = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*(torchrun if nproc > 1 else [python]), str(TRAINEE)]


@pytest.mark.parametrize("nproc", [1, 2], ids=["1-process", "torchrun-x2"])
@pytest.mark.parametrize(("every", "max_steps"), [
    # step 60 ends an epoch, and its checkpoint is taken at evaluate()'s first batch
    pytest.param(4, 60, id="epoch-end"),
    # step 50 is inside an epoch, and its checkpoint is the exit one (the Trainer is gone by then)
    pytest.param(7, 50, id="mid-epoch"),
])
def test_a_finished_trainer_rerun_trains_nothing_and_saves_the_trained_model(tmp_path, enabled, nproc,
                                                                              every, max_steps):
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {every}\n")
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MAX_STEPS=str(max_steps), **ENV)
    first = harness.run(_launch(enabled, nproc), tmp_path, env)
    assert first.returncode == 0, first.explain()
    trained = torch.load(tmp_path / "final.pt", weights_only=True)
    assert trained["global_step"] == max_steps
    saved = {path.name: path.read_bytes() for path in (tmp_path / "final").iterdir()}
    assert "model.safetensors" in saved

    rerun = harness.run(_launch(enabled, nproc), tmp_path, env)
    assert rerun.returncode == 0, rerun.explain()
    assert rerun.resumed_from == max_steps, rerun.explain()
    assert not [line for line in rerun.stdout if line.startswith("STEP ")], rerun.explain()
    assert "ravex: checkpoint step" not in rerun.stderr, rerun.stderr  # no step, none written
    assert "single sample" not in rerun.stderr and "NOT restored" not in rerun.stderr, rerun.stderr
    again = {path.name: path.read_bytes() for path in (tmp_path / "final").iterdir()}
    assert again.keys() == saved.keys()
    for name, data in saved.items():
        assert again[name] == data, f"final/{name} differs from the first run's"

    evaluated = torch.load(tmp_path / "final.pt", weights_only=True)
    for key in ("global_step", "epoch", "eval_loss", "logs"):
        assert evaluated[key] == trained[key], f"{key}: {evaluated[key]!r} != {trained[key]!r}"
    harness.assert_same_state(evaluated["model"], trained["model"], "model")
    [record] = (tmp_path / ".ravex").glob("last-run-*.json")  # what `ravex status` shows
    outcome = json.loads(record.read_text())
    assert (outcome["found"], outcome["restored"], outcome["steps"]) == (max_steps, max_steps, 0), outcome


def test_a_transformers_without_the_resume_methods_is_left_alone_with_one_line(monkeypatch, caplog):
    """Another transformers release may rename what the integration wraps: the script then runs as
    Ravex runs any script (torch objects restored), with one warning line naming the extra."""
    from transformers import trainer as trainer_module

    from ravex.integrations import hf

    monkeypatch.delattr(trainer_module, "skip_first_batches")
    replaced: list[str] = []
    with caplog.at_level("WARNING", logger="ravex"):
        hf.install(object(), lambda owner, name, make: replaced.append(name))  # type: ignore[arg-type]
    assert replaced == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "ravex"]
    assert "has no Trainer skip_first_batches" in line and "pip install 'ravex[hf]'" in line, line
