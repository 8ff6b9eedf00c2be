"""Per-array chunk sizes (``commit(..., chunk_bytes={name: bytes})``): the round trip through
Ravex, the spec's reference reader and stock zarr-python, and deltas that store only the
small chunks that changed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from fmt_helpers import object_files

from ravex.format import ArrayShard, open_store
from ravex.format.steps.manifest import Manifest
from ravex.format.writing.writer import DEFAULT_CHUNK_BYTES

SPEC = Path(__file__).resolve().parents[2] / "spec"
ROW = 64 * 4  # 64 fp32 per row
SMALL = 2 << 10  # 8 rows per chunk


def table_state(rows: int = 4096, seed: int = 0) -> dict:
    """An embedding-like table and its moment (small chunks), a dense weight (default)."""
    rng = np.random.default_rng(seed)
    return {
        "emb": {"weight": rng.standard_normal((rows, 64)).astype(np.float32)},
        "moment": rng.standard_normal((rows, 64)).astype(np.float32),
        "dense": rng.standard_normal((300, 17)).astype(np.float32),
        "step": 3,
    }


SIZES = {"emb/weight": SMALL, "moment": SMALL}


def _chunk_rows(store, step: int) -> dict[str, int]:
    m = store.manifest(step, 0)
    return {p: e.zarr["chunk_grid"]["configuration"]["chunk_shape"][0] for p, e in m.arrays.items()}


def _same(got, want) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, dict):
            _same(got[k], v)
        elif isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes(), k
        else:
            assert got[k] == v, k


def test_each_array_keeps_its_own_chunk_size_and_reads_back_everywhere(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    state = table_state(rows=1001)  # 1001 rows: the last small chunk is padded
    with store.writer() as w:
        w.commit(1, state, chunk_bytes=SIZES)
    assert _chunk_rows(store, 1) == {"emb/weight": 8, "moment": 8, "dense": 300}
    _same(store.open_step(1).read(), state)

    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SPEC / "schema" / "manifest.schema.json").read_text())
    manifest = json.loads((tmp_path / "s" / "steps" / "1" / "rank-0.json").read_bytes())
    jsonschema.Draft202012Validator(schema).validate(manifest)

    spec = importlib.util.spec_from_file_location("_chunks_reference_reader", SPEC / "reference_reader.py")
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    _same(rr.read_step(str(tmp_path / "s"), 1)[1], state)

    group = zarr.open_group("reference://", mode="r", storage_options={
        "fo": str(tmp_path / "s" / "steps" / "1" / "refs.json"), "template_overrides": {"u": str(tmp_path / "s")}})
    for path in ("emb/weight", "moment", "dense"):
        z = group[path]
        assert z.chunks[0] == (8 if path != "dense" else 300)
        want = state["emb"]["weight"] if path == "emb/weight" else state[path]
        assert np.asarray(z[...]).tobytes() == want.tobytes(), path


def test_delta_with_small_chunks_stores_only_the_changed_chunks(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    state = table_state()
    with store.writer() as w:
        first = w.commit(1, state, chunk_bytes=SIZES)
        assert first.chunks == 2 * 4096 // 8 + 1 and first.reused_chunks == 0
        before = object_files(tmp_path / "s")
        touched = np.array([5, 6, 900, 2047, 4095])  # rows 5 and 6 share chunk 0: 4 chunks per array
        state["emb"]["weight"][touched] += 1.0
        state["moment"][touched] *= 0.5
        second = w.commit(2, state, chunk_bytes=SIZES)
    assert second.new_chunks == 8 and second.reused_chunks == first.chunks - 8
    assert second.new_bytes == 8 * SMALL
    assert second.manifest_bytes < 200 * first.chunks  # one entry per chunk, packed or not
    added = set(object_files(tmp_path / "s")) - set(before)
    assert len(added) == 1, "the changed small chunks go into one pack object"
    _same(store.open_step(2).read(), state)
    # the writer hands its manifest to the store's cache instead of a re-parse: it must be what was stored
    stored = (tmp_path / "s" / "steps" / "2" / "rank-0.json").read_bytes()
    assert store.manifest(2, 0) == Manifest.from_bytes(stored, "step 2") and len(stored) == second.manifest_bytes


def test_changing_an_arrays_chunk_size_rewrites_that_array_only(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    state = table_state(rows=1024)
    with store.writer() as w:
        w.commit(1, state)
        assert _chunk_rows(store, 1)["moment"] == 1024  # 256 KiB: one default chunk
        s = w.commit(2, state, chunk_bytes={"moment": SMALL})
        assert _chunk_rows(store, 2)["moment"] == 8
        assert s.new_bytes == state["moment"].nbytes  # the other arrays are reused as they are
        assert w.commit(3, state, chunk_bytes={"moment": SMALL}).new_bytes == 0
    _same(store.open_step(2).read(), state)


def test_a_shard_keeps_its_chunk_rows(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    table = np.arange(64 * 10, dtype=np.float32).reshape(64, 10)
    with store.writer() as w:
        w.commit(1, {"t": ArrayShard(table, (64, 10), 0, 16)}, chunk_bytes={"t": SMALL})
    assert _chunk_rows(store, 1) == {"t": 16}
    assert store.open_step(1).read()["t"].tobytes() == table.tobytes()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2k"])
def test_a_bad_chunk_size_is_refused_before_anything_is_written(tmp_path, bad):
    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w, pytest.raises(ValueError, match=r"chunk_bytes\['moment'\].*positive int"):
        w.commit(1, table_state(rows=16), chunk_bytes={"moment": bad})
    assert store.latest_step() is None
    assert DEFAULT_CHUNK_BYTES == 16 << 20  # the default the other arrays keep
