"""``copy_step``: a step copied between two stores (tiers) lands whole, sends only what the
destination lacks, keeps its timeline, and leaves the destination's GC safe (spec §11.1)."""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pytest
from fmt_helpers import assert_same, counting

from ravex.format import CopyReport, StepNotFoundError, copy_step, open_store
from ravex.format.errors import ManifestError
from ravex.format.maintenance.gc import DEFAULT_GRACE_SECONDS
from ravex.format.objects.names import object_key
from ravex.format.reports.validate import validate


def _state(step: int, changed: tuple[int, ...] = ()) -> dict:
    """Eight 256 KiB tensors (an object each) and a few small ones (packed or inline); the
    tensors in ``changed`` differ from step 10's."""
    rng = np.random.default_rng(7)
    layers = {f"w{i}": rng.standard_normal((128, 512)).astype("float32") for i in range(8)}
    for i in changed:
        layers[f"w{i}"] += step
    norms = {f"n{i}": rng.standard_normal(300).astype("float32") for i in range(4)}
    return {"model": layers, "norms": norms, "step": step, "lr": 0.1}


STATES = {10: (), 20: (0,), 30: (1, 2)}


def _open(kind: str, tmp_path, name: str):
    url = str(tmp_path / name) if kind == "local" else f"memory://copy-{uuid.uuid4().hex}/{name}"
    return open_store(url, create=True)


def _names(store, step: int) -> set[str]:
    """Every object the step's manifests name."""
    owner, number = store.locate(step)
    info = owner.step_info(number)
    return {n for r in info.ranks for e in owner.manifest(number, r).arrays.values() for n in e.object_names()}


def _sizes(store, names: set[str]) -> int:
    return sum(store.storage.size(object_key(n)) for n in names)


@pytest.fixture
def src(tmp_path):
    store = open_store(tmp_path / "src", create=True)
    with store.writer() as w:
        for step, changed in STATES.items():
            w.commit(step, _state(step, changed))
    return store


@pytest.mark.parametrize("kinds", [("local", "local"), ("local", "memory"), ("memory", "local")])
def test_second_copy_sends_only_the_changed_objects(tmp_path, kinds):
    src = _open(kinds[0], tmp_path, "src")
    with src.writer() as w:
        for step, changed in STATES.items():
            w.commit(step, _state(step, changed))
    dst = _open(kinds[1], tmp_path, "dst")
    first = copy_step(src, dst, 10)
    assert (first.objects_copied, first.objects_present, first.manifests_copied) == (len(_names(src, 10)), 0, 1)
    assert first.bytes_copied == _sizes(src, _names(src, 10))

    second = copy_step(src, dst, 20)
    new = _names(src, 20) - _names(src, 10)
    assert 0 < len(new) < len(_names(src, 20)) / 2  # the state shares most chunks
    assert second.objects_copied == len(new) and second.bytes_copied == _sizes(src, new), second
    assert second.objects_present == len(_names(src, 20) & _names(src, 10))
    assert second.manifests_copied == 1 and second.to_json()["timeline"] == "main"

    assert dst.complete_steps() == [10, 20]
    assert_same(dst.read(20), src.read(20))
    assert_same(dst.read(10), src.read(10))
    for step in (10, 20):  # byte-identical manifests
        assert dst.storage.read(dst.manifest_key(step, 0)) == src.storage.read(src.manifest_key(step, 0))
    report = validate(dst, full=True)
    assert report.ok, report.findings

    again = copy_step(src, dst, 20)
    assert (again.objects_copied, again.bytes_copied, again.manifests_copied) == (0, 0, 0)


def test_copying_a_step_dst_holds_costs_only_the_checks(src, tmp_path):
    dst = open_store(tmp_path / "dst", create=True)
    copy_step(src, dst, 10)
    with counting(dst.storage, ("write", "write_pending", "create", "walk", "read", "list_dir")) as log:
        report = copy_step(src, dst, 10)
    assert report == CopyReport(10, "main", seconds=report.seconds)
    ops = sorted({call[0] for call in log})
    assert ops == ["list_dir", "read"], log  # no write, no listing of objects/
    assert [c for c in log if c[0] == "read"] == [("read", "steps/10/rank-0.json")], log


def test_refs_and_no_temp_files_left(src, tmp_path):
    dst = open_store(tmp_path / "dst", create=True)
    copy_step(src, dst, 10)
    assert dst.storage.read("steps/10/refs.json") == src.storage.read("steps/10/refs.json")
    assert not [f for _, _, files in os.walk(tmp_path / "dst") for f in files if f.startswith(".tmp-")]


