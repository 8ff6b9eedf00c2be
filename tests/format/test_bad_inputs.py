"""Bad and hostile inputs to the format layer: each gets one RavexError naming what is wrong,
never a traceback from deeper down, a hang, or an allocation its shape does not justify.

One test per row of docs/BAD_INPUTS.md that no older test already proves (those rows cite
tests/format/test_errors.py and test_integrity.py). Stores are real, on disk; manifests are
edited as JSON the way a corrupt disk or a hostile writer would leave them.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import xxhash

from ravex.format import (
    CorruptObjectError,
    ManifestError,
    RavexError,
    StepNotFoundError,
    StoreNotFoundError,
    UnsafeNameError,
    open_store,
)
from ravex.format.objects.names import manifest_key, object_key
from ravex.format.reports.validate import validate
from ravex.format.steps.manifest import Manifest

ROWS, COLS = 256, 256  # float32: chunks of 64 rows = 65536 bytes at chunk_bytes=64 KiB
CHUNK_BYTES = 64 * COLS * 4


def make_store(root: Path, compression: str = "zstd") -> Any:
    """Steps 1 and 2, each with a 4-chunk tensor ``w``, a packed ``b`` and plain values."""
    store = open_store(root, create=True)
    with store.writer(compression=compression, chunk_bytes=CHUNK_BYTES) as w:
        for s in (1, 2):
            w.commit(s, {"w": np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) + s,
                         "b": np.ones(10, np.float32), "lr": 0.5})
    return open_store(root)


def edit_manifest(store: Any, edit: Callable[[dict], Any], step: int = 2) -> None:
    path = Path(store.url) / manifest_key(step, 0)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def w_entry(doc: dict) -> dict:
    return doc["arrays"]["w"]


def errors(report: Any) -> list[Any]:
    return [f for f in report.findings if f.severity == "error"]


class peak_memory:
    """Peak bytes traced (Python and numpy allocations) inside the block."""

    def __enter__(self) -> peak_memory:
        tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# ---- manifests that do not parse: the step is not complete, read says why, validate names it ----

UNPARSABLE = {
    "chunk side 0": (lambda d: w_entry(d)["zarr"]["chunk_grid"]["configuration"].update(chunk_shape=[0, COLS]),
                     "malformed zarr.json metadata"),
    "shape of bools": (lambda d: w_entry(d)["zarr"].update(shape=[True, COLS]), "malformed zarr.json metadata"),
    "negative shape": (lambda d: w_entry(d)["zarr"].update(shape=[-1, COLS]), "malformed zarr.json metadata"),
    "codecs not objects": (lambda d: w_entry(d)["zarr"].update(codecs=[1, 2]), "malformed zarr.json metadata"),
    "stored size 10**15": (lambda d: w_entry(d)["chunks"]["c/0/0"].update(size=10**15),
                           r"stored size 1000000000000000 is larger than a chunk of shape \[64, 256\] can encode to"),
    "metadata a list": (lambda d: d.update(metadata=[1, 2]), "'metadata' must be an object, got list"),
    "stats a number": (lambda d: d.update(stats=5), "'stats' must be an object, got int"),
    "step a string": (lambda d: d.update(step="2"), "field 'step' must be a JSON integer, got '2'"),
    "raw not a digest": (lambda d: w_entry(d)["chunks"]["c/0/0"].update(raw=5), "no valid 'raw' digest"),
    "inline not base64": (lambda d: w_entry(d)["chunks"].update({"c/0/0": {"inline": 5, "raw": "0" * 32}}),
                          "bad inline chunk"),
    "chunk key 25 digits": (lambda d: w_entry(d)["chunks"].update({"c/" + "9" * 25 + "/0": w_entry(d)["chunks"]
                                                                   .pop("c/3/0")}), "bad chunk key"),
    "chunk key with a newline": (lambda d: w_entry(d)["chunks"].update({"c/3/0\n": w_entry(d)["chunks"]
                                                                       .pop("c/3/0")}), "bad chunk key"),
    "arrays a list": (lambda d: d.update(arrays=[]), "'arrays' must be an object"),
    "world_size 0": (lambda d: d.update(world_size=0), r"bad step/rank/world_size 2/0/0"),
}


@pytest.mark.parametrize("case", sorted(UNPARSABLE))
def test_unparsable_manifest_is_one_manifest_error(tmp_path, case):
    edit, message = UNPARSABLE[case]
    store = make_store(tmp_path / "s")
    edit_manifest(store, edit)
    data = (Path(store.url) / manifest_key(2, 0)).read_bytes()
    with pytest.raises(ManifestError, match=message):
        Manifest.from_bytes(data, "step 2 rank 0")
    s = open_store(store.url)
    assert s.latest_step() == 1 and s.complete_steps() == [1]  # listing still works
    with pytest.raises(StepNotFoundError, match=r"step 2 .*not readable .*" + message):
        s.read(2)
    report = validate(store.url)
    assert [(f.kind, f.step) for f in errors(report)] == [("malformed_manifest", 2)]
    # GC keeps a fresh unreadable step (it may be in flight), and then deletes no object at all
    gc = s.gc(keep_last=1, dry_run=True)
    assert gc.skipped_objects_because and "step 2" in gc.skipped_objects_because


# ---- manifests that parse but that a reader refuses: validate says so too ----------------------

REFUSED = {
    "unknown data_type": (lambda d: w_entry(d)["zarr"].update(data_type="float128"),
                          ManifestError, "unknown data_type 'float128'; Ravex format 1 stores"),
    "unknown codec": (lambda d: w_entry(d)["zarr"]["codecs"][1].update(name="gzip"),
                      ManifestError, "unknown codec 'gzip'"),
    "codec chain without bytes": (lambda d: w_entry(d)["zarr"].update(codecs=[{"name": "zstd"}]),
                                  ManifestError, r"unsupported codec chain .*; expected bytes\[, zstd\|blosc\]"),
    "big-endian": (lambda d: w_entry(d)["zarr"]["codecs"][0].update(configuration={"endian": "big"}),
                   ManifestError, "big-endian chunks are not written by Ravex"),
    "blosc shuffle 'zz'": (lambda d: w_entry(d)["zarr"].update(codecs=[
        {"name": "bytes"}, {"name": "blosc", "configuration": {"shuffle": "zz"}}]),
        ManifestError, "invalid codec configuration .*KeyError"),
    "zstd level 'x'": (lambda d: w_entry(d)["zarr"]["codecs"][1]["configuration"].update(level="x"),
                       ManifestError, "invalid codec configuration .*ValueError"),
    "chunk shape disagrees": (lambda d: w_entry(d)["zarr"]["chunk_grid"]["configuration"].update(
        chunk_shape=[128, COLS]), CorruptObjectError, r"4 chunk entries for a grid of 2 .*inconsistent"),
    "chunk outside the grid": (lambda d: w_entry(d)["chunks"].update({"c/9/0": w_entry(d)["chunks"]["c/0/0"]}),
                               CorruptObjectError, r"5 chunk entries for a grid of 4"),
    "chunk missing": (lambda d: w_entry(d)["chunks"].pop("c/3/0"), CorruptObjectError,
                      r"3 chunk entries for a grid of 4"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_inconsistent_array_is_refused_by_read_and_reported_by_validate(tmp_path, case):
    edit, error, message = REFUSED[case]
    store = make_store(tmp_path / "s")
    edit_manifest(store, edit)
    s = open_store(store.url)
    assert s.latest_step() == 2  # the manifest parses: the step is complete ...
    with pytest.raises(error, match=message):
        s.read(2)  # ... but its tensor 'w' is refused, in one line naming it
    assert s.read(2, subtree="lr") == 0.5  # the rest of the step still reads
    found = errors(validate(store.url))
    assert [(f.kind, f.step, f.tensor) for f in found] == [("malformed_manifest", 2, "w")]
    assert "step 2 tensor 'w'" in found[0].message


def test_huge_shape_is_refused_before_any_allocation(tmp_path):
    store = make_store(tmp_path / "s")
    edit_manifest(store, lambda d: w_entry(d)["zarr"].update(shape=[10**12, COLS]))
    with peak_memory() as mem, pytest.raises(CorruptObjectError, match=r"grid of 15625000000 .*inconsistent"):
        open_store(store.url).read(2)
    assert mem.peak < 4 << 20
    # shape and chunk shape both huge, one chunk entry: the stored size cannot justify the chunk
    edit_manifest(store, lambda d: (w_entry(d)["zarr"].update(shape=[10**12, 10**6]),
                                    w_entry(d)["zarr"]["chunk_grid"]["configuration"].update(chunk_shape=[1, 10**6]),
                                    w_entry(d)["chunks"].clear()), step=1)
    with peak_memory() as mem, pytest.raises(CorruptObjectError, match="0 chunk entries for a grid of"):
        open_store(store.url).read(1)
    assert mem.peak < 4 << 20


def test_huge_shape_with_a_matching_chunk_map_is_a_ravex_error(tmp_path):
    """One chunk entry for a [10**9, 10**6] array: the grid checks pass, the allocation cannot."""
    store = make_store(tmp_path / "s")
    edit_manifest(store, lambda d: (w_entry(d)["zarr"].update(shape=[10**9, 10**6]),
                                    w_entry(d)["zarr"]["chunk_grid"]["configuration"].update(
                                        chunk_shape=[10**9, 10**6]),
                                    w_entry(d).update(chunks={"c/0/0": w_entry(d)["chunks"]["c/0/0"]})))
    with pytest.raises(CorruptObjectError, match=r"tensor 'w'.*not believable"):
        open_store(store.url).read(2)


def test_hostile_pack_offsets_do_not_make_one_huge_read(tmp_path):
    """Two chunks of one pack, one moved to offset 10**15: read chunk by chunk, a clean error."""
    store = make_store(tmp_path / "s", compression="none")
    chunks = store.manifest(2, 0).arrays["w"].chunks
    assert chunks["c/0/0"].offset is not None and chunks["c/0/0"].object == chunks["c/1/0"].object  # packed
    edit_manifest(store, lambda d: w_entry(d)["chunks"]["c/1/0"].update(offset=10**15))
    with peak_memory() as mem, pytest.raises(CorruptObjectError, match=r"tensor 'w' chunk c/1/0: .*gave 0 bytes"):
        open_store(store.url).read(2)
    assert mem.peak < 16 << 20, mem.peak


@pytest.mark.parametrize("compression", ["zstd", "blosc"])
def test_decompression_bomb_is_refused_without_allocating_it(tmp_path, compression):
    """A chunk whose stored bytes decode to 64 MiB where its shape allows 64 KiB, in an object
    correctly named by its hash (a hostile writer, not a bit flip): refused, never inflated."""
    store = make_store(tmp_path / "s", compression)
    codec = numcodecs.Zstd(level=3) if compression == "zstd" else numcodecs.Blosc(cname="zstd", clevel=9)
    bomb = bytes(codec.encode(np.zeros(64 << 20, np.uint8)))
    assert len(bomb) < 1 << 20
    name = xxhash.xxh3_128_hexdigest(bomb)
    store.storage.write(object_key(name), bomb)
    raw = store.manifest(2, 0).arrays["w"].chunks["c/0/0"].raw
    edit_manifest(store, lambda d: w_entry(d)["chunks"].update({"c/0/0": {"object": name, "size": len(bomb),
                                                                          "raw": raw}}))
    with peak_memory() as mem, pytest.raises(CorruptObjectError,
                                             match=rf"tensor 'w' chunk c/0/0: chunk does not decode to {CHUNK_BYTES}"):
        open_store(store.url).read(2)
    assert mem.peak < 16 << 20, mem.peak  # the bomb would be 64 MiB

    # the same bomb under the name of the chunk's real object (a hash mismatch): validate --full
    # decodes it to name the damaged chunk, and also stops at the chunk's size
    real = store.manifest(1, 0).arrays["w"].chunks["c/0/0"]
    (Path(store.url) / object_key(real.object)).write_bytes(bomb)
    edit_manifest(store, lambda d: w_entry(d)["chunks"].update({"c/0/0": {"object": real.object, "size": len(bomb),
                                                                          "raw": real.raw}}), step=1)
    with peak_memory() as mem:
        report = validate(store.url, full=True)
    assert mem.peak < 16 << 20, mem.peak
    assert {(f.kind, f.step, f.tensor, f.chunk) for f in errors(report)} >= {("hash_mismatch", 1, "w", "c/0/0")}


def test_huge_world_size_does_not_walk_every_rank(tmp_path):
    store = make_store(tmp_path / "s")
    edit_manifest(store, lambda d: d.update(world_size=10**18))
    started = time.perf_counter()
    s = open_store(store.url)
    info = s.step_info(2)
    assert not info.complete and s.latest_step() == 1
    assert info.problem == f"missing manifests of ranks [1, 2, 3, 4, 5, 6, 7, 8, ...] ({10**18 - 1} of {10**18})"
    assert validate(store.url).ok  # an incomplete step is a warning
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("text,message", [
    ("[" * 100_000 + "]" * 100_000, "RecursionError"),
    ('{"format": "ravex-manifest", "step": ' + "9" * 5000 + "}", r"ValueError: Exceeds the limit \(4300 digits\)"),
    ("\x00\xff garbage", "truncated or malformed JSON"),
    ("", "truncated or malformed JSON"),
])
def test_deep_or_non_json_manifest(tmp_path, text, message):
    store = make_store(tmp_path / "s")
    (Path(store.url) / manifest_key(2, 0)).write_bytes(text.encode("latin-1"))
    with pytest.raises(ManifestError, match=message):
        Manifest.from_bytes(text.encode("latin-1"), "step 2 rank 0")
    assert open_store(store.url).latest_step() == 1
    assert [f.kind for f in errors(validate(store.url))] == ["malformed_manifest"]


@pytest.mark.parametrize("text,message", [
    ("[" * 100_000 + "]" * 100_000, "malformed JSON .*RecursionError"),
    ('{"format": "ravex", "version": ' + "9" * 5000 + "}", "malformed JSON .*4300 digits"),
    ("\x89PNG\r\n\x1a\n", "malformed JSON"),
    ('{"format": "ravex", "version": "1.0", "hash": "md5"}', "hash 'md5' is unknown; expected 'xxh3-128'"),
    ('{"format": "ravex", "version": 1}', "malformed spec version 1; expected 'MAJOR.MINOR'"),
])
def test_hostile_root_document(tmp_path, text, message):
    store = make_store(tmp_path / "s")
    (Path(store.url) / "ravex.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(RavexError, match=message):
        open_store(store.url)
    assert not validate(store.url).ok


@pytest.mark.parametrize("tree,message", [
    ({"$evil": 1}, r"unknown tag '\$evil'; written by a newer Ravex\?"),
    ({"x": 1.5}, r"bare JSON float 1.5; floats must be tagged"),
    ({"$dict": [[1]]}, r"malformed \$dict value"),
    ({"$dict": [[[1], 2]]}, r"dict key \[1\] is not hashable"),
    ({"$tuple": 5}, r"malformed \$tuple value 5"),
    ({"$bytes": "!!"}, r"malformed \$bytes value"),
    ({"$float": "abc"}, r"malformed \$float value 'abc'"),
    ({"a": {"$array": "nope"}}, "tree names tensor 'nope' that no manifest holds"),
    ({"a": {"$x": 1, "b": 2}}, r"untagged object with '\$' key"),
])
def test_hostile_state_tree_builds_nothing_else(tmp_path, tree, message):
    store = make_store(tmp_path / "s")
    edit_manifest(store, lambda d: d.update(tree=tree))
    with pytest.raises(ManifestError, match=message):
        open_store(store.url).read(2)


@pytest.mark.parametrize("name", ["A" * 32, "0" * 31, "0" * 32 + "/", "0" * 32 + "\n", "..", "", None, 7, [1]])
def test_object_names_that_are_not_digests(tmp_path, name):
    store = make_store(tmp_path / "s")
    edit_manifest(store, lambda d: w_entry(d)["chunks"]["c/0/0"].update(object=name))
    with pytest.raises(UnsafeNameError, match="is not a 32-digit hex digest"):
        Manifest.from_bytes((Path(store.url) / manifest_key(2, 0)).read_bytes(), "step 2 rank 0")
    assert [f.kind for f in errors(validate(store.url))] == ["unsafe_name"]


@pytest.mark.parametrize("step", ["9" * 5000, "-5", "1.5", "step_", "٣", "0x10", "1\n"])
def test_bad_step_numbers(tmp_path, step):
    store = make_store(tmp_path / "s")
    with pytest.raises(StepNotFoundError, match="is not a step; use a number, 'step_100' or 'latest'"):
        store.read(step)


@pytest.mark.parametrize("grace", [float("nan"), -1.0])
def test_gc_refuses_a_grace_that_would_delete_in_flight_objects(tmp_path, grace):
    store = make_store(tmp_path / "s")
    orphan = b"an object a concurrent writer just stored" * 10
    store.storage.write(object_key(xxhash.xxh3_128_hexdigest(orphan)), orphan)
    with pytest.raises(ValueError, match=r"grace_seconds=.* must be a number of seconds >= 0"):
        store.gc(keep_last=1, grace_seconds=grace)
    assert "orphan_object" in validate(store.url).kinds()  # nothing was deleted


def test_a_file_is_not_a_store(tmp_path):
    store = make_store(tmp_path / "s")
    with pytest.raises(StoreNotFoundError, match=r"ravex.json' is not a Ravex store \(no ravex.json\)"):
        open_store(Path(store.url) / "ravex.json")  # was a bare NotADirectoryError
    assert [f.kind for f in validate(str(Path(store.url) / "ravex.json")).findings] == ["missing_root"]
