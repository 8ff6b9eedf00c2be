"""PyTorch Lightning with ``Trainer(plugins=[RavexCheckpointIO(...)])``: a real Lightning script
(tiny model on CPU, three epochs, ``ModelCheckpoint(save_last=True)`` every 4 steps, resumed with
``ckpt_path="last"``) SIGKILLed at a random step and rerun unchanged ends bitwise equal to the
same script run once without any checkpointing; every save after the first reuses the chunks of
the frozen layer; the checkpoint files are Ravex pointers that load without pickle. And the same
script with no Ravex in it and Lightning's defaults, under ``ravex enable``, imported as
``lightning`` or as ``pytorch_lightning``: the same, its steps numbered by global step with their
training loss, in the configured store beside the runtime's own steps (which never restores one),
each save printing the checkpoint line every path prints; with DDP on two processes killed in a
later epoch: the same batches as the uninterrupted run; a finished run rerun: nothing trained, the
same files written after fit; and a run killed while an earlier Ravex wrote ``<storage>-lightning``
resumed from there."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

from runtime import harness  # tests/runtime: the kill-and-rerun harness
from runtime.conftest import make_venv

from ravex.format import open_store

TRAINEE = Path(__file__).with_name("lightning_trainee.py")
RUNTIME_TRAINEE = Path(__file__).parents[1] / "runtime" / "trainee.py"
STEPS, EVERY, EPOCHS = 48, 4, 3
ENV = {"OMP_NUM_THREADS": "1"}  # a tiny model: threads only contend on a small machine
PACKAGES = ["lightning", "pytorch_lightning"]


def _reference(cwd: Path, **extra: str) -> dict:
    """The script run once to the end, without Ravex and without checkpoints."""
    env = harness.child_env(T_OUT=str(cwd / "final.pt"), T_MODE="plain", **ENV, **extra)
    result = harness.run([sys.executable, str(TRAINEE)], cwd, env)
    assert result.returncode == 0, result.explain()
    assert "STATS" not in "".join(result.stdout) and not (cwd / "store").exists()
    final = torch.load(cwd / "final.pt", weights_only=True)
    assert final["global_step"] == STEPS
    return final


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """With the trainee's resumable loader (Lightning's ``state_dict`` protocol)."""
    return _reference(tmp_path_factory.mktemp("lightning-reference"))


@pytest.fixture(scope="module")
def uninterrupted_plain_loader(tmp_path_factory) -> dict:
    """With a plain ``DataLoader(shuffle=True)``, drawing its order from torch's global RNG."""
    return _reference(tmp_path_factory.mktemp("lightning-reference-plain"), T_LOADER="plain")


def _written_at_least(step: int, points: list[int] | None = None) -> str:
    """A ``STEP`` line whose newest durable checkpoint is at global step ``step`` or later, of
    ``points`` (every ``EVERY`` steps when None)."""
    points = list(range(EVERY, STEPS + 1, EVERY)) if points is None else points
    return rf"STEP \d+ W(?:{'|'.join(str(s) for s in points if s >= step)})$"


def _cadence(steps: int, per_epoch: int) -> list[int]:
    """The global steps the zero-code cadence saves at: each multiple of ``EVERY``, except that one
    due at an epoch's last batch is taken at the next epoch's first step (the last step of ``fit``
    at its end)."""
    return [s if s == steps or s % per_epoch else s + 1 for s in range(EVERY, steps + 1, EVERY)]


def _starts(result: harness.Result) -> int:
    return int(next(line for line in result.stdout if line.startswith("START ")).split()[1])


#: the line every checkpoint prints, whichever path wrote it (ravex.saving.logline.checkpoint_line)
LINE = re.compile(r"ravex: checkpoint step (\d+): stall [\d.]+ ms \(wait [\d.]+, stage [\d.]+; copied \d+/\d+ "
                  r"tensors, [\d.]+ MiB of [\d.]+ MiB\) \| .*ms \| [\d.]+ MiB new \(\d+ chunks\), [\d.]+ MiB reused "
                  r"\(\d+ chunks\) of [\d.]+ MiB \| in background [\d.]+ ms -> (.+)$")


