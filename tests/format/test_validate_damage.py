"""validate(full=True) names damage where it is: a flipped byte in a chunk is an error in that
chunk (and in no other chunk of its pack), a flipped byte no step reads (a pack's dead region,
an orphan object) is a warning about the object and its byte range. Each store is written by the
format's writer; each finding is checked through the API and through ``ravex validate --full --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fmt_helpers import REPO

from ravex.format import CorruptObjectError, open_store
from ravex.format.objects.chunkref import ChunkRef
from ravex.format.objects.names import manifest_key, object_key
from ravex.format.reports.validate import ValidationReport, validate


def state(step: int) -> dict:
    """Small tensors packed together and unchanged across steps, one large tensor in an object of
    its own (unchanged), an RNG-like stream that changes every step (packed), an inline tensor."""
    rng = np.random.default_rng(0)
    return {
        "layers": {f"l{i}": rng.standard_normal(2000).astype(np.float32) for i in range(40)},
        "big": rng.standard_normal(100_000).astype(np.float32),
        "rng": np.random.default_rng(step).integers(0, 256, 1000, dtype=np.uint8),
        "tiny": np.arange(4, dtype=np.int8) + step,
    }


def write(root: Path, compression: str = "none", steps: tuple[int, ...] = (1, 2, 3)) -> str:
    store = open_store(root, create=True)
    with store.writer(compression=compression) as w:
        for s in steps:
            w.commit(s, state(s))
    return store.url


def chunk(url: str, step: int, tensor: str, key: str = "c/0") -> ChunkRef:
    return open_store(url).manifest(step, 0).arrays[tensor].chunks[key]


def flip(url: str, name: str, at: int) -> None:
    path = Path(url) / object_key(name)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def cli_validate(url: str) -> tuple[int, dict]:
    """``python -m ravex validate --full --json URL``: exit status and document."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAVEX_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "ravex", "validate", "--full", "--json", url],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def both(url: str) -> tuple[ValidationReport, int, dict]:
    """The API's full report and the CLI's, which must hold the same findings."""
    report = validate(url, full=True)
    rc, doc = cli_validate(url)
    assert doc["findings"] == [f.to_json() for f in report.findings]
    assert doc["ok"] is report.ok
    return report, rc, doc


