"""Who writes a timeline now: one lease per timeline (spec/FORMAT.md §21).

Every step of a timeline must come from one run at a time (spec §14, A1): two runs writing the
same timeline collide step by step ("step 10 is already complete"), and one's start-up drops the
other's in-flight step as a crashed run's. A second run started while another still writes (a
requeued job whose predecessor lives on, a double launch) is therefore told so at its start, by a
small document the writing run holds and renews, and stops before it writes anything.

Layout: ``leases/<timeline>/<generation>.json``; the highest generation holds the timeline. A run
takes it by creating the next generation exclusively (:meth:`Storage.create`: a hard link on a
local disk, a PUT with ``If-None-Match: *`` on S3), so of two runs taking it at once exactly one
wins, without a lock and without rewriting anyone's document. Generations only grow: a released or
stale lease is superseded, never reused, so no run can mistake another's document for its own.

A lease not renewed for ``stale_after`` seconds is stale, so a crashed run blocks its rerun at
most that long, and on the same machine not at all: the rerun sees that the holder's process is
gone (its pid, with the process's start time against pid reuse). A holder on another machine
whose lease is still fresh may be alive or may have just died: the new run watches it until it is
renewed (alive: stop) or goes stale (dead: take it over), a bounded wait said in one line.
"""

from __future__ import annotations

import enum
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import LeaseLostError, ManifestError, TimelineBusyError
from ..objects.names import is_decimal
from . import clock
from .jsondoc import load_document

if TYPE_CHECKING:
    from ..storage import Storage

LEASES = "leases"
LEASE_FORMAT = "ravex-lease"
#: The spec version that introduced leases.
LEASE_VERSION = "1.3"
#: How often a holder rewrites its lease (a timer: a run that trains for an hour between two
#: checkpoints keeps its timeline all along).
RENEW_SECONDS = 10.0
#: A lease not renewed for this long is stale: the longest a crashed run on another machine
#: keeps its rerun waiting. Several renewals fit in it, so a holder slowed by its storage for a
#: renewal or two keeps its timeline.
STALE_SECONDS = 60.0
#: No document may claim a timeline for longer than this between renewals (a damaged or hostile
#: ``stale_after`` must not block a timeline for days).
MAX_STALE_SECONDS = 3600.0


@dataclass(frozen=True)
class Identity:
    """A process as a lease names it. ``machine`` (the boot and pid namespace) and
    ``process_start`` (the kernel's start time of the pid) let a judge on the same machine tell
    whether the holder's process still runs; elsewhere they are None and only time tells."""

    host: str
    pid: int
    machine: str | None = None
    process_start: int | None = None

    @classmethod
    def this_process(cls) -> Identity:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _machine(), _process_start(pid))


@dataclass(frozen=True)
class Holder:
    """One lease document (spec §21)."""

    timeline: str
    generation: int
    token: str
    host: str
    pid: int
    started_at: str
    renewed_at: float
    renew_every: float = RENEW_SECONDS
    stale_after: float = STALE_SECONDS
    machine: str | None = None
    process_start: int | None = None
    released: bool = False

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": LEASE_FORMAT, "version": LEASE_VERSION, "timeline": self.timeline,
            "generation": self.generation, "token": self.token, "host": self.host, "pid": self.pid,
            "started_at": self.started_at, "renewed_at": self.renewed_at,
            "renew_every": self.renew_every, "stale_after": self.stale_after, "released": self.released,
        }
        if self.machine is not None:
            doc["machine"] = self.machine
        if self.process_start is not None:
            doc["process_start"] = self.process_start
        return doc

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), indent=2).encode() + b"\n"

    def describe(self, now: float) -> str:
        """``host h, pid 4242, started 2026-..., renewed 3 s ago``: who to look for."""
        age = max(0.0, now - self.renewed_at)
        return (f"host {self.host}, pid {self.pid}, started {self.started_at}, "
                f"renewed {age:.0f} s ago")


