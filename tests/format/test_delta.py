"""Delta reuse, counted on disk: unchanged chunks cost no write, no encoding, no storage read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fmt_helpers import (
    WRITE_METHODS,
    assert_metadata_only,
    counting,
    object_calls,
    object_files,
    snapshot,
    tree_bytes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravex.format import open_store
from ravex.format.reports.validate import validate

CHUNK = 256 << 10  # chunks of 256 KiB get objects of their own; smaller ones are packed


def model_state(seed: int = 0) -> dict:
    """20 tensors of 512 KiB (2 chunks each), 20 of 8 KiB (packed), and plain values."""
    rng = np.random.default_rng(seed)
    return {
        "big": {f"layer.{i}.weight": rng.standard_normal((128, 1024)).astype(np.float32) for i in range(20)},
        "small": {f"layer.{i}.bias": rng.standard_normal(2048).astype(np.float32) for i in range(20)},
        "lr": 0.1,
        "step": 1,
    }


def copy_tree(tree: dict) -> dict:
    """Same content, fresh buffers (the writer must not rely on object identity)."""
    return {k: copy_tree(v) if isinstance(v, dict) else (v.copy() if isinstance(v, np.ndarray) else v)
            for k, v in tree.items()}


@pytest.mark.parametrize("compression", ["none", "zstd", "blosc"])
def test_unchanged_state_writes_zero_object_bytes(tmp_path, compression):
    store = open_store(tmp_path / "s", create=True)
    state = model_state()
    with store.writer(compression=compression, chunk_bytes=CHUNK) as w:
        w.commit(1, state)
        before = snapshot(store.url)
        with counting(store.storage, WRITE_METHODS) as writes:
            stats = w.commit(2, copy_tree(state))
    after = snapshot(store.url)
    assert after == before  # no object file added, removed or rewritten (inode and mtime unchanged)
    assert [c for c in writes if c[1].startswith("objects")] == []
    assert_metadata_only(writes, 2)
    assert stats.new_bytes == 0 and stats.new_chunks == 0
    assert store.read(2)["big"]["layer.3.weight"].tobytes() == state["big"]["layer.3.weight"].tobytes()


def _changed_chunk_bytes(reader, old: dict, new: dict) -> int:
    """Bytes of the (padded) chunks whose content differs, from the chunk grid in the manifest."""
    total = 0
    for group in ("big", "small"):
        for name, a in old[group].items():
            b = new[group][name]
            crow = reader.arrays[f"{group}/{name}"].chunk_shape[0]
            row_bytes = a[0].nbytes if a.ndim > 1 else a.itemsize
            for start in range(0, len(a), crow):
                if a[start : start + crow].tobytes() != b[start : start + crow].tobytes():
                    total += crow * row_bytes
    return total


def test_ten_percent_changed_writes_at_most_105_percent(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    old = model_state()
    new = copy_tree(old)
    rng = np.random.default_rng(1)
    new["big"]["layer.0.weight"] += 1  # both chunks change
    new["big"]["layer.7.weight"][:10] *= 2  # only the first of its two chunks
    new["small"]["layer.3.bias"] += rng.standard_normal(2048).astype(np.float32)
    new["small"]["layer.19.bias"][-1] = 7.0  # 4 of 40 tensors changed
    new["lr"] = 0.05
    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, old)
        objects_before = sum(s.st_size for s in object_files(store.url).values())
        all_before = tree_bytes(store.url)
        w.commit(2, new)
    objects_after = sum(s.st_size for s in object_files(store.url).values())
    reader = store.open_step(2)
    changed = _changed_chunk_bytes(reader, old, new)
    assert changed == 3 * CHUNK + 2 * 8192
    written = objects_after - objects_before
    assert changed <= written <= 1.05 * changed, (written, changed)
    # nothing else was written but the step's metadata (its manifest, and refs.json if any)
    step_files = sum(f.stat().st_size for f in (Path(store.url) / "steps" / "2").iterdir())
    assert tree_bytes(store.url) - all_before == written + step_files
    got = store.read(2)
    for name in ("layer.0.weight", "layer.7.weight", "layer.8.weight"):
        assert got["big"][name].tobytes() == new["big"][name].tobytes()
    assert got["small"]["layer.19.bias"].tobytes() == new["small"]["layer.19.bias"].tobytes()


def test_detecting_unchanged_chunks_reads_no_object(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    state = model_state()
    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, state)
        with counting(store.storage) as log:
            w.commit(2, copy_tree(state))
    assert object_calls(log) == []  # no read, exists, size or listing of any object
    # a new writer (as after a restart) loads its base from a manifest, never from objects
    fresh = open_store(tmp_path / "s")
    with fresh.writer(chunk_bytes=CHUNK) as w:
        with counting(fresh.storage) as log:
            stats = w.commit(3, copy_tree(state))
    assert object_calls(log) == []
    assert stats.new_bytes == 0
    assert any(c[1] == "steps/2/rank-0.json" for c in log)  # its base: the newest complete step


def test_new_writer_reuses_from_newest_complete_step(tmp_path):
    url = tmp_path / "s"
    a, b = model_state(0), model_state(1)
    store = open_store(url, create=True)
    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, a)
        w.commit(2, b)
    complete_only = snapshot(url)
    # an incomplete newer step (world size 2, only rank 0 written) must not be the base
    with store.writer(rank=0, world_size=2, chunk_bytes=CHUNK) as w:
        w.commit(3, model_state(2))
    assert store.latest_step() == 2
    before = snapshot(url)
    assert len(before) > len(complete_only)  # step 3 did store objects of its own
    fresh = open_store(url)  # a new process would do exactly this
    with fresh.writer(chunk_bytes=CHUNK) as w:
        with counting(fresh.storage, WRITE_METHODS) as writes:
            stats = w.commit(4, copy_tree(b))
    assert snapshot(url) == before
    assert_metadata_only(writes, 4)
    assert stats.reused_chunks == stats.chunks > 0
    assert open_store(url).read(4)["big"]["layer.5.weight"].tobytes() == b["big"]["layer.5.weight"].tobytes()


def test_frozen_layer_written_once(tmp_path):
    """90% frozen: each commit writes the trainable tenth only, for the life of the store."""
    store = open_store(tmp_path / "s", create=True)
    state = model_state()
    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, state)
        for step in range(2, 5):
            before = sum(s.st_size for s in object_files(store.url).values())
            state = copy_tree(state)
            state["big"]["layer.0.weight"] += 1
            state["big"]["layer.1.weight"] += 1
            w.commit(step, state)
            written = sum(s.st_size for s in object_files(store.url).values()) - before
            assert 4 * CHUNK <= written <= 1.05 * 4 * CHUNK


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, np.ndarray]]:
    """A few commits of a dict of float32 tensors; each commit edits some rows, adds, drops
    or reshapes tensors, or reverts one to an earlier content."""
    def fresh(seed: int) -> np.ndarray:
        rows, cols = draw(st.integers(1, 40)), draw(st.integers(1, 48))
        return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)

    state = {f"t{i}": fresh(i) for i in range(draw(st.integers(1, 5)))}
    out = [state]
    for step in range(draw(st.integers(1, 4))):
        state = dict(state)
        for _ in range(draw(st.integers(0, 3))):
            op = draw(st.sampled_from(["edit", "edit", "add", "drop", "reshape", "revert"]))
            names = sorted(state)
            if op == "add" or not names:
                state[f"n{step}_{len(state)}"] = fresh(1000 + step)
                continue
            name = draw(st.sampled_from(names))
            if op == "edit":
                a = state[name].copy()
                lo = draw(st.integers(0, len(a) - 1))
                a[lo : lo + draw(st.integers(1, 8))] += 1
                state[name] = a
            elif op == "drop":
                del state[name]
            elif op == "reshape":
                state[name] = state[name].reshape(-1, 1).copy()
            elif op == "revert":
                older = draw(st.sampled_from(out))
                if name in older:
                    state[name] = older[name]
        out.append(state)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_any_history_reads_back_and_writes_at_most_what_changed(tmp_path_factory, history):
    root = tmp_path_factory.mktemp("hist") / "s"
    store = open_store(root, create=True)
    prev: dict[str, np.ndarray] = {}
    sent = [0]  # object bytes handed to storage (a rewrite of an existing object counts too)
    real_write, real_pending = store.storage.write, store.storage.write_pending

    def write(key: str, data) -> None:
        if key.startswith("objects/"):
            sent[0] += memoryview(data).nbytes
        real_write(key, data)

    def write_pending(key: str, data):
        sent[0] += memoryview(data).nbytes
        return real_pending(key, data)

    store.storage.write, store.storage.write_pending = write, write_pending
    with store.writer(chunk_bytes=1024, threads=2) as w:
        for step, state in enumerate(history, start=1):
            before, sent[0] = sum(s.st_size for s in object_files(root).values()), 0
            stats = w.commit(step, state)
            grown = sum(s.st_size for s in object_files(root).values()) - before
            reader = store.open_step(step)
            changed = 0  # padded bytes of chunks whose content is not that chunk's previous content
            for name, a in state.items():
                crow = reader.arrays[name].chunk_shape[0]
                old = prev.get(name)
                for lo in range(0, len(a), crow):
                    same = old is not None and old.shape == a.shape and old[lo : lo + crow].tobytes() == a[
                        lo : lo + crow].tobytes()
                    changed += 0 if same else crow * a[0].nbytes
            # plus the unchanged chunks the pack-liveness rule stores afresh (test_pack_liveness)
            assert grown <= sent[0] <= changed + stats.rewritten_bytes, (step, grown, sent[0], changed)
            got = open_store(root).read(step)
            assert list(got) == list(state)
            for name, a in state.items():
                assert got[name].shape == a.shape and got[name].tobytes() == a.tobytes()
            prev = state
    assert validate(store, full=True).ok