def _lines(result: harness.Result) -> list[tuple[int, str]]:
    """Each checkpoint line the run printed: (step, store)."""
    found = [LINE.match(line) for line in result.stderr.splitlines() if line.startswith("ravex: checkpoint step")]
    assert all(found), result.explain()
    return [(int(m.group(1)), m.group(2)) for m in found if m is not None]


def _saves(result: harness.Result) -> int:
    """How many saves the run's zero-code plugin wrote (its ``STATS`` line)."""
    return len(json.loads(next(line for line in result.stdout if line.startswith("STATS ")).split()[1]))


def test_killed_at_a_random_step_resumes_bitwise(tmp_path, uninterrupted):
    """With the plugin's background writes (the synchronous ones are the same code, run inline:
    the test below writes that way)."""
    seed = random.randrange(10**6)
    # A checkpoint in any of the 3 epochs, but not at an epoch's last batch (16, 32): resumed from
    # there, Lightning itself does not continue exactly with its own TorchCheckpointIO either (it
    # re-enters the finished epoch's end with the loader's next-epoch state); that is Lightning's.
    points = [s for s in range(EVERY, STEPS - EVERY, EVERY) if s % 16]
    first = harness.kill_points().choice(points)
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="async", **ENV)
    killed = harness.run([sys.executable, str(TRAINEE)], tmp_path, env, kill_on=_written_at_least(first))
    assert killed.returncode == -9, f"seed {seed}: " + killed.explain()
    pointer = json.loads((tmp_path / "ckpts" / "last.ckpt").read_text())
    assert pointer["store"] == str(tmp_path / "store")

    rerun = harness.run([sys.executable, str(TRAINEE)], tmp_path, env)
    assert rerun.returncode == 0, f"seed {seed}: " + rerun.explain()
    start = int(next(line for line in rerun.stdout if line.startswith("START ")).split()[1])
    assert start >= first and start % EVERY == 0, f"seed {seed}, checkpoint {first}: " + rerun.explain()
    steps = [int(line.split()[1]) for line in rerun.stdout if line.startswith("STEP ")]
    assert steps == list(range(start + 1, STEPS + 1)), f"seed {seed}: {steps}"

    # Delta reuse: the frozen layer's chunks are never written again, a duplicate save writes nothing.
    new, reused = (json.loads(part) for part in
                   next(line for line in rerun.stdout if line.startswith("STATS ")).split(" ", 2)[1:])
    assert all(r >= 2 for r in reused[1:]), f"seed {seed}: reused {reused}"
    assert new[1::2] == [0] * len(new[1::2]), f"seed {seed}: the last.ckpt saves wrote {new}"

    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["global_step"] == STEPS
    harness.assert_same_state(final["model"], uninterrupted["model"], "model")


