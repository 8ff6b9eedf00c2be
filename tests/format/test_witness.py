"""The witness document (spec §22): written as the spec's table says, read back exactly, a
malformed one one clear error and a validate warning, collected with its step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ravex.format import ManifestError, open_store
from ravex.format.history.witness import Witness, WitnessEntry, read_witness, witness_key, write_witness
from ravex.format.reports.validate import validate

SPEC = Path(__file__).resolve().parents[2] / "spec" / "FORMAT.md"


def _witness(step: int = 10) -> Witness:
    return Witness(step, 0, "run1", (WitnessEntry(step + 1, "0.5", "0" * 32, 1),
                                     WitnessEntry(step + 2, "0.25", None, 0)))


def _store_with_step(tmp_path: Path, step: int = 10):
    store = open_store(tmp_path / "s", create=True)
    store.writer().commit(step, {"w": np.arange(4, dtype=np.float32)})
    return store


def test_the_document_is_the_spec_table(tmp_path: Path) -> None:
    store = _store_with_step(tmp_path)
    key = write_witness(store.storage, store.steps_prefix, _witness())
    assert key == witness_key(10, 0, "steps") == "steps/10/witness-0.json"
    section = SPEC.read_text(encoding="utf-8").split("\n## 22. Witnesses")[1]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert documented == set(json.loads(store.storage.read(key)))
    assert read_witness(store.storage, store.steps_prefix, 10, 0) == _witness()
    assert read_witness(store.storage, store.steps_prefix, 10, 1) is None


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(format="x"), "not a Ravex witness"),
    (lambda d: d["entries"][0].update(batch="XYZ"), "32 lowercase hex"),
    (lambda d: d["entries"][0].update(loss="fast"), "not a number"),
    (lambda d: d["entries"].reverse(), "in order"),
    (lambda d: d.update(version="2.0"), "1.x only"),
])
def test_a_malformed_witness_is_one_clear_error_and_a_warning(tmp_path: Path, mutate, message) -> None:
    store = _store_with_step(tmp_path)
    doc = _witness().to_json()
    mutate(doc)
    store.storage.write("steps/10/witness-0.json", json.dumps(doc).encode())
    with pytest.raises(Exception, match=message):
        read_witness(store.storage, store.steps_prefix, 10, 0)
    report = validate(store)
    assert report.ok and [f.kind for f in report.findings] == ["malformed_witness"], report.findings


def test_a_witness_is_collected_with_its_step(tmp_path: Path) -> None:
    store = _store_with_step(tmp_path, 10)
    write_witness(store.storage, store.steps_prefix, _witness(10))
    store.writer().commit(20, {"w": np.arange(4, dtype=np.float32) + 1})
    store.gc(keep_last=1, grace_seconds=0)
    assert not store.storage.exists("steps/10/witness-0.json")
    assert store.complete_steps() == [20] and validate(store).ok


def test_manifest_error_is_what_a_bad_document_raises(tmp_path: Path) -> None:
    store = _store_with_step(tmp_path)
    store.storage.write("steps/10/witness-0.json", b"{not json")
    with pytest.raises(ManifestError, match="malformed JSON"):
        read_witness(store.storage, store.steps_prefix, 10, 0)
