"""Retention and GC: the policy's unit rules, and GC racing a live writer process."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from fmt_helpers import assert_same, object_files, snapshot, spawn, writer_state

from ravex.format import open_store
from ravex.format.maintenance.gc import retained_steps
from ravex.format.objects.names import object_key
from ravex.format.reports.validate import validate
from ravex.format.store import StepInfo


def small_state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(300_000).astype(np.float32), "frozen": np.arange(100_000, dtype=np.float32)}


def fill(store, steps) -> None:
    with store.writer(chunk_bytes=256 << 10) as w:
        for s in steps:
            w.commit(s, small_state(s))


def referenced(store) -> set[str]:
    names = set()
    for s in store.step_numbers():
        for r in store.step_info(s).ranks:
            for e in store.manifest(s, r).arrays.values():
                names.update(c.object for c in e.chunks.values() if c.object)
    return names


def test_keep_last(store):
    fill(store, range(1, 7))
    report = store.gc(keep_last=2, grace_seconds=0)
    assert report.kept_steps == [5, 6] and report.deleted_steps == [1, 2, 3, 4]
    assert store.step_numbers() == [5, 6]
    # every object left is named by a kept manifest, and every named one is there
    on_disk = {k.rsplit(os.sep, 1)[-1] for k in object_files(store.url)}
    assert on_disk == referenced(store)
    assert report.deleted_objects > 0 and report.deleted_bytes > 0
    for s in (5, 6):
        assert_same(open_store(store.url).read(s), small_state(s))
    assert validate(store.url, full=True).findings == []


def test_keep_every_and_newest_always_kept(store):
    fill(store, [10, 20, 25, 30, 35, 41])
    report = store.gc(keep_every=10, grace_seconds=0)
    assert report.kept_steps == [10, 20, 30, 41]  # 41: the newest complete step, kept whatever the policy
    report = store.gc(keep_last=1, keep_every=20, grace_seconds=0)
    assert report.kept_steps == [20, 41]
    for s in (20, 41):
        assert_same(open_store(store.url).read(s), small_state(s))
    assert validate(store.url, full=True).ok


def test_in_flight_newer_steps_kept_stale_incomplete_dropped(store):
    fill(store, [1, 2, 3])
    with store.writer(rank=0, world_size=2) as w:
        w.commit(2_000, small_state(9))  # in flight: rank 1 not yet written
        w.commit(4, small_state(4))
    # an incomplete step below the newest complete one is a crashed run's leftover
    with store.writer(rank=0, world_size=3) as w:
        w.commit(0, small_state(0))
    report = store.gc(keep_last=1, grace_seconds=3600)
    assert report.kept_steps == [3, 4, 2_000] and report.deleted_steps == [0, 1, 2]
    # the in-flight step's objects are kept although no complete step names them
    for s in (4, 2_000):
        for e in store.manifest(s, 0).arrays.values():
            for c in e.chunks.values():
                assert (c.object is None) or os.path.exists(os.path.join(store.url, object_key(c.object)))
    # once the grace period has passed they count as stale and go
    report = store.gc(keep_last=1, grace_seconds=0)
    assert report.kept_steps == [3] and report.deleted_steps == [4, 2_000]
    assert store.step_numbers() == [3]
    assert validate(store.url, full=True).findings == []


def test_retention_rule_directly():
    now = 1000.0
    infos = [StepInfo(1, 1, (0,), True), StepInfo(2, 1, (0,), True), StepInfo(3, 2, (0,), False),
             StepInfo(4, 1, (0,), True), StepInfo(5, 2, (0,), False), StepInfo(6, 2, (1,), False)]
    ages = {3: now - 10, 5: now - 10, 6: now - 5000}
    steps, asked = [i.step for i in infos], []

    def is_complete(step: int) -> bool:
        asked.append(step)
        return next(i.complete for i in infos if i.step == step)

    assert retained_steps(steps, is_complete, 1, None, 3600, now, ages) == {4, 5}  # 6 stale, 3 below the newest
    assert 1 not in asked and 2 not in asked  # keep_last=1: nothing below the newest complete is read
    assert retained_steps(steps, is_complete, None, None, 3600, now, ages) == {1, 2, 4, 5}
    assert retained_steps(steps, is_complete, 2, 2, 3600, now, ages) == {2, 4, 5}
    assert retained_steps(steps, is_complete, 1, None, 1, now, ages) == {4}
    assert retained_steps([], is_complete, 1, None, 1, now, {}) == set()


def test_dry_run_deletes_nothing(store):
    fill(store, range(1, 5))
    store.storage.write(object_key("0" * 32), b"orphan" * 100)
    files_before = snapshot(store.url)
    steps_before = store.step_numbers()
    report = store.gc(keep_last=1, grace_seconds=0, dry_run=True)
    assert report.dry_run and report.deleted_steps == [1, 2, 3] and report.deleted_objects > 0
    assert snapshot(store.url) == files_before and store.step_numbers() == steps_before
    real = store.gc(keep_last=1, grace_seconds=0)
    assert (real.deleted_steps, real.deleted_objects, real.deleted_bytes) == (
        report.deleted_steps, report.deleted_objects, report.deleted_bytes)


def test_grace_period_protects_young_unreferenced_objects(store):
    fill(store, [1, 2])
    store.storage.write(object_key("f" * 32), b"a writer's object, its manifest not yet written" * 20)
    report = store.gc(keep_last=1, grace_seconds=3600)
    assert report.deleted_steps == [1] and report.deleted_objects == 0 and report.young_unreferenced > 0
    assert os.path.exists(os.path.join(store.url, object_key("f" * 32)))
    assert store.gc(keep_last=1, grace_seconds=0).deleted_objects > 0
    assert not os.path.exists(os.path.join(store.url, object_key("f" * 32)))


def test_gc_argument_errors(store):
    with pytest.raises(ValueError, match="keep_last=0"):
        store.gc(keep_last=0)
    with pytest.raises(ValueError, match="keep_every=-1"):
        store.gc(keep_every=-1)


def test_gc_races_a_writer(tmp_path):
    """A writer process commits continuously; this process runs GC after each commit it sees.
    Every retained step must stay readable, and GC must really delete while the writer runs."""
    url = str(tmp_path / "store")
    open_store(url, create=True)
    grace = 3.0  # above any one commit (~50 ms here), with room for a loaded machine
    proc = spawn("writer", url, "--stop-on-eof", stdin=True)
    deleted_steps = deleted_objects = gcs = 0
    try:
        assert proc.stdout is not None
        store = open_store(url)
        started = None
        for line in proc.stdout:
            if not line.startswith("committed "):
                continue
            step = int(line.split()[1])
            started = started or time.monotonic()
            report = store.gc(keep_last=2, grace_seconds=grace)
            gcs += 1
            deleted_steps += len(report.deleted_steps)
            deleted_objects += report.deleted_objects
            assert report.kept_steps and max(report.kept_steps) >= step
            latest = store.latest_step()
            assert_same(store.read(latest), writer_state(latest))  # the base of the writer's next commit
            if time.monotonic() - started > 3 * grace and deleted_objects > 20:
                break
            assert time.monotonic() - started < 60, "GC deleted nothing in a minute"
        proc.stdin.close()  # type: ignore[union-attr]
        tail = proc.stdout.read()
        assert proc.wait(timeout=60) == 0 and "exit" in tail
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    store = open_store(url)
    report = validate(store, full=True)
    assert report.ok, [f.message for f in report.findings if f.severity == "error"]
    complete = store.complete_steps()
    assert len(complete) >= 2
    for step in complete:
        assert_same(store.read(step), writer_state(step))
    print(f"{gcs} GCs raced the writer: deleted {deleted_steps} steps, {deleted_objects} objects; "
          f"{len(complete)} complete steps left")
    assert deleted_steps > 10 and deleted_objects > 20, (gcs, deleted_steps, deleted_objects)
    # GC after the writer stopped: nothing but the last two steps and their objects remain
    store.gc(keep_last=2, grace_seconds=0)
    assert store.complete_steps() == complete[-2:]
    assert {k.rsplit(os.sep, 1)[-1] for k in object_files(url)} == referenced(store)


def test_gc_does_not_delete_an_object_a_writer_just_stored_again(tmp_path):
    """A deterministic interleaving of GC and a concurrent writer (a second store instance on the
    same directory), made through the storage seam: the writer commits after GC listed the
    objects and before it deletes the first one, storing content an old, dropped step also had
    (so its objects, due for deletion by age, are stored anew)."""
    url = str(tmp_path / "store")
    gc_store = open_store(url, create=True)

    def big(step: int) -> dict:  # chunks of 512 KiB: objects of their own
        return {"w": np.random.default_rng(step).standard_normal((256, 1024)).astype(np.float32)}

    with gc_store.writer(chunk_bytes=512 << 10) as w:
        for step in (1, 2, 3):
            w.commit(step, big(step))
    old = time.time() - 3600
    for key in object_files(url):  # everything written an hour ago
        os.utime(os.path.join(url, key), (old, old))
    writer_store = open_store(url)
    storage = gc_store.storage
    committed = []

    def commit_first(method):
        orig = getattr(storage, method)

        def hooked(keys, *args):
            listed = [keys] if isinstance(keys, str) else list(keys)
            if not committed and any(k.startswith("objects/") for k in listed):
                with writer_store.writer(chunk_bytes=512 << 10) as w:
                    w.commit(4, big(1))  # step 1's content again
                committed.append(4)
            return orig(keys if isinstance(keys, str) else listed, *args)

        setattr(storage, method, hooked)

    for method in ("delete", "delete_if_older"):
        if hasattr(storage, method):
            commit_first(method)
    report = gc_store.gc(keep_last=1, grace_seconds=60)
    assert committed == [4]
    assert report.deleted_objects == 2  # step 2's objects: not stored again, so gone
    store = open_store(url)
    assert store.latest_step() == 4
    assert validate(store).ok
    assert_same(store.read(4), big(1))