@pytest.mark.parametrize("package", PACKAGES)
def test_checkpoint_is_a_ravex_step_read_without_pickle(tmp_path, package):
    """The plugin in ``Trainer(plugins=[...])`` of either Lightning (each checks it against its own
    ``CheckpointIO``)."""
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="sync", T_PKG=package, **ENV)
    result = harness.run([sys.executable, str(TRAINEE)], tmp_path, env)
    assert result.returncode == 0, result.explain()
    pointer = json.loads((tmp_path / "ckpts" / "last.ckpt").read_text())
    step = open_store(tmp_path / "store").read(pointer["step"])
    assert step["global_step"] == STEPS and step["epoch"] == 2
    assert step["hyper_parameters"]["betas"] == (0.9, 0.99)  # a tuple stays a tuple
    assert set(step["optimizer_states"][0]["state"]) == {0, 1, 2, 3}  # int keys stay ints
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert (step["state_dict"]["net.0.weight"] == final["model"]["net.0.weight"].numpy()).all()
    # save_top_k=1 dropped every superseded epoch=E-step=S step; the store lists only what pointers name.
    named = {json.loads(p.read_text())["step"] for p in (tmp_path / "ckpts").glob("*.ckpt")}
    assert set(open_store(tmp_path / "store").step_numbers()) == named
    listed = subprocess.run([sys.executable, "-m", "ravex", "ls", str(tmp_path / "store")], env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0 and f"step_{pointer['step']}" in listed.stdout, listed.stderr


def test_a_file_not_written_by_the_plugin_is_refused_in_one_line(tmp_path):
    from ravex.integrations.lightning import RavexCheckpointIO

    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": {}}, path)
    io = RavexCheckpointIO(tmp_path / "store")
    with pytest.raises(ValueError, match=r"model\.ckpt is not a RavexCheckpointIO checkpoint"):
        io.load_checkpoint(path)
    with pytest.raises(ValueError, match="local dirpath"):
        io.save_checkpoint({"epoch": 0}, "s3://bucket/last.ckpt")


def test_a_value_typed_json_cannot_hold_is_refused_by_its_key(tmp_path):
    from ravex.errors import UnsupportedValueError
    from ravex.integrations.lightning import RavexCheckpointIO

    io = RavexCheckpointIO(tmp_path / "store", async_writes=False)
    with pytest.raises(UnsupportedValueError, match="hyper_parameters"):
        io.save_checkpoint({"hyper_parameters": {"activation": torch.nn.ReLU()}}, tmp_path / "last.ckpt")
    assert not (tmp_path / "last.ckpt").exists()


@pytest.fixture(scope="module")
def enabled(tmp_path_factory) -> str:
    return make_venv(tmp_path_factory.mktemp("lightning-venv"))


@pytest.mark.parametrize("package", PACKAGES)
def test_zero_code_under_ravex_enable_resumes_bitwise(tmp_path, uninterrupted_plain_loader, enabled, package):
    """No plugin, no ModelCheckpoint, no ckpt_path in the script, a plain shuffled DataLoader that
    Lightning alone cannot resume mid-epoch: ``ravex.yaml``'s cadence, and the rerun exact. The
    script imports ``lightning`` or the standalone ``pytorch_lightning``: one integration for both
    (the reference is the ``lightning`` run: the two are the same code)."""
    points = _cadence(STEPS, STEPS // EPOCHS)
    # mid-epoch or an epoch's first step; not the last few: a background write may be durable only
    # after the script has ended
    first = harness.kill_points().choice(points[:-3])
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\nkeep_last: 2\n")
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="zero", T_LOADER="plain", T_PKG=package, **ENV)
    killed = harness.run([enabled, str(TRAINEE)], tmp_path, env, kill_on=_written_at_least(first, points))
    assert killed.returncode == -9, f"checkpoint {first}: " + killed.explain()

    rerun = harness.run([enabled, str(TRAINEE)], tmp_path, env)
    assert rerun.returncode == 0, rerun.explain()
    assert "IO ZeroCodeIO" in rerun.stdout, rerun.explain()
    assert "Ravex's own checkpoints stand down" in rerun.stderr and "NOT restored" not in rerun.stderr
    assert "ravex: resumed from" not in rerun.stderr, rerun.stderr  # the runtime restored nothing
    assert "Lightning Trainer's checkpoint" not in rerun.stderr, rerun.stderr
    start = _starts(rerun)
    assert start >= first and start in points, f"checkpoint {first}: " + rerun.explain()
    # killed once its step was durable: verified, or, where no step after it had finished yet, said so
    said = rerun.witness or ""
    assert said.startswith((f"ravex: resume verified: after step {start}, ",
                            f"ravex: resume not verified (resumed from step {start}): no step after step {start} "
                            "had finished")), rerun.explain()
    steps = [int(line.split()[1]) for line in rerun.stdout if line.startswith("STEP ")]
    assert steps == list(range(start + 1, STEPS + 1)), steps
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["global_step"] == STEPS
    harness.assert_same_state(final["model"], uninterrupted_plain_loader["model"], "model")

    # The steps are Lightning's checkpoints in the configured store, keep_last honoured.
    assert not (tmp_path / "ckpt-lightning").exists()
    store = open_store(tmp_path / "ckpt")
    newest = store.read(store.latest_step())
    assert newest["global_step"] == STEPS and "loops" in newest
    pointers = sorted((tmp_path / ".ravex").glob("lightning-*/step=*.ckpt"))
    assert [p.name for p in pointers] == [f"step={STEPS - EVERY}.ckpt", f"step={STEPS}.ckpt"]

    # Each save printed the checkpoint line of every other path once, naming its step and the store.
    lines = _lines(rerun)
    assert [step for step, _ in lines] == [s for s in points if s > start], rerun.explain()
    assert len(lines) == _saves(rerun) and {url for _, url in lines} == {str(tmp_path / "ckpt")}, rerun.explain()

    # Each step is its global step, with the training loss of that step as `ravex ls` shows it.
    losses = {int(p[1]): p[2] for p in (line.split() for line in killed.stdout + rerun.stdout) if p[0] == "LOSS"}
    listed = subprocess.run([sys.executable, "-m", "ravex", "ls", "--json", str(tmp_path / "ckpt")],
                            env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    rows = [r for r in json.loads(listed.stdout)["steps"] if r["complete"]]  # one the kill cut short: incomplete
    assert {STEPS - EVERY, STEPS} <= {r["step"] for r in rows} <= set(points), rows
    for row in rows:
        assert store.read(row["step"])["global_step"] == row["step"]
        assert repr(row["loss"]) == losses[row["step"]], (row, losses[row["step"]])
    checked = subprocess.run([sys.executable, "-m", "ravex", "validate", str(tmp_path / "ckpt")],
                             env=env, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_zero_code_resume_is_verified_by_the_witness(tmp_path, uninterrupted_plain_loader, enabled):
    """Lightning restores the run itself; rank 0's witness recorded the steps after each save (its
    files beside the step) and checks the resumed run's first steps against them. Killed three
    steps after a save, every write flushed: the rerun says ``resume verified``, and ends bitwise."""
    every = _cadence(STEPS, STEPS // EPOCHS)
    saved = every[1]
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\nkeep_last: 2\n")
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="zero", T_LOADER="plain", **ENV)
    killed = harness.run([enabled, str(TRAINEE)], tmp_path, {**env, "T_BLOCK_AT": str(saved + 3)}, kill_on="BLOCKED")
    assert killed.returncode == -9, killed.explain()
    assert (tmp_path / "ckpt" / "steps" / str(saved) / "witness-0.json").exists(), killed.explain()
    rerun = harness.run([enabled, str(TRAINEE)], tmp_path, env)
    assert rerun.returncode == 0 and _starts(rerun) == saved, rerun.explain()
    rerun.assert_verified()
    assert rerun.witness.startswith(f"ravex: resume verified: after step {saved}, steps {saved + 1}-{saved + 3} "
                                    "match"), rerun.explain()
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    harness.assert_same_state(final["model"], uninterrupted_plain_loader["model"], "model")


def test_a_finished_run_rerun_unchanged_trains_nothing_and_writes_the_same_files(tmp_path, enabled):
    """What the script writes after ``fit`` (``trainer.save_checkpoint``, ``torch.save`` of the
    weights) is, byte for byte, what the first run wrote: the rerun resumes the state ``fit`` ended
    with (the RNG streams included) and trains nothing. The file ``trainer.save_checkpoint`` wrote
    is Lightning's own, loadable with ``weights_only=True`` as without Ravex."""
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\n")
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="zero", T_LOADER="plain", T_AFTER="1", **ENV)
    first = harness.run([enabled, str(TRAINEE)], tmp_path, env)
    assert first.returncode == 0, first.explain()
    written = {name: (tmp_path / name).read_bytes() for name in ("final.pt", "after.ckpt")}
    steps = open_store(tmp_path / "ckpt").step_numbers()
    assert steps[-1] == STEPS, steps
    assert [step for step, _ in _lines(first)] == _cadence(STEPS, STEPS // EPOCHS), first.explain()

    rerun = harness.run([enabled, str(TRAINEE)], tmp_path, env)
    assert rerun.returncode == 0, rerun.explain()
    assert not [line for line in rerun.stdout if line.startswith(("START", "STEP"))], rerun.explain()
    assert f"resuming from step {STEPS}" in rerun.stderr and "NOT restored" not in rerun.stderr, rerun.stderr
    # the take-over's resume is not left as the Trainer's ckpt_path for a later test()/validate(),
    # and the Trainer's own signature shows through its wrapped __init__ (LightningCLI reads it)
    for run in (first, rerun):
        assert "CKPT_PATH None" in run.stdout, run.explain()
        assert "SIGNATURE accelerator,strategy,devices" in run.stdout, run.explain()
    for name, data in written.items():
        assert (tmp_path / name).read_bytes() == data, f"{name} differs from the first run's"
    assert open_store(tmp_path / "ckpt").step_numbers() == steps and not _lines(rerun), rerun.explain()
    after = torch.load(tmp_path / "after.ckpt", weights_only=True)
    assert after["global_step"] == STEPS


@pytest.mark.slow
def test_ddp_killed_in_a_later_epoch_resumes_the_same_batches_bitwise(tmp_path, enabled):
    """``devices=2, strategy="ddp"`` on CPU (gloo): Lightning gives the shuffled loader a
    ``DistributedSampler``, whose order is its epoch's. Killed (every process at once) in epoch 1
    or 2, the rerun draws on each rank the batches the uninterrupted run drew, each rank's dropout
    RNG goes on as it was, and the weights end bitwise equal."""
    steps, per_epoch = STEPS // 2, STEPS // EPOCHS // 2  # each rank half the samples
    points = _cadence(steps, per_epoch)
    common = {"T_LOADER": "plain", "T_DEVICES": "2", **ENV}
    (tmp_path / "reference").mkdir()
    reference = harness.run([sys.executable, str(TRAINEE)], tmp_path / "reference", harness.child_env(
        T_OUT=str(tmp_path / "reference" / "final.pt"), T_MODE="plain", **common), tree=True)
    assert reference.returncode == 0, reference.explain()
    drawn = {tuple(line.split()[1:3]): line.split()[3] for line in reference.stdout if line.startswith("BATCH ")}
    assert len(drawn) == 2 * steps, reference.explain()

    first = harness.kill_points().choice([s for s in points if per_epoch < s < points[-2]])  # epoch 1 or 2
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\n")
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="zero", **common)
    killed = harness.run([enabled, str(TRAINEE)], tmp_path, env, kill_on=_written_at_least(first, points), tree=True)
    assert killed.returncode == -9, f"checkpoint {first}: " + killed.explain()

    rerun = harness.run([enabled, str(TRAINEE)], tmp_path, env, tree=True)
    assert rerun.returncode == 0, rerun.explain()
    start = _starts(rerun)
    assert start >= first and start in points, f"checkpoint {first}: " + rerun.explain()
    # killed once its step was durable: verified, or, where no step after it had finished yet, said so
    said = rerun.witness or ""
    assert said.startswith((f"ravex: resume verified: after step {start}, ",
                            f"ravex: resume not verified (resumed from step {start}): no step after step {start} "
                            "had finished")), rerun.explain()
    resumed = {tuple(line.split()[1:3]): line.split()[3] for line in rerun.stdout if line.startswith("BATCH ")}
    assert set(resumed) == {(str(r), str(s)) for r in (0, 1) for s in range(start + 1, steps + 1)}, rerun.explain()
    assert {k: v for k, v in resumed.items() if drawn[k] != v} == {}, f"resumed from {start}: other batches drawn"
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["global_step"] == steps
    expected = torch.load(tmp_path / "reference" / "final.pt", weights_only=True)
    harness.assert_same_state(final["model"], expected["model"], "model")


def test_a_failed_background_write_is_raised_by_flush_and_no_pointer_is_left(tmp_path):
    from ravex.integrations.lightning import RavexCheckpointIO

    (tmp_path / "not-a-folder").write_text("a file where the store should be\n")
    io = RavexCheckpointIO(tmp_path / "not-a-folder" / "store")
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 0}, tmp_path / "last.ckpt")  # returns at once
    with pytest.raises(OSError):
        io.flush()
    assert not (tmp_path / "last.ckpt").exists()
    io.flush()  # raised once; the plugin goes on
    io.teardown()


