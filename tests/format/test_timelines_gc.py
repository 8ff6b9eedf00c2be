"""GC with several timelines and tags (spec/FORMAT.md §14, §19): what it keeps, and GC crashed at
random points (every storage call is a possible crash point) never costs a kept or tagged step
a byte."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
from fmt_helpers import GC_CALLS, Crash, assert_same, crash_after

from ravex.format import open_store

TRIALS = 40


def state(step: int, branch: int) -> dict:
    rng = np.random.default_rng(step * 10 + branch)
    # "frozen" is carried forward from step to step: objects shared by many steps and timelines
    return {"w": rng.standard_normal(3000).astype(np.float32), "frozen": np.arange(2000, dtype=np.float32),
            "small": rng.standard_normal(16).astype(np.float32)}


def build(root: str) -> dict[str, dict]:
    """main 1..6; ``a`` forked at main@3 with 4..6; ``b`` forked at a@5, nothing written yet;
    tags on main@2 and a@4. Returns what each step holds, by ``timeline@step``."""
    store = open_store(root, create=True)
    want: dict[str, dict] = {}
    with store.writer(chunk_bytes=4096) as w:
        for s in range(1, 7):
            w.commit(s, state(s, 0))
            want[f"main@{s}"] = state(s, 0)
    a = store.fork(3, name="a")
    with a.writer(chunk_bytes=4096) as w:
        for s in range(4, 7):
            w.commit(s, state(s, 1))
            want[f"a@{s}"] = state(s, 1)
    a.fork(5, name="b")
    store.tag("two", 2)
    store.tag("four", "a@4")
    return want


#: what keep_last=1 must leave: each timeline's newest, the tagged steps, and b's head (a@5)
KEPT = ["main@2", "main@6", "a@4", "a@5", "a@6"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gc") / "store")
    return root, build(root)


def test_gc_keeps_tags_heads_and_each_timelines_newest(built, tmp_path):
    root, want = built
    shutil.copytree(root, tmp_path / "s")
    store = open_store(tmp_path / "s")
    report = store.gc(keep_last=1, grace_seconds=0)
    assert sorted(map(str, report.kept_steps)) == sorted(["2", "6", "a@4", "a@5", "a@6"])
    assert sorted(map(str, report.deleted_steps)) == sorted(["1", "3", "4", "5"])
    assert report.deleted_objects > 0 and report.skipped_objects_because is None
    check_reads(open_store(tmp_path / "s"), want, KEPT)
    assert [s for _, s in open_store(tmp_path / "s").on_timeline("b").lineage_steps()] == [2, 4, 5]
    store.untag("four")  # untagged, a@4 goes with the next collection
    assert "a@4" in store.gc(keep_last=1, grace_seconds=0).deleted_steps


def check_reads(store, want: dict[str, dict], refs: list[str]) -> None:
    for ref in refs:
        assert_same(store.read(ref), want[ref], ref)


def test_gc_crashed_at_random_points_never_loses_a_kept_or_tagged_step(built, tmp_path):
    root, want = built
    seed = int(os.environ.get("RAVEX_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"crash-point seed {seed} (rerun with RAVEX_TEST_SEED={seed})")
    rng = random.Random(seed)
    shutil.copytree(root, tmp_path / "count")
    counted = open_store(tmp_path / "count")
    left = crash_after(counted.storage, 10**6, GC_CALLS)
    counted.gc(keep_last=1, grace_seconds=0)
    calls = 10**6 - left[0]  # storage calls of one whole GC: every one a crash point
    crashed = 0
    for trial in range(TRIALS):
        copy = tmp_path / f"t{trial}"
        shutil.copytree(root, copy)
        store = open_store(copy)
        crash_after(store.storage, rng.randrange(0, calls), GC_CALLS)
        try:
            store.gc(keep_last=1, grace_seconds=0)
        except Crash:
            crashed += 1
        fresh = open_store(copy)
        check_reads(fresh, want, KEPT)  # after the crash, before any other GC
        fresh.gc(keep_last=1, grace_seconds=0)  # the next GC finishes the job
        check_reads(open_store(copy), want, KEPT)
        shutil.rmtree(copy)
    assert crashed == TRIALS, f"only {crashed} of {TRIALS} trials crashed: crash points miss GC"
