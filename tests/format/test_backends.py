"""The same write / read / validate / gc round trip on every kind of store URL."""

from __future__ import annotations

import uuid

import fsspec
import numpy as np
import pytest
from fmt_helpers import WRITE_METHODS, assert_metadata_only, assert_same, counting

from ravex.format import StoreNotFoundError, open_store
from ravex.format.reports.validate import validate
from ravex.format.storage import FsspecStorage, LocalStorage


def state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {
        "model": {"w": rng.standard_normal((128, 1024)).astype(np.float32), "frozen": np.ones((300, 300), np.float32),
                  "b": rng.standard_normal(100).astype(np.float16)},
        "optim": {"state": {0: {"step": step}}, "param_groups": [{"lr": 0.1 / step}]},
        "name": "ünï", "blob": b"\x00\x01",
    }


@pytest.fixture(params=["memory", "file", "path"])
def url(request, tmp_path):
    if request.param == "memory":
        u = f"memory://ravex-test-{uuid.uuid4().hex}/store"
        yield u
        fs = fsspec.filesystem("memory")
        if fs.exists(u):
            fs.rm(u, recursive=True)
    elif request.param == "file":
        yield f"file://{tmp_path}/store"
    else:
        yield str(tmp_path / "store")


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_round_trip(url, compression):
    with pytest.raises(StoreNotFoundError, match="not a Ravex store"):
        open_store(url)
    store = open_store(url, create=True)
    assert isinstance(store.storage, FsspecStorage if url.startswith("memory://") else LocalStorage)
    with store.writer(compression=compression, chunk_bytes=256 << 10) as w:
        for step in range(1, 5):
            stats = w.commit(step, state(step))
    assert stats.reused_chunks > 0  # the frozen tensor
    # a fresh reader of the same URL
    again = open_store(url)
    assert again.complete_steps() == [1, 2, 3, 4] and again.latest_step() == 4
    for step in range(1, 5):
        assert_same(again.read(step), state(step))
    assert again.read("latest", subtree=("model", "b")).tobytes() == state(4)["model"]["b"].tobytes()
    report = validate(url, full=True)
    assert report.ok and report.findings == [], report.findings
    # orphans and retention
    again.storage.write("objects/00/" + "0" * 32, b"orphan" * 100)
    assert "orphan_object" in validate(url).kinds()
    gc = again.gc(keep_last=2, grace_seconds=0)
    assert gc.deleted_steps == [1, 2] and gc.deleted_objects >= 3
    after = open_store(url)
    assert after.complete_steps() == [3, 4]
    for step in (3, 4):
        assert_same(after.read(step), state(step))
    assert validate(url, full=True).findings == []
    # a new writer on the reopened store resumes deltas from the newest step
    with after.writer(compression=compression, chunk_bytes=256 << 10) as w:
        with counting(after.storage, WRITE_METHODS) as writes:
            w.commit(5, state(4))
    assert_metadata_only(writes, 5)
    assert_same(open_store(url).read(5), state(4))


def test_file_url_and_path_are_the_same_store(tmp_path):
    a = open_store(f"file://{tmp_path}/s", create=True)
    with a.writer() as w:
        w.commit(7, state(7))
    b = open_store(tmp_path / "s")
    assert b.latest_step() == 7
    assert_same(b.read(7), state(7))
