"""Chunk tables (spec §5.1): an array of many small chunks is stored as columns, written and read
back bit-exact, its delta found row by row, and a damaged table refused in one line."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from ravex.format import open_store
from ravex.format._version import TABLE_SPEC_VERSION
from ravex.format.errors import CorruptObjectError, ManifestError, RavexError
from ravex.format.objects.chunktable import ROW_BYTES, ChunkTable
from ravex.format.objects.names import object_key
from ravex.format.objects.tabledelta import TABLE_MIN_CHUNKS
from ravex.format.reports.validate import validate
from ravex.format.steps.manifest import Manifest

CHUNK = 2048  # 32 rows of 16 float32 per chunk
ROWS = 32 * TABLE_MIN_CHUNKS + 5  # one more chunk than the threshold: a short edge chunk


def table_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"emb": rng.standard_normal((ROWS, 16)).astype(np.float32),
            "bias": rng.standard_normal(64).astype(np.float32), "step": 1}


def manifest_doc(root: Path, step: int) -> dict:
    return json.loads((root / "steps" / str(step) / "rank-0.json").read_bytes())


def commit(root: Path, step: int, tree: dict, **writer: object):
    store = open_store(str(root), create=True)
    with store.writer(chunk_bytes=CHUNK, **writer) as w:
        return w.commit(step, tree)


def test_a_table_is_written_for_many_small_chunks_and_reads_back(tmp_path: Path) -> None:
    state = table_state()
    commit(tmp_path, 1, state)
    doc = manifest_doc(tmp_path, 1)
    assert doc["version"] == TABLE_SPEC_VERSION
    emb, bias = doc["arrays"]["emb"], doc["arrays"]["bias"]
    assert set(emb) == {"zarr", "table"} and set(bias) == {"zarr", "chunks"}
    assert len(base64.b64decode(emb["table"]["rows"])) == (TABLE_MIN_CHUNKS + 1) * ROW_BYTES
    got = open_store(str(tmp_path)).read(1)
    np.testing.assert_array_equal(got["emb"], state["emb"])
    np.testing.assert_array_equal(got["bias"], state["bias"])
    assert validate(open_store(str(tmp_path)), full=True).ok


def test_only_the_changed_rows_are_stored_and_the_rest_keep_their_place(tmp_path: Path) -> None:
    state = table_state()
    store = open_store(str(tmp_path), create=True)
    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, state)
        changed = [0, 7, 500, TABLE_MIN_CHUNKS]  # the last is the short edge chunk
        for c in changed:
            state["emb"][c * 32] += 1.0
        stats = w.commit(2, state)
    assert stats.new_chunks == len(changed) and stats.rewritten_chunks == 0
    a, b = store.manifest(1, 0).arrays["emb"].chunks, store.manifest(2, 0).arrays["emb"].chunks
    assert isinstance(a, ChunkTable) and isinstance(b, ChunkTable)
    moved = [row for row in range(len(a)) if (a.ref(row).object, a.ref(row).offset) != (b.ref(row).object,
                                                                                        b.ref(row).offset)]
    assert moved == changed
    assert all(a.ref(r).raw != b.ref(r).raw for r in changed)
    np.testing.assert_array_equal(store.read(2)["emb"], state["emb"])
    np.testing.assert_array_equal(store.read(1)["emb"][: 32], table_state()["emb"][: 32])


def test_identical_rows_are_stored_once(tmp_path: Path) -> None:
    stats = commit(tmp_path, 1, {"moments": np.zeros((ROWS, 16), np.float32)})
    assert stats.new_bytes == CHUNK  # 1025 zero chunks, the edge padded with zeros: one chunk
    table = open_store(str(tmp_path)).manifest(1, 0).arrays["moments"].chunks
    assert isinstance(table, ChunkTable) and len(table.pack_ranges()[0]) == 1
    assert not open_store(str(tmp_path)).read(1)["moments"].any()


def test_compressed_tables_round_trip(tmp_path: Path) -> None:
    state = table_state()
    state["emb"][: ROWS // 2] = 0  # half compresses to little, half not at all
    store = open_store(str(tmp_path), create=True)
    with store.writer(chunk_bytes=CHUNK, compression="zstd") as w:
        w.commit(1, state)
        state["emb"][40] = 3.0
        stats = w.commit(2, state)
    assert stats.new_chunks == 1
    sizes = store.manifest(2, 0).arrays["emb"].chunks
    assert isinstance(sizes, ChunkTable) and len(set(sizes.size.tolist())) > 1
    np.testing.assert_array_equal(store.read(2)["emb"], state["emb"])


def test_tables_off_writes_json_maps_that_older_readers_read(tmp_path: Path) -> None:
    commit(tmp_path, 1, table_state(), tables=False)
    doc = manifest_doc(tmp_path, 1)
    assert doc["version"] == "1.0" and "chunks" in doc["arrays"]["emb"]


def test_a_map_base_is_reused_by_the_first_table_commit(tmp_path: Path) -> None:
    """A store written before tables: the first table commit reuses every unchanged chunk."""
    state = table_state()
    commit(tmp_path, 1, state, tables=False)
    state["emb"][64] += 1.0
    stats = commit(tmp_path, 2, state)
    assert "table" in manifest_doc(tmp_path, 2)["arrays"]["emb"]
    assert stats.new_chunks == 1
    np.testing.assert_array_equal(open_store(str(tmp_path)).read(2)["emb"], state["emb"])


def test_gc_keeps_what_the_kept_table_reads(tmp_path: Path) -> None:
    state = table_state()
    store = open_store(str(tmp_path), create=True)
    with store.writer(chunk_bytes=CHUNK) as w:
        for step in range(1, 6):
            state["emb"][step * 3000 : step * 3000 + 900] += 1.0
            w.commit(step, state)
    report = store.gc(keep_last=1, grace_seconds=0)
    assert report.deleted_objects > 0
    np.testing.assert_array_equal(open_store(str(tmp_path)).read(5)["emb"], state["emb"])
    assert validate(open_store(str(tmp_path)), full=True).ok


def _damage(doc: dict, how: str) -> dict:
    table = doc["arrays"]["emb"]["table"]
    rows = bytearray(base64.b64decode(table["rows"]))
    n = len(rows) // ROW_BYTES
    if how == "not base64":
        table["rows"] = "@@" + table["rows"][2:]
    elif how == "truncated":
        table["rows"] = base64.b64encode(rows[:-ROW_BYTES]).decode()
    elif how == "object index":
        rows[16 * n : 16 * n + 4] = (len(table["objects"]).to_bytes(4, "little"))
        table["rows"] = base64.b64encode(rows).decode()
    elif how == "object name":
        table["objects"][0] = "../../etc/passwd"
    elif how == "size":
        rows[28 * n : 28 * n + 4] = (1 << 30).to_bytes(4, "little")
        table["rows"] = base64.b64encode(rows).decode()
    elif how == "not an object":
        doc["arrays"]["emb"]["table"] = ["rows"]
    elif how == "both forms":
        doc["arrays"]["emb"]["chunks"] = {}
    return doc


@pytest.mark.parametrize("how", ["not base64", "truncated", "object index", "object name", "size", "not an object",
                                 "both forms"])
def test_a_damaged_table_is_refused_in_one_line(tmp_path: Path, how: str) -> None:
    commit(tmp_path, 1, table_state())
    path = tmp_path / "steps" / "1" / "rank-0.json"
    path.write_text(json.dumps(_damage(manifest_doc(tmp_path, 1), how)))
    with pytest.raises(ManifestError) as err:
        Manifest.from_bytes(path.read_bytes(), "step 1 rank 0")
    assert "\n" not in str(err.value) and "emb" in str(err.value)
    with pytest.raises(RavexError):
        open_store(str(tmp_path)).read(1)


def test_a_flipped_byte_in_a_table_chunk_is_caught(tmp_path: Path) -> None:
    commit(tmp_path, 1, table_state())
    store = open_store(str(tmp_path))
    table = store.manifest(1, 0).arrays["emb"].chunks
    assert isinstance(table, ChunkTable)
    ref = table.ref(3)
    assert ref.object is not None and ref.offset is not None
    pack = tmp_path / object_key(ref.object)
    data = bytearray(pack.read_bytes())
    data[ref.offset + 5] ^= 0xFF
    pack.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="c/3/0"):
        open_store(str(tmp_path)).read(1)
    assert not validate(open_store(str(tmp_path)), full=True).ok
