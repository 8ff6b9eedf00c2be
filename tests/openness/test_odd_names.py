"""Tree keys that need escaping (dots, '/', '%', '~', unicode, '', '..', '__x', int keys) reach
every reader the same: zarr StepStore, refs.json, plain export, tensorstore, reference reader."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import fsspec
import numpy as np
import tensorstore as ts
import zarr

from ravex.format import open_store
from ravex.format.interop.export import export_safetensors, export_zarr
from ravex.format.interop.tensorstore_spec import open_tensorstore
from ravex.format.interop.zarr_store import StepStore
from ravex.format.steps.refs import write_refs

KEYS = ["layer.0.weight", "état", "a/b", "~x", "%", "__x", "..", "", "sp ace", "q?#&=", 5]


def test_odd_names_everywhere(tmp_path):
    root = tmp_path / "ckpt"
    tree = {k: np.full((3,), i, np.int32) for i, k in enumerate(KEYS)}
    store = open_store(root, create=True)
    with store.writer() as w:
        w.commit(1, tree)
    write_refs(store, 1)
    export_zarr(store, tmp_path / "plain")
    fs = fsspec.filesystem(
        "reference", fo=f"{root}/steps/1/refs.json", template_overrides={"u": str(root)}, asynchronous=True
    )
    groups = {
        "StepStore": zarr.open_group(store=StepStore(root), mode="r"),
        "refs": zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True), mode="r"),
        "export": zarr.open_group(str(tmp_path / "plain"), mode="r"),
    }
    source = Path(__file__).resolve().parents[2] / "spec" / "reference_reader.py"
    spec = importlib.util.spec_from_file_location("_rr_odd", source)
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    arrays, rr_tree = rr.read_step(str(root))
    reader = store.open_step(1)
    assert len(reader.arrays) == len(KEYS)
    for path in reader.arrays:
        expected = reader.read_array(path)
        for name, group in groups.items():
            assert np.array_equal(group[path][...], expected), (name, path)
        assert np.array_equal(open_tensorstore(store, 1, path).read().result(), expected), path
        plain = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "plain" / path)}})
        assert np.array_equal(plain.result().read().result(), expected), path
        assert np.array_equal(arrays[path], expected), path
    assert all(np.array_equal(rr_tree[k], tree[k]) for k in KEYS)
    export_safetensors(store, tmp_path / "odd.safetensors", sep="/")
