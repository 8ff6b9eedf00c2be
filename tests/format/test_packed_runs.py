"""Reading many small packed chunks: runs of them are fetched and copied as one, and each
chunk is still checked against its own digest.

A sparse table in 2 KiB chunks has ~100k chunks per 200 MiB, packed into ~4 MiB objects.
The reader takes a pack's consecutive chunks as one run (one slice of the pack, one copy);
these tests pin down that it reads the same bytes as chunk by chunk, on whole arrays and on
row ranges that cut runs, and that damage is still named per chunk.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fmt_helpers import counting, object_calls

from ravex.format import open_store
from ravex.format.errors import CorruptObjectError
from ravex.format.objects.names import object_key

ROWS, DIM = 3000, 16  # 64-byte rows; 2 KiB chunks of 32 rows: 94 chunks, the last one short


def _table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, DIM)).astype("float32")


def _store(tmp_path: Path, compression: str = "none"):
    store = open_store(tmp_path / "s", create=True)
    with store.writer(compression=compression) as w:
        w.commit(1, {"t": _table(), "u": _table(1)}, chunk_bytes={"t": 2048, "u": 2048})
    return store


def _packs(store, name: str = "t") -> dict[str, list[tuple[str, dict]]]:
    doc = json.loads((Path(store.url) / "steps" / "1" / "rank-0.json").read_text())
    out: dict[str, list[tuple[str, dict]]] = {}
    for key, ref in doc["arrays"][name]["chunks"].items():
        out.setdefault(ref.get("object", "inline"), []).append((key, ref))
    return out


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_whole_arrays_and_row_ranges_read_back_exactly(tmp_path, compression):
    store = _store(tmp_path, compression)
    assert all("offset" in ref for refs in _packs(store).values() for _, ref in refs)  # all packed
    step = store.open_step(1)
    whole = step.read_arrays(["t", "u"])
    assert whole["t"].tobytes() == _table().tobytes() and whole["u"].tobytes() == _table(1).tobytes()
    for rows in (slice(0, 32), slice(5, 37), slice(31, 33), slice(100, 2999), slice(2980, 3000), slice(0, ROWS)):
        assert step.read_array("t", rows=rows).tobytes() == _table()[rows].tobytes(), rows
    into = np.zeros((ROWS, DIM), "float32")
    step.read_array("u", out=into)
    assert into.tobytes() == _table(1).tobytes()


def test_a_pack_is_fetched_once_not_per_chunk(tmp_path):
    store = _store(tmp_path)
    reader = open_store(store.url).open_step(1)
    with counting(reader.store.storage) as calls:
        reader.read_arrays(["t"])
    packs = [name for name in _packs(store) if name != "inline"]
    fetched = object_calls(calls)
    assert len(fetched) <= len(packs), fetched  # 94 chunks: one read per pack


def test_a_flipped_bit_is_named_by_its_chunk(tmp_path):
    store = _store(tmp_path)
    name, refs = max(_packs(store).items(), key=lambda kv: len(kv[1]))
    key, ref = refs[len(refs) // 2]  # a chunk in the middle of a run
    path = Path(store.url) / object_key(name)
    data = bytearray(path.read_bytes())
    data[ref["offset"] + 100] ^= 0x10
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match=rf"tensor 't' chunk {key}: object {name} does not match"):
        open_store(store.url).open_step(1).read_arrays(["t"])
    # rows that avoid the damaged chunk still read
    first_key = refs[0][0]
    rows = int(first_key.split("/")[1]) * 32
    assert open_store(store.url).open_step(1).read_array("t", rows=slice(rows, rows + 32)).tobytes() == \
        _table()[rows : rows + 32].tobytes()


def test_a_truncated_pack_names_the_first_chunk_it_cuts(tmp_path):
    store = _store(tmp_path)
    name, refs = max(_packs(store).items(), key=lambda kv: len(kv[1]))
    key, ref = refs[3]
    path = Path(store.url) / object_key(name)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[: ref["offset"] + 10])
    with pytest.raises(CorruptObjectError, match=rf"chunk {key}: object {name} gave 10 bytes, manifest says 2048"):
        open_store(store.url).open_step(1).read_arrays(["t"])


def test_a_missing_pack_is_named(tmp_path):
    store = _store(tmp_path)
    name, refs = max(_packs(store).items(), key=lambda kv: len(kv[1]))
    (Path(store.url) / object_key(name)).unlink()
    with pytest.raises(CorruptObjectError, match=rf"chunk {refs[0][0]}: object {name} is missing"):
        open_store(store.url).open_step(1).read_arrays(["t"])
