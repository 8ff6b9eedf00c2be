"""GC repacks mostly-dead packs (spec/FORMAT.md §14, phase 3b).

After a GC with no writer running (grace 0), at most a tenth of the object bytes are read by no
kept step, whatever wrote the store: a writer without §13's pack-liveness rule (as a 1.0 writer),
or a table in small chunks that the rule leaves up to half dead. Repacked stores read bit-exact
by Ravex and by the spec's own reading sketch (what any 1.x reader does); a manifest keeps all it
said but where packed bytes live; a writer that read a manifest before GC replaced it never ends
up naming a deleted pack; and GC crashed at any storage call loses no kept step.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from _liveness_child import liveness_state
from fmt_helpers import REPO, Crash, assert_same, crash_after
from test_pack_liveness import _age_objects, _table_steps, dead_bytes

import ravex.format.maintenance.gc as gc_module
import ravex.format.writing.writer as writer_module
from ravex.format import open_store
from ravex.format.maintenance.gc import gc
from ravex.format.maintenance.repack import DEAD_BOUND, RETIRED_PREFIX, WHILE_WRITING_MIN_DEAD
from ravex.format.reports.validate import validate

TRIALS = 40


@pytest.fixture
def without_liveness_rule(monkeypatch):
    """A writer that reuses any chunk of any pack (a 1.0 writer, before §13's rule)."""
    monkeypatch.setattr(writer_module, "PACK_LIVE_FLOOR", 0.0)
    monkeypatch.setattr(writer_module, "PACK_LIVE_TARGET", 0.0)


def _long_run(root: Path, keep_last: int = 3) -> None:
    """96 steps of a small model, a checkpoint every 2, GC after each (the runtime's, grace 1 h)."""
    store = open_store(root, create=True)
    with store.writer() as w:
        for step in range(2, 97, 2):
            w.commit(step, liveness_state(step))
            gc(store, keep_last=keep_last)


def every_timelines_dead_bytes(root: Path) -> tuple[int, int]:
    """(object bytes no manifest of any timeline reads, all object bytes), from the files."""
    cover: dict[str, set[tuple[int, int]]] = {}
    for manifest in [*root.glob("steps/*/rank-*.json"), *root.glob("timelines/*/steps/*/rank-*.json")]:
        for entry in json.loads(manifest.read_bytes())["arrays"].values():
            for ref in entry["chunks"].values():
                if "object" in ref:
                    cover.setdefault(ref["object"], set()).add((ref.get("offset", 0), ref["size"]))
    dead = total = 0
    for obj in (root / "objects").glob("*/*"):
        size = obj.stat().st_size
        live = end = 0
        for offset, n in sorted(cover.get(obj.name, ())):
            live += max(0, offset + n - max(offset, end))
            end = max(end, offset + n)
        total += size
        dead += size - live
    return dead, total


def spec_reader():
    """``read_array`` of spec/FORMAT.md §12, run as written: what a reader that knows only the
    spec reads (no Ravex code)."""
    text = (REPO / "spec" / "FORMAT.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- example: reader -->\s*```python\n(.*?)\n```", text, re.S)
    assert block is not None
    namespace: dict = {}
    exec(compile(block.group(1), "FORMAT.md reader sketch", "exec"), namespace)
    return namespace["read_array"]


def assert_refs_name_present_objects(root: Path, step: int) -> None:
    """Every object a step's ``refs.json`` names exists (repacking rewrites it too)."""
    refs = root / "steps" / str(step) / "refs.json"
    if refs.exists():
        for ref in json.loads(refs.read_text())["refs"].values():
            if isinstance(ref, list):
                obj = ref[0].rsplit("/", 1)[-1]
                assert (root / "objects" / obj[:2] / obj).exists(), f"step {step} refs.json names {obj}"


def assert_every_step_reads(root: Path, state) -> None:
    """Every complete step, by Ravex and by the spec's sketch, bit-exact; validate finds no error;
    a refs.json names only objects that exist."""
    store = open_store(root)
    read_array = spec_reader()
    steps = store.complete_steps()
    assert steps
    for step in steps:
        want = state(step)
        assert_same(store.read(step), want, f"step {step}")
        arrays = store.manifest(step, 0).arrays
        for path, entry in arrays.items():
            group, name = path.split("/", 1)
            got = read_array(root, {"zarr": entry.zarr, "chunks": {k: c.to_json() for k, c in entry.chunks.items()}})
            assert got.tobytes() == want[group][name].tobytes(), f"step {step} {path} by the spec's reader"
        assert_refs_name_present_objects(root, step)
    report = validate(store, full=True)
    assert report.ok, [f.message for f in report.findings if f.severity == "error"]


def test_a_long_run_written_without_the_liveness_rule_ends_at_most_a_tenth_dead(tmp_path, without_liveness_rule):
    root = tmp_path / "s"
    _long_run(root)
    shutil.copytree(root, tmp_path / "plain")
    gc(open_store(tmp_path / "plain"), keep_last=3, grace_seconds=0, repack_packs=False)
    plain_dead, plain_total = dead_bytes(open_store(tmp_path / "plain"))
    report = gc(open_store(root), keep_last=3, grace_seconds=0)
    dead, total = dead_bytes(open_store(root))
    print(f"96 steps, keep_last 3, no liveness rule: dead after GC {plain_dead / plain_total:.1%} without "
          f"repacking, {dead / total:.1%} with it ({report.repack})")
    assert plain_dead > DEAD_BOUND * plain_total  # the problem is there ...
    assert dead <= DEAD_BOUND * total  # ... and GC bounds it
    assert report.repack is not None and report.repack.packs >= 1 and report.repack.manifests_rewritten == 3
    assert not (root / RETIRED_PREFIX).exists()  # the records went with the packs
    assert_every_step_reads(root, liveness_state)
    # a rerun of the writer continues from a replaced manifest: unchanged state writes nothing
    store = open_store(root)
    with store.writer() as w:
        assert w.commit(98, liveness_state(96)).new_bytes == 0


def test_a_table_in_small_chunks_ends_at_most_a_tenth_dead(tmp_path):
    """§13's rule leaves up to half of a pack of a sparsely updated table dead (16% here)."""
    root = tmp_path / "t"
    store = open_store(root, create=True)
    tables = list(_table_steps(1 << 16, 24, 20))
    with store.writer() as w:
        for step, table in enumerate(tables, start=1):
            w.commit(step, {"t": {"table": table}}, chunk_bytes={"t/table": 2048})
            gc(store, keep_last=3)
    report = gc(open_store(root), keep_last=3, grace_seconds=0)
    dead, total = dead_bytes(open_store(root))
    print(f"table: {report.repack}; dead after {dead / total:.1%}")
    assert report.repack is not None and report.repack.dead_bytes_before > DEAD_BOUND * report.repack.total_bytes
    assert dead <= DEAD_BOUND * total
    assert_every_step_reads(root, lambda step: {"t": {"table": tables[step - 1]}})


def test_a_replaced_manifest_keeps_everything_but_where_packed_bytes_live(tmp_path, without_liveness_rule):
    root = tmp_path / "s"
    store = open_store(root, create=True)
    with store.writer() as w:
        for step in range(1, 7):
            w.commit(step, liveness_state(step))
    key = root / "steps" / "5" / "rank-0.json"
    doc = json.loads(key.read_bytes())
    doc["x-newer-member"] = {"kept": True}  # a member from a newer 1.x writer: a 1.x GC keeps it
    key.write_text(json.dumps(doc, separators=(",", ":")))
    before = {s: json.loads((root / "steps" / str(s) / "rank-0.json").read_bytes()) for s in (4, 5, 6)}
    report = gc(open_store(root), keep_last=3, grace_seconds=0)
    assert report.repack is not None and report.repack.manifests_rewritten == 3
    moved = 0
    for step, old in before.items():
        new = json.loads((root / "steps" / str(step) / "rank-0.json").read_bytes())
        for path, entry in old["arrays"].items():
            for ck, ref in entry["chunks"].items():
                got = new["arrays"][path]["chunks"][ck]
                moved += got != ref
                assert {k: v for k, v in got.items() if k not in ("object", "offset")} == \
                    {k: v for k, v in ref.items() if k not in ("object", "offset")}
                new["arrays"][path]["chunks"][ck] = ref
        assert new == old, f"step {step}: more than object/offset changed"
    assert moved > 0
    assert_every_step_reads(root, liveness_state)


def test_dry_run_reports_the_repack_and_writes_nothing(tmp_path, without_liveness_rule):
    root = tmp_path / "s"
    _long_run(root)
    gc(open_store(root), keep_last=3, grace_seconds=0, repack_packs=False)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    report = gc(open_store(root), keep_last=3, grace_seconds=0, dry_run=True)
    assert report.repack is not None and report.repack.packs >= 1
    assert report.repack.dead_bytes_after <= DEAD_BOUND * report.repack.total_bytes
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == files


def _slow_state(step: int) -> dict:
    """Weights that change every step and a buffer that changes every 6 steps: the pack a step
    stores holds both, so once the buffer changes, the steps that still name that pack for it
    read only a fifth of it."""
    rng = np.random.default_rng(step)
    return {"m": {"fast": rng.standard_normal(4096, dtype=np.float32),
                  "slow": np.full(1024, step // 6, dtype=np.float32)}}


def test_while_a_writer_may_run_its_base_packs_are_left_and_retired_packs_wait(tmp_path, without_liveness_rule):
    """With a grace, a pack the newest step names is not repacked (a writer copies entries from its
    base without reading it again); a pack only older kept steps name is, once half dead, and the
    old pack waits out the grace after its retirement."""
    root = tmp_path / "s"
    store = open_store(root, create=True)
    state = _slow_state
    with store.writer() as w:
        for step in range(1, 14):
            w.commit(step, state(step))
    _age_objects(str(root), 3600)
    report = gc(store, keep_last=2, keep_every=4, grace_seconds=600)
    assert report.repack is not None and report.repack.packs >= 1
    newest = {r.object for e in store.manifest(13, 0).arrays.values() for r in e.chunks.values()}
    retired = {p.stem for p in (root / RETIRED_PREFIX).iterdir()}
    assert retired and not retired & newest
    assert report.retired_waiting == len(retired)
    for name in retired:
        assert (root / "objects" / name[:2] / name).exists()  # within the grace: kept
    assert_every_step_reads(root, state)
    sizes = sum((root / "objects" / name[:2] / name).stat().st_size for name in retired)
    assert report.repack.copied_bytes <= (1 - WHILE_WRITING_MIN_DEAD) * sizes  # each at least half dead


def test_a_writer_and_a_reader_racing_a_repacking_gc_never_meet_a_deleted_pack(
    tmp_path, monkeypatch, without_liveness_rule
):
    """The races of spec §14 proof step 7, made deterministic through the storage seam. GC (grace
    600 s) has chosen its packs and is retiring them when a writer commits two steps, copying
    entries from its base (the newest step, which names the sparsest pack of all); a reader opened
    a kept old step before GC replaced its manifest and reads it after. The writer's packs are not
    repacked, the reader's old pack waits out the grace, and an hour later it goes."""
    root = tmp_path / "s"
    store = open_store(root, create=True)
    writer = open_store(root).writer()
    for step in range(1, 14):
        writer.commit(step, _slow_state(step))
    _age_objects(str(root), 3600)  # written an hour ago: only the retirement rule keeps a retired pack
    reader = open_store(root).open_step(4)  # manifests read now, chunks later
    gc_store = open_store(root)
    storage = gc_store.storage
    racing: list[int] = []
    write = storage.write

    def hooked(key, data):
        if key.startswith(f"{RETIRED_PREFIX}/") and not racing:
            for step in (14, 15):  # the writer commits while GC retires packs and replaces manifests
                writer.commit(step, _slow_state(step))
                racing.append(step)
        return write(key, data)

    monkeypatch.setattr(storage, "write", hooked)
    report = gc(gc_store, keep_last=2, keep_every=4, grace_seconds=600)
    assert racing == [14, 15] and report.repack is not None and report.repack.packs >= 1
    retired = {p.stem for p in (root / RETIRED_PREFIX).iterdir()}
    step12_pack = {r.object for r in store.manifest(12, 0).arrays["m/slow"].chunks.values()}
    for step in (13, 14, 15):  # the base's packs, the deadest of all, were left to the writer
        names = {r.object for e in open_store(root).manifest(step, 0).arrays.values() for r in e.chunks.values()}
        assert not names & retired
    assert step12_pack <= {r.object for r in open_store(root).manifest(15, 0).arrays["m/slow"].chunks.values()}
    assert_same(reader.read(), _slow_state(4))  # read after GC replaced its manifest: the old pack waits
    for name in retired:
        assert (root / "objects" / name[:2] / name).exists()
    # an hour later (twice the grace) the retired packs go; what the writer and every kept step name stays
    later = gc_module.time.time() + 3600
    monkeypatch.setattr(gc_module.time, "time", lambda: later)
    report = gc(open_store(root), keep_last=2, keep_every=4, grace_seconds=600)
    assert report.retired_waiting == 0
    for name in retired:
        assert not (root / "objects" / name[:2] / name).exists()
    assert not (root / RETIRED_PREFIX).exists()
    writer.commit(16, _slow_state(16))
    writer.close()
    assert_every_step_reads(root, _slow_state)
    # the run over, a GC with no grace repacks the rest
    gc(open_store(root), keep_last=2, keep_every=4, grace_seconds=0)
    dead, total = dead_bytes(open_store(root))
    assert dead <= DEAD_BOUND * total
    assert_every_step_reads(root, _slow_state)


def test_two_ranks_and_a_forked_timeline_are_repacked_whole(tmp_path, without_liveness_rule):
    """Each rank's manifests are rewritten, and the step's refs.json after both; a timeline forked
    from main keeps its own packs and reads through the lineage bit-exact."""
    root = tmp_path / "s"
    store = open_store(root, create=True)

    def rank_state(step: int, rank: int) -> dict:
        state = liveness_state(step)
        state["rank"] = {f"id{rank}": np.full(64, rank, dtype=np.int64)}  # an array of its own per rank
        state["model"] = {f"{k}.r{rank}": v for k, v in state["model"].items()}
        return state

    writers = [open_store(root).writer(rank=r, world_size=2, run="run-1") for r in (0, 1)]
    for step in range(1, 13):
        for r, w in enumerate(writers):
            w.commit(step, rank_state(step, r))
    for w in writers:
        w.close()
    branch = store.fork(10, name="b")
    with branch.writer(rank=0, world_size=1) as w:
        for step in (11, 12):
            w.commit(step, rank_state(step + 100, 0))
    report = gc(open_store(root), keep_last=3, grace_seconds=0)
    assert report.repack is not None and report.repack.packs >= 1
    assert report.repack.manifests_rewritten == 6  # both ranks of each of the 3 kept steps of main
    dead, total = every_timelines_dead_bytes(root)
    assert dead <= DEAD_BOUND * total
    fresh = open_store(root)
    for step in fresh.complete_steps():
        for r in (0, 1):
            assert_same(fresh.read(step, rank=r), rank_state(step, r), f"step {step} rank {r}")
        assert_refs_name_present_objects(root, step)
    other = open_store(root).on_timeline("b")
    for step in (11, 12):
        assert_same(other.read(step), rank_state(step + 100, 0))
    assert_same(other.read(10, rank=1), rank_state(10, 1))  # the fork step, through the lineage
    assert validate(open_store(root), full=True).ok


def _sparse_pack(root: Path) -> tuple[str, set[tuple[int, int]]]:
    """The pack the kept steps read least of, and the ranges they read in it."""
    ranges: dict[str, set[tuple[int, int]]] = {}
    for manifest in root.glob("steps/*/rank-*.json"):
        for entry in json.loads(manifest.read_bytes())["arrays"].values():
            for ref in entry["chunks"].values():
                if "offset" in ref:
                    ranges.setdefault(ref["object"], set()).add((ref["offset"], ref["size"]))

    def live_share(name: str) -> float:
        return sum(n for _, n in ranges[name]) / (root / "objects" / name[:2] / name).stat().st_size

    name = min(ranges, key=live_share)
    return name, ranges[name]


@pytest.mark.parametrize("where", ["live", "dead"])
def test_a_damaged_pack_is_not_copied_and_damage_in_dead_bytes_goes_with_the_pack(tmp_path, where,
                                                                                 without_liveness_rule):
    root = tmp_path / "s"
    _long_run(root)
    gc(open_store(root), keep_last=3, grace_seconds=0, repack_packs=False)
    name, live = _sparse_pack(root)
    path = root / "objects" / name[:2] / name
    data = bytearray(path.read_bytes())
    covered = {i for offset, n in live for i in range(offset, offset + n)}
    spot = min(covered) if where == "live" else min(set(range(len(data))) - covered)
    data[spot] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    report = gc(open_store(root), keep_last=3, grace_seconds=0)
    assert report.repack is not None
    if where == "live":  # left as it is, for validate to name; nothing copied from it
        assert report.repack.damaged == [name] and report.repack.packs == 0 and path.exists()
        assert not validate(open_store(root), full=True).ok
    else:  # only live bytes are copied: the damage goes with the pack
        assert report.repack.damaged == [] and report.repack.packs >= 1 and not path.exists()
        assert_every_step_reads(root, liveness_state)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """The 96-step store of a writer without the liveness rule, retention applied, nothing repacked."""
    root = tmp_path_factory.mktemp("repack") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_module, "PACK_LIVE_FLOOR", 0.0)
        mp.setattr(writer_module, "PACK_LIVE_TARGET", 0.0)
        _long_run(root, keep_last=4)
    gc(open_store(root), keep_last=4, grace_seconds=0, repack_packs=False)
    return root


def test_gc_crashed_at_random_points_of_the_repack_loses_no_kept_step(long_run, tmp_path):
    """Each trial crashes a GC (keep_last 3: one more step goes, then the repack) at a random one of
    its storage calls; every kept step reads bit-exact right after, and after the next GC, which
    finishes the job within the bound."""
    seed = int(os.environ.get("RAVEX_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"crash-point seed {seed} (rerun with RAVEX_TEST_SEED={seed})")
    rng = random.Random(seed)
    shutil.copytree(long_run, tmp_path / "count")
    counted = open_store(tmp_path / "count")
    left = crash_after(counted.storage, 10**6)
    report = gc(counted, keep_last=3, grace_seconds=0)
    assert report.repack is not None and report.repack.packs >= 1
    calls = 10**6 - left[0]  # storage calls of one whole GC: every one a crash point
    kept = open_store(tmp_path / "count").complete_steps()
    crashed = 0
    for trial in range(TRIALS):
        copy = tmp_path / f"t{trial}"
        shutil.copytree(long_run, copy)
        store = open_store(copy)
        crash_after(store.storage, rng.randrange(0, calls))
        try:
            gc(store, keep_last=3, grace_seconds=0)
        except Crash:
            crashed += 1
        fresh = open_store(copy)
        for step in kept:  # after the crash, before any other GC
            assert_same(fresh.read(step), liveness_state(step), f"trial {trial} step {step}")
        assert validate(fresh).ok
        gc(fresh, keep_last=3, grace_seconds=0)  # the next GC finishes the job
        assert open_store(copy).complete_steps() == kept
        dead, total = dead_bytes(open_store(copy))
        assert dead <= DEAD_BOUND * total, (trial, dead, total)
        assert_every_step_reads(copy, liveness_state)
        shutil.rmtree(copy)
    assert crashed == TRIALS, f"only {crashed} of {TRIALS} trials crashed: crash points miss GC"
