"""Zarr inside: stock zarr-python and tensorstore decode what Ravex wrote, from the manifest's
exact ``zarr.json`` and the stored chunk bytes alone (no Ravex code on the read side)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorstore as ts
import zarr
from fmt_helpers import assemble_zarr

from ravex.format import open_store
from ravex.format.objects.dtypes import BY_NAME

EXTENSION_TYPES = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}  # not in zarr-python 3.1


def dtype_zoo() -> dict:
    """Every dtype: a multi-chunk 2-d array with a padded edge chunk, a 0-d array, an empty one,
    a 1-d array and a chunk big enough (>= 256 KiB) for an object of its own."""
    tree: dict = {}
    for name, dt in sorted(BY_NAME.items()):
        np_dt = dt.numpy.newbyteorder("=")
        rng = np.random.default_rng(sum(map(ord, name)))

        def make(shape: tuple[int, ...], np_dt: np.dtype = np_dt, rng: np.random.Generator = rng) -> np.ndarray:
            n = int(np.prod(shape))
            if np_dt == np.bool_:
                return (rng.integers(0, 2, n) == 1).reshape(shape)
            return np.frombuffer(rng.bytes(n * np_dt.itemsize), dtype=np_dt).reshape(shape).copy()

        tree[name] = {
            "multi": make((53, 37)),  # chunk_bytes=1 KiB: many chunks, the last padded
            "scalar": make(()),
            "empty": make((0, 4)),
            "vec": make((1001,)),
            "whole": make((520 * 1024 // np_dt.itemsize,)),  # two chunks of 260 KiB: objects of their own
            "odd.name/with%": make((5, 3)).T,
        }
    return tree


@pytest.fixture(scope="module", params=["none", "zstd", "blosc"])
def written(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"zarr-{request.param}")
    tree = dtype_zoo()
    store = open_store(root / "store", create=True)
    with store.writer(compression=request.param, chunk_bytes=1024) as w:
        w.commit(1, {k: {n: a for n, a in v.items() if n != "whole"} for k, v in tree.items()})
    with store.writer(compression=request.param, chunk_bytes=260 << 10) as w:
        w.commit(2, {k: {"whole": v["whole"]} for k, v in tree.items()})
    out = root / "zarr"
    for step in (1, 2):
        assemble_zarr(root / "store", store.open_step(step).manifests, out)
    return tree, store, out, request.param


def _arrays(tree: dict) -> list[tuple[str, str, str, np.ndarray]]:
    from ravex.format.objects.names import escape_key

    return [
        (dt, n, f"{escape_key(dt)}/{escape_key(n)}", a) for dt, group in tree.items() for n, a in group.items()
    ]


def test_zarr_python_decodes_every_chunk(written):
    tree, _store, out, compression = written
    zstore = zarr.storage.LocalStore(out, read_only=True)
    checked = 0
    for dt, _n, path, want in _arrays(tree):
        if dt in EXTENSION_TYPES:
            continue
        z = zarr.open_array(store=zstore, path=path, mode="r")
        got = np.asarray(z[...])
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), path
        if compression != "none":
            assert [c.to_dict()["name"] for c in z.metadata.codecs][-1] == compression
        checked += 1
    assert checked == 14 * 6


def test_zarr_json_is_exact_zarr_v3(written):
    """zarr-python's own parse of each zarr.json re-serializes to the same document."""
    _tree, store, out, _c = written
    for m in store.open_step(1).manifests:
        for path, entry in m.arrays.items():
            if entry.data_type in EXTENSION_TYPES:
                continue
            z = zarr.open_array(store=zarr.storage.LocalStore(out, read_only=True), path=path, mode="r")
            theirs = json.loads(json.dumps(z.metadata.to_dict(), default=str))
            for field in ("zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding"):
                assert theirs[field] == entry.zarr[field], (path, field)


def test_tensorstore_decodes_every_dtype(written):
    tree, _store, out, _c = written
    for _dt, _n, path, want in _arrays(tree):
        arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(out / path)}}, open=True).result()
        got = arr.read().result()
        assert got.shape == want.shape, path
        assert np.dtype(got.dtype).itemsize == want.dtype.itemsize, path
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), path
        if _dt in EXTENSION_TYPES:
            assert np.dtype(got.dtype) == want.dtype, path


def test_ravex_reads_what_zarr_reads(written):
    tree, store, _out, _c = written
    got1, got2 = store.read(1), store.read(2)
    for dt, n, _path, want in _arrays(tree):
        got = (got2 if n == "whole" else got1)[dt][n]
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
