"""``ravex.format.writing.reshard``: ranks write their dim-0 shards of one global array as whole
chunks (uneven and empty last shards included); a reader at another world size fetches only
the chunks its rows overlap. Torch-free and in-process: each "rank" is a StepWriter."""

from __future__ import annotations

import numpy as np
import pytest

from ravex.format import open_store, write_refs
from ravex.format.writing.reshard import aligned_chunk_rows, read_rows, shard_of, shard_rows

ROW = 32768  # float64 columns: 256 KiB a row, so every chunk is an object of its own


def _write(tmp_path, full: np.ndarray, world: int, chunk_rows: int):
    store = open_store(tmp_path / "s", create=True)
    for rank in range(world):
        rows = shard_rows(full.shape[0], world, rank)
        shard = shard_of(full[rows], full.shape, world, rank, chunk_rows)
        with store.writer(rank=rank, world_size=world, run="r1") as w:
            w.commit(1, {"w": shard, "rank": rank})
    write_refs(store, 1)
    return store


class _Counting:
    def __init__(self, storage):
        self.keys: list[str] = []
        for name in ("read", "read_into", "read_range"):
            original = getattr(storage, name)

            def wrapped(key, *a, _o=original, **k):
                if key.startswith("objects/"):
                    self.keys.append(key)
                return _o(key, *a, **k)

            setattr(storage, name, wrapped)


@pytest.mark.parametrize(("n_rows", "world", "new_world"), [(10, 3, 2), (10, 3, 4), (5, 4, 2), (7, 2, 1), (7, 1, 3)])
def test_resharded_reads_fetch_only_overlapping_chunks(tmp_path, n_rows, world, new_world):
    full = np.arange(n_rows * ROW, dtype=np.float64).reshape(n_rows, ROW)
    rows = aligned_chunk_rows(full.shape, world, 8, chunk_bytes=2 * ROW * 8)
    assert rows >= 1 and shard_rows(n_rows, world, 0).stop % rows == 0
    store = _write(tmp_path, full, world, rows)
    assert store.step_info(1).complete
    reader = store.open_step(1)
    assert reader.arrays["w"].chunk_shape[0] == rows
    for m in reader.manifests:  # every rank wrote exactly the chunks of its own rows
        mine = shard_rows(n_rows, world, m.rank)
        span = range(mine.start // rows, -(-mine.stop // rows)) if mine.stop > mine.start else range(0)
        expect = {f"c/{i}/0" for i in span}
        assert set(m.arrays["w"].chunks) == expect
    np.testing.assert_array_equal(reader.read_array("w"), full)
    for rank in range(new_world):
        fresh = open_store(tmp_path / "s").open_step(1)
        counter = _Counting(fresh.store.storage)
        want = shard_rows(n_rows, new_world, rank)
        got = read_rows(fresh, "w", new_world, rank)
        np.testing.assert_array_equal(got, full[want])
        overlapping = len(range(want.start // rows, -(-want.stop // rows))) if want.stop > want.start else 0
        assert len(set(counter.keys)) == overlapping, (rank, counter.keys)


def test_aligned_chunk_rows_divides_the_shard():
    assert aligned_chunk_rows((33, 16), 2, 4) == 17
    assert aligned_chunk_rows((100, 1000), 4, 4, chunk_bytes=8000) == 1  # 25-row shards, 2 rows fit: 1 divides
    for n, w in [(33, 2), (100, 3), (1, 4), (0, 2)]:
        size = max(1, -(-n // w))
        r = aligned_chunk_rows((n, 1000), w, 4, chunk_bytes=4000 * 3)
        assert size % r == 0 and (r * 4000 <= 4000 * 3 or r == 1)


def test_shard_of_rejects_a_wrong_local_shape():
    with pytest.raises(ValueError, match="holds rows"):
        shard_of(np.zeros((3, 2)), (10, 2), 3, 0)
