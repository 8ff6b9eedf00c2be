"""The commit protocol, observed through the storage seam: what a rank writes, in what order,
and what a half-written step looks like to readers."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from fmt_helpers import assert_same, snapshot

from ravex.format import ArrayShard, ManifestError, open_store
from ravex.format.reports.validate import validate


def state(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "big": rng.standard_normal((192, 1024)).astype(np.float32),  # 3 chunks of 256 KiB
        "small": {f"b{i}": rng.standard_normal(500).astype(np.float32) for i in range(5)},  # packed
        "tiny": np.float32(seed),  # inline
        "v": seed,
    }


class Recorder:
    """Every write, pending write, publish and sync of a Storage instance, in order.

    An object written with ``write_pending`` is recorded as written when it is published
    (fsync'd and renamed into place): only then may a manifest name it."""

    def __init__(self, storage) -> None:
        self.events: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        orig_write, orig_sync = storage.write, storage.sync
        orig_pending, orig_publish = storage.write_pending, storage.publish

        def write(key, data):
            orig_write(key, data)
            with self.lock:
                self.events.append(("write", key))

        def write_pending(key, data):
            handle = orig_pending(key, data)
            with self.lock:
                self.events.append(("pending", key))
            return handle

        def publish(pending):
            orig_publish(pending)
            with self.lock:
                self.events.extend(("write", p.key) for p in pending)

        storage.write_pending, storage.publish = write_pending, publish

        def sync():
            with self.lock:
                self.events.append(("sync-start", None))
            orig_sync()
            with self.lock:
                self.events.append(("sync", None))

        storage.write, storage.sync = write, sync


@pytest.mark.parametrize("rank,world", [(0, 1), (2, 4)])
@pytest.mark.parametrize("compression", ["none", "blosc"])
def test_manifest_last_after_every_object_is_synced(tmp_path, rank, world, compression):
    store = open_store(tmp_path / "s", create=True)
    rec = Recorder(store.storage)
    with store.writer(rank=rank, world_size=world, compression=compression, chunk_bytes=256 << 10) as w:
        w.commit(7, state(1))
        first = list(rec.events)
        rec.events.clear()
        w.commit(8, state(2))
        second = list(rec.events)
    for events, step in ((first, 7), (second, 8)):
        keys = [k for e, k in events if e == "write"]
        manifest = f"steps/{step}/rank-{rank}.json"
        # rank r writes only objects and its own manifest (and, where the commit made the step
        # complete, the step's optional refs.json after it): nothing another rank also writes
        extra = [f"steps/{step}/refs.json"] if world == 1 else []
        assert keys.count(manifest) == 1
        at = keys.index(manifest)
        assert all(k.startswith("objects/") for k in keys[:at])
        assert keys[at + 1 :] in ([], extra), keys[at + 1 :]
        manifest_at = events.index(("write", manifest))
        # a sync completed after the last object write and before the manifest write
        last_object = max(i for i, (e, k) in enumerate(events) if e == "write" and k.startswith("objects/"))
        assert last_object < manifest_at
        assert ("sync", None) in events[last_object:manifest_at]
        assert ("sync", None) in events[manifest_at:]  # the manifest itself is made durable too
        # nothing written pending stays unpublished
        assert sorted(k for e, k in events if e == "pending") == sorted(
            k for e, k in events if e == "write" and k.startswith("objects/"))
        assert any(e == "pending" for e, _ in events)  # a local disk batches the objects' fsyncs
        # every object the manifest names exists once the manifest does
        doc = json.loads((tmp_path / "s" / manifest).read_text())
        for entry in doc["arrays"].values():
            for ref in entry["chunks"].values():
                if "object" in ref:
                    assert os.path.exists(tmp_path / "s" / "objects" / ref["object"][:2] / ref["object"])


def test_a_step_is_complete_exactly_when_every_rank_has_its_manifest(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    world = 3
    g = np.random.default_rng(0).standard_normal((30, 256)).astype(np.float32)
    for r in range(world):
        assert store.latest_step() is None and not store.step_info(5).complete
        with store.writer(rank=r, world_size=world, run="run") as w:
            w.commit(5, {"w": ArrayShard(g[r * 10 : (r + 1) * 10], g.shape, r * 10, 10), "r": r})
    info = store.step_info(5)
    assert info.complete and info.ranks == (0, 1, 2)
    assert store.open_step(5).read_array("w").tobytes() == g.tobytes()
    # unchanged shards committed again: zero object bytes
    before = snapshot(store.url)
    for r in range(world):
        with store.writer(rank=r, world_size=world, run="run") as w:
            stats = w.commit(6, {"w": ArrayShard(g[r * 10 : (r + 1) * 10], g.shape, r * 10, 10), "r": r})
            assert stats.new_bytes == 0
    assert snapshot(store.url) == before
    assert_same(store.read(6, rank=2), {"w": g, "r": 2})


def test_no_pickle_unknown_tags_are_refused(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        w.commit(1, {"x": 1})
    path = tmp_path / "s" / "steps" / "1" / "rank-0.json"
    doc = json.loads(path.read_text())
    doc["tree"] = {"x": {"$pickle": "gASVAAAAAAAAAAB9lC4="}}
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=r"unknown tag '\$pickle'"):
        open_store(tmp_path / "s").read(1)


def test_ranks_disagreeing_on_a_tensor_are_reported(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    for r in range(2):
        with store.writer(rank=r, world_size=2, run="run") as w:
            w.commit(1, {"rng_state": np.full(1000, r, np.uint8)})  # rank-specific, same name
    assert store.latest_step() is None  # never offered for resume
    (finding,) = [f for f in validate(store).findings if f.kind == "incomplete_step"]
    assert "ranks disagree" in finding.message and "rng_state" in finding.message
