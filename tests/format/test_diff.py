"""Diff of two steps: statuses and chunk counts from manifests alone; numbers right vs numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fmt_helpers import counting, object_calls

from ravex.format import open_store
from ravex.format.objects.names import object_key
from ravex.format.reports.diff import diff

CHUNK = 256 << 10


def base_state() -> dict:
    rng = np.random.default_rng(0)
    return {
        "model": {
            "frozen": rng.standard_normal((256, 1024)).astype(np.float32),  # 4 chunks, unchanged
            "frozen_small": rng.standard_normal(1000).astype(np.float32),  # packed, unchanged
            "tuned": rng.standard_normal((256, 1024)).astype(np.float32),  # 1 of 4 chunks changes
            "moved": rng.standard_normal((64, 1024)).astype(np.float64),  # all changes
            "old": np.arange(10, dtype=np.int32),  # removed
            "counts": np.arange(100_000, dtype=np.int64),
        },
        "lr": 0.1,
        "step": 100,
        "name": "run",
    }


def changed_state() -> dict:
    s = base_state()
    m = dict(s["model"])
    m["tuned"] = m["tuned"].copy()
    m["tuned"][70:80] += 0.5  # rows 64..127: chunk 1 only
    m["moved"] = m["moved"] * 1.01 + 0.001
    m["counts"] = m["counts"].copy()
    m["counts"][5] = -7
    del m["old"]
    m["new"] = np.zeros(3, np.float32)  # added
    return {**s, "model": m, "lr": 0.05, "step": 200, "extra": True}


@pytest.fixture
def two_steps(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, base_state())
        w.commit(2, changed_state())
    return open_store(store.url)


def test_statuses_chunks_and_numbers(two_steps):
    store = two_steps
    a, b = store.open_step(1), store.open_step(2)
    unchanged_places = set()
    for name in ("model/frozen", "model/frozen_small"):
        for ref in b.arrays[name].chunks.values():
            unchanged_places.add((object_key(ref.object), ref.offset))
    with counting(store.storage) as log:
        d = diff(a, b)
    by = {t.name: t for t in d.tensors}
    assert by["model/frozen"].status == "unchanged" and (by["model/frozen"].chunks_changed,
                                                       by["model/frozen"].chunks_total) == (0, 4)
    assert by["model/frozen_small"].status == "unchanged"
    assert by["model/tuned"].status == "changed"
    assert (by["model/tuned"].chunks_changed, by["model/tuned"].chunks_total) == (1, 4)
    assert (by["model/moved"].chunks_changed, by["model/moved"].chunks_total) == (2, 2)
    assert by["model/old"].status == "removed" and by["model/new"].status == "added"
    assert by["model/counts"].status == "changed" and by["model/counts"].chunks_changed == 1
    assert d.changed() and {t.name for t in d.changed()} == {
        "model/tuned", "model/moved", "model/old", "model/new", "model/counts"}
    # numbers, against numpy in float64
    x, y = base_state()["model"], changed_state()["model"]
    for name in ("tuned", "moved", "counts"):
        xa, ya = x[name].astype(np.float64), y[name].astype(np.float64)
        t = by[f"model/{name}"]
        assert t.max_abs == pytest.approx(np.max(np.abs(ya - xa)), rel=1e-12)
        assert t.rel_l2 == pytest.approx(np.linalg.norm(ya - xa) / np.linalg.norm(xa), rel=1e-9)
    assert by["model/counts"].max_abs == 12.0  # 5 -> -7
    # unchanged tensors were never read: no fetch touched their chunks
    for call in object_calls(log):
        place = (call[1], call[2] if call[0] == "read_range" else None)
        whole = (call[1], None)
        assert place not in unchanged_places and whole not in unchanged_places, call
        if call[0] == "read_range":
            for key, off in unchanged_places:
                if key == call[1] and off is not None:
                    assert not (call[2] <= off < call[3]), call
    # values
    vals = {v.name: v for v in d.values}
    assert (vals["lr"].status, vals["lr"].a, vals["lr"].b) == ("changed", 0.1, 0.05)
    assert vals["step"].status == "changed" and vals["name"].status == "unchanged"
    assert vals["extra"].status == "added" and vals["extra"].b is True
    assert d.to_json()["tensors"]


def test_manifest_only_diff_reads_no_object(two_steps):
    store = two_steps
    a, b = store.open_step(1), store.open_step(2)
    with counting(store.storage) as log:
        d = diff(a, b, stats=False)
    assert object_calls(log) == []
    assert {t.name: t.status for t in d.tensors}["model/tuned"] == "changed"
    assert all(t.max_abs is None for t in d.tensors)


def test_same_step_is_all_unchanged(two_steps):
    d = diff(two_steps.open_step(2), two_steps.open_step(2))
    assert {t.status for t in d.tensors} == {"unchanged"}
    assert {v.status for v in d.values} == {"unchanged"}


def test_diff_across_two_stores(tmp_path, two_steps):
    """Another store with other chunking and compression: same content is unchanged, and
    a changed tensor is measured right."""
    other = open_store(tmp_path / "other", create=True)
    s = changed_state()
    s["model"] = dict(s["model"])
    s["model"]["tuned"] = s["model"]["tuned"] * 2
    with other.writer(chunk_bytes=100_000, compression="zstd") as w:
        w.commit(9, s)
    d = diff(two_steps.open_step(2), other.open_step(9))
    by = {t.name: t for t in d.tensors}
    assert by["model/frozen"].status == "unchanged" and by["model/moved"].status == "unchanged"
    t = by["model/tuned"]
    assert t.status == "changed"
    want = changed_state()["model"]["tuned"].astype(np.float64)
    assert t.max_abs == pytest.approx(np.max(np.abs(want)), rel=1e-12)
    assert t.rel_l2 == pytest.approx(1.0, rel=1e-9)
    assert d.a.endswith("@2") and d.b.endswith("@9")
    assert not [v for v in d.values if v.status != "unchanged"]


def test_nan_values_compare_equal(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        w.commit(1, {"x": math.nan, "y": 1})
        w.commit(2, {"x": math.nan, "y": 1.0})
    vals = {v.name: v.status for v in diff(store.open_step(1), store.open_step(2)).values}
    assert vals == {"x": "unchanged", "y": "changed"}  # int 1 -> float 1.0 is a change of type