def _lightning_steps(url: Path, global_steps: list[int], base: int = 0) -> None:
    """Steps as the zero-code plugin writes them (Lightning's tree, its metadata), without a Trainer."""
    from ravex.integrations.lightning import RavexCheckpointIO

    io = RavexCheckpointIO(url, async_writes=False, numbering="global_step", loss=lambda: 0.5)
    io._base = base
    for step in global_steps:
        io.save_checkpoint({"global_step": step, "epoch": 0, "state_dict": {"w": torch.full((4,), float(step))}},
                           url.parent / ".pointers" / f"step={step}.ckpt")
    io.teardown()


def test_a_script_without_a_trainer_never_restores_a_lightning_step_and_says_so(tmp_path):
    """The newest step of the store is a Lightning Trainer's: a plain training script there (no
    Trainer takes it over) restores nothing, writes nothing below or among Lightning's steps, and
    says so in one line; it trains as the same script without Ravex."""
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    _lightning_steps(tmp_path / "ckpt", [4, 8])
    env = {"T_EPOCHS": "1", **ENV}
    plain = harness.run([sys.executable, str(RUNTIME_TRAINEE)], tmp_path, harness.child_env(T_ENTRY="none", **env))
    ran = harness.run([sys.executable, str(RUNTIME_TRAINEE)], tmp_path, harness.child_env(T_ENTRY="activate", **env))
    assert ran.returncode == 0 and plain.returncode == 0, ran.explain()
    told = [line for line in ran.stderr.splitlines() if "is a Lightning Trainer's checkpoint" in line]
    assert len(told) == 1 and "step 8, the newest of" in told[0], ran.explain()
    assert "resumed from" not in ran.stderr and "NOT restored" not in ran.stderr, ran.explain()
    assert not _lines(ran) and open_store(tmp_path / "ckpt").step_numbers() == [4, 8]
    assert ran.losses == plain.losses, ran.explain()


