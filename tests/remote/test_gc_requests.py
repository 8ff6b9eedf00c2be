"""How many requests one GC costs over ``s3://`` (moto through the counting proxy), and that the
fewer listings still see a step that lands while GC runs.

GC used to list each step's folder two or three times (completeness, then the manifests to
read), read every manifest of every step, and send one DELETE per dropped step: ~20 LIST,
8 GET and 6 DELETE for one ``gc(keep_last=2)`` over 8 steps. Now: one listing of ``steps/``,
a second only after deleting, one of ``objects/``; manifests are read only for the steps the
policy looks at; the dropped steps go in one delete.
"""

from __future__ import annotations

import uuid

import pytest
from faultproxy import FaultProxy
from rhelpers import BUCKET, FAST_RETRY, assert_same, options_for, state

from ravex.format import open_store
from ravex.format.validate import validate

STEPS = range(1, 9)


def _state(step: int) -> dict:
    return state(step, small=8, big_rows=64)  # small: the requests are what is measured


@pytest.fixture
def counted(moto_server):
    proxy = FaultProxy(moto_server.port, seed=7).start()
    yield proxy
    proxy.stop()


def _open(url: str, proxy: FaultProxy, create: bool = False):
    return open_store(url, create=create, storage_options=options_for(proxy.url), retry=FAST_RETRY)


def test_one_gc_over_many_steps_lists_steps_twice_and_objects_once(counted):
    url = f"s3://{BUCKET}/gcreq-{uuid.uuid4().hex[:12]}"
    with _open(url, counted, create=True).writer() as w:
        for step in STEPS:
            w.commit(step, _state(step))
    store = _open(url, counted)  # a fresh process (`ravex gc`): no manifest cached
    counted.reset_counts()
    report = store.gc(keep_last=2)
    ops = counted.ops
    assert report.deleted_steps == [1, 2, 3, 4, 5, 6] and report.kept_steps == [7, 8], report
    lists = [r.path for r in counted.log if r.op == "LIST"]
    assert ops["LIST"] <= 3, lists  # steps/, steps/ again after the deletes, objects/
    assert ops["GET"] <= 2, ops  # the manifests of the two kept steps; the dropped ones are not read
    assert ops["DELETE_MULTI"] + ops["DELETE"] == 1, ops  # six steps' manifests in one request
    assert ops["HEAD"] == 0, ops

    counted.reset_counts()
    again = store.gc(keep_last=2)  # nothing to delete: no second listing of steps/
    assert again.deleted_steps == [] and counted.ops["LIST"] <= 2, counted.ops
    assert counted.ops["GET"] == 0, counted.ops  # the kept steps are complete: cached
    for step in (7, 8):
        assert_same(_open(url, counted).read(step), _state(step))


def test_gc_after_each_checkpoint_costs_a_bounded_number_of_lists(counted):
    """What the runtime does with ``keep_last``: one long-lived store, GC after each commit."""
    url = f"s3://{BUCKET}/gcreq-{uuid.uuid4().hex[:12]}"
    store = _open(url, counted, create=True)
    per_call = []
    with store.writer() as w:
        for step in STEPS:
            w.commit(step, _state(step))
            counted.reset_counts()
            store.gc(keep_last=3)
            per_call.append(dict(counted.ops))
    print(f"\nrequests per gc call: {per_call}")
    assert all(c.get("LIST", 0) <= 3 for c in per_call), per_call  # was 6 to 12, growing with the steps
    assert all(c.get("GET", 0) <= 1 for c in per_call), per_call  # at most the new step's manifest
    assert store.complete_steps() == [6, 7, 8]


def test_a_step_committed_while_gc_deletes_keeps_its_objects(counted):
    """A writer commits a step between GC's first listing and its object collection (inside the
    delete of the old steps), with a grace of 0: its manifest is read by the second listing of
    ``steps/``, so none of the objects it names is collected."""
    url = f"s3://{BUCKET}/gcreq-{uuid.uuid4().hex[:12]}"
    store = _open(url, counted, create=True)
    with store.writer() as w:
        for step in (1, 2, 3):
            w.commit(step, _state(step))
    delete_steps = store.delete_steps
    landed = []

    def delete_then_commit(files):
        delete_steps(files)
        with _open(url, counted).writer(delta=False) as other:  # stores all its objects anew
            other.commit(4, _state(4))
        landed.append(4)

    store.delete_steps = delete_then_commit
    report = store.gc(keep_last=1, grace_seconds=0)
    assert landed == [4] and report.deleted_steps == [1, 2] and report.skipped_objects_because is None, report
    # step 4's objects were counted as referenced (not spared as young, nor deleted as old garbage)
    assert report.young_unreferenced == 0, report
    fresh = _open(url, counted)
    assert fresh.complete_steps() == [3, 4]
    assert_same(fresh.read(4), _state(4))
    assert_same(fresh.read(3), _state(3))
    assert validate(fresh, full=True).ok
