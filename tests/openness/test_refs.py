"""steps/<step>/refs.json: fsspec + zarr alone open a step, in a process that cannot import
Ravex or torch, with the store as the working directory and from elsewhere, and walk it:
the root's consolidated metadata lists every group and every array of a core data type."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from open_helpers import BLOCK_RAVEX_TORCH, RAW_BITS, same

from ravex.format import open_store
from ravex.format.steps.refs import refs_key, step_refs, write_refs

#: The lines spec/FORMAT.md shows ("Reading without Ravex"), run verbatim below.
FSSPEC_LINES = """
import zarr  # and fsspec, which zarr uses for "reference://"
group = zarr.open_group("reference://", mode="r", storage_options={
    "fo": f"{root}/steps/{step}/refs.json", "template_overrides": {"u": root}})
"""

#: What stock zarr-python (no Ravex) can do with a bfloat16/float8 array: read its bits.
RAW_BITS_LINES = """
import json
refs = json.load(open(f"{root}/steps/{step}/refs.json"))
meta = json.loads(refs["refs"][f"{path}/zarr.json"])
meta["data_type"], meta["fill_value"] = {"bfloat16": "uint16"}.get(meta["data_type"], "uint8"), 0
refs["refs"][f"{path}/zarr.json"] = json.dumps(meta)
bits = zarr.open_array("reference://", path=path, mode="r",
                       storage_options={"fo": refs, "template_overrides": {"u": root}})[...]
