"""How many requests one GC costs over ``s3://`` (moto through the counting proxy), and that the
fewer listings still see a step that lands while GC runs.

GC used to list each step's folder two or three times (completeness, then the manifests to
read), read every manifest of every step, and send one DELETE per dropped step: ~20 LIST,
8 GET and 6 DELETE for one ``gc(keep_last=2)`` over 8 steps. Now: one listing of ``steps/``,
a second only after deleting, one of ``objects/``; the timelines and tags of spec 1.1 add one
listing of ``tags/`` and of ``timelines/``, the latter again after deleting (a timeline forked
meanwhile is read too), and ``repack/`` is listed when some object is unreferenced; a folder
that does not exist costs one LIST, not two; manifests are read only for the steps the
policy looks at; the dropped steps go in one delete. GC checks each unreferenced object's age
again just before deleting it (spec/FORMAT.md, GC, A5): one HEAD, then the DELETE (``FsspecStorage``
used to inherit the base class's check, a listing of the object's key: one LIST per object).
"""

from __future__ import annotations

import uuid
from collections import Counter

from faultproxy import FaultProxy
from rhelpers import BUCKET, FAST_RETRY, assert_same, listed_folders, options_for, state

from ravex.format import open_store
from ravex.format.reports.validate import validate

STEPS = range(1, 9)


def _state(step: int) -> dict:
    return state(step, small=8, big_rows=64)  # small: the requests are what is measured


#: one GC that deleted steps and objects
AFTER_DELETES = Counter({"timelines": 2, "steps": 2, "tags": 1, "objects": 1, "repack": 1})
#: the same with a grace of 0, which first looks for a live run's lease (spec §21): one LIST more
AFTER_DELETES_GRACE_0 = AFTER_DELETES + Counter({"leases": 1})


def _open(url: str, proxy: FaultProxy, create: bool = False):
    return open_store(url, create=create, storage_options=options_for(proxy.url), retry=FAST_RETRY)


def test_one_gc_over_many_steps_lists_steps_twice_and_objects_once(proxy):
    url = f"s3://{BUCKET}/gcreq-{uuid.uuid4().hex[:12]}"
    with _open(url, proxy, create=True).writer() as w:
        for step in STEPS:
            w.commit(step, _state(step))
    store = _open(url, proxy)  # a fresh process (`ravex gc`): no manifest cached
    proxy.reset_counts()
    report = store.gc(keep_last=2)
    ops = proxy.ops
    assert report.deleted_steps == [1, 2, 3, 4, 5, 6] and report.kept_steps == [7, 8], report
    assert listed_folders(proxy) == AFTER_DELETES  # steps/ and timelines/ again after the deletes
    assert ops["GET"] <= 2, ops  # the manifests of the two kept steps; the dropped ones are not read
    assert ops["DELETE_MULTI"] + ops["DELETE"] == 1, ops  # six steps' manifests in one request
    assert ops["HEAD"] == 0, ops

    proxy.reset_counts()
    again = store.gc(keep_last=2)  # nothing to delete: no second listing of steps/
    # the dropped steps' objects are still within the grace: unreferenced, so repack/ is read
    assert again.deleted_steps == [] and listed_folders(proxy) == Counter(
        {"timelines": 1, "tags": 1, "steps": 1, "objects": 1, "repack": 1}), proxy.ops
    assert proxy.ops["GET"] == 0, proxy.ops  # the kept steps are complete: cached
    for step in (7, 8):
        assert_same(_open(url, proxy).read(step), _state(step))


def test_gc_after_each_checkpoint_costs_a_bounded_number_of_lists(proxy):
    """What the runtime does with ``keep_last``: one long-lived store, GC after each commit."""
    url = f"s3://{BUCKET}/gcreq-{uuid.uuid4().hex[:12]}"
    store = _open(url, proxy, create=True)
    per_call = []
    with store.writer() as w:
        for step in STEPS:
            w.commit(step, _state(step))
            proxy.reset_counts()
            store.gc(keep_last=3)
            per_call.append(dict(proxy.ops))
    print(f"\nrequests per gc call: {per_call}")
    assert all(c.get("LIST", 0) <= sum(AFTER_DELETES.values()) for c in per_call), per_call  # was 6 to 12, growing
    assert all(c.get("GET", 0) <= 1 for c in per_call), per_call  # at most the new step's manifest
    assert store.complete_steps() == [6, 7, 8]