def test_where_a_zero_code_run_starts_in_a_store_it_shares(tmp_path):
    """Steps of the runtime's own in the store: a fresh Lightning run numbers its steps above them;
    one resuming a Lightning step below a newer step of the runtime's forks a new timeline from it;
    ``resume:`` naming a step of the runtime's own is one clear error."""
    from ravex.errors import RestoreError
    from ravex.integrations.lightning import ZeroCode, _start

    url = tmp_path / "ckpt"
    settings = ZeroCode(url=str(url), pointers=str(tmp_path / ".pointers"), every=4, keep_last=None)
    writer = open_store(url, create=True).writer()
    writer.commit(100, {"ravex": {"step": 100}, "w": torch.ones(2).numpy()})
    start = _start(settings)
    assert (start.step, start.fork, start.base) == (None, False, 100)

    _lightning_steps(url, [4, 8], base=100)
    assert open_store(url).step_numbers() == [100, 104, 108]
    start = _start(settings)
    assert (start.step, start.fork, start.base) == (108, False, 100)

    writer.commit(200, {"ravex": {"step": 200}, "w": torch.zeros(2).numpy()})
    writer.close()
    start = _start(settings)
    assert (start.step, start.fork, start.base) == (108, True, 100)
    with pytest.raises(RestoreError, match="resume: 200 names a step of Ravex's own"):
        _start(dataclasses.replace(settings, resume=200))


