"""Timelines and tags in the format (spec/FORMAT.md §19): the layout, reading through a lineage,
which timeline a rerun continues, names that are refused, and a 1.0 store opening unchanged."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from fmt_helpers import assert_same

from ravex.format import open_store
from ravex.format.errors import BadNameError, ManifestError, NameTakenError, StepNotFoundError
from ravex.format.history.jsondoc import load_named
from ravex.format.history.timelines import MAIN

EXAMPLE = Path(__file__).resolve().parents[2] / "spec" / "example"


def state(step: int, branch: int = 0) -> dict:
    rng = np.random.default_rng(step * 10 + branch)
    return {"w": rng.standard_normal(64).astype(np.float32), "frozen": np.arange(32, dtype=np.int64), "s": step}


def test_a_fork_writes_its_steps_under_its_own_prefix_and_reads_its_lineage(store):
    with store.writer() as w:
        for s in (60, 70, 80):
            w.commit(s, state(s))
    branch = store.fork(60)
    assert branch.timeline.name == "main-60" and branch.timeline.parent == MAIN and branch.timeline.fork_step == 60
    with branch.writer() as w:
        for s in (70, 80):
            w.commit(s, state(s, branch=1))
    root = Path(store.url)
    doc = json.loads((root / "timelines" / "main-60.json").read_text())
    assert doc["format"] == "ravex-timeline" and doc["version"] == "1.1" and doc["fork_step"] == 60
    assert (root / "timelines/main-60/steps/70/rank-0.json").exists()
    again = open_store(store.url)
    for s in (60, 70, 80):  # main untouched
        assert_same(again.read(s), state(s))
    assert_same(again.read("main-60@70"), state(70, branch=1))
    assert_same(again.read("main-60@60"), state(60))  # up to the fork: the parent's step
    assert_same(again.read("main-60@latest"), state(80, branch=1))
    view = again.on_timeline("main-60")
    assert [(v.timeline.name, s) for v, s in view.lineage_steps()] == [("main", 60), ("main-60", 70), ("main-60", 80)]
    with pytest.raises(StepNotFoundError, match="no timeline 'nope'"):
        again.read("nope@60")


def test_a_rerun_continues_the_timeline_with_the_newest_event(store):
    with store.writer() as w:
        for s in (1, 2, 3):
            w.commit(s, state(s))
    assert store.current().timeline.name == MAIN
    branch = store.fork(1)
    assert store.current().timeline.name == "main-1"  # forked, nothing written yet: its head is main@1
    assert [s for _, s in store.current().lineage_steps()] == [1]
    with branch.writer() as w:
        w.commit(2, state(2, branch=1))
    assert store.current().timeline.name == "main-1"
    second = store.fork(1)  # a second roll-back to the same step gets the next name
    assert second.timeline.name == "main-1-2"
    nested = branch.fork(2)
    assert nested.timeline.parent == "main-1"
    assert [(v.timeline.name, s) for v, s in nested.lineage_steps()] == [("main", 1), ("main-1", 2)]


def test_a_tie_of_modification_times_goes_to_the_timeline_created_last(store):
    """A storage clock coarser than two events (a fork in the same tick as its parent's last
    step; S3 keeps whole seconds) must not hand a plain rerun the old timeline."""
    import os

    with store.writer() as w:
        for s in (1, 2, 3):
            w.commit(s, state(s))
    root = Path(store.url)
    first, second = store.fork(1), store.fork(2)
    tick = 1_700_000_000
    for path in [*root.glob("steps/*/*"), *root.glob("timelines/*.json")]:
        os.utime(path, (tick, tick))
    assert store.current().timeline.name == second.timeline.name  # created last
    with first.writer() as w:
        w.commit(4, state(4, branch=1))
    for path in root.glob("timelines/main-1/steps/4/*"):
        os.utime(path, (tick + 1, tick + 1))
    assert store.current().timeline.name == first.timeline.name  # a newer event wins outright


def test_two_runs_forking_one_name_one_wins_the_other_errors_nothing_lost(store):
    with store.writer() as w:
        w.commit(5, state(5))
    results: list[object] = []

    def fork() -> None:
        try:
            results.append(open_store(store.url).fork(5, name="exp"))
        except NameTakenError as exc:
            results.append(exc)

    threads = [threading.Thread(target=fork) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, NameTakenError)]
    assert len(results) == 8 and len(errors) == 7
    assert all("'exp' already exists" in str(e) and "\n" not in str(e) for e in errors)
    assert store.timelines()["exp"].fork_step == 5
    with pytest.raises(NameTakenError, match="first timeline"):
        store.fork(5, name="main")


@pytest.mark.parametrize(("name", "why"), [
    ("", "empty"), ("x" * 65, "65 characters"), ("../up", "may only hold"), ("a/b", "may only hold"),
    (".hidden", "may only hold"), ("a@b", "may only hold"), ("é", "may only hold"),
])
def test_bad_names_are_one_line_errors_and_write_nothing(store, name, why):
    with store.writer() as w:
        w.commit(1, state(1))
    before = sorted(p.relative_to(store.url) for p in Path(store.url).rglob("*"))
    with pytest.raises(BadNameError, match=why) as fork_err:
        store.fork(1, name=name)
    with pytest.raises(BadNameError, match=why) as tag_err:
        store.tag(name, 1)
    assert "\n" not in str(fork_err.value) and "\n" not in str(tag_err.value)
    assert sorted(p.relative_to(store.url) for p in Path(store.url).rglob("*")) == before


def test_tags_name_complete_steps_once(store):
    with store.writer() as w:
        for s in (1, 2):
            w.commit(s, state(s))
    branch = store.fork(1)
    with branch.writer() as w:
        w.commit(2, state(2, branch=1))
    tag = store.tag("good", "main-1@2")
    assert (tag.timeline, tag.step, tag.ref) == ("main-1", 2, "main-1@2")
    assert store.tag("base", "main-1@1").ref == "1"  # a tag names the timeline that holds the step
    with pytest.raises(NameTakenError, match="already exists"):
        store.tag("good", 1)
    with pytest.raises(StepNotFoundError, match="step 9"):
        store.tag("missing", 9)
    assert set(store.tags()) == {"good", "base"}
    assert store.untag("good").ref == "main-1@2"
    with pytest.raises(StepNotFoundError, match="no tag 'good'"):
        store.untag("good")
    assert set(store.tags()) == {"base"}


def test_a_1_0_store_opens_unchanged_as_main(tmp_path):
    """spec/example was written by 1.0: one timeline, no tags, every step read as before."""
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    store = open_store(copy)
    assert list(store.timelines()) == [MAIN] and store.tags() == {}
    assert store.current().timeline.name == MAIN
    assert [s for _, s in store.lineage_steps()] == store.complete_steps() == [1, 2]
    for step in (1, 2):
        reader = store.open_step(f"main@{step}")
        for path in reader.arrays:
            want = np.load(EXAMPLE / "expected" / str(step) / f"{path}.npy")
            got = reader.read_array(path)
            assert got.tobytes() == want.tobytes(), path
    report = store.gc(grace_seconds=0)
    assert report.deleted_objects == 0 and report.kept_steps == [1, 2]


def test_a_root_timeline_holds_only_its_own_steps_and_gc_keeps_them(store):
    """``resume: never`` beside another run's steps (spec §19, since 1.5): a timeline without a
    parent, whose history is its own steps; a plain rerun continues it, GC keeps both histories,
    and a 1.4 reader's check of a timeline document rejects it (and with it the store) rather
    than collect what only its steps name."""
    with store.writer() as w:
        for s in (10, 20):
            w.commit(s, state(s))
    fresh = store.start_root(run="r2")
    assert (fresh.timeline.name, fresh.timeline.parent, fresh.timeline.fork_step) == ("fresh", None, None)
    with fresh.writer() as w:
        for s in (10, 20):
            w.commit(s, state(s, branch=2))
    doc = json.loads((Path(store.url) / "timelines" / "fresh.json").read_text())
    assert doc["version"] == "1.5" and doc["parent"] is None and doc["fork_step"] is None and doc["run"] == "r2"
    again = open_store(store.url)
    assert again.current().timeline.name == "fresh"
    history = again.on_timeline("fresh").lineage_steps()
    assert [(v.timeline.name, s) for v, s in history] == [("fresh", 10), ("fresh", 20)]
    assert_same(again.read("fresh@10"), state(10, branch=2))
    assert_same(again.read("main@20"), state(20))
    assert again.start_root().timeline.name == "fresh-2"
    again.gc(keep_last=1)
    assert_same(again.read("fresh@20"), state(20, branch=2))
    assert_same(again.read("main@20"), state(20))
    # a 1.1-1.4 reader's check of a timeline document: a parent and a fork step
    key = "timelines/fresh.json"
    with pytest.raises(ManifestError, match="not a timeline document"):
        load_named((Path(store.url) / key).read_bytes(), key, "timeline", "ravex-timeline", "parent", "fork_step")
