"""Timeline leases (spec §21): one run writes a timeline at a time. Real contenders are real
processes racing for one lease; the judgement of a lease (stale, released, its process gone, on
another machine) runs on an injected clock and identity, so no test waits on the wall clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ravex.format import open_store
from ravex.format.errors import LeaseLostError, TimelineBusyError
from ravex.format.history.leases import (
    Holder,
    Identity,
    Lease,
    Verdict,
    generations,
    judge,
    lease_key,
    read_holder,
)
from ravex.format.reports.validate import validate
from ravex.format.storage import open_storage

CHILD = Path(__file__).with_name("_lease_child.py")
ME = Identity("here", 1000, "boot/ns", 77)
OTHER_HOST = Identity("there", 2000, "other-boot/ns", 5)


class Clock:
    """Wall time that moves only when the code under test sleeps."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.slept: list[float] = []
        self.on_sleep = None

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


def _take(storage, who: Identity, clock: Clock, alive=None, **kw) -> Lease:
    return Lease.acquire(storage, "main", identity=who, clock_=clock, sleep=clock.sleep,
                         alive=alive or (lambda pid, start: True), **kw)


def test_a_second_run_on_this_machine_is_refused_naming_the_first(store):
    clock = Clock()
    first = _take(store.storage, ME, clock)
    assert first.holder.generation == 1 and generations(store.storage, "main") == [1]
    with pytest.raises(TimelineBusyError) as info:
        _take(store.storage, Identity("here", 1001, "boot/ns", 90), clock)
    line = str(info.value)
    assert "\n" not in line and "timeline 'main'" in line and store.url in line
    assert "host here, pid 1000, started " in line and "running on this machine" in line
    assert generations(store.storage, "main") == [1]  # the refused run wrote nothing


def test_a_dead_released_or_stale_holder_is_taken_over_and_the_old_one_learns_it(store):
    clock = Clock()
    old = _take(store.storage, ME, clock)
    # its process is gone (SIGKILL): the rerun on this machine takes over at once
    new = _take(store.storage, Identity("here", 1001, "boot/ns", 90), clock, alive=lambda pid, start: False)
    assert new.holder.generation == 2 and generations(store.storage, "main") == [2]  # gen 1 superseded
    with pytest.raises(LeaseLostError, match=r"taken over by another run .*pid 1001"):
        old.confirm()
    old.release()  # a lost lease is not released: the new holder's stays
    assert read_holder(store.storage, "main").token == new.holder.token
    # released at exit: the next run takes it at once, even from another machine
    new.release()
    assert _take(store.storage, OTHER_HOST, clock).holder.generation == 3
    # not renewed for its stale_after: anyone takes it (a run on another machine that died)
    clock.now += 61
    assert _take(store.storage, Identity("here", 1002, "boot/ns", 91), clock).holder.generation == 4


def test_renewal_keeps_the_lease_fresh(store):
    clock = Clock()
    lease = _take(store.storage, ME, clock)
    for _ in range(10):  # 100 s, renewed every 10 s: never stale
        clock.now += 10
        lease.renew()
    assert judge(read_holder(store.storage, "main"), OTHER_HOST, clock.now) is Verdict.UNSURE
    assert lease.holder.generation == 1


def test_another_machine_is_watched_until_it_renews_or_goes_stale(store):
    clock = Clock()
    held = _take(store.storage, OTHER_HOST, clock)
    told: list[tuple[Holder, float]] = []
    # alive: it renews while the new run watches -> refused
    clock.on_sleep = held.renew
    with pytest.raises(TimelineBusyError, match=r"host there, pid 2000.*renewed while this run watched"):
        _take(store.storage, ME, clock, notify=lambda h, s: told.append((h, s)))
    assert len(told) == 1 and told[0][0].host == "there" and told[0][1] == pytest.approx(60)
    # dead: not renewed -> taken over once stale, after at most stale_after of watching
    clock.on_sleep = None
    clock.slept.clear()
    lease = _take(store.storage, ME, clock)
    assert lease.holder.generation == 2 and 50 < sum(clock.slept) <= 61
    # a long stale_after is watched to its end, one poll a second, however many polls that is
    held = _take(store.storage, OTHER_HOST, clock, stale_after=300)
    clock.slept.clear()
    assert _take(store.storage, ME, clock).holder.generation == 4 and 290 < sum(clock.slept) <= 301
    # wait=False refuses at once
    with pytest.raises(TimelineBusyError, match="its lease is fresh"):
        _take(store.storage, Identity("far", 3, None, None), clock, wait=False, alive=lambda p, s: None)


