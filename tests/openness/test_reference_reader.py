"""spec/reference_reader.py: the stand-alone reader reads the committed example store and every
store the writer produces, bit-exact, without importing Ravex, zarr or torch."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from open_helpers import RAW_BITS, same

from ravex.format import open_store

SPEC = Path(__file__).resolve().parents[2] / "spec"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_openness_{name}", SPEC / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rr = _load("reference_reader")


def _plain(value):
    """Compare trees with NaN == NaN and arrays by bits."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.itemsize, value.shape, value.tobytes())
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


@pytest.mark.parametrize("step", [1, 2])
def test_example_store_matches_expected(example_dir, step):
    arrays, tree = rr.read_step(str(example_dir), step)
    expected_dir = example_dir / "expected" / str(step)
    expected = {
        p.relative_to(expected_dir).with_suffix("").as_posix(): np.load(p, allow_pickle=False)
        for p in expected_dir.rglob("*.npy")
    }
    assert sorted(arrays) == sorted(expected)
    for path, array in arrays.items():
        assert same(array, expected[path]), path
    make_example = _load("make_example")
    assert _plain(tree) == _plain(make_example.state(step))


def test_example_latest_is_step_2(example_dir):
    _, tree = rr.read_step(str(example_dir))
    assert tree["count"] == 2000 and tree["done"] is True


def test_example_has_every_kind_of_chunk(example_dir):
    """The fixture is only useful if it exercises all of the format."""
    store = open_store(example_dir)
    kinds = set()
    for step in (1, 2):
        reader = store.open_step(step)
        for entry in reader.arrays.values():
            kinds.add(entry.codecs[-1]["name"])
            for ref in entry.chunks.values():
                kinds.add("inline" if ref.inline is not None else "pack" if ref.offset is not None else "object")
            kinds.add(entry.data_type)
        kinds.add(f"ranks={reader.world_size}")
    assert {"inline", "pack", "object", "bytes", "zstd", "bfloat16", "ranks=1", "ranks=2"} <= kinds


def test_writer_stores(zoo):
    arrays, tree = rr.read_step(str(zoo.root), zoo.step)
    assert sorted(arrays) == sorted(zoo.arrays)
    for path, array in arrays.items():
        assert array.dtype.name == zoo.arrays[path].dtype.name or array.dtype.name in ("uint16", "uint8")
        assert same(array, zoo.arrays[path]), path
    assert _plain(tree) == _plain(zoo.tree)


def test_raw_bits_without_ml_dtypes(zoo_zstd, tmp_path):
    """Without ml_dtypes, bfloat16/float8 come back as their bits; numpy, numcodecs and the
    standard library are all it needs (ravex, zarr, torch, ml_dtypes, xxhash blocked)."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ravex", "zarr", "torch", "ml_dtypes", "xxhash", "tensorstore"):
            raise ImportError(name + " is blocked")
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(SPEC)!r})
import reference_reader as rr
arrays, tree = rr.read_step({str(zoo_zstd.root)!r})
import numpy as np
for path, a in sorted(arrays.items()):
    np.save({str(tmp_path)!r} + "/" + path.replace("/", "__") + ".npy", a)
print(rr.xxhash is None, rr.ml_dtypes is None)
"""
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
    for path, expected in zoo_zstd.arrays.items():
        got = np.load(tmp_path / (path.replace("/", "__") + ".npy"))
        name = expected.dtype.name
        if name in RAW_BITS:
            assert got.dtype == RAW_BITS[name]
        assert same(got, expected), path


def test_detects_corruption(zoo_zstd, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(zoo_zstd.root, root)
    obj = max((p for p in (root / "objects").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    with pytest.raises(rr.FormatError, match=r"digest|decode"):
        rr.read_step(str(root))


def test_rejects_unknown_major(tmp_path, zoo_zstd):
    import json
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(zoo_zstd.root, root)
    doc = json.loads((root / "ravex.json").read_text())
    doc["version"] = "2.0"
    (root / "ravex.json").write_text(json.dumps(doc))
    with pytest.raises(rr.FormatError, match=r"reads 1\.x"):
        rr.read_step(str(root))


def _weight(m):
    return m["arrays"]["model/weight"]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m["arrays"].__setitem__("../escape", m["arrays"].pop("count")), "unsafe array path"),
        (lambda m: _weight(m)["chunks"]["c/0/0"].__setitem__("object", "../../ravex.json"), "bad object"),
        (lambda m: _weight(m)["zarr"].__setitem__("shape", [10**9, 16]), "chunks for a grid"),
        (lambda m: _weight(m)["chunks"].__setitem__("c/9/0", _weight(m)["chunks"].pop("c/1/0")), "outside"),
    ],
)
def test_refuses_hostile_manifests(example_dir, tmp_path, edit, match):
    import json
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(example_dir, root)
    path = root / "steps" / "1" / "rank-0.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(rr.FormatError, match=match):
        rr.read_step(str(root), 1)
