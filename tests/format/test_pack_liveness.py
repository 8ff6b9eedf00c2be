"""Packs do not keep dead bytes alive (spec/FORMAT.md §13, §14).

A commit covers at least PACK_LIVE_FLOOR of every pack it names, and PACK_LIVE_TARGET where
its own new bytes pay for it: a chunk it would reuse from a pack it otherwise left behind (an
RNG state, a frozen bias) is stored afresh, so that once the steps that read the rest of the
pack are collected, GC deletes the pack. After a training run's GC at most 10% of the object
bytes are read by no retained step; a table in small chunks keeps small deltas and at most
half its pack bytes dead. Manifests are never rewritten, and GC racing a writer, both
SIGKILLed at random points, loses nothing.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from _liveness_child import liveness_state
from fmt_helpers import PY, assert_same, child_env

from ravex.format import open_store
from ravex.format.reports.validate import validate
from ravex.format.writing.writer import PACK_LIVE_FLOOR, PACK_LIVE_TARGET

CHILD = Path(__file__).with_name("_liveness_child.py")
TRIALS = int(os.environ.get("RAVEX_LIVENESS_TRIALS", "32"))


def _coverage(store) -> dict[str, dict[int, int]]:
    """Per object, the byte ranges ``{offset: size}`` that the manifests present read."""
    cover: dict[str, dict[int, int]] = {}
    for step in store.step_numbers():
        for rank in range(store.step_info(step).world_size or 1):
            try:
                m = store.manifest(step, rank)
            except FileNotFoundError:
                continue
            for entry in m.arrays.values():
                for ref in entry.chunks.values():
                    if ref.object is not None:
                        cover.setdefault(ref.object, {})[ref.offset or 0] = ref.size
    return cover


def dead_bytes(store) -> tuple[int, int]:
    """(object bytes read by no manifest present, all object bytes) of ``store``."""
    cover = _coverage(store)
    dead = total = 0
    for obj in store.storage.walk("objects"):
        ranges = sorted(cover.get(obj.key.rsplit("/", 1)[-1], {}).items())
        live, end = 0, 0
        for offset, size in ranges:  # the union of the ranges
            live += max(0, offset + size - max(offset, end))
            end = max(end, offset + size)
        total += obj.size
        dead += obj.size - live
    return dead, total


def _packs_covered(store, step: int) -> dict[str, float]:
    """The fraction of each pack that ``step``'s manifest covers."""
    ranges: dict[str, dict[int, int]] = {}
    for entry in store.manifest(step, 0).arrays.values():
        for ref in entry.chunks.values():
            if ref.offset is not None:
                ranges.setdefault(ref.object, {})[ref.offset] = ref.size
    return {name: sum(r.values()) / store.storage.size(f"objects/{name[:2]}/{name}") for name, r in ranges.items()}


@pytest.mark.parametrize("keep_last", [1, 3, 10])
def test_a_long_run_leaves_at_most_a_tenth_of_object_bytes_dead(tmp_path, keep_last):
    """96 steps of a small model, a checkpoint every 2, GC after each (as the runtime runs it),
    then ``gc --keep-last N --grace 0``."""
    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        for step in range(2, 97, 2):
            w.commit(step, liveness_state(step))
            store.gc(keep_last=keep_last)
            assert min(_packs_covered(store, step).values()) >= PACK_LIVE_TARGET
    before = dead_bytes(store)
    store.gc(keep_last=keep_last, grace_seconds=0)
    dead, total = dead_bytes(store)
    print(f"keep_last {keep_last}: dead {dead} of {total} object bytes ({dead / total:.1%}); before GC {before}")
    assert dead <= 0.10 * total, (dead, total)
    assert validate(store, full=True).ok
    for step in store.complete_steps():
        assert_same(store.read(step), liveness_state(step))