def test_a_run_an_earlier_ravex_wrote_beside_the_store_resumes_from_there(tmp_path, uninterrupted_plain_loader,
                                                                         enabled):
    """Earlier versions kept a zero-code run's steps in ``<storage>-lightning``: killed there, the
    rerun with nothing in the configured store resumes from that store (saying so once), writes its
    own steps into the configured store, and ends bitwise equal to the uninterrupted run."""
    points = _cadence(STEPS, STEPS // EPOCHS)
    first = harness.kill_points().choice(points[:-3])
    env = harness.child_env(T_OUT=str(tmp_path / "final.pt"), T_MODE="zero", T_LOADER="plain", **ENV)
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt-lightning\ncheckpoint_every: {EVERY}\n")
    killed = harness.run([enabled, str(TRAINEE)], tmp_path, env, kill_on=_written_at_least(first, points))
    assert killed.returncode == -9, f"checkpoint {first}: " + killed.explain()

    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\ncheckpoint_every: {EVERY}\n")
    rerun = harness.run([enabled, str(TRAINEE)], tmp_path, env)
    assert rerun.returncode == 0, rerun.explain()
    start = _starts(rerun)
    told = [line for line in rerun.stderr.splitlines() if "where an earlier Ravex kept Lightning's steps" in line]
    assert len(told) == 1 and f"resuming from step {start} of ./ckpt-lightning" in told[0], rerun.stderr
    assert start >= first and start in points, f"checkpoint {first}: " + rerun.explain()
    steps = open_store(tmp_path / "ckpt").step_numbers()  # this run's, keep_last (default 3) kept
    assert steps and steps[-1] == STEPS and set(steps) <= {s for s in points if s > start}, steps
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    harness.assert_same_state(final["model"], uninterrupted_plain_loader["model"], "model")
