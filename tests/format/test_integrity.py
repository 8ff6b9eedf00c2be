"""Content addressing, corruption detection and validate(): each kind of damage reported
distinctly, naming step, rank and tensor; hostile names never reach outside the store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from fmt_helpers import counting, object_files

from ravex.format import (
    CorruptObjectError,
    FormatVersionError,
    ManifestError,
    RavexError,
    UnsafeNameError,
    open_store,
)
from ravex.format.objects.names import manifest_key, manifest_ranks, object_key
from ravex.format.reports.validate import validate
from ravex.format.steps.manifest import Manifest


def state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "model": {
            "w": rng.standard_normal((128, 1024)).astype(np.float32),  # 2 whole-object chunks
            "b": rng.standard_normal(3000).astype(np.float32),  # packed
            "tiny": np.arange(4, dtype=np.int8),  # inline
        },
        "lr": 0.1,
    }


def make_store(root: Path, compression: str = "none", steps: int = 2):
    store = open_store(root, create=True)
    with store.writer(compression=compression, chunk_bytes=256 << 10) as w:
        for s in range(1, steps + 1):
            w.commit(s, state(s))
    return open_store(root)


def ref_of(store, step: int, tensor: str, chunk: str = "c/0/0"):
    return store.manifest(step, 0).arrays[tensor].chunks[chunk]


def finding(report, kind: str):
    found = [f for f in report.findings if f.kind == kind]
    assert found, f"no {kind} in {[f.kind for f in report.findings]}"
    return found[0]


@pytest.mark.parametrize("compression", ["none", "zstd", "blosc"])
def test_every_object_is_named_by_the_hash_of_its_bytes(tmp_path, compression):
    store = make_store(tmp_path / "s", compression)
    files = object_files(store.url)
    assert len(files) >= 2
    for rel in files:
        data = (Path(store.url) / rel).read_bytes()
        name = xxhash.xxh3_128_hexdigest(data)
        assert rel == object_key(name).replace("/", os.sep)
    report = validate(store, full=True)
    assert report.ok and report.findings == [] and report.objects_checked == len(files)


@pytest.mark.parametrize("compression", ["none", "zstd", "blosc"])
@pytest.mark.parametrize("tensor,chunk", [("model/w", "c/1/0"), ("model/b", "c/0")])
def test_corrupt_byte_is_detected(tmp_path, compression, tensor, chunk):
    store = make_store(tmp_path / "s", compression)
    ref = ref_of(store, 2, tensor, chunk)
    path = Path(store.url) / object_key(ref.object)
    data = bytearray(path.read_bytes())
    data[(ref.offset or 0) + ref.size // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match=rf"step 2 tensor '{tensor}' chunk {chunk}"):
        open_store(store.url).read(2)
    assert open_store(store.url).read(2, subtree=("model", "tiny")).tobytes() == state(2)["model"]["tiny"].tobytes()
    quick = validate(store.url)  # sizes only: corrupt bytes of the right size are not seen
    assert quick.ok
    report = validate(store.url, full=True)
    f = finding(report, "hash_mismatch")
    assert not report.ok and f.severity == "error"
    assert (f.step, f.rank, f.object) == (2, 0, ref.object)
    assert f.tensor is not None and "step 2 rank 0 tensor" in f.message


@pytest.mark.parametrize("compression", ["none", "zstd", "blosc"])
def test_corruption_anywhere_never_gives_wrong_data(tmp_path, compression):
    """Whatever byte of a chunk is hit, a read either fails with CorruptObjectError naming the
    chunk (never a codec's own error) or returns exactly the right data (a blosc header byte
    that does not change the decoding), and validate(full=True) always reports hash_mismatch."""
    store = make_store(tmp_path / "s", compression, steps=1)
    ref = ref_of(store, 1, "model/w", "c/0/0")
    want = state(1)["model"]["w"].tobytes()
    path = Path(store.url) / object_key(ref.object)
    clean = path.read_bytes()
    errors = 0
    for pos in [*range(32), 100, ref.size // 2, ref.size - 1]:
        data = bytearray(clean)
        data[(ref.offset or 0) + pos] ^= 0xFF
        path.write_bytes(bytes(data))
        try:
            got = open_store(store.url).read(1)["model"]["w"].tobytes()
        except CorruptObjectError as exc:
            assert "step 1 tensor 'model/w' chunk c/0/0" in str(exc)
            errors += 1
        else:
            assert got == want, f"byte {pos}: wrong data returned"
        assert "hash_mismatch" in validate(store.url, full=True).kinds()
    assert errors >= 32
    path.write_bytes(clean)
    assert open_store(store.url).read(1)["model"]["w"].tobytes() == want


def test_truncated_object_is_size_mismatch(tmp_path):
    store = make_store(tmp_path / "s")
    ref = ref_of(store, 2, "model/w", "c/0/0")
    path = Path(store.url) / object_key(ref.object)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptObjectError, match=r"step 2 tensor 'model/w' chunk c/0/0.*bytes"):
        open_store(store.url).read(2)
    f = finding(validate(store.url), "size_mismatch")
    assert (f.step, f.rank, f.tensor, f.chunk, f.object) == (2, 0, "model/w", "c/0/0", ref.object)


def test_truncated_pack_is_size_mismatch(tmp_path):
    store = make_store(tmp_path / "s")
    ref = ref_of(store, 2, "model/b", "c/0")
    assert ref.offset is not None  # a packed chunk
    path = Path(store.url) / object_key(ref.object)
    path.write_bytes(path.read_bytes()[: ref.offset + ref.size - 1])
    with pytest.raises(CorruptObjectError, match=r"step 2 tensor 'model/b' chunk c/0"):
        open_store(store.url).read(2)
    f = finding(validate(store.url), "size_mismatch")
    assert (f.step, f.rank, f.tensor) == (2, 0, "model/b")


def test_deleted_object_is_missing_object(tmp_path):
    store = make_store(tmp_path / "s")
    ref = ref_of(store, 2, "model/w", "c/1/0")
    (Path(store.url) / object_key(ref.object)).unlink()
    with pytest.raises(CorruptObjectError, match=r"step 2 tensor 'model/w' chunk c/1/0: object \w+ is missing"):
        open_store(store.url).read(2)
    report = validate(store.url)
    f = finding(report, "missing_object")
    assert (f.step, f.rank, f.tensor, f.chunk) == (2, 0, "model/w", "c/1/0")
    assert not report.ok
    assert open_store(store.url).read(1)  # step 1 does not use that object


def _rewrite_manifest(store, step: int, edit) -> None:
    path = Path(store.url) / manifest_key(step, 0)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", ["truncated", "not json", "not an object", "no arrays", "bad chunk key"])
def test_damaged_manifest_is_malformed_manifest(tmp_path, damage):
    store = make_store(tmp_path / "s")
    path = Path(store.url) / manifest_key(2, 0)
    text = path.read_text()
    path.write_text({
        "truncated": text[: len(text) // 2],
        "not json": "{'format': 'ravex-manifest'",
        "not an object": "[1, 2]",
        "no arrays": json.dumps({k: v for k, v in json.loads(text).items() if k != "arrays"}),
        "bad chunk key": text.replace('"c/0/0"', '"x/0/0"', 1),
    }[damage])
    report = validate(store.url)
    f = finding(report, "malformed_manifest")
    assert (f.step, f.rank) == (2, 0) and "step 2 rank 0" in f.message
    assert not report.ok
    s = open_store(store.url)
    assert s.latest_step() == 1  # a step with an unreadable manifest is not complete
    with pytest.raises(RavexError, match="step 2"):
        s.read(2)


def test_unknown_manifest_version(tmp_path):
    store = make_store(tmp_path / "s")
    _rewrite_manifest(store, 2, lambda d: d.update(version="2.0"))
    f = finding(validate(store.url), "unknown_version")
    assert (f.step, f.rank) == (2, 0) and "2.0" in f.message
    with pytest.raises(FormatVersionError, match=r"format 2\.0.*understands 1\.x only"):
        Manifest.from_bytes((Path(store.url) / manifest_key(2, 0)).read_bytes(), "step 2 rank 0")
    # a minor version only adds: 1.7 reads, unknown fields ignored
    _rewrite_manifest(store, 1, lambda d: d.update(version="1.7", future_field={"x": 1}))
    assert open_store(store.url).read(1)["lr"] == 0.1


def test_unknown_root_version(tmp_path):
    store = make_store(tmp_path / "s")
    root = Path(store.url) / "ravex.json"
    doc = json.loads(root.read_text())
    root.write_text(json.dumps({**doc, "version": "2.0"}))
    with pytest.raises(FormatVersionError, match=r"ravex.json: written with Ravex format 2\.0.*upgrade ravex"):
        open_store(store.url)
    assert finding(validate(store.url), "unknown_version")
    root.write_text(json.dumps({**doc, "version": "1.9"}))
    assert open_store(store.url).read(2)["lr"] == 0.1


class _OpenAudit:
    """Every path this process opens while active (sys.addaudithook, installed once)."""

    paths: list[str] | None = None
    installed = False

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.paths is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            cls.paths.append(os.fsdecode(args[0]))

    def __enter__(self) -> list[str]:
        if not _OpenAudit.installed:
            sys.addaudithook(_OpenAudit.hook)
            _OpenAudit.installed = True
        _OpenAudit.paths = []
        return _OpenAudit.paths

    def __exit__(self, *exc: object) -> None:
        _OpenAudit.paths = None


@pytest.mark.parametrize(
    "hostile",
    ["object ../../../secret", "object absolute", "object 33 hex", "array path ..", "array path /abs", "array %2E%2E"],
)
def test_hostile_names_are_unsafe_and_never_followed(tmp_path, hostile):
    store = make_store(tmp_path / "s")
    # a decoy outside the store, where an escaping name would lead
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 64)
    good = ref_of(store, 2, "model/w", "c/0/0").object

    def edit(doc: dict) -> None:
        arrays = doc["arrays"]
        chunk = arrays["model/w"]["chunks"]["c/0/0"]
        kind, _, what = hostile.partition(" ")
        if kind == "object":
            chunk["object"] = {"../../../secret": "../../../secret", "absolute": str(secret),
                               "33 hex": good + "a"}[what]
        elif hostile == "array %2E%2E":
            arrays["model/%2E%2E"] = arrays.pop("model/w")  # escaped dots are a plain name: fine
        else:
            arrays[{"path ..": "model/../../secret", "path /abs": "/abs/w"}[what]] = arrays.pop("model/w")

    _rewrite_manifest(store, 2, edit)
    if hostile == "array %2E%2E":
        assert validate(store.url).ok
        return
    store_root = os.path.realpath(store.url)
    with _OpenAudit() as opened:
        report = validate(store.url, full=True)
        s = open_store(store.url)
        with pytest.raises(RavexError, match=r"unsafe|not a 32-digit"):
            s.read(2)
        assert s.latest_step() == 1
        with pytest.raises(UnsafeNameError):
            Manifest.from_bytes((Path(store.url) / manifest_key(2, 0)).read_bytes(), "step 2 rank 0")
    outside = [p for p in opened if not os.path.realpath(p).startswith(store_root + os.sep)
               and os.path.realpath(p).startswith(str(tmp_path))]
    assert outside == []
    f = finding(report, "unsafe_name")
    assert (f.step, f.rank) == (2, 0) and "tensor" in f.message and not report.ok


def test_incomplete_step_is_reported_and_ignored(tmp_path):
    store = make_store(tmp_path / "s")
    with store.writer(rank=0, world_size=2) as w:
        w.commit(3, state(3))
    s = open_store(store.url)
    assert s.latest_step() == 2
    assert s.complete_steps() == [1, 2]
    info = s.step_info(3)
    assert not info.complete and info.ranks == (0,) and info.world_size == 2
    report = validate(s)
    f = finding(report, "incomplete_step")
    assert f.step == 3 and "missing manifests of ranks [1]" in f.message
    assert report.ok  # a crash leaves this: a warning, not damage
    with pytest.raises(RavexError, match=r"step 3 .*not readable \(missing manifests of ranks \[1\]\)"):
        s.read(3)


def test_mixed_runs_do_not_make_a_step_complete(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    with store.writer(rank=0, world_size=2, run="a") as w0, store.writer(rank=1, world_size=2, run="b") as w1:
        w0.commit(1, state(1))
        w1.commit(1, state(1))
    assert store.latest_step() is None
    assert "another run" in (store.step_info(1).problem or "")


def test_orphans_are_reported_as_warnings(tmp_path):
    store = make_store(tmp_path / "s")
    orphan = b"garbage left by a crashed writer" * 40
    name = xxhash.xxh3_128_hexdigest(orphan)
    store.storage.write(object_key(name), orphan)
    report = validate(store.url)
    f = finding(report, "orphan_object")
    assert f.object == name and f.severity == "warning" and report.ok


def test_validate_missing_root(tmp_path):
    report = validate(str(tmp_path / "nothing"))
    assert finding(report, "missing_root") and not report.ok


def test_manifest_from_another_step_is_refused(tmp_path):
    store = make_store(tmp_path / "s")
    src = Path(store.url) / manifest_key(1, 0)
    dst = Path(store.url) / "steps" / "5" / "rank-0.json"
    dst.parent.mkdir()
    dst.write_bytes(src.read_bytes())
    s = open_store(store.url)
    assert s.latest_step() == 2
    with pytest.raises(RavexError, match="manifest says step 1"):
        s.manifest(5, 0)
    with pytest.raises(ManifestError):
        Manifest.from_json({"format": "ravex-manifest", "version": "1.0", "hash": "sha256"}, "x")


def test_manifest_ranks_takes_only_the_names_writers_make():
    names = ["rank-0.json", "rank-2.json", "rank-10.json", "rank-01.json", "rank-1.json\n",
             "rank-١.json", ".tmp-rank-3.json", "rank-4.json.tmp", "zarr.json"]
    assert manifest_ranks(names) == [0, 2, 10]


def test_validate_reads_each_manifest_and_lists_each_step_once(tmp_path):
    """validate() and step_info() used to parse a step's manifests twice each (and list its
    folder twice): for 10,000-tensor manifests that doubled the time of `ravex validate`."""
    store = open_store(tmp_path / "s", create=True)
    for step in (1, 2):
        with store.writer(rank=0, world_size=2, run="r") as w0, store.writer(rank=1, world_size=2, run="r") as w1:
            w0.commit(step, state(step))
            w1.commit(step, state(step))
    fresh = open_store(store.url)
    with counting(fresh.storage) as calls:
        report = validate(fresh)
    assert report.findings == [] and report.steps_checked == [1, 2]
    reads = [key for name, key in calls if name == "read" and key.endswith(".json") and "/rank-" in key]
    assert sorted(reads) == sorted(manifest_key(s, r) for s in (1, 2) for r in (0, 1))
    listed = [key for name, key in calls if name == "list_dir"]
    assert sorted(listed) == ["steps", "steps/1", "steps/2", "timelines"]  # timelines/: are there others (§19)?