class Verdict(enum.Enum):
    """What a judge makes of the lease it found."""

    FREE = "free"  # released, stale, its process gone, or this very process's: take it
    HELD = "held"  # its process runs on this machine: stop
    UNSURE = "unsure"  # fresh, from another machine: watch it until renewed or stale


def lease_prefix(timeline: str) -> str:
    return f"{LEASES}/{timeline}"


def lease_key(timeline: str, generation: int) -> str:
    return f"{LEASES}/{timeline}/{generation}.json"


def parse_lease(data: bytes, key: str) -> Holder:
    """A lease document, checked; a malformed one is a :class:`ManifestError` naming ``key``."""
    doc = load_document(data, key)
    parts = key.split("/")
    ok = (isinstance(doc, dict) and doc.get("format") == LEASE_FORMAT and len(parts) == 3
          and doc.get("timeline") == parts[1] and doc.get("generation") == _generation(parts[2])
          and isinstance(doc.get("token"), str) and isinstance(doc.get("host"), str)
          and type(doc.get("pid")) is int and isinstance(doc.get("started_at"), str)
          and _number(doc.get("renewed_at")) and _number(doc.get("renew_every"))
          and _number(doc.get("stale_after")) and 0 < doc["renew_every"] <= doc["stale_after"]
          and isinstance(doc.get("released", False), bool))
    if not ok:
        raise ManifestError(f"{key}: not a lease document (format, timeline, generation, token, host, pid, "
                            "started_at, renewed_at, renew_every <= stale_after; spec §21)")
    machine, start = doc.get("machine"), doc.get("process_start")
    return Holder(doc["timeline"], doc["generation"], doc["token"], doc["host"], doc["pid"],
                  doc["started_at"], float(doc["renewed_at"]), float(doc["renew_every"]),
                  min(float(doc["stale_after"]), MAX_STALE_SECONDS),
                  machine if isinstance(machine, str) else None,
                  start if type(start) is int else None, bool(doc.get("released", False)))


def generations(storage: Storage, timeline: str) -> list[int]:
    """The generations of ``timeline``'s lease present, ascending."""
    found = (_generation(name) for name in storage.list_dir(lease_prefix(timeline)))
    return sorted(g for g in found if g is not None)


def read_holder(storage: Storage, timeline: str, now: float | None = None) -> Holder | None:
    """The document of the highest generation, None when the timeline has none. One that does
    not parse (damage: lease documents land whole) is judged by its modification time, as a
    holder nobody can name that is renewed never again."""
    for _ in range(8):  # a generation deleted between the listing and the read: list again
        gens = generations(storage, timeline)
        if not gens:
            return None
        key = lease_key(timeline, gens[-1])
        try:
            return parse_lease(storage.read(key), key)
        except FileNotFoundError:
            continue
        except ManifestError:
            listing = storage.walk(lease_prefix(timeline))
            when = next((o.mtime for o in listing if o.key == key), now if now is not None else time.time())
            return Holder(timeline, gens[-1], f"unreadable:{key}", "?", 0, f"(unreadable {key})", when)
    return None


def judge(holder: Holder, me: Identity, now: float,
          alive: Callable[[int, int | None], bool | None] | None = None) -> Verdict:
    """What ``me`` may do with the lease ``holder``: take it, stop, or watch it.

    Released, or not renewed for ``stale_after`` (clocks agreeing to well under that, as GC's
    grace assumes of mtimes): free. On the same machine (boot and pid namespace), the holder's
    pid tells: gone (or reused by a process started at another time, or a zombie) is free,
    running is held, this very process is free (a re-activation). Elsewhere a fresh lease may
    belong to a live run or to one that just died: unsure."""
    if holder.released or now - holder.renewed_at > holder.stale_after:
        return Verdict.FREE
    if holder.machine is None or holder.machine != me.machine:
        return Verdict.UNSURE
    if holder.pid == me.pid and holder.process_start == me.process_start:
        return Verdict.FREE
    running = (alive or process_alive)(holder.pid, holder.process_start)
    if running is None:
        return Verdict.UNSURE
    return Verdict.HELD if running else Verdict.FREE