def test_unchanged_state_committed_again_writes_nothing(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        w.commit(1, liveness_state(1))
        w.commit(2, liveness_state(2))  # the frozen chunks now sit in step 1's pack: stored afresh
        stats = w.commit(3, liveness_state(2))
    assert stats.new_bytes == 0 and stats.rewritten_chunks == 0
    with open_store(tmp_path / "s").writer() as w:  # after a restart too
        assert w.commit(4, liveness_state(2)).new_bytes == 0


def _table_steps(rows: int, steps: int, changed_rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((rows, 16), dtype=np.float32)
    for _ in range(steps):
        yield table
        table = table.copy()
        hot = rng.choice(rows, changed_rows, replace=False)
        table[hot] = rng.standard_normal((changed_rows, 16), dtype=np.float32)


def test_a_one_percent_delta_of_a_table_in_small_chunks_stays_honest(tmp_path):
    """A table of 2 KiB chunks (32 rows of 64 B each), 1% of its chunks changed per commit:
    each commit writes at most 1.05x the changed chunks' bytes plus what the liveness rule
    stores afresh; the rule stores nothing while the packs are fresh, and over a long run it
    re-stores fewer bytes than changed, every pack staying at least half read."""
    rows, steps = 1 << 17, 24  # 8 MiB: 4096 chunks in two packs
    chunk = 2048
    store = open_store(tmp_path / "s", create=True)
    changed_total = rewritten_total = 0
    prev = None
    with store.writer() as w:
        for step, table in enumerate(_table_steps(rows, steps, 41), start=1):
            stats = w.commit(step, {"t": table}, chunk_bytes={"t": chunk})
            if prev is None:
                prev = table
                continue
            diff = (prev != table).reshape(-1, chunk // 64 * 16).any(axis=1)
            changed = int(diff.sum()) * chunk
            assert stats.new_bytes <= 1.05 * changed + stats.rewritten_bytes, (step, stats)
            if step == 2:
                assert stats.rewritten_bytes == 0  # fresh packs, 99% covered
            assert min(_packs_covered(store, step).values()) >= PACK_LIVE_FLOOR
            changed_total += changed
            rewritten_total += stats.rewritten_bytes
            prev = table
    store.gc(keep_last=3, grace_seconds=0)
    dead, total = dead_bytes(store)
    # A pack is re-stored once half dead (the floor): every ln 0.5 / ln 0.99 ≈ 69 commits at 1%,
    # half of it, about 0.72x the changed bytes on average; the target's share is capped by each
    # commit's own new bytes.
    print(f"changed {changed_total} bytes, stored afresh by the liveness rule {rewritten_total} "
          f"({rewritten_total / changed_total:.2f}x); dead after GC {dead / total:.1%}")
    assert rewritten_total <= changed_total
    assert dead <= (1 - PACK_LIVE_FLOOR) * total, (dead, total)


class _Zygote:
    def __init__(self) -> None:
        env = child_env()
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([PY, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, bufsize=1)
        assert self.readline() == "zygote ready"

    def readline(self) -> str:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"liveness zygote exited (rc={self.proc.wait()})")
        return line.rstrip("\n")

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]


def _age_objects(url: str, seconds: float) -> None:
    """Make every object look ``seconds`` older: time passing between trials, with no writer
    running, so that GC racing the next writer has old garbage to collect."""
    then = time.time() - seconds
    for folder, _, files in os.walk(os.path.join(url, "objects")):
        for name in files:
            os.utime(os.path.join(folder, name), (then, then))


@pytest.mark.timeout(300)
def test_gc_racing_a_writer_sigkilled_at_random_points_loses_nothing(tmp_path):
    url = str(tmp_path / "s")
    open_store(url, create=True)
    rng = random.Random(20261203)
    z = _Zygote()
    kills = 0
    try:
        for _trial in range(TRIALS):
            target = rng.randrange(1, 16)  # the storage operation at which the kill lands (3 commits: ~15)
            z.send(f"fork {url} 3")
            pid, ops, finished = None, 0, False
            while True:
                line = z.readline()
                if line.startswith("forked "):
                    pid = int(line.split()[1])
                elif line.startswith("op "):
                    ops += 1
                elif line == "trial done" or line.startswith("Traceback"):
                    assert line == "trial done", line
                    finished = True
                    break
                if pid is not None and ops >= target:
                    os.kill(pid, signal.SIGKILL)
                    break
            z.send(f"reap {pid}")
            while not (line := z.readline()).startswith(f"reaped {pid} "):
                pass
            kills += not finished
            store = open_store(url)
            report = validate(store)
            assert report.ok, [f.message for f in report.findings if f.severity == "error"]
            for step in store.complete_steps():
                assert_same(store.read(step), liveness_state(step))
            _age_objects(url, 3600)
        z.send("quit")
        z.proc.wait(timeout=30)
    finally:
        if z.proc.poll() is None:
            z.proc.kill()
            z.proc.wait()
    assert kills >= TRIALS // 2
    store = open_store(url)
    assert store.latest_step() >= TRIALS // 2  # each trial resumed from the newest complete step
    store.gc(keep_last=3, grace_seconds=0)
    final = validate(store, full=True)
    assert final.ok, [f.message for f in final.findings if f.severity == "error"]
    for step in store.complete_steps():
        assert_same(store.read(step), liveness_state(step))
    dead, total = dead_bytes(store)
    print(f"{TRIALS} trials, {kills} kills: dead {dead} of {total} object bytes after GC")
    assert dead <= 0.10 * total, (dead, total)
