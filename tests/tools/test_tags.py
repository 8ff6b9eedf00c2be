"""Timelines and tags from the command line and in the inspector (spec/FORMAT.md §19): the tree
``ravex ls`` prints, ``ravex tag``, ``TIMELINE@STEP`` in the verbs that take a step, and what
GC keeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from conftest import settle

from ravex.format import open_store
from ravex.tui.app import InspectorApp

pytestmark = pytest.mark.timeout(120)


def state(step: int, branch: int) -> dict:
    return {"model": {"w": np.full(1000, step * 10 + branch, np.float32)}, "step": step}


@pytest.fixture
def forked(tmp_path: Path) -> Path:
    """main 60, 70, 80; main-60 forked at 60 with 70 and 80 of its own (the current timeline)."""
    root = tmp_path / "ckpt"
    store = open_store(root, create=True)
    with store.writer() as w:
        for s in (60, 70, 80):
            w.commit(s, state(s, 0))
    with store.fork(60).writer() as w:
        for s in (70, 80):
            w.commit(s, state(s, 1))
    return root


def test_ls_shows_the_tree_and_steps_take_a_timeline(cli, forked):
    env = {"RAVEX_STORAGE": str(forked)}
    r = cli("tag", "spike-free", "main@70", env=env)
    assert r.rc == 0 and "tagged 70 as spike-free" in r.out, r
    r = cli("ls", env=env)
    assert r.rc == 0, r
    assert "timeline main-60 (forked at main@60)" in r.out
    assert "main  steps 60..80 (3)  tags: spike-free -> 70" in r.out
    assert "main-60  steps 70..80 (2)  forked at main@60  <- current" in r.out
    doc = cli("ls", "--json", env=env).json()
    assert [s["step"] for s in doc["steps"]] == [60, 70, 80]  # main's, as a 1.0 reader lists them
    tls = {t["name"]: t for t in doc["timelines"]}
    assert (tls["main-60"]["parent"], tls["main-60"]["fork_step"], tls["main-60"]["current"]) == ("main", 60, True)
    assert [s["step"] for s in tls["main-60"]["steps"]] == [70, 80]
    assert doc["current_timeline"] == "main-60" and doc["tags"][0]["name"] == "spike-free"
    tagged_row = next(line for line in r.out.splitlines() if "step_70" in line and "spike-free" in line)
    assert "701" not in tagged_row  # the tags column of main's table, not main-60's
    # a bare step is the current timeline's; main@70 is the old one's
    shown = cli("show", "70", "--json", env=env).json()
    assert (shown["timeline"], shown["values"]["step"]) == ("main-60", 70)
    assert "main-60@step_70" in cli("show", "70", env=env).out
    old = cli("show", "main@70", "--json", env=env).json()
    assert (old["timeline"], old["tags"]) == ("main", ["spike-free"])
    assert "tags: spike-free" in cli("show", "main@70", env=env).out
    assert shown["tags"] == []
    assert cli("show", "main-60@60", "--json", env=env).json()["timeline"] == "main"  # its lineage: main's 60
    d = cli("diff", "main@70", "70", "--json", env=env)
    assert d.rc == 0 and d.json()["tensors"], d
    assert (d.json()["a"], d.json()["b"]) == (f"{forked}@70", f"{forked}@main-60@70")
    out = forked.parent / "w.safetensors"
    e = cli("export", "main-60@80", "--format", "safetensors", str(out), env=env)
    assert e.rc == 0, e
    from safetensors.numpy import load_file

    assert load_file(out)["model.w"][0] == 801


def test_tag_lists_deletes_and_refuses_bad_input_in_one_line(cli, forked):
    env = {"RAVEX_STORAGE": str(forked)}
    assert "no tags" in cli("tag", env=env).out
    assert cli("tag", "good", "latest", env=env).out.strip() == "tagged main-60@80 as good"
    bad = {
        ("tag", "", "70"): "tag name is empty",
        ("tag", "x" * 65, "70"): "is 65 characters; use at most 64",
        ("tag", "../escape", "70"): "may only hold letters",
        ("tag", "missing", "99"): "step main-60@99 in",  # a bare step: the current timeline
        ("tag", "good", "70"): "tag 'good' already exists",
        ("tag", "x", "nope@70"): "no timeline 'nope'",
        ("tag", "--delete", "absent"): "no tag 'absent'",
        ("tag", "x", "@70"): "before '@' comes a timeline",
        ("tag", "x", "y" * 65 + "@70"): "timeline name 'yyyy",
        ("tag", "x", "main-60@65"): "step main-60@65 in",
        ("show", "nope@70"): "a store is named by its path: ./nope@70",
    }
    for args, why in bad.items():
        r = cli(*args, env=env)
        assert r.rc == 2 and why in r.err and r.err.count("\n") == 1, (args, r)
    listed = cli("tag", "--json", env=env).json()["tags"]
    assert [(t["name"], t["timeline"], t["step"]) for t in listed] == [("good", "main-60", 80)]
    assert cli("tag", "--delete", "good", env=env).out.strip() == "deleted tag good (was main-60@80)"
    assert open_store(forked).tags() == {}


def test_gc_never_collects_a_tagged_step_of_any_timeline(cli, forked):
    env = {"RAVEX_STORAGE": str(forked)}
    assert cli("tag", "keep", "main@60", env=env).rc == 0
    r = cli("gc", "--keep-last", "1", "--grace", "0", "--json", env=env)
    assert r.rc == 0, r
    assert sorted(map(str, r.json()["kept_steps"])) == ["60", "80", "main-60@80"]
    store = open_store(forked)
    assert store.read("main@60")["model"]["w"].tobytes() == state(60, 0)["model"]["w"].tobytes()
    assert store.read("main-60@80")["model"]["w"].tobytes() == state(80, 1)["model"]["w"].tobytes()
    assert cli("validate", "--full", env=env).rc == 0  # objects of main-60 are not orphans


def test_the_inspector_lists_the_current_timelines_history_and_t_moves_on(forked):
    open_store(forked).tag("good", "main-60@70")
    open_store(forked).tag("old", "main@70")

    def rows(app: InspectorApp) -> list[str]:
        options = app.query_one("#step-list")
        return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]

    async def run() -> None:
        app = InspectorApp(str(forked))
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            box = app.query_one("#timelines")
            assert box.display
            tree = str(box.render())
            assert "  main 60..80\n▶ └ main-60 at 60: 70..80 ●" in tree, tree
            assert "tag good -> main-60@70" in tree and "tag old -> 70" in tree
            # main-60's history: main's 60 (lent), then its own 70 and 80; its 70 is tagged
            assert app.timeline == "main-60"
            assert [(r.split()[0], "◆" in r) for r in rows(app)] == [("step_60", False), ("step_70", True),
                                                                      ("step_80", False)]
            assert str(app.query_one("#steps").border_title) == "steps of main-60"
            details = str(app.query_one("#details-body").render())
            assert details.startswith("main-60@step_80"), details
            await pilot.press("up")
            await settle(pilot)
            assert str(app.query_one("#details-body").render()).startswith("main-60@step_70  ◆ good")
            await pilot.press("tab", "down", "enter", "down")  # a tensor of main-60's step 70: its own bytes
            await settle(pilot)
            assert app.leaf is not None and app.reader(70).store.timeline.name == "main-60"
            await pilot.press("shift+tab", "t")
            await settle(pilot)
            assert app.timeline == "main" and "▶ main 60..80" in str(box.render())
            assert [(r.split()[0], "◆" in r) for r in rows(app)] == [("step_60", False), ("step_70", True),
                                                                      ("step_80", False)]
            assert app.step == 80 and app.leaf is None  # the choice made on main-60 did not carry over
            assert str(app.query_one("#details-body").render()).startswith("step_80")
            assert app.reader(70).read_array("model/w")[0] == 700  # main's 70, not main-60's
            leaves = app.leaves
            app._set_leaves(80, [], {}, "main-60")  # a read of main-60's step 80 that lands late
            assert app.leaves is leaves and app.leaves
            await pilot.press("t")
            await settle(pilot)
            assert app.timeline == "main-60"

    asyncio.run(run())


def test_the_inspector_validates_every_timeline_and_opens_a_finding_where_it_is_listed(forked):
    store = open_store(forked)
    only_fork = sorted(_objects(store.on_timeline("main-60"), [80]) - _objects(store, [60, 70, 80])
                       - _objects(store.on_timeline("main-60"), [70]))
    victim = forked / "objects" / only_fork[0][:2] / only_fork[0]
    victim.write_bytes(victim.read_bytes()[::-1])  # main-60@80's own bytes, damaged

    async def run() -> None:
        app = InspectorApp(str(forked))
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("t", "v")  # main listed: validate still checks every timeline
            await settle(pilot)
            assert app.timeline == "main" and app.validated
            bad = [f for f in app.findings if f.severity == "error"]
            assert [(f.timeline, f.step, f.tensor) for f in bad] == [("main-60", 80, "model/w")], app.findings
            table = app.query_one("#validate-table")
            assert str(table.get_row_at(0)[1]) == "main-60@step_80"
            await pilot.press("enter")  # main-60 is not listed: a notice, the choice stays
            await settle(pilot)
            assert app.mode == "validate" and app.step == 80 and app.timeline == "main"
            await pilot.press("t", "v")
            await settle(pilot)
            await pilot.press("enter")
            await settle(pilot)
            assert (app.timeline, app.mode, app.step) == ("main-60", "details", 80)
            assert app.leaf is not None and app.leaf.path == "model/w"

    asyncio.run(run())


def test_timelines_snapshot(snap_compare, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store("ckpt", create=True)
    with store.writer(run="r0") as w:
        for s in (60, 70, 80):
            w.commit(s, state(s, 0))
    with store.fork(60).writer(run="r1") as w:
        for s in (70, 80):
            w.commit(s, state(s, 1))
    store.tag("before-spike", "60")

    async def settled(pilot) -> None:
        await settle(pilot)

    assert snap_compare(InspectorApp("ckpt"), terminal_size=(80, 24), run_before=settled)


def _objects(view, steps) -> set[str]:
    return {ref.object for s in steps for e in view.manifest(s, 0).arrays.values()
            for ref in e.chunks.values() if ref.object is not None}


def test_validate_checks_every_timeline_and_names_the_step_with_its_timeline(cli, forked):
    env = {"RAVEX_STORAGE": str(forked)}
    store = open_store(forked)
    fork = store.on_timeline("main-60")
    only_fork = sorted(_objects(fork, [70, 80]) - _objects(store, [60, 70, 80]))
    assert only_fork, "main-60's steps name objects of their own"
    ok = cli("validate", "--full", "--json", env=env).json()
    assert ok["ok"] and ok["steps_checked"] == [60, 70, 80, "main-60@70", "main-60@80"], ok
    victim = forked / "objects" / only_fork[0][:2] / only_fork[0]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # damage a byte only main-60's steps read
    victim.write_bytes(bytes(data))
    r = cli("validate", "--full", "--json", env=env)
    assert r.rc == 1, r
    bad = [f for f in r.json()["findings"] if f["severity"] == "error"]
    assert bad and all(f["timeline"] == "main-60" and f["kind"] == "hash_mismatch" for f in bad), bad
    assert "step main-60@" in bad[0]["message"]
    victim.unlink()
    r = cli("validate", env=env)
    assert r.rc == 1 and "missing_object" in r.out and "main-60@" in r.out, r
