"""Resuming a rerun: the step to resume from, read once, restored into the live objects
before training touches them, and each DataLoader put back where it was.

A DataLoader resumes where it was: epochs already finished pass through empty (the outer
``for epoch`` loop runs on), and the interrupted epoch replays the RNG state it started
with, so the shuffle order and worker seeds are the same, then skips the consumed batches
at the sampler. Several ranks first agree on a step every one of them holds.

A loop wrapped in ``ravex.loop`` resumes where it was (:mod:`.loops`): its finished
iterations are skipped, and the checkpoint is restored where it was taken, at the start of
the iteration that was next. A rerun that can find neither a DataLoader's position nor a
wrapped loop's says so once, naming the loop it is in.
"""

from __future__ import annotations

import logging
import sys
import time
from types import FrameType
from typing import Any

from ravex.errors import ConfigError, LeaseLostError, RestoreError, TimelineBusyError
from ravex.saving.backend import CheckpointBackend
from ravex.saving.load import read_refs

from .. import patches, position
from ..config import RavexConfig
from ..distributed import collectives, layout
from ..position import Entry, Loop, LoopPosition, Reentry, advice
from ..recording.witness import ResumeWitness
from ..state import restore, rng, workers
from ..state.lookahead import LookAhead
from ..state.plan import script_name
from ..state.registry import LoaderState, Registry

logger = logging.getLogger("ravex")


class _Empty:
    """The iterator of an epoch that already finished before the resume."""

    def __iter__(self) -> _Empty:
        return self

    def __next__(self) -> Any:
        raise StopIteration

    def __len__(self) -> int:
        return 0