@pytest.mark.parametrize("compression", ["none", "zstd", "blosc"])
def test_flip_in_a_live_packed_chunk_is_an_error_in_that_chunk_only(tmp_path, compression):
    url = write(tmp_path / "s", compression)
    ref = chunk(url, 3, "layers/l7")
    assert ref.offset is not None and chunk(url, 3, "layers/l8").object == ref.object  # a pack of many
    flip(url, ref.object, ref.offset + ref.size // 2)
    with pytest.raises(CorruptObjectError, match="tensor 'layers/l7' chunk c/0"):
        open_store(url).read(3)
    report, rc, doc = both(url)
    errors = [f for f in report.findings if f.severity == "error"]
    # once, at the oldest step naming it, and no other chunk of the pack
    assert [(f.kind, f.step, f.rank, f.tensor, f.chunk, f.object) for f in errors] == [
        ("hash_mismatch", 1, 0, "layers/l7", "c/0", ref.object)
    ]
    assert errors[0].ranges == ((ref.offset, ref.offset + ref.size),)
    assert report.findings == errors and not report.ok
    assert rc == 1 and doc["findings"][0]["ranges"] == [[ref.offset, ref.offset + ref.size]]


def test_flip_in_a_packs_dead_region_is_a_warning_about_the_object(tmp_path):
    url = write(tmp_path / "s")
    dead = chunk(url, 1, "rng")  # only step 1 reads it; its pack also holds every layer
    assert dead.offset is not None and chunk(url, 3, "layers/l0").object == dead.object
    report = open_store(url).gc(keep_last=2, grace_seconds=0)
    assert report.deleted_steps == [1]
    assert (Path(url) / object_key(dead.object)).exists(), "the pack stays: steps 2 and 3 read its layers"
    flip(url, dead.object, dead.offset + 10)
    open_store(url).read(2), open_store(url).read(3)  # what the kept steps read is intact
    report, rc, doc = both(url)
    [f] = report.findings
    assert (f.kind, f.severity, f.step, f.tensor, f.object) == ("unread_damage", "warning", None, None, dead.object)
    assert f.ranges == ((dead.offset, dead.offset + dead.size),)
    assert f"[{dead.offset}, {dead.offset + dead.size})" in f.message
    assert report.ok and rc == 0 and doc["findings"][0]["ranges"] == [[dead.offset, dead.offset + dead.size]]


@pytest.mark.parametrize("compression", ["none", "zstd", "blosc"])
def test_flip_in_a_whole_object_is_an_error_in_its_chunk(tmp_path, compression):
    url = write(tmp_path / "s", compression)
    ref = chunk(url, 3, "big")
    assert ref.offset is None
    flip(url, ref.object, ref.size // 2)
    report, rc, _doc = both(url)
    assert [(f.kind, f.severity, f.step, f.rank, f.tensor, f.chunk, f.object) for f in report.findings] == [
        ("hash_mismatch", "error", 1, 0, "big", "c/0", ref.object)  # once, at the oldest step naming it
    ]
    assert report.findings[0].ranges == ((0, ref.size),) and rc == 1


def test_flip_in_an_orphan_object_is_a_warning_about_the_object(tmp_path):
    url = write(tmp_path / "s", steps=(1,))
    store = open_store(url)
    with store.writer() as w:
        w.commit(2, {**state(2), "big": state(2)["big"] + 1})
    old = chunk(url, 1, "big")
    report = store.gc(keep_last=1)  # the default grace period keeps step 1's young objects
    assert report.deleted_steps == [1] and report.young_unreferenced > 0
    flip(url, old.object, 5)
    report, rc, _doc = both(url)
    mine = {f.kind: f for f in report.findings if f.object == old.object}
    assert sorted(mine) == ["orphan_object", "unread_damage"]
    assert {f.severity for f in mine.values()} == {"warning"}
    assert mine["unread_damage"].ranges == ((0, old.size),) and f"[0, {old.size})" in mine["unread_damage"].message
    assert report.ok and rc == 0


def test_flip_in_an_inline_chunk_is_an_error_in_that_chunk(tmp_path):
    url = write(tmp_path / "s")
    path = Path(url) / manifest_key(2, 0)
    text = path.read_text()
    inline = json.loads(text)["arrays"]["tiny"]["chunks"]["c/0"]["inline"]
    changed = ("B" if inline[0] == "A" else "A") + inline[1:]  # still base64: one decoded byte differs
    assert text.count(f'"inline":"{inline}"') == 1
    path.write_text(text.replace(f'"inline":"{inline}"', f'"inline":"{changed}"'))
    with pytest.raises(CorruptObjectError, match="tensor 'tiny' chunk c/0"):
        open_store(url).read(2)
    report, rc, _doc = both(url)
    assert [(f.kind, f.severity, f.step, f.rank, f.tensor, f.chunk, f.object) for f in report.findings] == [
        ("hash_mismatch", "error", 2, 0, "tiny", "c/0", None)
    ]
    assert rc == 1


def test_flip_a_codec_ignores_is_named_by_a_fresh_encoding(tmp_path):
    """Some blosc header bytes do not change the decoding: a reader gets the right data, yet
    the chunk's bytes are not what was written. Every other chunk of the pack re-encodes to its
    bytes, so the one that does not is named, and no other."""
    url = write(tmp_path / "s", "blosc")
    ref = chunk(url, 3, "layers/l7")
    path = Path(url) / object_key(ref.object)
    clean = path.read_bytes()
    want = state(3)["layers"]["l7"]
    for at in range(16):  # the header
        flip(url, ref.object, ref.offset + at)
        try:
            if open_store(url).read(3, subtree=("layers", "l7")).tobytes() == want.tobytes():
                break
        except CorruptObjectError:
            pass
        path.write_bytes(clean)
    else:
        pytest.fail("no header byte of a blosc chunk that the decoding ignores")
    report, rc, _doc = both(url)
    assert [(f.kind, f.severity, f.step, f.tensor, f.chunk, f.object) for f in report.findings] == [
        ("hash_mismatch", "error", 1, "layers/l7", "c/0", ref.object)
    ]
    assert report.findings[0].ranges == ((ref.offset, ref.offset + ref.size),) and rc == 1
