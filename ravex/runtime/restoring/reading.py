"""Which step a rerun resumes, and reading it once: the candidates ``resume:`` allows, the
ranks' agreement on the ones every rank holds, the first readable one read (an unreadable one
falls back to the next, saying so), and the steps that are not Ravex's to restore (a Lightning
Trainer's, another script's).

Apart from :class:`.resume.Resume`, which decides *when* the step is put back: reading costs
requests and, with several ranks, collectives, and what was read is kept here so that it is
read once whoever asks first (an integration placing its loop, a DataLoader's ``iter()``, the
first forward pass).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ravex.errors import ConfigError, LeaseLostError, TimelineBusyError
from ravex.saving.backend import CheckpointBackend
from ravex.saving.load import read_refs

from ..config import RavexConfig
from ..distributed import collectives, layout
from ..state import restore
from ..state.plan import script_name
from ..state.registry import Registry

logger = logging.getLogger("ravex")


class StepReader:
    """The step this run resumes from, chosen among the candidates and read once."""

    def __init__(self, config: RavexConfig, registry: Registry, rank: int, world_size: int) -> None:
        self.config = config
        self.registry = registry
        self.rank = rank
        self.world_size = world_size
        self.candidates: list[int] = []
        self.resumed_from: int | None = None
        self.tree: dict[str, Any] | None = None  # the step read, until its tensors live in the model
        self.loaders: list[dict[str, Any]] | None = None  # its DataLoaders' entries, until they are placed
        self.loops: list[dict[str, Any]] | None = None  # its wrapped loops' positions not yet entered
        #: what the framework integrations kept in it, by name (read before the restore)
        self.integrations: dict[str, Any] = {}
        self.loaded = False
        self.load_seconds = 0.0
        self.saved_world_size = 1  # how many ranks wrote the step resumed from
        self.run_agreed = False  # several ranks: run id and resume steps agreed
        self.handed_over = False  # several ranks: this rank read the step with rank 0's manifests
        #: the step this run found is a Lightning Trainer's checkpoint: never restored here, it is
        #: a Trainer's to resume (:meth:`lightning_first`)
        self.lightning_step: int | None = None
        #: the script that wrote the step this run found, when it is not this one: Ravex stays off
        self.other_script: str | None = None
        self._peeked: tuple[int, Any] | None = None  # (step, what read_step gave) before load
        self._several: dict[int, bool] = {}  # step -> written by several ranks (written_by_several)

    def choose(self, backend: CheckpointBackend) -> bool:
        """The candidate steps, newest first, as ``resume:`` asks; False for ``resume: never``,
        which resumes nothing and plans nothing more."""
        resume = self.config.resume
        if resume == "never":
            self._start_fresh(backend)
            return False
        if resume == "auto" and self.follows():  # rank 0 lists; this rank guesses for its position
            newest = backend.newest_step_guess(self.rank)
            self.candidates = [] if newest is None else [newest]
        elif resume == "auto" and self.world_size > 1:  # rank 0: the newest step checked, the others listed
            self.candidates = backend.resume_candidates()
        elif resume == "auto":
            self.candidates = sorted(backend.complete_steps(), reverse=True)
        else:  # an older step of a timeline forks a new one for this run's steps (spec §19)
            self.candidates = [backend.resume_point(resume, follow=self.follows())]
        return True

    def lightning_first(self, backend: CheckpointBackend) -> bool:
        """Whether the step this run would resume is a Lightning Trainer's checkpoint (a Lightning
        script under ``ravex enable`` wrote it). The runtime tells it from its own by its manifest
        and never reads it: the Trainer, once created, resumes it through Lightning
        (``hand_over``). One process decides here, its restore triggers then waiting for the
        Trainer; several ranks decide together when they read the step (:meth:`load`),
        rank 0 reading nothing of it before (a rank that follows rank 0 reads no manifest now)."""
        step = self.candidates[0]
        if self.follows() or not self._is_lightning(backend, step):
            return False
        if self.world_size == 1:
            self.lightning_step, self.candidates = step, []
        return True

    def _is_lightning(self, backend: CheckpointBackend, step: int, agree: bool = False) -> bool:
        """Whether ``step`` is a Lightning Trainer's checkpoint; one whose manifest this rank
        cannot read is not (reading the step then fails as for any unreadable step). ``agree``
        (several ranks, a collective on each): whether any rank finds it Lightning's."""
        try:
            mine = backend.lightning_step(step)
        except Exception:
            mine = False
        return not collectives.all_ok(not mine) if agree else mine

    def _start_fresh(self, backend: CheckpointBackend) -> None:
        """``resume: never`` is a fresh run, whose steps would collide with the complete steps
        of its timeline (steps are immutable). It writes a root timeline of its own beside them
        (spec §19): none of their steps in its history, they stay as they are, and a plain
        rerun continues the new one; said once. A backend without timelines stops the run at
        activation (rank 0), before its first step, with the fixes."""
        steps = backend.complete_steps()
        if not steps:
            return
        held = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        timeline = backend.timeline_name
        name = backend.start_fresh()
        if name is None and not backend.fork_pending:
            if self.rank == 0:
                raise ConfigError(
                    f"`resume: never` asks for a fresh run, but {backend.url!r} already holds {held}, "
                    "which a fresh run's steps would collide with. Point `storage` at a new location for a "
                    f"fresh run, or drop `resume: never` (RAVEX_RESUME) to go on from step {steps[-1]}")
            return
        if self.rank == 0:
            logger.info("ravex: `resume: never`: %s holds %s of timeline %r; this run writes a new timeline%s "
                        "of its own beside them, which a plain rerun continues (`resume: %s@%d` goes back)",
                        backend.url, held, timeline, "" if name is None else f" {name!r}", timeline, steps[-1])

    def follows(self) -> bool:
        """Several ranks, ``resume: auto`` or a step, not rank 0: this rank lets rank 0 decide
        which steps are complete (and whether a step named forks a timeline) and hand it the
        chosen step's manifests, and reads only what it alone wrote before that, so its requests
        do not grow with the world size (docs/SCALE.md)."""
        return self.world_size > 1 and self.rank != 0 and self.config.resume != "never"

    def claim_timeline(self, backend: CheckpointBackend) -> None:
        """At activation, once the timeline this run writes is known: take it for this run
        (spec §21), stopping the run (:class:`TimelineBusyError`, one line naming the run that
        holds it) when another still writes it. Storage that fails now is tried again before the
        first write (:meth:`.cadence.Cadence._prepare_writes`)."""
        if collectives.launched_child():
            return
        try:
            backend.claim()
        except (TimelineBusyError, LeaseLostError):
            raise
        except Exception as exc:
            logger.warning("ravex: could not take the lease of this run's timeline in %s (%s: %s); the "
                           "first checkpoint tries again", backend.url, type(exc).__name__, exc)

    def another_script(self, backend: CheckpointBackend) -> bool:
        """Whether this process runs another script than the one that wrote the step it would
        resume (its steps name their script, :func:`.plan.script_name`): an evaluation run
        beside the training, ``python -c``, a notebook or pytest where a ``ravex.yaml`` lies.
        Such a run is not the training's: Ravex stays off for it, says so once, and restores
        and writes nothing, unless ``resume:`` names a step (then the user asked for it)."""
        if (self.config.resume != "auto" or self.world_size > 1
                or self.written_by_several(backend, self.candidates[0])):
            return False
        tree = self.load(backend)
        theirs = ((tree or {}).get("ravex") or {}).get("script")
        ours = script_name()
        if tree is None or theirs is None or theirs == ours:
            return False
        self.other_script = theirs
        logger.warning("ravex: %s is not the script that wrote %s (its step %s is %s's): Ravex stays "
                       "off for this run and restores or writes nothing; `resume: %s` (RAVEX_RESUME=%s) "
                       "resumes that step here, another `storage` checkpoints this script on its own",
                       ours or "this interactive session", backend.url, self.resumed_from, theirs,
                       self.resumed_from, self.resumed_from)
        self.resumed_from = None
        self.tree = None
        return True

    def peek_position(self, backend: CheckpointBackend, step: int) -> dict[str, Any] | None:
        """Several ranks, or a step several wrote: this rank's script position in ``step`` (read
        once; the rest of the step is resolved against the live objects at the restore). A rank
        the step's job did not have (a rerun on more ranks) goes back to rank 0's position, with
        its variables: every rank must run the same iterations, or the last ones would wait for
        the others in a collective forever."""
        if self.follows():  # its own manifest alone: one request (two for a new rank)
            try:
                return _position_in(backend.peek_step(step, self.rank, self.world_size))
            except Exception:  # none of this rank's (or unreadable: the agreed step is read later)
                pass
            try:
                theirs = backend.peek_step(step, 0, self.world_size)
            except Exception:
                return None
            return _position_in(theirs) if theirs is not None and theirs.saved_world_size <= self.rank else None
        self.written_by_several(backend, step)
        return _position_in(self._peeked[1] if self._peeked is not None and self._peeked[0] == step else None)

    def written_by_several(self, backend: CheckpointBackend, step: int) -> bool:
        """Whether ``step`` was written by several ranks (or holds shards): such a step is read
        against the live objects (its loaders' lengths, its shards), so not before they exist."""
        if step in self._several:
            return self._several[step]
        try:
            loaded = backend.read_step(step, self.rank, self.world_size)
        except Exception:  # unreadable: load falls back and says so
            return False
        self._peeked = (step, loaded)  # read once: load takes it from here
        self._several[step] = loaded is not None and loaded.reader is not None
        return self._several[step]

    def load(self, backend: CheckpointBackend | None) -> dict[str, Any] | None:
        """Read the newest readable candidate step; corrupt ones fall back with a warning."""
        if self.loaded:
            return self.tree
        self.loaded = True
        assert backend is not None  # a resume is planned only with a backend open
        candidates = self.candidates
        if self.world_size > 1:  # one collective: the steps every rank holds, and the run id
            candidates = self.agree_on_steps(backend, candidates)
        for i, step in enumerate(candidates):
            started = time.perf_counter()
            if self.world_size > 1:
                self._hand_over(backend, step)  # the manifests: telling a Lightning step costs no request
            if self._is_lightning(backend, step, agree=self.world_size > 1):
                if i == 0:  # the newest: a Trainer's to resume
                    self.lightning_step, self.candidates = step, []
                    return None
                logger.warning("ravex: checkpoint step %d in %s is a Lightning Trainer's, not one Ravex restores: "
                               "passed over", step, backend.url)
                continue
            try:
                peeked, self._peeked = self._peeked, None
                loaded = peeked[1] if peeked is not None and peeked[0] == step else backend.read_step(
                    step, self.rank, self.world_size)
                if loaded is None:
                    raise FileNotFoundError(f"step {step} vanished")
                if loaded.reader is not None:  # several ranks or shards: read what is ours
                    tree = layout.resolve(self.registry, loaded, self.rank, self.world_size)
                else:  # model/optimizer tensors go straight into the live ones at restore
                    tree = restore.read_small(loaded.tree)
                saved_world_size = loaded.saved_world_size
                failed: Exception | None = None
            except Exception as exc:
                failed = exc
            if self.world_size > 1 and not collectives.all_ok(failed is None) and failed is None:
                failed = RuntimeError("another rank could not read it")
            if failed is not None:
                nxt = candidates[i + 1] if i + 1 < len(candidates) else None
                logger.warning("ravex: checkpoint step %d in %s is unreadable (%s: %s); %s",
                               step, backend.url, type(failed).__name__, failed,
                               f"falling back to step {nxt}" if nxt is not None
                               else "no older step left, starting fresh")
                continue
            self.resumed_from = step
            self.saved_world_size = saved_world_size
            self.tree = tree
            self.loaders = list(tree.get("loaders", []))
            self.loops = [dict(e) for e in tree.get("loops", [])]
            self.integrations = dict(tree.get("integrations") or {})
            self.load_seconds = time.perf_counter() - started
            return tree
        return None

    def agree_on_steps(self, backend: CheckpointBackend, candidates: list[int]) -> list[int]:
        """Several ranks, before anyone writes: rank 0 takes the timeline's lease and drops a
        crashed run's partial steps (newer than its newest complete one), then the ranks agree
        on the resume candidates and the run id their manifests share. Rolling back, rank 0
        then forks the new timeline under that run id and the others follow it; nothing of the
        timeline resumed is dropped (this run does not write it)."""
        if self.rank == 0 and not backend.fork_pending:
            self.claim_timeline(backend)
            try:
                dropped = backend.discard_incomplete_above(backend.latest_step())
            except Exception as exc:  # a stale partial step costs space, not correctness
                logger.warning("ravex: could not drop incomplete steps in %s: %s", backend.url, exc)
            else:
                if dropped:
                    logger.info("ravex: dropped incomplete steps %s (a crashed run's partial writes)",
                                dropped)
        agreed, run_id = collectives.agree_on_steps(candidates, self.rank, self.world_size,
                                                    follow=self.config.resume == "auto")
        backend.set_run(run_id)
        if backend.fork_pending or self.config.resume not in ("auto", "never"):  # the same on every rank
            backend.fork_agreed(self.rank, collectives.all_ok)
        self.run_agreed = True
        return agreed

    def _hand_over(self, backend: CheckpointBackend, step: int) -> None:
        """Several ranks, before each reads ``step``: rank 0 (which read every manifest of it to
        know it complete) broadcasts them, and every other rank reads the step with no request
        for what another rank wrote. Collective on every rank; when rank 0 cannot pack them, or
        a rank cannot take them, that rank reads the step from storage as before."""
        payload = b""
        if self.rank == 0:
            try:
                payload = backend.hand_over(step)
            except Exception as exc:  # the others read the step themselves
                logger.debug("ravex: step %d not handed over (%s: %s)", step, type(exc).__name__, exc)
        payload = collectives.broadcast_bytes(payload)
        if self.rank != 0 and payload:
            try:
                backend.take_over(payload)
                self.handed_over = True
            except Exception as exc:
                logger.warning("ravex: rank 0's manifests of step %d were not usable here (%s: %s); "
                               "reading them from storage", step, type(exc).__name__, exc)


def _position_in(loaded: Any) -> dict[str, Any] | None:
    """This rank's script position (and wrapped-loop positions) in a step read with
    ``read_step``/``peek_step``; None where it has none."""
    if loaded is None or "script" not in loaded.tree:
        return None
    return {"script": read_refs(loaded.tree["script"]), "loops": loaded.tree.get("loops")}
