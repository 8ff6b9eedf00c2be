"""tensorstore reads a step in place (kvstack spec) and from a plain Zarr export; safetensors,
plain Zarr and .pt exports round-trip bit-exact."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorstore as ts
import zarr
from open_helpers import same, torch_numpy

from ravex.format import open_store
from ravex.format.interop.export import export_safetensors, export_zarr
from ravex.format.interop.tensorstore_spec import open_tensorstore, tensorstore_spec
from ravex.format.objects.names import object_key


def test_tensorstore_in_place(zoo):
    store = open_store(zoo.root)
    for path, expected in zoo.arrays.items():
        t = open_tensorstore(store, zoo.step, path)
        assert same(t.read().result(), expected), path


def test_tensorstore_spec_of_whole_objects_is_self_contained(zoo_zstd):
    """An array whose chunks all have objects of their own needs nothing but the JSON spec."""
    spec = tensorstore_spec(open_store(zoo_zstd.root), "latest", "big/whole")
    json.dumps(spec)  # plain JSON
    assert all(layer["base"]["driver"] == "file" for layer in spec["kvstore"]["layers"])
    t = ts.open(spec, read=True).result()
    assert same(t[1, 100:200].read().result(), zoo_zstd.arrays["big/whole"][1, 100:200])


@pytest.mark.parametrize("link", [True, False])
def test_export_zarr(zoo_zstd, tmp_path, link):
    dest = tmp_path / "plain"
    store = open_store(zoo_zstd.root)
    export_zarr(store, dest, link=link)
    group = zarr.open_group(str(dest), mode="r")  # ravex.format is imported: extension types known
    for path, expected in zoo_zstd.arrays.items():
        assert same(group[path][...], expected), path
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(dest / path)}}, read=True).result()
        assert same(t.read().result(), expected), path
    ref = store.open_step("latest").arrays["big/whole"].chunks["c/0/0"]
    exported, original = (dest / "big/whole/c/0/0").stat(), (zoo_zstd.root / object_key(ref.object)).stat()
    assert (exported.st_ino == original.st_ino) is link
    with pytest.raises(FileExistsError):
        export_zarr(store, dest)


def test_export_safetensors(zoo_zstd, tmp_path):
    from safetensors import safe_open

    from ravex.format.errors import UnsupportedValueError

    dest = tmp_path / "state.safetensors"
    with pytest.raises(UnsupportedValueError, match="complex128"):
        export_safetensors(zoo_zstd.root, dest)
    assert not dest.exists()
    dtypes = sorted({p.split("/")[1] for p in zoo_zstd.arrays if p.startswith("tensors/")} - {"complex128"})
    for group in ["big", *(f"tensors/{n}" for n in dtypes)]:
        export_safetensors(zoo_zstd.root, dest, subtree=tuple(group.split("/")), sep="/")
        with safe_open(str(dest), framework="pt") as f:  # torch: the framework with bf16 and float8
            expected = {p.removeprefix(group + "/"): a for p, a in zoo_zstd.arrays.items() if p.startswith(group + "/")}
            assert set(f.keys()) == set(expected)
            for name, want in expected.items():
                assert same(torch_numpy(f.get_tensor(name)), want), (group, name)
            tree = json.loads(f.metadata()["ravex.tree"])
        if group == "big":
            assert tree == {"whole": {"$array": "whole"}, "sharded": {"$array": "sharded"}}


def test_export_safetensors_subtree_names(example_dir, tmp_path):
    from safetensors.numpy import load_file

    dest = tmp_path / "model.safetensors"
    export_safetensors(example_dir, dest, step=1, subtree="model")
    with open(dest, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert sorted(k for k in header if k != "__metadata__") == ["bias", "emb", "scale", "weight"]
    assert header["emb"]["dtype"] == "BF16" and header["scale"]["dtype"] == "F8_E4M3"
    assert (8 + len(json.dumps(header, separators=(",", ":")))) % 8 in range(8)  # header parses
    weight = np.load(example_dir / "expected/1/model/weight.npy")
    try:
        loaded = load_file(str(dest))
    except (TypeError, ValueError, KeyError, AttributeError):  # numpy has no bfloat16/float8
        return
    assert same(loaded["weight"], weight)


def test_export_pt(zoo_zstd, tmp_path):
    import torch

    from ravex.saving.export import export_pt

    dest = tmp_path / "state.pt"
    export_pt(zoo_zstd.root, dest)
    tree = torch.load(dest, weights_only=True)
    assert tree["lr"] == 0.5 and tree["pair"] == (1, None) and tree["blob"] == b"\x00\xff" and tree["ids"] == {1: "one"}
    assert tree["tensors"]["bfloat16"]["multi"].dtype == torch.bfloat16
    assert tree["tensors"]["float8_e5m2"]["multi"].dtype == torch.float8_e5m2
    for path, expected in zoo_zstd.arrays.items():
        node = tree
        for key in path.split("/"):
            node = node[key]
        assert same(torch_numpy(node), expected), path
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]  # no temp file left beside it
