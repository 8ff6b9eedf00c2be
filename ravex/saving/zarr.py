"""The default backend: checkpoints in the Ravex format (:mod:`ravex.format`).

A write is the commit of the step's manifest (:meth:`ZarrBackend._commit`) followed by the
steps that need a committed step, each named: ``refs.json`` of the steps every rank has
completed and the job's one log line for each (several ranks, rank 0: :mod:`ravex.saving.steps.settler`),
then retention (rank 0: one GC per store).

Steps are written to one timeline (spec/FORMAT.md §19): the one a plain rerun continues
(:meth:`~ravex.format.CheckpointStore.current`), or a new one forked by :meth:`ZarrBackend.resume_point`
when the run resumes a step that is not its timeline's newest. Its complete steps are that
timeline's history, the parent's steps up to the fork included. With several ranks the fork waits
for the ranks' agreement: rank 0 creates it once, under the run id they agreed on, and the other
ranks find it by that id (:meth:`ZarrBackend.fork_agreed`).

One run writes a timeline at a time: rank 0 holds the timeline's lease (spec §21,
:mod:`ravex.format.history.leases`) from :meth:`ZarrBackend.claim` to :meth:`ZarrBackend.close`, renewed by a
:class:`LeaseKeeper` thread and confirmed before each manifest.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, ClassVar

from ravex.format import CheckpointStore, RavexError, open_store
from ravex.format.errors import LeaseLostError
from ravex.format.history.leases import Holder, Lease
from ravex.format.history.runs import write_run
from ravex.format.history.witness import Witness, read_witness, write_witness
from ravex.format.steps.handoff import adopt_step, newest_own_step, pack_manifests, payload_timeline
from ravex.format.steps.reader import RankReader

from .backend import LIGHTNING_KEY, CheckpointBackend, LoadedStep
from .load import read_refs
from .logline import commit_text
from .plan import SavingSettings
from .ranks import place
from .steps.forks import TimelineForks
from .steps.replicas import Machines, ReplicaLink, check_machines, say_copies
from .steps.settler import Settler
from .steps.tiers import Persister, Unopened, describe, fetch, gather_witnesses
from .witness_writer import WitnessWriter
from .writer_thread import Job

logger = logging.getLogger("ravex")

#: Sections of a multi-rank tree that each rank writes for itself (under ``rank-<r>``).
PER_RANK = ("rng", "loaders", "script")


class LeaseKeeper:
    """Renews a timeline's lease every ``renew_every`` seconds on a daemon thread, so a run keeps
    its timeline however long it trains between checkpoints. A renewal that fails on storage is
    tried again at the next tick (the lease only goes stale after several); one that finds another
    run took the timeline stops, keeping the error for the next checkpoint to raise."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="ravex-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease.holder.renew_every):
            try:
                self.lease.renew()
            except LeaseLostError as exc:
                self.lost = exc
                logger.error("ravex: %s", exc)
                return
            except Exception as exc:
                if not self._failing:
                    logger.warning("ravex: the lease of timeline %r was not renewed (%s: %s); retrying every "
                                   "%.0f s", self.lease.timeline, type(exc).__name__, exc,
                                   self.lease.holder.renew_every)
                self._failing = True
            else:
                self._failing = False

    def close(self) -> None:
        """Stop renewing, then release the lease (the next run of the timeline takes it at once)."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self.lost is None:
            try:
                self.lease.release()
            except Exception as exc:  # it goes stale on its own
                logger.warning("ravex: the lease of timeline %r was not released (%s); the next run "
                               "takes it over once it is stale", self.lease.timeline, exc)


class ZarrBackend(TimelineForks, CheckpointBackend):
    """Default backend, on :mod:`ravex.format`."""

    name: ClassVar[str] = "zarr"
    multi_rank_steps: ClassVar[bool] = True
    records_runs: ClassVar[bool] = True

    def __init__(self, config: SavingSettings, rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        #: with ``local:``, the durable tier's background copy (ravex/saving/steps/tiers.py)
        self.persister: Persister | None = None
        #: with ``replicas: 1``, the other machines' local tiers and the copies to them (steps/replicas.py)
        self.link: ReplicaLink | None = None
        self.replicas: list[Persister] = []
        #: with ``replicas: 1``, the first rank of a machine other than rank 0's: it applies
        #: retention to its machine's tier (rank 0 to its own), a local GC, not one over the link
        self._keeps_tier = False
        if config.local is None:
            self.store = self._open_durable()
        else:
            self.store = self._two_tiers(config.local)
        #: the timeline this backend resumes from and writes to
        self.timeline = self.store.current()
        self._writer: Any = None
        self._run_id: str | None = None
        self._run_recorded = False
        #: several ranks rolling back: (the timeline resumed, the step) to fork once they agree;
        #: (None, None): a root timeline to start (``resume: never``)
        self._fork_from: tuple[Any, int | None] | None = None
        self._keeper: LeaseKeeper | None = None  # rank 0: the lease of the timeline it writes
        #: rank 0, several ranks: its steps not yet seen complete, and the job's line for each
        self._settler = Settler(world_size, self.store.url)
        self._handed: tuple[int, Any] | None = None  # (step, its timeline's view) rank 0 handed over
        #: (step, its timeline's view, its reader) of the last multi-rank read_step: read again
        #: (the load after the loop-position peek) or handed over, it costs no request
        self._last_read: tuple[int, Any, Any] | None = None
        self._committed: list[int] = []  # the newest steps this rank committed (their witnesses may follow)
        super().__init__(self.store.url, as_numpy=True, config=config)
        self._witnesses = WitnessWriter(self._write_witness, self._saver.wait_idle, self._committed.__contains__)

    def _open_durable(self) -> CheckpointStore:
        storage = self.config.storage
        return open_store(storage.url, create=True, storage_options=storage.storage_options())

    def _two_tiers(self, local_path: str) -> CheckpointStore:
        """The local tier, holding the newest step of the other machines' local tiers (``replicas:
        1``) or of the durable tier, if it had none as new. Where the durable tier is unreachable
        now and the local tier holds a step to resume from, the first copy that reaches the
        durable tier opens it (:class:`~.steps.tiers.Unopened`)."""
        durable: CheckpointStore | Unopened
        try:
            durable = self._open_durable()
        except RavexError as exc:
            durable = Unopened(self.config.storage.url, self._open_durable, str(exc))
        machines = Machines.from_env(self.rank, self.world_size)
        replicas = self.config.replicas
        if replicas:
            check_machines(machines, local_path)
            say_copies(machines, local_path)
        elif machines.count > 1:
            raise RavexError(
                f"local: {local_path!r} holds only this machine's ranks, and these {self.world_size} ranks "
                f"run on several machines: a step there is never complete. Set 'replicas: 1' (each machine's "
                f"local tier also keeps the other machines' steps), drop 'local:' (every checkpoint "
                f"goes to {durable.url!r}) or run on one machine")
        local = open_store(local_path, create=True)
        if replicas:
            self.link = ReplicaLink(local, machines)
            self.fork_peer = self.link.first_machine
            for partner in self.link.partners:
                fetch(local, partner.store, source=partner.source)
            gather_witnesses(local, [partner.store for partner in self.link.partners])
            self._keeps_tier = machines.rank % machines.local_world_size == 0
            self.replicas = [Persister(partner.store, 1, None, self.rank, tier="replica", in_order=True)
                             for partner in self.link.partners]
        if isinstance(durable, Unopened):
            self._without_durable(local, durable)
        else:
            fetch(local, durable)
        self.persister = Persister(durable, self.config.persist_every, self.config.persist_keep_last, self.rank)
        return local

    def _without_durable(self, local: CheckpointStore, durable: Unopened) -> None:
        """Go on with the local tier alone while the durable one is unreachable, where the local
        tier holds a step to resume from (said once); raise the durable tier's error where it
        holds none, since the durable tier may hold a step this run must resume."""
        history = local.current().lineage_steps()
        if not history:
            if self.link is not None:
                self.link.close_now()
            raise RavexError(f"{durable.error} (the local tier {local.url} holds no step to resume from)")
        if self.rank == 0:
            logger.warning("ravex: storage %s is unreachable (%s): resuming from the local tier %s (newest step "
                           "%d) and checkpointing there; each copy to storage tries it again", durable.url,
                           durable.error, local.url, history[-1][1])

    @property
    def _copies(self) -> list[Persister]:
        """The background copies out of the local tier: to the other machines', then the durable one."""
        return [*self.replicas, *([self.persister] if self.persister is not None else [])]

    def durable_tier(self) -> dict[str, Any] | None:
        # docstring inherited
        persister = self.persister
        if persister is None:
            return None
        out: dict[str, Any] = {"url": persister.url, "persisted_step": persister.persisted_step,
                               "copying": persister.copying, "last_error": persister.last_error}
        if self.replicas:  # replicas: 1, the other machines' local tiers
            out["replicas"] = [{"url": replica.url, "replicated_step": replica.persisted_step,
                                "copying": replica.copying, "last_error": replica.last_error}
                               for replica in self.replicas]
        return out

    def set_run(self, run_id: str | None) -> None:
        # docstring inherited
        self._run_id = run_id

    def discard_incomplete_above(self, floor: int | None) -> list[int]:
        """Drop the partial writes of steps newer than ``floor`` (a crashed run's), in the local
        tier and, with ``replicas: 1``, in the other machines' tiers too: their copies of a
        crashed run's partial step would mix with this run's copies of the step of that number.
        Rank 0 calls it at start, before any rank writes; rank 0 reaches every machine's tier
        (its partners), and a step above the newest complete one is in no tier complete. The
        steps dropped in any tier."""
        dropped = set(self.timeline.discard_incomplete_above(floor))
        name = self.timeline.timeline.name
        for partner in self.link.partners if self.link is not None else []:
            if name in partner.store.timelines():
                dropped.update(partner.store.on_timeline(name).discard_incomplete_above(floor))
        return sorted(dropped)

    # ── the timeline's lease (rank 0) ───────────────────────────────────

    def claim(self) -> None:
        """Rank 0 takes the lease of the timeline this run writes (spec §21), or raises
        :class:`~ravex.format.errors.TimelineBusyError` naming the run that holds it. Nothing
        to take on other ranks, nor while a fork waits for the ranks' agreement; taking the
        lease it holds again costs nothing."""
        name = self.timeline.timeline.name
        if self.rank != 0 or self._fork_from is not None:
            return
        if self._keeper is not None and self._keeper.lease.timeline == name:
            return
        self._release()
        lease = Lease.acquire(self.store.storage, name, notify=self._waiting)
        self._keeper = LeaseKeeper(lease)

    def _waiting(self, holder: Holder, seconds: float) -> None:
        logger.warning("ravex: timeline %r of %s is leased by a run on another machine (%s): waiting up to "
                       "%.0f s for it to be renewed (that run is alive: this one stops) or to go stale (it "
                       "died: this run takes the timeline over)", holder.timeline, self.url,
                       holder.describe(time.time()), seconds)

    def check_claim(self) -> None:
        """Raise the :class:`~ravex.format.errors.LeaseLostError` of a lease another run took over."""
        if self._keeper is not None and self._keeper.lost is not None:
            raise self._keeper.lost

    def _release(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.close()

    # ── writing (writer thread) ─────────────────────────────────────────

    def _make_writer(self) -> Any:
        """The writer of this run's steps. The step rank 0 checked and handed over (several
        ranks) is its delta base, from this rank's manifest of it (pinned: no request); its
        W manifests then need not stay in memory for the whole run."""
        handed, self._handed, self._last_read = self._handed, None, None
        kwargs: dict[str, Any] = {
            "rank": self.rank, "world_size": self.world_size,
            "compression": self.config.compression, "delta": self.config.delta,
            "tables": self.config.chunk_tables,
        }
        if self._run_id is not None:
            kwargs["run"] = self._run_id
        writer = self.timeline.writer(**kwargs)
        if handed is not None:
            step, view = handed
            if view.timeline.name == self.timeline.timeline.name and self.rank in view.pinned_ranks(step):
                writer.start_from(step, view.manifest(step, self.rank))
            view.forget(step)
        return writer

    def _write(self, job: Job) -> dict[str, Any]:
        result: dict[str, Any] = {"stats": self._commit(job)}
        if self.replicas:
            result["replicating"] = sum(replica.committed(self.timeline, job.step) for replica in self.replicas)
        persister = self.persister
        if persister is not None:
            result["persisting"] = persister.committed(self.timeline, job.step)
        if self.world_size > 1 and self.rank == 0:
            self._settler.tiers[job.step] = self._tiers(result)  # the job's line says where the step goes
            self._settler.settle(self.timeline, job.step)
        if self._retains:
            result["gc"] = self._retain(job.step)
        return result

    def _commit(self, job: Job) -> Any:
        """Write the step's chunks and its manifest: after this the step is this rank's."""
        if self._keeper is not None:  # no manifest lands on a timeline another run took over
            self.check_claim()
            self._keeper.lease.confirm()
        if self._writer is None:
            self._writer = self._make_writer()
            self._run_id = self._writer.run  # a writer made after a failure keeps the run's id
        plan = job.plan
        if plan.run_record is not None and not self._run_recorded:
            self._record_run(plan)
        tree = plan.tree if plan.layout is None else place(plan.tree, plan.layout)
        extra = {"chunk_bytes": dict(plan.chunk_bytes)} if plan.chunk_bytes else {}
        try:
            stats = self._writer.commit(plan.step, tree, metadata=plan.metadata, on_read=job.released.set,
                                        known=plan.known_digests, **extra)
        except BaseException:
            self._drop_writer()  # next interval starts from a fresh writer
            raise
        self._committed[:] = [*self._committed[-7:], plan.step]
        return stats

    def _record_run(self, plan: Any) -> None:
        """The run's record, before its first manifest (``runs/<run>.json``). It is informative:
        a failed write is logged and tried again with the next checkpoint, never a failed one."""
        try:
            write_run(self.store.storage, dataclasses.replace(plan.run_record, run=self._writer.run))
            self._run_recorded = True
        except Exception as exc:
            logger.warning("ravex: the run record was not written (next checkpoint tries again): %s", exc)

    @property
    def last_job_line(self) -> str | None:
        """Rank 0, several ranks: the job's line for the newest complete step."""
        return self._settler.last_job_line

    def _log_line(self, line: str) -> None:
        """Several ranks: this rank's line only at DEBUG (it stays ``ravex.status()``'s
        ``last_log_line``); rank 0 prints the job's line once the step is complete
        (:class:`~ravex.saving.steps.settler.Settler`)."""
        if self.world_size > 1:
            logger.debug("%s", line)
        else:
            super()._log_line(line)

    @property
    def _retains(self) -> bool:
        """This rank applies its store's retention (``keep_last``/``keep_every`` set): rank 0,
        and with ``replicas: 1`` the first rank of each machine, in that machine's tier."""
        return (self.rank == 0 or self._keeps_tier) and bool(self.config.keep_last or self.config.keep_every)

    def _retain(self, step: int) -> float:
        """Retention (``keep_last``/``keep_every``): the store's GC; its seconds. A failure
        is logged, not a failed checkpoint."""
        started = time.perf_counter()
        try:
            self.store.gc(keep_last=self._keep_last_now(), keep_every=self.config.keep_every)
        except Exception as exc:
            logger.warning("ravex: retention (gc) failed after step %d: %s", step, exc)
        return time.perf_counter() - started

    def _keep_last_now(self) -> int | None:
        """``keep_last``, raised to keep each local step a background copy has yet to read (a
        copy to the durable tier or another machine's: retention must not wait for the copies,
        which may never all be idle at once)."""
        keep = self.config.keep_last
        needed = [step for copy in self._copies if (step := copy.oldest_needed) is not None]
        if keep is None or not needed:
            return keep
        return max(keep, sum(1 for step in self.timeline.complete_steps() if step >= min(needed)))

    def _drop_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:
                pass

    def _phases(self, result: dict[str, Any]) -> dict[str, float]:
        """The commit's phases (hash, encode and write summed over the writer's threads;
        manifest, refs and the commit's wall ``total``) and retention's ``gc``."""
        out = {k: float(v) for k, v in (result["stats"].seconds or {}).items()}
        if "gc" in result:
            out["gc"] = float(result["gc"])
        return out

    def _describe(self, job: Job, result: dict[str, Any]) -> str:
        return commit_text(result["stats"], result.get("gc")) + self._tiers(result)

    def _tiers(self, result: dict[str, Any]) -> str:
        """The tiers half of a checkpoint's line (with ``local:``), from :meth:`_write`'s result."""
        if self.persister is None:
            return ""
        return describe(result.get("persisting", False), result.get("replicating", 0))

    # ── the resume witness (spec §22) ───────────────────────────────────

    def write_witness(self, witness: Witness) -> None:
        # docstring inherited
        self._witnesses.put(witness)

    def _write_witness(self, witness: Witness) -> None:
        """Witness thread: into the step's folder, under the run id its manifest carries. A step
        retention collected meanwhile (a fast loop outruns the queue) needs none."""
        timeline = self.timeline
        try:
            write_witness(timeline.storage, timeline.steps_prefix, dataclasses.replace(witness, run=self._run_id or ""))
        except Exception:
            if timeline.storage.exists(timeline.manifest_key(witness.step, self.rank)):
                raise
        for replica in self.replicas:  # a machine lost before the next copy must not take this record along
            replica.refresh_witness()

    def read_witness(self, step: int, rank: int) -> Witness | None:
        # docstring inherited
        owner, number = self._owner_of(step)
        return read_witness(owner.storage, owner.steps_prefix, number, rank)

    def _owner_of(self, step: int) -> tuple[CheckpointStore, int]:
        """The timeline holding ``step`` and its number there, without a request for the step
        handed over or read last."""
        if self._handed is not None and self._handed[0] == step:
            return self._handed[1], step  # rank 0's manifests, pinned
        if self._last_read is not None and self._last_read[0] == step:
            return self._last_read[1], step  # read already: known complete
        return self.timeline.locate(step)

    def flush(self) -> None:
        """Wait for the write in flight, its witness, and a copy to the durable tier underway."""
        super().flush()
        self._witnesses.flush()
        for persister in self._copies:
            persister.flush()  # the copy underway, then its step's witness
            persister.refresh_witness()
            persister.flush()

    def close(self) -> None:
        super().close()
        self._witnesses.close()
        for replica in self.replicas:
            replica.close()
        if self.persister is not None:
            self.persister.close()
        if self.link is not None:  # serves this tier until the other machines' last copies landed
            self.link.close()
        self._settler.close(self.timeline)  # the last steps' lines, before retention collects them
        if self.persister is not None and self._committed and self._retains:
            self._retain(self._committed[-1])  # once the copies out of and into this tier ended
        self._drop_writer()
        self._release()

    # ── reading ─────────────────────────────────────────────────────────

    def complete_steps(self) -> list[int]:
        """The steps of this backend's timeline's history (spec §19), oldest first."""
        return [step for _, step in self.timeline.lineage_steps()]

    def latest_step(self) -> int | None:
        """The newest complete step of this timeline's history, checked newest first
        (:meth:`~ravex.format.CheckpointStore.resume_steps`): one step's manifests read, not
        every kept step's."""
        found = self.timeline.resume_steps(limit=1)
        return found[0][1] if found else None

    def resume_candidates(self, limit: int = 64) -> list[int]:
        """Rank 0: the newest complete step of the history (its manifests read
        :data:`~ravex.format.steps.catalog.MANIFEST_READ_THREADS` at a time and pinned: the
        hand-over and the read that follow ask for none of them again), then up to ``limit - 1``
        older steps whose folder lists every rank (checked only if a resume falls back to one:
        :meth:`~ravex.format.CheckpointStore.resume_steps`). ``W`` GETs, not ``S x W``."""
        found = self.timeline.resume_steps(limit=limit, pin=True)
        if found:
            view, step = found[0]
            self._handed = (step, view)  # pinned: forgotten once this backend writes (_make_writer)
        return [step for _, step in found]

    def lightning_step(self, step: int) -> bool:
        """From the metadata of the step's manifest of rank 0: none requested once the step was
        listed (its manifests are cached) or handed over by rank 0."""
        owner, number = self._owner_of(step)
        return LIGHTNING_KEY in owner.manifest(number, 0).metadata

    def tag(self, name: str) -> str | None:
        """Rank 0 tags the newest step of this backend's timeline (the caller flushed first);
        ``timeline@step`` or the step, None on other ranks."""
        if self.rank != 0:
            return None
        return self.timeline.tag(name, "latest").ref

    def load_step(self, step: int) -> dict[str, Any] | None:
        """The step's tree with numpy arrays (rank 0's view of a multi-rank step)."""
        tree: dict[str, Any] = self.timeline.read(step, rank=0)
        return tree

    def read_step(self, step: int, rank: int = 0, world_size: int = 1) -> LoadedStep | None:
        """One process and a one-process step: the tree with its tensors as ``ArrayRef``
        leaves, for the runtime to read straight into the live tensors. Otherwise this rank's
        view (its own per-rank state read, the rest left for the runtime: :class:`LoadedStep`)."""
        owner, number = self._owner_of(step)
        last = self._last_read
        if last is not None and last[0] == step and last[1] is owner:
            reader = last[2]
        else:
            reader = owner.open_step(number)
            self._last_read = (step, owner, reader)
        if world_size == 1 and reader.world_size == 1:
            tree = reader.tree(0)
            if "distributed" not in tree:
                return LoadedStep(tree)
        saved_world = reader.world_size
        src = rank if rank < saved_world else 0
        tree = dict(reader.tree(src))
        per_rank = tree.pop(f"rank-{src}", None)
        if per_rank is None:
            per_rank = {k: tree.pop(k) for k in PER_RANK if k in tree}
        else:
            for k in PER_RANK:
                tree.pop(k, None)
        tree.update(read_refs(per_rank))  # (one reader: the refs all come from reader.tree)
        return LoadedStep(tree, reader, saved_world, src)

    # ── several ranks: O(1) requests per rank at a resume (rank 0 reads, the others are told) ──

    def newest_step_guess(self, rank: int) -> int | None:
        """The newest step whose folder lists every rank (:func:`~ravex.format.steps.handoff.newest_own_step`:
        two listings and this rank's manifest, whatever the world size). On a forked timeline,
        the same over its lineage: its own steps first, then each parent's up to the fork (two
        more listings per timeline walked down)."""
        if self.timeline.timeline.parent is None:
            return newest_own_step(self.timeline, rank)
        for view, floor, ceiling in self.timeline.lineage_spans():
            step = newest_own_step(view, rank, floor, ceiling)
            if step is not None:
                return step
        return None

    def peek_step(self, step: int, rank: int, world_size: int) -> LoadedStep | None:
        """This rank's own sections of ``step`` from its manifest alone (one request): its loop
        position, before the ranks agree. Tensors other ranks wrote are None in the tree."""
        reader = RankReader(self.timeline.locate(step, check=False)[0], step, rank)
        tree = dict(reader.tree(rank))
        per_rank = tree.pop(f"rank-{rank}", None)
        if per_rank is None:
            per_rank = {k: tree.pop(k) for k in PER_RANK if k in tree}
        tree.update(per_rank)
        return LoadedStep(tree, reader, reader.world_size, rank)

    def hand_over(self, step: int) -> bytes:
        """Rank 0: every manifest of ``step`` in one payload (:func:`~ravex.format.steps.handoff.pack_manifests`),
        from the reader its own read of the step opened (no request when it read it already)."""
        last = self._last_read
        if last is None or last[0] != step:
            self.read_step(step, 0, self.world_size)
            last = self._last_read
        assert last is not None
        return pack_manifests(last[1].timeline.name, step, last[2].manifests)

    def take_over(self, payload: bytes) -> None:
        """Pin rank 0's manifests on the view of the timeline that holds the step: the
        :meth:`read_step` that follows asks storage for none of them."""
        name, _ = payload_timeline(payload)
        owner = self.timeline if name == self.timeline.timeline.name else self.timeline.on_timeline(name)
        self._handed = (adopt_step(owner, payload), owner)
