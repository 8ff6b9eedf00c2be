"""What collecting garbage objects costs over ``s3://`` (moto through the counting proxy).

GC checks each unreferenced object's age again just before deleting it (spec/FORMAT.md, GC, A5).
``FsspecStorage`` used to inherit the base class's check, a listing of the object's key: one LIST
per collected object. Now one HEAD, then the DELETE.
"""

from __future__ import annotations

import uuid

import pytest
from faultproxy import FaultProxy
from rhelpers import BUCKET, FAST_RETRY, assert_same, options_for, state

from ravex.format import open_store
from ravex.format.validate import validate


def _state(step: int) -> dict:
    return state(step, small=8, big_rows=64)


@pytest.fixture
def counted(moto_server):
    proxy = FaultProxy(moto_server.port, seed=11).start()
    yield proxy
    proxy.stop()


def _open(url: str, proxy: FaultProxy, create: bool = False):
    return open_store(url, create=create, storage_options=options_for(proxy.url), retry=FAST_RETRY)


def test_gc_collects_each_old_object_with_one_head_and_no_list(counted):
    url = f"s3://{BUCKET}/gcobj-{uuid.uuid4().hex[:12]}"
    with _open(url, counted, create=True).writer() as w:
        for step in (1, 2, 3, 4):
            w.commit(step, _state(step))
    store = _open(url, counted)
    before = sum(1 for _ in store.storage.walk("objects"))
    counted.reset_counts()
    report = store.gc(keep_last=1, grace_seconds=0)  # every object is older than now
    ops = counted.ops
    assert report.deleted_steps == [1, 2, 3] and report.deleted_objects >= 3, report
    assert report.deleted_objects + report.kept_objects == before, (report, before)
    lists = [r.path for r in counted.log if r.op == "LIST"]
    assert ops["LIST"] <= 3, lists  # steps/, steps/ after the delete, objects/: none per object
    assert ops["HEAD"] == report.deleted_objects, ops  # the age check, once per collected object
    assert ops["DELETE_MULTI"] + ops["DELETE"] == 1 + report.deleted_objects, ops  # the steps, then each object

    fresh = _open(url, counted)
    assert fresh.complete_steps() == [4]
    assert_same(fresh.read(4), _state(4))
    assert validate(fresh, full=True).ok
    assert sum(1 for _ in fresh.storage.walk("objects")) == report.kept_objects


def test_delete_if_older_heads_once_and_spares_young_and_missing_objects(counted):
    store = _open(f"s3://{BUCKET}/gcobj-{uuid.uuid4().hex[:12]}", counted, create=True)
    storage = store.storage
    storage.write("objects/ab/abcd", b"x")
    mtime = next(o.mtime for o in storage.walk("objects/ab"))
    counted.reset_counts()
    assert storage.delete_if_older("objects/ab/abcd", cutoff=mtime) is False  # not older than the cutoff
    assert dict(counted.ops) == {"HEAD": 1}, counted.ops
    counted.reset_counts()
    # absent (another GC got there first): nothing to do; s3fs follows the 404 with one LIST of
    # ``key/`` to tell a missing object from a folder
    assert storage.delete_if_older("objects/ab/none", cutoff=mtime + 60) is False
    assert counted.ops["HEAD"] == 1 and counted.ops["DELETE"] + counted.ops["DELETE_MULTI"] == 0, counted.ops
    assert storage.exists("objects/ab/abcd")
    assert storage.delete_if_older("objects/ab/abcd", cutoff=mtime + 60) is True
    assert not storage.exists("objects/ab/abcd")