class Lease:
    """This run's hold on one timeline. :meth:`acquire` takes it; :meth:`renew` (on a timer) keeps
    it; :meth:`confirm` (before each manifest) raises :class:`LeaseLostError` once another run has
    taken it; :meth:`release` (at exit) frees it at once for the next run."""

    def __init__(self, storage: Storage, holder: Holder, clock_: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.holder = holder
        self._clock = clock_

    @property
    def timeline(self) -> str:
        return self.holder.timeline

    @property
    def key(self) -> str:
        return lease_key(self.holder.timeline, self.holder.generation)

    @classmethod
    def acquire(
        cls,
        storage: Storage,
        timeline: str,
        *,
        identity: Identity | None = None,
        wait: bool = True,
        notify: Callable[[Holder, float], None] | None = None,
        clock_: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        alive: Callable[[int, int | None], bool | None] | None = None,
        renew_every: float = RENEW_SECONDS,
        stale_after: float = STALE_SECONDS,
    ) -> Lease:
        """Take ``timeline`` for this process, or raise :class:`TimelineBusyError` naming the run
        that holds it. A fresh lease of another machine is watched (``wait``), for at most its
        ``stale_after``: renewed meanwhile, its run is alive and this one stops; not renewed, its
        run died and this one takes over. ``notify(holder, seconds)`` is told once before it waits."""
        me = identity or Identity.this_process()
        where = storage.url
        watched: tuple[str, float] | None = None
        changes = 0  # holders seen come and go, and creates lost to another run: bounded
        while changes < 64:
            now = clock_()
            holder = read_holder(storage, timeline, now)
            verdict = Verdict.FREE if holder is None else judge(holder, me, now, alive)
            if holder is not None and verdict is Verdict.HELD:
                raise TimelineBusyError(_busy(timeline, where, holder, now, "its process is running on this machine"))
            if holder is not None and verdict is Verdict.UNSURE:
                seen = (holder.token, holder.renewed_at)
                if not wait or (watched is not None and watched != seen and watched[0] == seen[0]):
                    raise TimelineBusyError(_busy(timeline, where, holder, now,
                                                  "its lease was renewed while this run watched it"
                                                  if wait else "its lease is fresh"))
                if watched is None or watched[0] != seen[0]:
                    changes += 1
                    if notify is not None:
                        notify(holder, max(0.0, holder.renewed_at + holder.stale_after - now))
                watched = seen
                sleep(max(0.05, min(1.0, holder.renew_every / 2, holder.renewed_at + holder.stale_after - now)))
                continue
            generation = (holder.generation if holder is not None else 0) + 1
            mine = Holder(timeline, generation, uuid.uuid4().hex, me.host, me.pid, clock.now_iso(), now,
                          renew_every, stale_after, me.machine, me.process_start)
            if storage.create(lease_key(timeline, generation), mine.encode()):
                lease = cls(storage, mine, clock_)
                lease._drop_below(generation)
                return lease
            changes += 1
        raise TimelineBusyError(f"timeline {timeline!r} of {where!r}: its lease changed hands 64 times while "
                                "this run tried to take it; stop the other runs of this timeline and rerun")

    def confirm(self) -> None:
        """Raise :class:`LeaseLostError` when the highest generation is not this run's document
        (another run judged its lease stale and took the timeline). A lease deleted by hand is
        taken again. One listing and one read."""
        gens = generations(self.storage, self.timeline)
        top = gens[-1] if gens else 0
        now = self._clock()
        if top < self.holder.generation and self.storage.create(self.key, self.holder.encode()):
            return
        other: Holder | None = None
        if top:
            try:
                other = parse_lease(self.storage.read(lease_key(self.timeline, top)), lease_key(self.timeline, top))
            except (FileNotFoundError, ManifestError):
                other = None
        if other is not None and other.token == self.holder.token:  # (a generation deleted by hand and
            return  # taken again by another run has the same number, never the same token)
        who = other.describe(now) if other is not None else "a run that has since left it"
        raise LeaseLostError(f"timeline {self.timeline!r} of {self.storage.url!r} was taken over by another run "
                             f"({who}) after this run's lease went {self.holder.stale_after:.0f} s without "
                             "renewal: this run stops checkpointing; stop one of the two runs")

    def renew(self) -> None:
        """Confirm the lease, then rewrite it with the time now (the holder's only write)."""
        self.confirm()
        renewed = replace(self.holder, renewed_at=self._clock())
        self.storage.write(self.key, renewed.encode())
        self.holder = renewed

    def release(self) -> None:
        """Mark the lease released (if this run still holds it): the next run takes it at once."""
        try:
            self.confirm()
        except LeaseLostError:
            return
        released = replace(self.holder, renewed_at=self._clock(), released=True)
        self.storage.write(self.key, released.encode())
        self.holder = released

    def _drop_below(self, generation: int) -> None:
        """Older generations are superseded: deleted (best effort; the next taker tries again)."""
        try:
            old = [lease_key(self.timeline, g) for g in generations(self.storage, self.timeline) if g < generation]
            if old:
                self.storage.delete(old)
        except OSError:
            pass


def lease_problems(storage: Storage) -> list[tuple[str, str]]:
    """``(key, problem)`` of every lease document that does not parse (for validate)."""
    found: list[tuple[str, str]] = []
    for info in storage.walk(LEASES):
        parts = info.key.split("/")
        if len(parts) != 3 or _generation(parts[2]) is None or parts[2].startswith("."):
            continue
        try:
            parse_lease(storage.read(info.key), info.key)
        except FileNotFoundError:
            continue
        except ManifestError as exc:
            found.append((info.key, str(exc)))
    return found


def active_holders(storage: Storage, me: Identity | None = None, now: float | None = None) -> list[Holder]:
    """The leases of every timeline that some other run may still hold (held or unsure, by
    :func:`judge`): what a GC that assumes no writer runs (grace 0) must not run beside."""
    me = me or Identity.this_process()
    now = time.time() if now is None else now
    found = []
    for timeline in storage.list_dir(LEASES):
        holder = read_holder(storage, timeline, now) if not timeline.startswith(".") else None
        if holder is not None and judge(holder, me, now) is not Verdict.FREE:
            found.append(holder)
    return found


def process_alive(pid: int, start: int | None) -> bool | None:
    """Whether ``pid`` runs on this machine and started at ``start`` (kernel ticks since boot);
    False for a zombie (killed, not yet reaped) and for a pid reused by a later process. None
    where this system cannot say (no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):
        return False
    return start is None or int(fields[19]) == start


def _busy(timeline: str, where: str, holder: Holder, now: float, why: str) -> str:
    """The one line a run that may not write ``timeline`` stops with: who holds it, and the fix."""
    dies = ("once it exits" if why.endswith("this machine") else
            f"{holder.stale_after:.0f} s after its last renewal if it died")
    return (f"timeline {timeline!r} of {where!r} is being written by another run ({holder.describe(now)}; "
            f"{why}): stop that run or wait for it (it frees the timeline {dies}), or give this run "
            "another `storage`")


def _generation(name: str) -> int | None:
    stem = name.removesuffix(".json")
    return int(stem) if stem != name and is_decimal(stem) and stem != "0" else None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _machine() -> str | None:
    """This boot of this kernel and this pid namespace: where a pid means the same process.
    None without ``/proc`` (then only time tells whether a lease's run died)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}"


def _process_start(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