def test_a_step_committed_while_gc_deletes_keeps_its_objects(proxy):
    """A writer commits a step between GC's first listing and its object collection (inside the
    delete of the old steps), with a grace of 0: its manifest is read by the second listing of
    ``steps/``, so none of the objects it names is collected."""
    url = f"s3://{BUCKET}/gcreq-{uuid.uuid4().hex[:12]}"
    store = _open(url, proxy, create=True)
    with store.writer() as w:
        for step in (1, 2, 3):
            w.commit(step, _state(step))
    delete_steps = store.delete_steps
    landed = []

    def delete_then_commit(files):
        delete_steps(files)
        with _open(url, proxy).writer(delta=False) as other:  # stores all its objects anew
            other.commit(4, _state(4))
        landed.append(4)

    store.delete_steps = delete_then_commit
    report = store.gc(keep_last=1, grace_seconds=0)
    assert landed == [4] and report.deleted_steps == [1, 2] and report.skipped_objects_because is None, report
    # step 4's objects were proxy as referenced (not spared as young, nor deleted as old garbage)
    assert report.young_unreferenced == 0, report
    fresh = _open(url, proxy)
    assert fresh.complete_steps() == [3, 4]
    assert_same(fresh.read(4), _state(4))
    assert_same(fresh.read(3), _state(3))
    assert validate(fresh, full=True).ok


# ---- collecting old objects: one HEAD each, no LIST ------------------------------------------


def test_gc_collects_each_old_object_with_one_head_and_no_list(proxy):
    url = f"s3://{BUCKET}/gcobj-{uuid.uuid4().hex[:12]}"
    with _open(url, proxy, create=True).writer() as w:
        for step in (1, 2, 3, 4):
            w.commit(step, _state(step))
    store = _open(url, proxy)
    before = sum(1 for _ in store.storage.walk("objects"))
    proxy.reset_counts()
    report = store.gc(keep_last=1, grace_seconds=0)  # every object is older than now
    ops = proxy.ops
    assert report.deleted_steps == [1, 2, 3] and report.deleted_objects >= 3, report
    assert report.deleted_objects + report.kept_objects == before, (report, before)
    assert listed_folders(proxy) == AFTER_DELETES_GRACE_0  # none per object
    assert ops["HEAD"] == report.deleted_objects, ops  # the age check, once per collected object
    assert ops["DELETE_MULTI"] + ops["DELETE"] == 1 + report.deleted_objects, ops  # the steps, then each object

    fresh = _open(url, proxy)
    assert fresh.complete_steps() == [4]
    assert_same(fresh.read(4), _state(4))
    assert validate(fresh, full=True).ok
    assert sum(1 for _ in fresh.storage.walk("objects")) == report.kept_objects


def test_delete_if_older_heads_once_and_spares_young_and_missing_objects(proxy):
    store = _open(f"s3://{BUCKET}/gcobj-{uuid.uuid4().hex[:12]}", proxy, create=True)
    storage = store.storage
    storage.write("objects/ab/abcd", b"x")
    mtime = next(o.mtime for o in storage.walk("objects/ab"))
    proxy.reset_counts()
    assert storage.delete_if_older("objects/ab/abcd", cutoff=mtime) is False  # not older than the cutoff
    assert dict(proxy.ops) == {"HEAD": 1}, proxy.ops
    proxy.reset_counts()
    # absent (another GC got there first): nothing to do; s3fs follows the 404 with one LIST of
    # ``key/`` to tell a missing object from a folder
    assert storage.delete_if_older("objects/ab/none", cutoff=mtime + 60) is False
    assert proxy.ops["HEAD"] == 1 and proxy.ops["DELETE"] + proxy.ops["DELETE_MULTI"] == 0, proxy.ops
    assert storage.exists("objects/ab/abcd")
    assert storage.delete_if_older("objects/ab/abcd", cutoff=mtime + 60) is True
    assert not storage.exists("objects/ab/abcd")