def test_forked_timeline_step_copies_with_its_records(src, tmp_path):
    exp = src.fork(20, "exp", run="r-exp")
    with exp.writer() as w:
        w.commit(25, _state(25, (3,)))
    deeper = exp.fork(25, "deeper")
    with deeper.writer() as w:
        w.commit(26, _state(26, (4,)))
    dst = open_store(tmp_path / "dst", create=True)

    report = copy_step(deeper, dst, 26)
    assert report.timeline == "deeper" and report.manifests_copied == 1
    made = dst.timelines()
    for name in ("exp", "deeper"):  # ancestors too, as src has them
        have, want = made[name], src.timelines()[name]
        assert (have.parent, have.fork_step, have.run) == (want.parent, want.fork_step, want.run)
    assert_same(dst.on_timeline("deeper").read(26), deeper.read(26))

    # a step of deeper's lineage up to a fork belongs to the parent: it lands there
    assert copy_step(deeper, dst, 20).timeline == "main"
    assert copy_step(deeper, dst, 25).timeline == "exp"
    assert [n for _, n in dst.on_timeline("deeper").lineage_steps()] == [20, 25, 26]
    assert_same(dst.read("deeper@20"), src.read(20))
    assert validate(dst).ok


def test_a_timeline_dst_holds_with_another_history_is_refused(src, tmp_path):
    exp = src.fork(20, "exp")
    with exp.writer() as w:
        w.commit(25, _state(25, (3,)))
    dst = open_store(tmp_path / "dst", create=True)
    with dst.writer() as w:
        w.commit(10, _state(10))
    dst.fork(10, "exp")  # exp in dst forks at 10, src's at 20
    with pytest.raises(ManifestError, match="another history"):
        copy_step(exp, dst, 25)
    assert dst.on_timeline("exp").step_numbers() == []


def test_a_step_dst_holds_from_another_run_is_refused(src, tmp_path):
    dst = open_store(tmp_path / "dst", create=True)
    with dst.writer() as w:
        w.commit(10, _state(10))
    with pytest.raises(ManifestError, match="another step under that number"):
        copy_step(src, dst, 10)


def test_a_missing_step_is_a_step_not_found_error(src, tmp_path):
    dst = open_store(tmp_path / "dst", create=True)
    with pytest.raises(StepNotFoundError) as caught:
        copy_step(src, dst, 99)
    message = str(caught.value)
    assert "99" in message and src.url in message and "[10, 20, 30]" in message and "\n" not in message
    with src.writer(rank=0, world_size=2) as w:  # an incomplete step is no step to copy either
        w.commit(40, _state(40))
    with pytest.raises(StepNotFoundError, match="missing manifests of ranks"):
        copy_step(src, dst, 40)
    assert dst.step_numbers() == [] and list(dst.storage.walk("objects")) == []


def _two_ranks(store, step: int) -> None:
    for rank in (0, 1):
        with store.writer(rank=rank, world_size=2, run="two") as w:
            w.commit(step, {f"rank{rank}": _state(step, (rank,))["model"], "step": step})


def test_every_rank_is_copied_and_a_partial_copy_is_no_step(tmp_path):
    src = open_store(tmp_path / "src", create=True)
    _two_ranks(src, 10)
    _two_ranks(src, 20)
    dst = open_store(f"memory://copy-{uuid.uuid4().hex}/dst", create=True)

    assert copy_step(src, dst, 10).manifests_copied == 2
    for rank in (0, 1):
        assert_same(dst.read(10, rank=rank), src.read(10, rank=rank))

    only = copy_step(src, dst, 20, ranks=[1])
    assert only.manifests_copied == 1 and dst.step_info(20).ranks == (1,)
    assert not dst.step_info(20).complete and dst.complete_steps() == [10]
    assert not dst.storage.exists("steps/20/refs.json")  # written with the step's last manifest
    rest = copy_step(src, dst, 20)  # rank 1's is there: only rank 0's travels
    assert rest.manifests_copied == 1 and dst.complete_steps() == [10, 20]
    for rank in (0, 1):
        assert_same(dst.read(20, rank=rank), src.read(20, rank=rank))
    assert validate(dst).ok
    with pytest.raises(ValueError, match="world_size 2"):
        copy_step(src, dst, 20, ranks=[2])


