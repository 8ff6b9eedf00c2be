"""Error messages: each names what is wrong, where, and (where there is one) the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ravex.format import (
    ArrayNotFoundError,
    ArrayShard,
    FormatVersionError,
    ManifestError,
    RavexError,
    StepNotFoundError,
    StoreNotFoundError,
    UnsupportedValueError,
    open_store,
)


def test_not_a_store(tmp_path):
    with pytest.raises(StoreNotFoundError, match=r"is not a Ravex store \(no ravex.json\).*create=True"):
        open_store(tmp_path / "nowhere")
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match="not a Ravex store"):  # also a FileNotFoundError
        open_store(tmp_path / "plain")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "ravex.json").write_text(json.dumps({"format": "zarr"}))
    with pytest.raises(ManifestError, match="not a Ravex root document"):
        open_store(tmp_path / "other")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "ravex.json").write_text("{")
    with pytest.raises(ManifestError, match="malformed JSON"):
        open_store(tmp_path / "broken")


def test_unknown_major_version(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    root = tmp_path / "s" / "ravex.json"
    root.write_text(json.dumps({**store.root, "version": "2.0"}))
    with pytest.raises(FormatVersionError, match=r"format 2\.0, this reader understands 1\.x only; upgrade ravex"):
        open_store(tmp_path / "s")
    root.write_text(json.dumps({**store.root, "version": "one"}))
    with pytest.raises(FormatVersionError, match="malformed spec version 'one'"):
        open_store(tmp_path / "s")


def test_missing_step_names_the_complete_steps(store):
    with pytest.raises(StepNotFoundError, match="has no complete step yet"):
        store.read("latest")
    with store.writer() as w:
        for s in (10, 20, 30):
            w.commit(s, {"x": s})
    missing = r"step 25 .* not readable \(no manifest\); complete steps: \[10, 20, 30\]"
    with pytest.raises(StepNotFoundError, match=missing):
        store.read(25)
    with pytest.raises(KeyError):  # also a KeyError
        store.read("step_26")
    with pytest.raises(StepNotFoundError, match="'best' is not a step; use a number, 'step_100' or 'latest'"):
        store.read("best")
    assert store.read("step_20") == {"x": 20} and store.read("30") == {"x": 30} and store.read() == {"x": 30}


def test_steps_are_immutable(store):
    with store.writer() as w:
        w.commit(1, {"x": 1})
        with pytest.raises(RavexError, match=r"step 1 is already complete .*steps are immutable"):
            w.commit(1, {"x": 2})
    assert store.read(1) == {"x": 1}


def test_missing_subtree_and_tensor(store):
    with store.writer() as w:
        w.commit(1, {"model": {"w": np.zeros(3)}})
    with pytest.raises(ArrayNotFoundError, match=r"step 1: no subtree .*missing 'optim'"):
        store.read(1, subtree="optim")
    with pytest.raises(ArrayNotFoundError, match="step 1 has no tensor 'model/b'"):
        store.open_step(1).read_array("model/b")
    with pytest.raises(ArrayNotFoundError, match=r"ranks 0..0, not 3"):
        store.read(1, rank=3)


def test_writer_argument_errors(store):
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        store.writer(rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"unknown compression 'lz5'.*'zstd:3'"):
        store.writer(compression="lz5")


def test_unsupported_values(store):
    with store.writer() as w:
        with pytest.raises(UnsupportedValueError, match=r"'opt/fn'.*type function.*numpy array or a Python value"):
            w.commit(1, {"opt": {"fn": lambda: 0}})
        with pytest.raises(UnsupportedValueError, match=r"dict key .* has type frozenset"):
            w.commit(1, {frozenset(): 1})
        with pytest.raises(RavexError, match="cannot be stored; supported"):
            w.commit(1, {"s": np.array(["text"])})
    assert store.latest_step() is None


def test_misaligned_shard(store):
    g = np.zeros((10, 4), np.float32)
    with store.writer(rank=0, world_size=2) as w:
        with pytest.raises(ValueError, match=r"rows \[3, 6\) of global shape \(10, 4\) do not align with chunk_rows=5"):
            w.commit(1, {"w": ArrayShard(g[3:6], g.shape, 3, 5)})


def test_bad_out_buffer(store):
    with store.writer() as w:
        w.commit(1, {"w": np.zeros((4, 4), np.float32)})
    with pytest.raises(ValueError, match=r"out for 'w' must be a writable C-contiguous array of shape \(4, 4\)"):
        store.open_step(1).read_array("w", out=np.zeros((4, 4), np.float64))
    with pytest.raises(ValueError, match="contiguous slice"):
        store.open_step(1).read_array("w", rows=slice(0, 4, 2))
