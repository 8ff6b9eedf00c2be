"""Resuming a rerun: the step to resume from, read once (:mod:`.reading`), restored into the
live objects before training touches them, and each DataLoader put back where it was
(:mod:`.loaders`). Several ranks first agree on a step every one of them holds.

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

from ravex.errors import RestoreError
from ravex.saving.backend import CheckpointBackend

from .. import patches, position
from ..config import RavexConfig
from ..distributed import collectives
from ..position import Entry, Loop, LoopPosition, advice
from ..recording.witness import ResumeWitness
from ..state import restore, rng
from ..state.lookahead import LookAhead
from ..state.plan import script_name
from ..state.registry import Registry
from .loaders import LoaderResume
from .reading import StepReader

logger = logging.getLogger("ravex")


class Resume:
    """The runtime's resume half: when the step found is restored, and the state it shares
    with the rest. Which step and reading it is :class:`.reading.StepReader`'s; placing the
    DataLoaders :class:`.loaders.LoaderResume`'s."""

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
        self.reading = StepReader(config, self.registry, self.rank, self.world_size)
        self.loaders = LoaderResume(self)
        self._triggers: list[Any] = []  # the hooks that restore before the first forward/step
        self._restored = True
        self.loops: list[Loop] = []  # the wrapped loops running now, outermost first
        self.loops_used = False
        self._loops_matched = 0  # how many of the saved positions this run has entered
        self._loops_skipped = False
        self.loop_position = LoopPosition(config.script_variables)  # where the user's loops stand
        self.lookahead = LookAhead()  # what a loader's wrapper fetched before the loop consumed it
        script_name()  # read while the main script's file is known (see script_name)
        self._early_rng: dict[str, Any] | None = None  # restored before the loop position: its RNG streams
        self._reentry_step: int | None = None  # the step whose loop position the rerun goes back to
        self.loaders_elsewhere = False  # the script resumed its loop itself: loaders go where it asks

    @property
    def resumed_from(self) -> int | None:
        """The step read to resume from (None before one is, or when none was)."""
        return self.reading.resumed_from

    @property
    def lightning_step(self) -> int | None:
        """The step found is a Lightning Trainer's (:meth:`.reading.StepReader.lightning_first`)."""
        return self.reading.lightning_step

    @property
    def other_script(self) -> str | None:
        """Another script wrote the step found: Ravex stays off (:meth:`.reading.StepReader.another_script`)."""
        return self.reading.other_script

    @property
    def restored(self) -> bool:
        """Nothing (more) to restore: the step found is in the live objects, or there was none."""
        return self._restored

    @property
    def loops_skipped(self) -> bool:
        """The wrapped loops skipped iterations on the way back to their saved positions."""
        return self._loops_skipped

    def _plan_resume(self) -> None:
        backend = self.backend
        if backend is None:
            return
        reading = self.reading
        if not reading.choose(backend):
            return
        lightning = bool(reading.candidates) and reading.lightning_first(backend)
        if not lightning and reading.candidates and reading.another_script(backend):
            reading.candidates = []
            return
        if reading.candidates or self.world_size > 1 or lightning:  # every rank joins the resume agreement
            self._restored = False
            if not lightning and self._plan_reentry():
                self._triggers = patches.install_restore_triggers(self, forward=False)
            else:
                self._triggers = patches.install_restore_triggers(self)

    def _claim_timeline(self) -> None:
        """At activation: take this run's timeline (:meth:`.reading.StepReader.claim_timeline`)."""
        if self.backend is not None:
            self.reading.claim_timeline(self.backend)

    def _plan_reentry(self) -> bool:
        """A step that recorded the loop position of the user's code (:mod:`.position`) is
        restored there: the rerun is traced back to it, and the first forward pass no longer
        restores (the script may run one before its loop). The first optimizer step still
        does, should the position never come. Under torchrun each rank reads its own position
        now (before the process group exists) and the ranks agree on the step when they reach
        it (:meth:`_restore_at_position`)."""
        reading = self.reading
        if not reading.candidates:
            return False
        assert self.backend is not None
        step = reading.candidates[0]
        if self.world_size > 1 or reading.written_by_several(self.backend, step):
            tree = reading.peek_position(self.backend, step)
        else:
            tree = self._load_resume()
            step = self.resumed_from if self.resumed_from is not None else step
        script = (tree or {}).get("script")
        if not script or (tree or {}).get("loops"):
            return False
        self._reentry_step = step
        return self.loop_position.reenter(script, step, self._restore_at_position, self.position_lost,
                                          sys._getframe(1))

    def _load_resume(self) -> dict[str, Any] | None:
        """The step resumed from, read once (:meth:`.reading.StepReader.load`)."""
        return self.reading.load(self.backend)

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

    def position_lost(self, why: str) -> None:
        """The rerun cannot go back to the recorded position: the checkpoint is restored at the
        next optimizer step instead. Where the script resumed its loop elsewhere itself (from a
        file of its own), its DataLoaders start their epochs where the script asks, too: the
        epochs and batches the checkpoint counted are not the ones this run's loop is at."""
        reentry = self.loop_position.give_up()
        if reentry is None:
            return
        self.loaders_elsewhere = reentry.elsewhere
        logger.warning("ravex: cannot return to the loop at %s where checkpoint step %s was taken: "
                       "%s; the checkpoint is restored at the next optimizer step and %s on from where "
                       "this run is", position.describe(reentry.script), self._reentry_step, why,
                       "the loop and its DataLoaders go" if reentry.elsewhere else "the loop goes")

    def before_user_save(self) -> None:
        """``torch.save`` by the script: a checkpoint this run found and has not restored yet
        is restored first, so that the file holds the trained state, never the state the run
        started with; one that cannot be restored stops the run before the save
        (:class:`~ravex.errors.RestoreError`, one line). Before a recorded loop position is
        reached (a script saving its configuration or initial weights before its loop), the
        position still restores the RNG streams and the loop's variables there. Not before a
        ``ravex.loop`` (its restore belongs at the loop), nor with several ranks (the restore
        is collective; a save by rank 0 alone must not start it)."""
        if (self._restored or not self.enabled or self.world_size > 1 or not self.reading.loaded
                or self.reading.loops):
            return
        reentry = self.loop_position.reentry
        if reentry is not None and reentry.active and self.reading.tree is not None:
            # the loop position is still to come: its RNG streams are put back there again
            self._early_rng = self.reading.tree.get("rng")
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
            self.position_lost("the position was not reached before the first optimizer step")
        if tree is None:
            return
        started = time.perf_counter()
        assert self.backend is not None
        where = f"checkpoint step {self.resumed_from} in {self.backend.url!r}"
        restore.restore(self.registry, tree, where, partial)
        self.step = int(tree["ravex"]["step"])
        self.last_checkpoint_step = self.step
        self.reading.tree = None  # the tensors now live in the model; drop the copy
        reading = self.reading
        self._say_for_job(logging.INFO, "ravex: resumed from step %d of %s (%sread %.1f ms%s, restore %.1f ms)",
                          self.step, self.backend.url,
                          f"{self.world_size} ranks; rank {self.rank}: " if self.world_size > 1 else "",
                          reading.load_seconds * 1000, ", the manifests from rank 0" if reading.handed_over else "",
                          (time.perf_counter() - started) * 1000)
        main_file = position.main_file()
        if tree.get("script", {}).get("mode") in ("head", "header", "end") and main_file:
            self.loop_position.last = (tree["script"], main_file)
        if self.loop_position.reentry is not None and self.loop_position.reentry.mode == "end":
            self.loaders.sync(tree)
            self._say_for_job(logging.WARNING, "ravex: this run had finished at step %d: back at the end of "
                              "its loop at %s, whose own condition decides whether it trains on (the same "
                              "bounds train nothing, larger ones the added steps)", self.step,
                              position.describe(self.loop_position.reentry.script))
            self.witness.resumed(self.step, self.backend, reading.saved_world_size, finished=True)
            return
        if self.loop_position.reentry is not None and self.loop_position.reentry.mode == "after":
            self.loaders.sync(tree)
            after = self.loop_position.reentry.script["frames"][-1]["after"]["line"]
            goes_on = (f"; the script goes on at {position.describe(self.loop_position.reentry.script)}"
                       if after is not None else ", and nothing of the script follows it: exiting")
            self._say_for_job(logging.WARNING, "ravex: this run had finished at step %d: its training is "
                              "not run again%s", self.step, goes_on)
            return
        if self.loop_position.reentry is not None:
            self.loaders.sync(tree)
            self._say_for_job(logging.INFO, "ravex: back in the loop at %s where step %d was taken",
                              position.describe(self.loop_position.reentry.script), self.step)
        elif self.rank == 0 and not (self.loops_used or tree.get("loops") or tree.get("script")
                                     or any(entry.get("epoch", -1) >= 0 for entry in tree.get("loaders", []))):
            logger.warning("ravex: resumed step %d, but where the loop stood is unknown: %s", self.step,
                           advice())
        self.witness.resumed(self.step, self.backend, reading.saved_world_size)

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

    def restore_here(self) -> None:
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
        if self.reading.loops is None and not self._restored:
            self._load_resume()
            self._restore_at_loops()
        saved = self.reading.loops
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
        self.reading.loops = []
        return Entry(skip, restore=bool(here.get("boundary")))

    def _restore_at_loops(self) -> None:
        """A checkpoint taken at a wrapped loop's boundary is restored there, not at the
        first forward or optimizer step: the restore triggers go."""
        if self.reading.loops and any(e.get("boundary") for e in self.reading.loops):
            self.drop_triggers()

    def _loops_lost(self, why: str) -> None:
        """The saved loop positions do not match this run's loops: say so, restore now."""
        self.reading.loops = []
        logger.warning("ravex: cannot resume the wrapped loops where they stood: %s; the "
                       "checkpoint is restored here and the loops run from where they are", why)
        self.ensure_restored()

    def _loops_pending(self, loop: Loop) -> None:
        """A matched loop moves on or ends while a loop it holds was never entered."""
        if self.reading.loops and loop.depth < self._loops_matched:
            self._loops_lost(f"the loop at {self.reading.loops[self._loops_matched]['site']} "
                             f"was not reached inside {loop.site}")

    def loader_iter(self, loader: Any, original: Any) -> Any:
        """``DataLoader.__iter__``: count the epoch; on resume, skip or replay it (:mod:`.loaders`)."""
        return self.loaders.loader_iter(loader, original)
