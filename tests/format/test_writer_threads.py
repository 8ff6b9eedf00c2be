"""How many threads a commit writes with (``ravex.format.writing.threads``): a local disk's writes
take CPU from the cores that train, so it gets one per two usable cores (1 to 4); object storage
waits on the network, so it gets 4 whatever the cores."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from ravex.format import open_store
from ravex.format.writing import threads


@pytest.mark.parametrize(("cores", "local"), [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (64, 4)])
def test_a_local_disk_gets_one_thread_per_two_cores_object_storage_four(monkeypatch, cores, local):
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    assert threads.writer_threads(local_disk=True) == local
    assert threads.writer_threads(local_disk=False) == threads.DEFAULT_THREADS == 4


def test_a_commit_writes_with_the_threads_its_storage_gets(monkeypatch, tmp_path):
    """The writer of a local store and of a ``memory://`` one (no local file system), on 2 cores:
    1 and 4 threads; both commits read back. ``LOCAL_THREADS`` overrides the local count."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    state = {"w": np.arange(1 << 16, dtype=np.float32)}
    for url, want in [(str(tmp_path / "disk"), 1), (f"memory://threads-{uuid.uuid4().hex}", 4)]:
        store = open_store(url, create=True)
        writer = store.writer()
        try:
            assert writer._pool._max_workers == want, url
            writer.commit(1, state)
        finally:
            writer.close()
        assert np.array_equal(np.asarray(store.read(1)["w"]), state["w"])
    monkeypatch.setattr(threads, "LOCAL_THREADS", 3)
    writer = open_store(str(tmp_path / "disk3"), create=True).writer()
    assert writer._pool._max_workers == 3
    writer.close()