def test_this_process_takes_its_own_lease_again(store):
    clock = Clock()
    _take(store.storage, ME, clock)
    assert _take(store.storage, ME, clock).holder.generation == 2  # a re-activation


def test_a_lease_deleted_by_hand_is_taken_again_unless_another_run_took_its_place(store, tmp_path):
    clock = Clock()
    lease = _take(store.storage, ME, clock)
    store.storage.delete([lease.key])
    lease.confirm()  # nobody else: written again
    assert read_holder(store.storage, "main").token == lease.holder.token
    store.storage.delete([lease.key])
    _take(store.storage, Identity("here", 1001, "boot/ns", 90), clock)  # generation 1 again
    with pytest.raises(LeaseLostError):
        lease.confirm()


def test_an_unreadable_lease_waits_for_its_age_and_validate_names_it(store):
    key = lease_key("main", 3)
    store.storage.write(key, b"{not json")
    report = validate(store)
    [finding] = [f for f in report.findings if f.kind == "malformed_lease"]
    assert finding.severity == "warning" and key in finding.message and "\n" not in finding.message
    mtime = next(o.mtime for o in store.storage.walk("leases") if o.key == key)
    clock = Clock(mtime + 5)
    lease = _take(store.storage, ME, clock)
    assert lease.holder.generation == 4 and 50 < sum(clock.slept) <= 56
    assert not [f for f in validate(store).findings if f.kind == "malformed_lease"]


def test_gc_with_grace_0_refuses_beside_a_live_writer(store, tmp_path):
    with store.writer() as w:
        w.commit(1, {"x": 1})
    proc = _contenders(store.url, 1)
    try:
        assert _line(proc[0]).startswith("won")
        with pytest.raises(TimelineBusyError, match=rf"grace 0 needs no run writing.*pid {proc[0].pid}"):
            store.gc(keep_last=1, grace_seconds=0)
        store.gc(keep_last=1, grace_seconds=0, dry_run=True)  # looking is fine
        store.gc(keep_last=1)  # the default grace is safe beside a writer
    finally:
        _finish(proc)
    store.gc(keep_last=1, grace_seconds=0)  # its process is gone: nobody writes


def _contenders(url: str, n: int, options: dict | None = None) -> list[subprocess.Popen]:
    """``n`` lease children (``_lease_child.py``), each told ``go`` once all are ready."""
    argv = [sys.executable, str(CHILD), url, "main"] + ([json.dumps(options)] if options else [])
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:  # all at once
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs


def _line(proc: subprocess.Popen) -> str:
    return proc.stdout.readline().strip()


def _finish(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.stdin.close()
    for p in procs:
        p.wait(timeout=60)


def race(url: str, options: dict | None = None, n: int = 4) -> None:
    """``n`` processes take one lease at once: exactly one wins, the others are told its pid."""
    procs = _contenders(url, n, options)
    try:
        results = {p.pid: _line(p) for p in procs}
    finally:
        _finish(procs)
    won = [pid for pid, line in results.items() if line.startswith("won")]
    assert len(won) == 1, results
    for pid, line in results.items():
        if pid != won[0]:
            assert line.startswith("busy ") and f"pid {won[0]}," in line, results


def test_processes_racing_for_one_lease_one_wins(store):
    race(store.url)
    race(store.url)  # its holder exited (not released): on this machine the next race starts at once


def test_create_is_exclusive_on_fsspec_memory():
    storage = open_storage(f"memory://lease-{os.getpid()}")
    assert storage.create("leases/main/1.json", b"a")
    assert not storage.create("leases/main/1.json", b"b")
    assert storage.read("leases/main/1.json") == b"a"


def test_store_with_leases_reads_and_collects_as_before(tmp_path):
    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        for step in (1, 2, 3):
            w.commit(step, {"x": step})
    lease = Lease.acquire(store.storage, "main")
    lease.release()
    assert store.complete_steps() == [1, 2, 3] and store.current().timeline.name == "main"
    assert store.timelines().keys() == {"main"}
    report = store.gc(keep_last=1, grace_seconds=0)
    assert report.deleted_steps == [1, 2] and generations(store.storage, "main") == [1]
    assert validate(store).ok
