"""Each step's loss and its run's record in ``ravex ls`` and ``ravex show`` (real subprocesses),
and ``-`` for stores written before either existed (the 1.0 conformance fixture)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ravex.format import open_store
from ravex.format.history.runs import GitState, RunRecord, write_run

EXAMPLE = Path(__file__).resolve().parents[2] / "spec" / "example"
LOSSES = {1: 2.5, 2: 0.1 + 0.2, 3: float("nan"), 4: None}  # step 4: a run that saw no backward()


def _store(path: Path) -> Path:
    store = open_store(path, create=True)
    with store.writer(run="0a1b2c3d") as w:
        for step, loss in LOSSES.items():
            metadata = {} if loss is None else {"loss": repr(loss)}
            w.commit(step, {"model": {"w": np.full(4, step, "float32")}}, metadata=metadata)
    write_run(store.storage, RunRecord(
        run="0a1b2c3d", created_at="2026-12-03T12:00:00.000+00:00", argv=("train.py", "--lr", "0.1"),
        script="/w/train.py", cwd="/w", git=GitState("c0ffee" + "0" * 34, False), hostname="node-7",
        world_size=1, versions={"python": "3.11.7", "torch": "2.13.0", "ravex": "0.1.0"},
        config={"checkpoint_every": (3, "ravex.yaml"), "delta": (True, "default")}))
    return path


def test_ls_shows_each_steps_loss(cli, tmp_path):
    store = _store(tmp_path / "s")
    steps = {s["step"]: s for s in cli("ls", store, "--json").json()["steps"]}
    assert steps[1]["loss"] == 2.5 and steps[2]["loss"] == 0.30000000000000004  # exact, not rounded
    assert steps[3]["loss"] == "nan" and steps[4]["loss"] is None
    assert {s["run"] for s in steps.values()} == {"0a1b2c3d"}
    r = cli("ls", store)
    assert r.rc == 0, r
    rows = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in r.out.splitlines() if "step_" in line}
    assert rows == {"step_1": "2.5", "step_2": "0.3", "step_3": "nan", "step_4": "-"}, r.out


def test_show_prints_the_loss_and_the_run_record(cli, tmp_path):
    store = _store(tmp_path / "s")
    r = cli("show", f"{store}@2")
    assert r.rc == 0, r
    assert "loss 0.3  run 0a1b2c3d" in r.out
    assert "command: train.py --lr 0.1" in r.out and "git: c0ffee000000 (clean)" in r.out
    assert "host: node-7, world size 1" in r.out and "checkpoint_every=3 (ravex.yaml)" in r.out
    assert "delta=" not in r.out  # defaults are left out of the text
    doc = cli("show", f"{store}@2", "--json").json()
    assert doc["loss"] == 0.30000000000000004 and doc["run"] == "0a1b2c3d"
    assert doc["run_record"]["git"] == {"commit": "c0ffee" + "0" * 34, "dirty": False}
    assert doc["run_record"]["config"]["checkpoint_every"] == {"value": 3, "source": "ravex.yaml"}


def test_a_1_0_store_shows_no_loss_and_no_record(cli, tmp_path):
    store = tmp_path / "example"
    shutil.copytree(EXAMPLE, store)
    steps = cli("ls", store, "--json").json()["steps"]
    assert [s["loss"] for s in steps] == [None, None]
    r = cli("ls", store)
    assert all(line.split("│")[3].strip() == "-" for line in r.out.splitlines() if "step_" in line), r.out
    r = cli("show", f"{store}@1")
    assert r.rc == 0, r
    assert "loss -" in r.out and "no run record (a store written before 1.1)" in r.out
    assert cli("show", f"{store}@1", "--json").json()["run_record"] is None


def test_the_inspector_draws_the_loss_and_shows_the_run(tmp_path):
    import asyncio

    from conftest import settle

    from ravex.tui.app import InspectorApp
    from ravex.tui.formatting import SPARK

    store = _store(tmp_path / "s")

    async def drive() -> tuple[str, str, str]:
        app = InspectorApp(str(store))
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            spark = str(app.query_one("#spark").render())
            newest = str(app.query_one("#details-body").render())  # step 4: no loss recorded
            await pilot.press("up", "up")  # step 2
            await settle(pilot)
            return spark, newest, str(app.query_one("#details-body").render())

    spark, newest, second = asyncio.run(drive())
    loss_line = spark.splitlines()[1]
    # steps 1 and 2 have finite losses: the highest is the top bar, the lowest the bottom one
    assert loss_line == f"loss  {SPARK[-1]}{SPARK[0]}", spark
    assert "loss      -" in newest
    assert "loss      0.3" in second and "run       0a1b2c3d" in second
    assert "git: c0ffee000000 (clean)" in second and "host: node-7, world size 1" in second


def test_the_inspector_says_a_1_0_store_has_no_run_record(tmp_path):
    import asyncio

    from conftest import settle

    from ravex.tui.app import InspectorApp

    store = tmp_path / "example"
    shutil.copytree(EXAMPLE, store)

    async def drive() -> tuple[str, str]:
        app = InspectorApp(str(store))
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            return str(app.query_one("#spark").render()), str(app.query_one("#details-body").render())

    spark, details = asyncio.run(drive())
    assert "loss" not in spark  # no sparkline of nothing
    assert "loss      -" in details and "no run record (a store written before 1.1)" in details
