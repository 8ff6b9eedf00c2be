"""The run record document (``runs/<run>.json``): written once, read back exactly, checked."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from ravex.format import RavexError, UnsafeNameError, open_store
from ravex.format.history.runs import GitState, ResumeCheck, RunRecord, read_run, run_key, write_run


def _record(run: str = "0123abcd", **changes: object) -> RunRecord:
    fields: dict[str, object] = dict(
        run=run, created_at="2026-12-03T12:00:00.000+00:00", argv=("train.py", "--lr", "0.1"),
        script="/w/train.py", cwd="/w", git=GitState("a" * 40, True), hostname="node-1", world_size=4,
        versions={"python": "3.11.7", "torch": "2.13.0", "ravex": "0.1.0"},
        config={"checkpoint_every": (100, "default"), "checkpoint_every_seconds": (1.5, "env RAVEX_X"),
                "checkpoint_on_signal": (["SIGTERM"], "default"), "keep_last": (None, "default")})
    fields.update(changes)
    return RunRecord(**fields)  # type: ignore[arg-type]


def test_a_record_round_trips_and_is_never_replaced(tmp_path) -> None:
    store = open_store(tmp_path / "s", create=True)
    record = _record()
    assert write_run(store.storage, record) == "runs/0123abcd.json"
    assert read_run(store.storage, "0123abcd") == record
    doc = json.loads((tmp_path / "s" / "runs" / "0123abcd.json").read_text())
    assert doc["config"]["checkpoint_every_seconds"]["value"] == {"$float": "1.5"}  # typed JSON
    write_run(store.storage, _record(hostname="elsewhere"))
    assert read_run(store.storage, "0123abcd") == record  # written once
    assert read_run(store.storage, "ffff") is None  # no record: a 1.0 store


def test_no_commit_reads_back_with_its_reason(tmp_path) -> None:
    store = open_store(tmp_path / "s", create=True)
    record = _record(git=GitState(unavailable="not a git checkout"), script=None)
    write_run(store.storage, record)
    assert read_run(store.storage, "0123abcd") == record
    assert record.git.describe() == "not a git checkout"
    assert _record().git.describe() == "aaaaaaaaaaaa (dirty)"


@pytest.mark.parametrize("run", ["", "../x", "a/b", ".hidden", "x" * 129, "a\n"])
def test_a_run_id_that_would_leave_runs_is_refused(run: str) -> None:
    with pytest.raises(UnsafeNameError, match="run id is 1 to 128"):
        run_key(run)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="x"), "not a Ravex run record"),
    (lambda d: d.update(version="2.0"), "upgrade ravex"),
    (lambda d: d.pop("hostname"), "lacks 'hostname'"),
    (lambda d: d.update(world_size=0), "world_size"),
    (lambda d: d["git"].update(dirty="yes"), "git.dirty"),
    (lambda d: d.update(argv="train.py"), "argv"),
    (lambda d: d["config"]["keep_last"].update(value=0.5), "bare JSON float"),
    (lambda d: d.update(run="other"), "records run 'other'"),
])
def test_a_malformed_record_is_one_clear_error(tmp_path, mutate, message) -> None:
    store = open_store(tmp_path / "s", create=True)
    doc = _record().to_json()
    mutate(doc)
    (tmp_path / "s" / "runs").mkdir()
    (tmp_path / "s" / "runs" / "0123abcd.json").write_text(json.dumps(doc))
    with pytest.raises(RavexError, match=message):  # ManifestError, FormatVersionError
        read_run(store.storage, "0123abcd")


def test_the_spec_documents_exactly_the_members_written() -> None:
    """spec/FORMAT.md §20's table lists every member of the record Ravex writes, and no other."""
    text = (Path(__file__).resolve().parents[2] / "spec" / "FORMAT.md").read_text(encoding="utf-8")
    section = text.split("\n## 20. Run records")[1].split("\n## ")[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    checked = dataclasses.replace(_record(), resume=ResumeCheck(60, "verified", (61, 62, 63)))
    assert documented == set(checked.to_json())  # `resume`: optional, written after a checked resume


def test_a_resume_check_round_trips(tmp_path) -> None:
    store = open_store(tmp_path / "s", create=True)
    check = ResumeCheck(60, "diverged", (61, 62), 62, "the input batch differs")
    write_run(store.storage, dataclasses.replace(_record(), resume=check))
    record = read_run(store.storage, _record().run)
    assert record is not None and record.resume == check
    assert record.resume.describe().startswith("DIVERGED at step 62 (resumed from step 60)")
