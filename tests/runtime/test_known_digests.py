"""Digests hashed while staging: each one is the digest of the bytes its key names, whatever
happened to the tensor since it was first staged, and a commit that uses them writes exactly
the store a commit that hashes everything itself writes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ravex.format.objects.hashing import KNOWN_MIN_BYTES, ChunkHasher, digest
from ravex.format.objects.tabledelta import pad
from ravex.format.reports.validate import validate
from ravex.format.store import open_store
from ravex.format.writing.writer import DEFAULT_CHUNK_BYTES, StepWriter, hashed_chunk_len
from ravex.saving import copier as _copier
from ravex.saving.plan import RowShard
from ravex.saving.stager import Stager


def _truth(known: dict[tuple[int, int, int], str]) -> None:
    """Every known digest is the digest of the padded bytes its key names, read now."""
    for (address, length, padded_to), got in known.items():
        raw = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * length).from_address(address))
        assert got == digest(pad(memoryview(raw.tobytes()), padded_to)), (address, length, padded_to)


def _chunks(arr: np.ndarray, chunk_len: int) -> list[tuple[int, int, int]]:
    flat = arr.reshape(-1).view(np.uint8)
    return [(int(flat[at:].ctypes.data), min(chunk_len, flat.nbytes - at), chunk_len)
            for at in range(0, flat.nbytes, chunk_len)]


def test_the_chunk_hasher_pads_as_the_writer_does():
    data = np.random.default_rng(0).integers(0, 256, 3 * 1000 + 7, dtype=np.uint8)
    hasher = ChunkHasher(4096)
    for at in range(0, data.nbytes, 1000):
        hasher.update(data[at:at + 1000].data)
    assert hasher.hexdigest() == digest(pad(memoryview(data.tobytes()), 4096))


def test_large_tensors_are_hashed_in_the_writers_chunks_and_small_ones_are_not():
    tensors = {"big": torch.randn(4099, 2048), "edge": torch.randn(5, 300_001), "small": torch.randn(100),
               "scalar": torch.tensor(3.0), "empty": torch.zeros(0, 7)}
    stager = Stager(as_numpy=True)
    staged = stager.stage({"t": tensors})
    expected = set()
    for name in ("big", "edge"):
        arr = staged["t"][name]
        chunk_len = hashed_chunk_len(arr.shape, arr.itemsize)
        assert chunk_len is not None and chunk_len >= KNOWN_MIN_BYTES
        expected.update(_chunks(arr, chunk_len))
    assert set(stager.known) == expected  # the last chunk of each short, padded
    _truth(dict(stager.known))
    for name in ("small", "scalar", "empty"):
        assert hashed_chunk_len(staged["t"][name].shape, 4) is None


def test_a_commit_with_known_digests_writes_the_same_store(tmp_path):
    torch.manual_seed(1)
    tree = {"w": torch.randn(3000, 3000), "v": torch.randn(7, 300_000), "b": torch.randn(9)}
    stager = Stager(as_numpy=True)
    staged = stager.stage(tree)
    assert stager.known
    stores = {}
    for name, known in (("known", stager.known), ("hashed", None)):
        store = open_store(tmp_path / name, create=True)
        StepWriter(store, delta=False).commit(1, staged, known=known)
        assert validate(store, full=True).ok
        stores[name] = sorted(os.path.relpath(os.path.join(root, f), tmp_path / name)
                              for root, _, files in os.walk(tmp_path / name) for f in files if "objects" in root)
    assert stores["known"] == stores["hashed"]


def test_the_commit_hashes_only_what_is_not_known(tmp_path, monkeypatch):
    import ravex.format.writing.writer as writer

    tree = {"w": torch.randn(2048, 4096), "b": torch.randn(9)}
    stager = Stager(as_numpy=True)
    staged = stager.stage(tree)
    hashed: list[int] = []
    real = writer.digest
    monkeypatch.setattr(writer, "digest", lambda data: hashed.append(memoryview(data).nbytes) or real(data))
    StepWriter(open_store(tmp_path / "s", create=True), delta=False).commit(1, staged, known=stager.known)
    assert len(stager.known) == 2 and max(hashed) < KNOWN_MIN_BYTES  # only the small tensor, and JSON
    hashed.clear()
    StepWriter(open_store(tmp_path / "t", create=True), delta=False).commit(1, staged)
    assert sorted(hashed)[-2:] == [16 << 20, 16 << 20]


def test_no_digest_outlives_its_bytes():
    """Through in-place updates (copied again), skips (kept), a probe that catches a write the
    counter missed, a copy that cannot hash (dropped) and a shape change (a new buffer)."""
    torch.manual_seed(2)
    w = torch.randn(2048, 1024)
    m = torch.randn(1024, 2048)
    stager = Stager(as_numpy=True, full_stage_every=1000)
    tree = {"w": w, "m": m}
    stager.stage(tree)
    first = dict(stager.known)
    _truth(first)
    with torch.no_grad():
        w.add_(1.0)  # counted: copied and hashed again
    stager.stage(tree)
    _truth(dict(stager.known))
    assert stager.skipped_bytes == m.nbytes  # m skipped: its digests kept, still true
    assert {k: v for k, v in stager.known.items() if k not in first} == {}
    assert any(first[k] != stager.known[k] for k in first)
    m.data.mul_(2.0)  # uncounted: the probe sees it and copies
    stager.stage(tree)
    _truth(dict(stager.known))
    tree["m"] = torch.randn(2048, 1024).t()  # same shape, not contiguous: copied without hashing
    stager.stage(tree)
    _truth(dict(stager.known))
    assert len(stager.known) == len(_chunks(np.empty((2048, 1024), np.float32), DEFAULT_CHUNK_BYTES))
    tree["m"] = m
    stager.stage(tree)
    tree["w"] = torch.randn(1024, 1024)  # another shape: a new buffer
    stager.stage(tree)
    _truth(dict(stager.known))
    assert len(stager.known) == len(_chunks(np.empty((1024, 1024), np.float32), DEFAULT_CHUNK_BYTES)) + len(
        _chunks(np.empty((1024, 2048), np.float32), DEFAULT_CHUNK_BYTES))


def test_a_failed_stage_leaves_no_digest(monkeypatch):
    stager = Stager(as_numpy=True)
    tree = {"w": torch.randn(4096, 1024)}
    stager.stage(tree)
    assert stager.known

    def fail(dst, src):
        raise OSError("no")

    monkeypatch.setattr(_copier, "_copy", fail)
    with torch.no_grad():
        tree["w"].add_(1.0)
    with pytest.raises(OSError):
        stager.stage(tree)
    assert stager.known == {} and stager._digests == {}


def test_a_row_shard_is_hashed_in_its_own_rows():
    local = torch.randn(300, 4096)  # chunk_rows 128: 128, 128 and 44 rows, the last padded
    stager = Stager(as_numpy=True)
    staged = stager.stage({"s": RowShard(local, (1000, 4096), 300, 128)})
    chunk_len = 128 * 4096 * 4
    assert set(stager.known) == set(_chunks(staged["s"].local, chunk_len))
    _truth(dict(stager.known))