class Resume:
    """The runtime's resume half: what it restores, and the state it shares with the rest."""

    witness: ResumeWitness  # made by the checkpointing half, which records what it compares

    def __init__(self, config: RavexConfig) -> None:
        self.config = config
        self.registry = Registry()
        self.enabled = False
        self.step = 0
        self.rank = collectives.get_rank()
        self.world_size = collectives.get_world_size()
        self.backend: CheckpointBackend | None = None
        self.last_checkpoint_step: int | None = None
        self.resumed_from: int | None = None
        self._triggers: list[Any] = []  # the hooks that restore before the first forward/step
        self._run_agreed = False  # several ranks: run id and resume steps agreed
        self._candidates: list[int] = []
        self._resume_tree: dict[str, Any] | None = None
        self._resume_loaders: list[dict[str, Any]] | None = None
        self._resume_loaded = False
        self._load_seconds = 0.0
        self._restored = True
        self.loops: list[Loop] = []  # the wrapped loops running now, outermost first
        self.loops_used = False
        self._resume_loops: list[dict[str, Any]] | None = None  # saved positions not yet entered
        self._loops_matched = 0  # how many of them this run has entered
        self._loops_skipped = False
        self.loop_position = LoopPosition(config.script_variables)  # where the user's loops stand
        self.lookahead = LookAhead()  # what a loader's wrapper fetched before the loop consumed it
        self._peeked: tuple[int, Any] | None = None  # (step, what read_step gave) before _load_resume
        #: the script that wrote the step this run found, when it is not this one: Ravex stays off
        self.other_script: str | None = None
        script_name()  # read while the main script's file is known (see script_name)
        self._early_rng: dict[str, Any] | None = None  # restored before the loop position: its RNG streams
        self._reentry_step: int | None = None  # the step whose loop position the rerun goes back to
        self._several: dict[int, bool] = {}  # step -> written by several ranks (_written_by_several)
        self._handed_over = False  # several ranks: this rank read the step with rank 0's manifests
        self._loaders_elsewhere = False  # the script resumed its loop itself: loaders go where it asks
        self._saved_world_size = 1  # how many ranks wrote the step resumed from
        #: the step this run found is a Lightning Trainer's checkpoint: never restored here, it is
        #: a Trainer's to resume (:meth:`_lightning_first`)
        self.lightning_step: int | None = None

    def _plan_resume(self) -> None:
        resume = self.config.resume
        if self.backend is None:
            return
        if resume == "never":
            self._refuse_a_store_with_steps(self.backend)
            return
        if resume == "auto" and self._follows():  # rank 0 lists; this rank guesses for its position
            newest = self.backend.newest_step_guess(self.rank)
            self._candidates = [] if newest is None else [newest]
        elif resume == "auto":
            self._candidates = sorted(self.backend.complete_steps(), reverse=True)
        else:  # an older step of a timeline forks a new one for this run's steps (spec §19)
            self._candidates = [self.backend.resume_point(resume)]
        lightning = bool(self._candidates) and self._lightning_first()
        if not lightning and self._candidates and self._another_script():
            self._candidates = []
            return
        if self._candidates or self.world_size > 1 or lightning:  # every rank joins the resume agreement
            self._restored = False
            if not lightning and self._plan_reentry():
                self._triggers = patches.install_restore_triggers(self, forward=False)
            else:
                self._triggers = patches.install_restore_triggers(self)

    def _lightning_first(self) -> bool:
        """Whether the step this run would resume is a Lightning Trainer's checkpoint (a Lightning
        script under ``ravex enable`` wrote it). The runtime tells it from its own by its manifest
        and never reads it: the Trainer, once created, resumes it through Lightning
        (``hand_over``). One process decides here, its restore triggers then waiting for the
        Trainer; several ranks decide together when they read the step (:meth:`_load_resume`),
        rank 0 reading nothing of it before (a rank that follows rank 0 reads no manifest now)."""
        step = self._candidates[0]
        if self._follows() or not self._is_lightning(step):
            return False
        if self.world_size == 1:
            self.lightning_step, self._candidates = step, []
        return True

    def _is_lightning(self, step: int, agree: bool = False) -> bool:
        """Whether ``step`` is a Lightning Trainer's checkpoint; one whose manifest this rank
        cannot read is not (reading the step then fails as for any unreadable step). ``agree``
        (several ranks, a collective on each): whether any rank finds it Lightning's."""
        assert self.backend is not None
        try:
            mine = self.backend.lightning_step(step)
        except Exception:
            mine = False
        return not collectives.all_ok(not mine) if agree else mine

    def _refuse_a_store_with_steps(self, backend: CheckpointBackend) -> None:
        """``resume: never`` is a fresh run, whose steps would collide with the complete steps
        already there (steps are immutable: every checkpoint would fail and the run would
        train with none). Rank 0 stops the run at activation, before its first step, with the
        fixes; the store is left as it is. (A fresh timeline of its own in the same store needs
        a timeline without a parent, which the format does not have.)"""
        if self.rank != 0:
            return
        steps = backend.complete_steps()
        if steps:
            held = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
            timeline = "" if backend.timeline_name is None else f" (timeline {backend.timeline_name!r})"
            raise ConfigError(
                f"`resume: never` asks for a fresh run, but {backend.url!r} already holds {held}{timeline}, "
                "which a fresh run's steps would collide with. Point `storage` at a new location for a "
                f"fresh run, or drop `resume: never` (RAVEX_RESUME) to go on from step {steps[-1]}")

    def _follows(self) -> bool:
        """Several ranks, ``resume: auto``, not rank 0: this rank lets rank 0 decide which steps
        are complete and hand it the chosen step's manifests, and reads only what it alone
        wrote before that, so its requests do not grow with the world size (docs/SCALE.md)."""
        return self.world_size > 1 and self.rank != 0 and self.config.resume == "auto"

    def _claim_timeline(self) -> None:
        """At activation, once the timeline this run writes is known: take it for this run
        (spec §21), stopping the run (:class:`TimelineBusyError`, one line naming the run that
        holds it) when another still writes it. Storage that fails now is tried again before the
        first write (:meth:`_prepare_writes`)."""
        if self.backend is None or collectives.launched_child():
            return
        try:
            self.backend.claim()
        except (TimelineBusyError, LeaseLostError):
            raise
        except Exception as exc:
            logger.warning("ravex: could not take the lease of this run's timeline in %s (%s: %s); the "
                           "first checkpoint tries again", self.backend.url, type(exc).__name__, exc)

    def _another_script(self) -> bool:
        """Whether this process runs another script than the one that wrote the step it would
        resume (its steps name their script, :func:`.plan.script_name`): an evaluation run
        beside the training, ``python -c``, a notebook or pytest where a ``ravex.yaml`` lies.
        Such a run is not the training's: Ravex stays off for it, says so once, and restores
        and writes nothing, unless ``resume:`` names a step (then the user asked for it)."""
        if self.config.resume != "auto" or self.world_size > 1 or self._written_by_several(self._candidates[0]):
            return False
        tree = self._load_resume()
        theirs = ((tree or {}).get("ravex") or {}).get("script")
        ours = script_name()
        if tree is None or theirs is None or theirs == ours:
            return False
        self.other_script = theirs
        assert self.backend is not None
        logger.warning("ravex: %s is not the script that wrote %s (its step %s is %s's): Ravex stays "
                       "off for this run and restores or writes nothing; `resume: %s` (RAVEX_RESUME=%s) "
                       "resumes that step here, another `storage` checkpoints this script on its own",
                       ours or "this interactive session", self.backend.url, self.resumed_from, theirs,
                       self.resumed_from, self.resumed_from)
        self.resumed_from = None
        self._resume_tree = None
        return True

    def _plan_reentry(self) -> bool:
        """A step that recorded the loop position of the user's code (:mod:`.position`) is
        restored there: the rerun is traced back to it, and the first forward pass no longer
        restores (the script may run one before its loop). The first optimizer step still
        does, should the position never come. Under torchrun each rank reads its own position
        now (before the process group exists) and the ranks agree on the step when they reach
        it (:meth:`_restore_at_position`)."""
        if not self._candidates:
            return False
        step = self._candidates[0]
        if self.world_size > 1 or self._written_by_several(step):
            tree = self._peek_position(step)
        else:
            tree = self._load_resume()
            step = self.resumed_from if self.resumed_from is not None else step
        script = (tree or {}).get("script")
        if not script or (tree or {}).get("loops"):
            return False
        self._reentry_step = step
        return self.loop_position.reenter(script, step, self._restore_at_position, self._position_lost,
                                          sys._getframe(1))

    def _peek_position(self, step: int) -> dict[str, Any] | None:
        """Several ranks, or a step several wrote: this rank's script position in ``step`` (read
        once; the rest of the step is resolved against the live objects at the restore). A rank
        the step's job did not have (a rerun on more ranks) goes back to rank 0's position, with
        its variables: every rank must run the same iterations, or the last ones would wait for
        the others in a collective forever."""
        if self._follows():  # its own manifest alone: one request (two for a new rank)
            assert self.backend is not None
            try:
                return self._position_in(self.backend.peek_step(step, self.rank, self.world_size))
            except Exception:  # none of this rank's (or unreadable: the agreed step is read later)
                pass
            try:
                theirs = self.backend.peek_step(step, 0, self.world_size)
            except Exception:
                return None
            return self._position_in(theirs) if theirs is not None and theirs.saved_world_size <= self.rank else None
        self._written_by_several(step)
        return self._position_in(self._peeked[1] if self._peeked is not None and self._peeked[0] == step else None)

    def _position_in(self, loaded: Any) -> dict[str, Any] | None:
        """This rank's script position (and wrapped-loop positions) in a step read with
        ``read_step``/``peek_step``; None where it has none."""
        if loaded is None or "script" not in loaded.tree:
            return None
        return {"script": read_refs(loaded.tree["script"]), "loops": loaded.tree.get("loops")}

    def _written_by_several(self, step: int) -> bool:
        """Whether ``step`` was written by several ranks (or holds shards): such a step is read
        against the live objects (its loaders' lengths, its shards), so not before they exist."""
        assert self.backend is not None
        if step in self._several:
            return self._several[step]
        try:
            loaded = self.backend.read_step(step, self.rank, self.world_size)
        except Exception:  # unreadable: _load_resume falls back and says so
            return False
        self._peeked = (step, loaded)  # read once: _load_resume takes it from here
        self._several[step] = loaded is not None and loaded.reader is not None
        return self._several[step]

    def drop_triggers(self) -> None:
        """Remove the hooks that restore before the first forward pass or optimizer step."""
        for handle in self._triggers:
            handle.remove()
        self._triggers.clear()

    def drop_enumerate(self) -> None:
        """The resumed epoch is running: ``enumerate`` is the builtin again."""
        self.loop_position.drop_enumerate()

    def _restore_at_position(self, live: list[FrameType]) -> None:
        """The rerun reached the saved loop position: restore, with the script's variables.
        Several ranks agree on the step here; one other than the position's is an error, never
        a restore at another step's position."""
        reentry = self.loop_position.reentry
        finished = reentry is not None and reentry.mode == "after"
        if finished and reentry is not None and reentry.script["frames"][-1]["after"]["line"] is None:
            self._restored = True  # nothing of the script follows its training: nothing to restore into
            self.drop_triggers()
            self._say_for_job(logging.WARNING, "ravex: this run had finished at step %s and nothing of the "
                              "script follows its training: exiting without training again", self.resumed_from)
            return
        self.ensure_restored(partial=finished)
        early, self._early_rng = self._early_rng, None
        if early is not None:  # restored at a torch.save before the loop: the loop starts from the checkpoint's RNG
            rng.restore_rng(early)
        if reentry is not None and self.resumed_from != self._reentry_step:
            raise RestoreError(f"the ranks resumed step {self.resumed_from}, but this rank went "
                               f"back to the loop position of step {self._reentry_step} (a step completed "
                               "while the job started); rerun the job")
        if reentry is not None:
            position.put_variables(reentry.script, live)
            self.loop_position.last_frames = live

    def _position_lost(self, why: str) -> None:
        """The rerun cannot go back to the recorded position: the checkpoint is restored at the
        next optimizer step instead. Where the script resumed its loop elsewhere itself (from a
        file of its own), its DataLoaders start their epochs where the script asks, too: the
        epochs and batches the checkpoint counted are not the ones this run's loop is at."""
        reentry = self.loop_position.give_up()
        if reentry is None:
            return
        self._loaders_elsewhere = reentry.elsewhere
        logger.warning("ravex: cannot return to the loop at %s where checkpoint step %s was taken: "
                       "%s; the checkpoint is restored at the next optimizer step and %s on from where "
                       "this run is", position.describe(reentry.script), self._reentry_step, why,
                       "the loop and its DataLoaders go" if reentry.elsewhere else "the loop goes")

    def _load_resume(self) -> dict[str, Any] | None:
        """Read the newest readable candidate step; corrupt ones fall back with a warning."""
        if self._resume_loaded:
            return self._resume_tree
        self._resume_loaded = True
        backend = self.backend
        assert backend is not None  # a resume is planned only with a backend open
        candidates = self._candidates
        if self.world_size > 1:  # one collective: the steps every rank holds, and the run id
            candidates = self._agree_on_steps(backend, candidates)
        for i, step in enumerate(candidates):
            started = time.perf_counter()
            if self.world_size > 1:
                self._hand_over(backend, step)  # the manifests: telling a Lightning step costs no request
            if self._is_lightning(step, agree=self.world_size > 1):
                if i == 0:  # the newest: a Trainer's to resume
                    self.lightning_step, self._candidates = step, []
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
            self._saved_world_size = saved_world_size
            self._resume_tree = tree
            self._resume_loaders = list(tree.get("loaders", []))
            self._resume_loops = [dict(e) for e in tree.get("loops", [])]
            self._load_seconds = time.perf_counter() - started
            return tree
        return None

    def _agree_on_steps(self, backend: CheckpointBackend, candidates: list[int]) -> list[int]:
        """Several ranks, before anyone writes: rank 0 takes the timeline's lease and drops a
        crashed run's partial steps (newer than its newest complete one), then the ranks agree
        on the resume candidates and the run id their manifests share. Rolling back, rank 0
        then forks the new timeline under that run id and the others follow it; nothing of the
        timeline resumed is dropped (this run does not write it)."""
        if self.rank == 0 and not backend.fork_pending:
            self._claim_timeline()
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
        if backend.fork_pending:
            backend.fork_agreed(self.rank, collectives.all_ok)
        self._run_agreed = True
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
                self._handed_over = True
            except Exception as exc:
                logger.warning("ravex: rank 0's manifests of step %d were not usable here (%s: %s); "
                               "reading them from storage", step, type(exc).__name__, exc)

    def before_user_save(self) -> None:
        """``torch.save`` by the script: a checkpoint this run found and has not restored yet
        is restored first, so that the file holds the trained state, never the state the run
        started with; one that cannot be restored stops the run before the save
        (:class:`~ravex.errors.RestoreError`, one line). Before a recorded loop position is
        reached (a script saving its configuration or initial weights before its loop), the
        position still restores the RNG streams and the loop's variables there. Not before a
        ``ravex.loop`` (its restore belongs at the loop), nor with several ranks (the restore
        is collective; a save by rank 0 alone must not start it)."""
        if (self._restored or not self.enabled or self.world_size > 1 or not self._resume_loaded
                or self._resume_loops):
            return
        reentry = self.loop_position.reentry
        if reentry is not None and reentry.active and self._resume_tree is not None:
            # the loop position is still to come: its RNG streams are put back there again
            self._early_rng = self._resume_tree.get("rng")
        self.ensure_restored()

    def ensure_restored(self, partial: bool = False) -> None:
        """Restore the checkpoint into the live objects, once, before training touches them
        (``partial``: a finished run's, past its training, :func:`.restore.restore`)."""
        if self._restored:
            return
        self._restored = True
        self.drop_triggers()
        tree = self._load_resume()
        if self.loop_position.reentry is not None and self.loop_position.reentry.active:
            self._position_lost("the position was not reached before the first optimizer step")
        if tree is None:
            return
        started = time.perf_counter()
        assert self.backend is not None
        where = f"checkpoint step {self.resumed_from} in {self.backend.url!r}"
        restore.restore(self.registry, tree, where, partial)
        self.step = int(tree["ravex"]["step"])
        self.last_checkpoint_step = self.step
        self._resume_tree = None  # the tensors now live in the model; drop the copy
        self._say_for_job(logging.INFO, "ravex: resumed from step %d of %s (%sread %.1f ms%s, restore %.1f ms)",
                          self.step, self.backend.url,
                          f"{self.world_size} ranks; rank {self.rank}: " if self.world_size > 1 else "",
                          self._load_seconds * 1000, ", the manifests from rank 0" if self._handed_over else "",
                          (time.perf_counter() - started) * 1000)
        main_file = position.main_file()
        if tree.get("script", {}).get("mode") in ("head", "header", "end") and main_file:
            self.loop_position.last = (tree["script"], main_file)
        if self.loop_position.reentry is not None and self.loop_position.reentry.mode == "end":
            self._sync_loaders(tree)
            self._say_for_job(logging.WARNING, "ravex: this run had finished at step %d: back at the end of "
                              "its loop at %s, whose own condition decides whether it trains on (the same "
                              "bounds train nothing, larger ones the added steps)", self.step,
                              position.describe(self.loop_position.reentry.script))
            return  # a finished run's final step has no witness: nothing trained after it
        if self.loop_position.reentry is not None and self.loop_position.reentry.mode == "after":
            self._sync_loaders(tree)
            after = self.loop_position.reentry.script["frames"][-1]["after"]["line"]
            goes_on = (f"; the script goes on at {position.describe(self.loop_position.reentry.script)}"
                       if after is not None else ", and nothing of the script follows it: exiting")
            self._say_for_job(logging.WARNING, "ravex: this run had finished at step %d: its training is "
                              "not run again%s", self.step, goes_on)
            return
        if self.loop_position.reentry is not None:
            self._sync_loaders(tree)
            self._say_for_job(logging.INFO, "ravex: back in the loop at %s where step %d was taken",
                              position.describe(self.loop_position.reentry.script), self.step)
        elif self.rank == 0 and not (self.loops_used or tree.get("loops") or tree.get("script")
                                     or any(entry.get("epoch", -1) >= 0 for entry in tree.get("loaders", []))):
            logger.warning("ravex: resumed step %d, but where the loop stood is unknown: %s", self.step,
                           advice())
        self.witness.resumed(self.step, self.backend, self._saved_world_size)

    def _say_for_job(self, level: int, message: str, *args: Any) -> None:
        """A line that every rank of a job would print alike, the resume having gone as it
        should: rank 0 prints it for the job, the other ranks at DEBUG (64 ranks would print 64
        copies). What goes wrong on a rank is that rank's own line, printed where it happens."""
        logger.log(level if self.rank == 0 else logging.DEBUG, message, *args)

    def restore_in_loop(self) -> None:
        """A wrapped loop (:mod:`.loops`) is back where the checkpoint was taken: restore, and
        put back the variables the script's loops carried (:func:`.position.capture.capture_variables`)."""
        tree = None if self._restored else self._load_resume()
        self.ensure_restored()
        script = (tree or {}).get("script")
        if script and script.get("mode") == "loop":
            position.put_variables(script, position.live_frames(script, sys._getframe(1)))

    def _restore_here(self) -> None:
        """Restore from a DataLoader's ``iter()``: at a recorded loop position, with the
        script's variables (and the index ``enumerate`` starts from)."""
        reentry = self.loop_position.reentry
        if reentry is None or self._restored:
            self.ensure_restored()
            return
        self._restore_at_position(reentry.live_frames(sys._getframe(1)))

    def enter_loop(self, loop: Loop) -> Entry:
        """A wrapped loop starts: on a resume, how many iterations it skips and whether the
        checkpoint is restored before its first one (:mod:`.loops`)."""
        loop.depth = len(self.loops)
        if self.loops:
            self.loops[-1].nested = True
        self.loops.append(loop)
        self.loops_used = True
        if self._resume_loops is None and not self._restored:
            self._load_resume()
            self._restore_at_loops()
        saved = self._resume_loops
        if not saved or loop.depth != self._loops_matched:
            return Entry()
        here = saved[loop.depth]
        if here["site"] != loop.site:
            self._loops_lost(f"this run's loop at depth {loop.depth} is at {loop.site} but the "
                             f"checkpoint's is at {here['site']}")
            return Entry()
        self._loops_matched += 1
        skip = int(here["at"])
        self._loops_skipped = self._loops_skipped or skip > 0
        if self._loops_matched < len(saved):
            return Entry(skip)
        self._resume_loops = []
        return Entry(skip, restore=bool(here.get("boundary")))

    def _restore_at_loops(self) -> None:
        """A checkpoint taken at a wrapped loop's boundary is restored there, not at the
        first forward or optimizer step: the restore triggers go."""
        if self._resume_loops and any(e.get("boundary") for e in self._resume_loops):
            self.drop_triggers()

    def _loops_lost(self, why: str) -> None:
        """The saved loop positions do not match this run's loops: say so, restore now."""
        self._resume_loops = []
        logger.warning("ravex: cannot resume the wrapped loops where they stood: %s; the "
                       "checkpoint is restored here and the loops run from where they are", why)
        self.ensure_restored()

    def _loops_pending(self, loop: Loop) -> None:
        """A matched loop moves on or ends while a loop it holds was never entered."""
        if self._resume_loops and loop.depth < self._loops_matched:
            self._loops_lost(f"the loop at {self._resume_loops[self._loops_matched]['site']} "
                             f"was not reached inside {loop.site}")

    def _loader_entry(self, loader: Any, st: LoaderState, force: bool = False) -> dict[str, Any] | None:
        if self._loaders_elsewhere:
            return None
        if not force and (st.resume_checked or (self._restored and self._resume_loaders is None)):
            return None
        st.resume_checked = True
        self._load_resume()
        if not self._resume_loaders:
            return None
        index = next(i for i, obj in enumerate(self.registry.live("loaders")) if obj is loader)
        if index >= len(self._resume_loaders):
            return None
        entry = self._resume_loaders[index]
        assert self.backend is not None  # a checkpoint was read through it
        restore.check_loader(f"checkpoint step {self.resumed_from} in {self.backend.url!r}",
                            index, loader, entry)
        return entry

    def _sync_loaders(self, tree: dict[str, Any]) -> None:
        """Back at a recorded loop position, the loaders' epoch counts continue the saved
        run's (the rerun skipped the epochs that counted them), but the one resumed mid-epoch."""
        for loader, entry in zip(self.registry.live("loaders"), tree.get("loaders", []), strict=False):
            st = self.registry.loader_state(loader)
            if st.resume_checked:
                continue
            st.resume_checked = True
            st.epoch, st.yielded, st.exhausted = int(entry["epoch"]), int(entry["yielded"]), True
            _after_finished_epoch(loader, st, entry)
        self._resume_loaders = None

    def _reentered_loader(self, loader: Any, st: LoaderState) -> dict[str, Any] | None:
        """With a recorded loop position: the saved entry of the loader whose epoch the
        checkpoint interrupted, when this ``iter()`` is that loop's; None for any other."""
        reentry = self.loop_position.reentry
        if reentry is None or self._restored:
            return None
        if reentry.mode == "head":
            return self._drawn_loader(loader, st, reentry)
        if not reentry.at_loader():
            return None
        st.resume_checked = True
        entry = self._loader_entry(loader, st, force=True)
        if entry is None or not entry.get("active"):
            self._position_lost("the DataLoader of that loop is not the one the checkpoint was taken in")
            return None
        st.epoch = int(entry["epoch"]) - 1
        return entry

    def _drawn_loader(self, loader: Any, st: LoaderState, reentry: Reentry) -> dict[str, Any] | None:
        """A position at a loop's head, whose loop draws its batches with ``next(it)`` from an
        iterator made before it (``data_iter = iter(loader)`` above a ``while True:``): that
        ``iter()``, called from a recorded frame, of the loader the checkpoint interrupted
        mid-epoch, resumes the epoch (replayed, consumed batches skipped); the restore waits
        for the loop's head. Any other loader starts its epoch as the first run did."""
        if not reentry.holds(position.innermost_frame(sys._getframe(3))):
            return None
        entry = self._loader_entry(loader, st, force=True)
        if entry is None or entry.get("exhausted") or int(entry["epoch"]) < 0:
            st.resume_checked = False  # counted on from the checkpoint once restored
            return None
        st.epoch = int(entry["epoch"]) - 1
        return entry

    def loader_iter(self, loader: Any, original: Any) -> Any:
        """``DataLoader.__iter__``: count the epoch; on resume, skip or replay it."""
        st = self.registry.loader_state(loader)
        if not self.enabled:
            return original(loader)
        if self.loop_position.reentry is not None and not self._restored:
            entry = self._reentered_loader(loader, st)
        else:
            entry = self._loader_entry(loader, st)
        epoch = st.epoch + 1
        if entry is not None and self._loops_skipped and st.epoch < 0:
            epoch = max(epoch, int(entry["epoch"]))  # the wrapped loops skipped its finished epochs
        if entry is not None and epoch <= entry["epoch"]:
            if epoch < entry["epoch"]:  # finished before the kill: pass through empty
                st.resume_checked = False  # look again at the next epoch
                st.epoch, st.yielded, st.exhausted = epoch, 0, True
                return _Empty()
            st.epoch, st.yielded, st.epoch_rng = epoch, int(entry["yielded"]), entry["epoch_rng"]
            st.offset, st.offset_sampler = int(entry.get("offset", 0)), entry.get("sampler")
            length = entry.get("length")
            if entry["exhausted"] or (length is not None and st.yielded >= length):
                st.exhausted = True
                _after_finished_epoch(loader, st, entry)
                self._restore_here()
                return _Empty()
            # Replay the epoch's start: same worker seeds, same shuffle order.
            # restored already, or at a loop head still to come: the RNG streams stay as they are
            later = self.loop_position.reentry is not None and self.loop_position.reentry.mode == "head"
            current = rng.capture_epoch_rng(loader) if self._restored or later else None
            rng.restore_epoch_rng(loader, entry["epoch_rng"])
            st.exhausted = False
            st.pending_skip = st.yielded
            st.reused = False  # until the iterator takes the first run's persistent one's seed
            st.pending_seed = entry.get("workers_seed") if entry.get("reused") else None
            st.pending_workers = workers.from_tree(entry.get("worker_rng"))
            iterator = original(loader)
            self.lookahead.epoch_began(st)
            if self.loop_position.enumerate is not None:
                self.loop_position.enumerate.expect(iterator, st.yielded)
            if current is not None:
                rng.restore_epoch_rng(loader, current)
            else:
                self._restore_here()  # sets every RNG to the checkpoint's
            return iterator
        st.epoch, st.yielded, st.exhausted = epoch, 0, False
        st.reused = bool(loader.persistent_workers and loader.num_workers and loader._iterator is not None)
        st.epoch_rng = rng.capture_epoch_rng(loader)
        st.pending_skip, st.offset, st.offset_sampler = 0, 0, None
        iterator = original(loader)
        self.lookahead.epoch_began(st)
        return iterator



def _after_finished_epoch(loader: Any, st: LoaderState, entry: dict[str, Any]) -> None:
    """A checkpoint after a finished epoch, which this run passes by: its loader's generators
    as they stood, and the first run's persistent workers, which went on to the next epoch:
    the iterator this run makes for it takes their base seed and streams (:mod:`.workers`)."""
    rng.restore_generators(loader, entry.get("generators") or {})
    seed = entry.get("workers_seed")
    if seed is not None:
        st.workers_seed = st.pending_seed = int(seed)
        st.pending_workers = workers.from_tree(entry.get("worker_rng"))