"""

def _run_without_ravex(zoo, root: str, cwd, out_dir) -> None:
    """Open the zoo step with the spec's lines and save every array (bits for extension types)."""
    extension = sorted(p for p, a in zoo.arrays.items() if a.dtype.name in RAW_BITS)
    plain = sorted(p for p in zoo.arrays if p not in extension)
    loop = "\n".join("    " + line for line in RAW_BITS_LINES.strip().splitlines())
    code = "\n".join(
        [
            BLOCK_RAVEX_TORCH,
            f"root, step, out = {root!r}, {zoo.step}, {str(out_dir)!r}",
            "import numpy as np",
            FSSPEC_LINES,
            'assert group.attrs["ravex"]["step"] == step',
            "walked = {k: v for k, v in group.members(max_depth=None) if isinstance(v, zarr.Array)}",
            f"assert sorted(walked) == {plain!r}, sorted(walked)",
            "shown = str(group.tree())",
            f"for path in {plain!r}:",
            '    assert path.rsplit("/", 1)[-1] in shown, (path, shown)',
            '    assert walked[path][...].tobytes() == group[path][...].tobytes(), path',
            '    np.save(out + "/" + path.replace("/", "__") + ".npy", group[path][...])',
            f"for path in {extension!r}:",
            loop,
            '    np.save(out + "/" + path.replace("/", "__") + ".npy", bits)',
            'assert "ravex" not in sys.modules and "torch" not in sys.modules',
            'print("ok")',
        ]
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
    for path, expected in zoo.arrays.items():
        got = np.load(out_dir / (path.replace("/", "__") + ".npy"))
        assert same(got, expected), path


def test_refs_from_store_directory(zoo, tmp_path):
    write_refs(open_store(zoo.root), zoo.step)
    _run_without_ravex(zoo, ".", zoo.root, tmp_path)


def test_refs_from_elsewhere(zoo_zstd, tmp_path):
    write_refs(open_store(zoo_zstd.root), zoo_zstd.step)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run_without_ravex(zoo_zstd, str(zoo_zstd.root), elsewhere, tmp_path)


def test_write_refs_is_idempotent_and_deterministic(zoo_zstd):
    store = open_store(zoo_zstd.root)
    key = write_refs(store, zoo_zstd.step)
    path = zoo_zstd.root / key
    first, mtime = path.read_bytes(), path.stat().st_mtime_ns
    assert write_refs(store, zoo_zstd.step) == key == refs_key(zoo_zstd.step)
    assert path.read_bytes() == first and path.stat().st_mtime_ns == mtime  # not rewritten
    doc = json.loads(first)
    assert doc["version"] == 1 and doc["templates"] == {"u": "."}
    whole = doc["refs"]["big/whole/c/0/0"]
    assert whole[0].startswith("{{u}}/objects/") and whole[1] == 0
    assert not any(os.path.isabs(v[0]) for v in doc["refs"].values() if isinstance(v, list))


def test_committed_example_refs_are_current(example_dir):
    """spec/example's refs.json files are exactly what write_refs produces today."""
    store = open_store(example_dir)
    for step in (1, 2):
        on_disk = json.loads((example_dir / refs_key(step)).read_text())
        assert on_disk == step_refs(store, step)


def test_store_on_an_fsspec_url():
    """A store behind any fsspec URL: the template names it, and StepStore reads it too."""
    import uuid

    import zarr

    from ravex.format.interop.zarr_store import StepStore

    root = f"memory://ravex-refs-{uuid.uuid4().hex}"
    store = open_store(root, create=True)
    whole = np.arange(2 * 70_000, dtype=np.float32).reshape(2, -1)  # a row per chunk: whole objects
    with store.writer() as w:
        w.commit(3, {"w": whole, "small": np.arange(5)})
    write_refs(store, 3)
    group = zarr.open_group("reference://", mode="r", storage_options={
        "fo": f"{root}/steps/3/refs.json", "template_overrides": {"u": root}})
    assert same(group["w"][...], whole) and same(group["small"][...], np.arange(5))
    assert same(zarr.open_group(store=StepStore(root), mode="r")["w"][1], whole[1])


def test_small_chunk_steps_get_refs_only_on_demand(tmp_path):
    """A table in 2 KiB chunks: the writer leaves refs.json out (it would outweigh the rows that
    change); ``ravex export --format refs`` writes it, and stock zarr reads the step through it."""
    import zarr

    from ravex.cli import main
    from ravex.format.steps.refs import AUTO_ALWAYS_ENTRIES

    root = tmp_path / "s"
    store = open_store(root, create=True)
    table = np.arange(8192 * 64, dtype=np.float32).reshape(8192, 64)  # 256 B rows, 8 rows per chunk
    dense = np.ones((512, 512), np.float32)
    with store.writer() as w:
        w.commit(1, {"table": table, "dense": dense}, chunk_bytes={"table": 2048})
        w.commit(2, {"dense": dense})
    assert len(store.manifest(1, 0).arrays["table"].chunks) == 1024 > 0
    assert 1024 + 1 <= AUTO_ALWAYS_ENTRIES  # below the count: written whatever the chunk size
    assert (root / refs_key(1)).exists() and (root / refs_key(2)).exists()

    big = np.arange(65536 * 64, dtype=np.float32).reshape(65536, 64)  # 8192 chunks of 2 KiB
    with store.writer() as w:
        w.commit(3, {"table": big}, chunk_bytes={"table": 2048})
    assert not (root / refs_key(3)).exists()  # ~1 MiB of refs for 16 MiB of rows: left out
    out = tmp_path / "step3.refs.json"
    assert main(["export", f"{root}@3", "--format", "refs", str(out)]) == 0
    group = zarr.open_group("reference://", mode="r", storage_options={
        "fo": str(out), "template_overrides": {"u": str(root)}})
    assert same(group["table"][...], big)
    assert main(["export", f"{root}@3", "--format", "refs", str(out)]) == 2  # never overwrites


def test_step_store_walks_every_array(zoo):
    """Through StepStore (which teaches zarr-python bfloat16 and float8) the root's consolidated
    metadata lists every array, extension types included, and each reads bit-exactly from the walk."""
    import zarr

    from ravex.format.interop.zarr_store import StepStore

    group = zarr.open_group(store=StepStore(zoo.root, zoo.step), mode="r")
    walked = {k: v for k, v in group.members(max_depth=None) if isinstance(v, zarr.Array)}
    assert sorted(walked) == sorted(zoo.arrays)
    for path, expected in zoo.arrays.items():
        assert same(walked[path][...], expected), path