def test_each_rank_copies_its_own_manifest_before_the_source_step_is_complete(tmp_path):
    """As each rank of a job commits and copies its own: rank 1 copies before rank 0 has
    written; the step is complete in ``dst`` when the second copy lands."""
    src = open_store(tmp_path / "src", create=True)
    dst = open_store(tmp_path / "dst", create=True)
    with src.writer(rank=1, world_size=2, run="two") as w:
        w.commit(10, {"rank1": _state(10, (1,))["model"], "step": 10})
    with pytest.raises(StepNotFoundError, match="missing manifests of ranks"):
        copy_step(src, dst, 10, ranks=[0])  # rank 0's own manifest is not there: nothing to copy
    assert copy_step(src, dst, 10, ranks=[1]).manifests_copied == 1
    assert dst.complete_steps() == []
    with src.writer(rank=0, world_size=2, run="two") as w:
        w.commit(10, {"rank0": _state(10, (0,))["model"], "step": 10})
    assert copy_step(src, dst, 10, ranks=[0]).manifests_copied == 1
    assert dst.complete_steps() == [10] and validate(dst).ok
    for rank in (0, 1):
        assert_same(dst.read(10, rank=rank), src.read(10, rank=rank))


def test_gc_keeps_the_objects_of_a_copy_whose_manifest_has_not_landed(src, tmp_path, monkeypatch):
    dst = open_store(tmp_path / "dst", create=True)
    real = dst.storage.write

    def no_manifest(key, data):
        if key.endswith("rank-0.json"):
            raise OSError("killed before the manifest")
        return real(key, data)

    monkeypatch.setattr(dst.storage, "write", no_manifest)
    with pytest.raises(OSError, match="killed"):
        copy_step(src, dst, 10)
    monkeypatch.undo()
    sent = len(list(dst.storage.walk("objects")))
    assert sent == len(_names(src, 10)) and dst.step_numbers() == []
    report = dst.gc()  # the default grace: the copy's objects are young
    assert report.deleted_objects == 0 and report.young_unreferenced == sent
    again = copy_step(src, dst, 10)  # young objects are trusted: none sent again
    assert again.objects_copied == 0 and again.objects_present == sent and dst.complete_steps() == [10]


def _age(store, seconds: float) -> None:
    """Make every object of a local store ``seconds`` old."""
    then = time.time() - seconds
    for obj in store.storage.walk("objects"):
        os.utime(store.storage.local_path(obj.key), (then, then))


def test_old_objects_are_trusted_only_where_gc_keeps_them(src, tmp_path):
    dst = open_store(tmp_path / "dst", create=True)
    copy_step(src, dst, 10)
    _age(dst, DEFAULT_GRACE_SECONDS)  # older than G/2: trusted only as step 10's, the newest complete
    assert copy_step(src, dst, 20).objects_copied == len(_names(src, 20) - _names(src, 10))

    other = open_store(tmp_path / "other", create=True)
    copy_step(src, other, 10)
    other.delete_step(10)  # its objects are garbage now: a GC may take them at any moment
    _age(other, DEFAULT_GRACE_SECONDS)
    report = copy_step(src, other, 20)
    assert report.objects_copied == len(_names(src, 20)) and report.objects_present == 0  # stored again
    assert other.gc().deleted_objects == len(_names(src, 10) - _names(src, 20))
    assert_same(other.read(20), src.read(20))


def test_the_record_of_the_steps_run_travels_with_rank_0s_manifest(tmp_path):
    """A reader of the destination finds what run wrote the step (spec §20): its record is copied
    once, byte for byte, by whichever copy carries rank 0's manifest, and never replaced."""
    from ravex.format.history.runs import GitState, RunRecord, read_run, run_key, write_run

    src = open_store(tmp_path / "src", create=True)
    record = RunRecord(run="two", created_at="2026-12-07T12:00:00.000+00:00", argv=("train.py",),
                       script="/w/train.py", cwd="/w", git=GitState(unavailable="not a git checkout"),
                       hostname="node-0", world_size=2, versions={"python": "3.11", "torch": "2.13.0",
                                                                  "ravex": "0.1.0"}, config={})
    write_run(src.storage, record)
    _two_ranks(src, 10)
    _two_ranks(src, 20)
    dst = open_store(tmp_path / "dst", create=True)
    copy_step(src, dst, 10, ranks=[1])
    assert read_run(dst.storage, "two") is None  # rank 1's copy does not carry it
    copy_step(src, dst, 10, ranks=[0])
    assert dst.storage.read(run_key("two")) == src.storage.read(run_key("two"))
    with counting(dst.storage, ("write",)) as calls:
        copy_step(src, dst, 20)
    assert ("write", run_key("two")) not in calls and ("write", "steps/20/rank-0.json") in calls  # not again
