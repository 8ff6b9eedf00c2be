"""GC against a writer that stores again the bytes of an object GC is about to delete.

GC lists objects (X is old and unreferenced), then deletes. If a writer re-stores X
in between (its new step has a tensor equal to an old one), deleting X would leave
the writer's step naming a missing object. LocalStorage.delete_if_older checks the
age at the delete; and a GC killed in the middle of that check must not lose X.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from rhelpers import assert_same

from ravex.format import open_store
from ravex.format.objects.hashing import digest
from ravex.format.objects.names import object_key
from ravex.format.reports.validate import validate
from ravex.format.storage import LocalStorage

A = np.full(100_000, 1.0, dtype="float32")  # 400 KB: an object of its own (not packed)
B = np.full(100_000, 2.0, dtype="float32")


class _Hooked(LocalStorage):
    """Runs ``hook(key)`` once, just before GC's first delete of an object."""

    def __init__(self, root, hook):
        super().__init__(root)
        self.hook = hook

    def delete_if_older(self, key, cutoff):
        hook, self.hook = self.hook, None
        if hook:
            hook(key)
        return super().delete_if_older(key, cutoff)


def _store_with_old_garbage(tmp_path):
    url = str(tmp_path / "store")
    store = open_store(url, create=True)
    with store.writer() as w:
        w.commit(1, {"t": A})
        w.commit(2, {"t": B})
    old = time.time() - 7200
    for d, _, files in os.walk(os.path.join(url, "objects")):
        for f in files:
            os.utime(os.path.join(d, f), (old, old))
    x = object_key(digest(A.tobytes()))
    assert os.path.exists(os.path.join(url, *x.split("/")))
    return url, store, x


def test_writer_restores_object_between_gc_listing_and_delete(tmp_path):
    url, store, x = _store_with_old_garbage(tmp_path)

    def writer_stores_a_again(key):
        assert key == x
        with open_store(url).writer(delta=False) as w:  # another process, no delta base: X is stored anew
            w.commit(3, {"t": A})

    store.storage = _Hooked(url, writer_stores_a_again)
    report = store.gc(keep_last=1, grace_seconds=60)
    assert 1 in report.deleted_steps
    again = open_store(url)
    assert again.complete_steps()[-1] == 3
    assert_same(again.read(3), {"t": A})
    assert validate(url, full=True).ok


def test_gc_killed_while_checking_a_restored_object_loses_nothing(tmp_path, monkeypatch):
    """The writer re-stored X before GC's delete; GC dies inside delete_if_older, after any
    move aside and before any putting back. X must still be in place for the writer's step."""
    url, _, x = _store_with_old_garbage(tmp_path)
    with open_store(url).writer(delta=False) as w:
        w.commit(3, {"t": A})  # X stored anew (young) after GC would have listed it as old garbage

    class Killed(BaseException):
        pass

    def die(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(os, "link", die)
    try:
        LocalStorage(url).delete_if_older(x, cutoff=time.time() - 60)  # GC's decision was made earlier
    except Killed:
        pass
    monkeypatch.undo()
    assert_same(open_store(url).read(3), {"t": A})
    assert validate(url, full=True).ok


def test_old_unreferenced_object_is_still_deleted(tmp_path):
    url, store, x = _store_with_old_garbage(tmp_path)
    report = store.gc(keep_last=1, grace_seconds=60)
    assert report.deleted_objects >= 1
    assert not os.path.exists(os.path.join(url, *x.split("/")))
    assert [n for _, _, fs in os.walk(url) for n in fs if n.startswith(".gc-")] == []
    assert_same(open_store(url).read(2), {"t": B})


@pytest.fixture(autouse=True)
def _writer_has_delta_flag():
    import inspect

    from ravex.format.writing.writer import StepWriter

    if "delta" not in inspect.signature(StepWriter.__init__).parameters:
        pytest.skip("StepWriter has no delta= switch in this tree")
