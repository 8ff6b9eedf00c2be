"""The runtime's lifecycle: one per process, started by ``ravex.activate()`` or the
autoloader, shut down at exit (final checkpoint, flush) or by ``ravex.deactivate()``.

:class:`RavexRuntime` is the whole runtime: its resume half (:mod:`.resume`: restore a
rerun before training touches the objects) and its checkpointing half (:mod:`.cadence`:
count steps, take due checkpoints at step boundaries) under the lifecycle here: patches,
signals and the excepthook installed and removed, status reported.

A rerun that found a complete step to resume from and exits without ever restoring it (no
forward pass or optimizer step after activation) trained nothing from the checkpoint, and
whatever it saved holds the state it started with. :meth:`RavexRuntime.shutdown` says so on
stderr, once, and records the outcome for ``ravex status`` (:mod:`.runrecord`). The script's
exit status stays the script's: Ravex observes the run and never turns a run the script
considers successful into a failure (a scheduler or wrapper reading that status would then
act on a verdict that is Ravex's, not the script's); the line and ``ravex status`` carry it.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ravex.errors import ConfigError, RestoreError, TimelineBusyError
from ravex.saving.backend import CheckpointBackend
from ravex.saving.plan import SavePlan

from .. import patches
from ..config import RavexConfig
from ..counting.cadence import Cadence
from ..recording import runrecord
from ..recording.witness import ResumeWitness
from ..state.registry import LoaderState
from . import frameworks, spawned

logger = logging.getLogger("ravex")

_runtime: RavexRuntime | None = None


def get_runtime() -> RavexRuntime | None:
    """The process's runtime, None before :func:`start` and after :func:`reset_runtime`."""
    return _runtime


def reset_runtime() -> None:
    global _runtime
    _runtime = None


def ever_started() -> bool:
    """Whether a runtime started in this process, even one that has shut down since: the
    autoloader's exit net (:mod:`.autoload`) says nothing for a process Ravex covered."""
    return _exit_hook_installed


def start(config: RavexConfig, scan_existing: bool = True) -> RavexRuntime:
    """Create, activate and publish the process's runtime."""
    global _runtime
    runtime = RavexRuntime(config)
    _runtime = runtime
    try:
        runtime.activate(scan_existing=scan_existing)
    except BaseException:
        _runtime = None
        runtime.shutdown(final_checkpoint=False)
        raise
    _install_exit_hook()
    return runtime


def start_or_exit(config: RavexConfig, scan_existing: bool = True) -> RavexRuntime:
    """:func:`start`, where the store refusing this run (another run writes its timeline;
    ``resume: never`` on a timeline with steps) is one line on stderr and exit status 2."""
    try:
        return start(config, scan_existing=scan_existing)
    except (TimelineBusyError, ConfigError) as exc:
        sys.stderr.write(f"ravex: {exc}\n")
        raise SystemExit(2) from None


def start_from_autoloader() -> RavexRuntime:
    """What the ``.pth`` hook calls once torch is imported: nothing exists yet to scan."""
    runtime = _runtime
    if runtime is not None:
        return runtime
    return start(RavexConfig.load(), scan_existing=False)


_exit_hook_installed = False


def _shutdown_at_exit() -> None:
    """The process is exiting: the runtime active now takes its final checkpoint and flushes.

    One hook per process, reading the runtime when it runs: a hook per runtime held every
    runtime ever started (its backend, its saver, what those reference) until exit, long
    after ``deactivate()``."""
    runtime = _runtime
    if runtime is not None:
        runtime.shutdown()


def _install_exit_hook() -> None:
    """Run :func:`_shutdown_at_exit` at interpreter exit *before* thread pools shut down.

    ``concurrent.futures`` stops accepting work from a ``threading`` exit hook that runs
    before plain ``atexit`` handlers; the final checkpoint's writer needs its pool, so
    ours goes in the same list (run in reverse order of registration: ours first).
    """
    global _exit_hook_installed
    if _exit_hook_installed:
        return
    _exit_hook_installed = True
    try:
        threading._register_atexit(_shutdown_at_exit)  # type: ignore[attr-defined]
    except RuntimeError:  # pragma: no cover - already shutting down
        atexit.register(_shutdown_at_exit)


class RavexRuntime(Cadence):
    """One per process. Public behaviour is reached through :mod:`ravex`."""

    def __init__(self, config: RavexConfig) -> None:
        super().__init__(config)
        self._patches: patches.Patches | None = None
        self._shut = False
        self._excepthook: tuple[Any, Any] | None = None
        #: what the framework integrations (:mod:`.frameworks`) add to every checkpoint, by name
        self._integrations: dict[str, Callable[[], Any]] = {}

    def activate(self, scan_existing: bool = True) -> None:
        _setup_logging(self.config.log_level)
        self._patches = patches.install(self)
        frameworks.watch(self, self._patches)
        spawned.watch(self, self._patches, lambda: start_or_exit(self.config))
        if scan_existing:
            self._scan_existing()
        self._open_backend()
        self._plan_resume()
        if self.other_script is not None:
            return  # another script's store: this run stays off (said by _plan_resume)
        self._claim_timeline()  # another run still writing this timeline stops this one here
        self.signals.install()
        self._start_watch()
        self._wrap_excepthook()
        self.enabled = True
        self.contents.prepare_staging(self.backend)  # what the scan found; the first step adds the optimizer's state

    def shutdown(self, final_checkpoint: bool = True) -> None:
        """Final checkpoint (``checkpoint_on_exit``), flush, close; remove patches."""
        if self._shut or os.getpid() != self.pid:
            return
        self._shut = True
        try:
            if (final_checkpoint and self.enabled and self.config.checkpoint_on_exit
                    and not self.signals.crashed and self._steps_here > 0
                    and self.step != self.last_checkpoint_step):
                self.exit_checkpoint()
            self.witness.finish()
            if self.backend is not None:
                self.backend.flush()
                self.backend.close()
            if self.enabled and self.rank == 0:
                self._report_resume()
        finally:
            self.enabled = False
            self.drop_triggers()
            self.contents.release()
            self._clear_forward_hook()
            self.lookahead.close()
            self.loop_position.stop()
            self.signals.restore()
            self._stop_watch()
            self._unwrap_excepthook()
            if self._patches is not None:
                self._patches.undo()
                self._patches = None

    # ── what framework integrations ask of the runtime (:mod:`.frameworks`) ──

    def track_integration(self, name: str, state: Callable[[], Any]) -> None:
        """Every checkpoint from now on stores ``state()`` (typed JSON) under ``integrations/<name>``."""
        self._integrations[name] = state

    def integration_state(self, name: str) -> Any:
        """What ``integrations/<name>`` held in the step this rerun resumes from; None when it
        resumes nothing. Read before the restore, so a framework can place its loop first."""
        if self.backend is not None and (self.reading.candidates or self.world_size > 1):
            self._load_resume()
        return self.reading.integrations.get(name)

    def position_loader(self, loader: Any, epoch: int, consumed: int) -> bool:
        """A framework that counts the batches its loop consumed puts ``loader`` there: its next
        ``__iter__`` is epoch ``epoch`` (the saved one, replayed) and skips ``consumed`` batches,
        whatever a look-ahead wrapper had fetched. False when the resumed step has no such
        position for it (another epoch, or no entry), and nothing changes."""
        if self.backend is None:
            return False
        self._load_resume()
        saved = self.reading.loaders or []
        index = next((i for i, obj in enumerate(self.registry.live("loaders")) if obj is loader), None)
        if index is None or index >= len(saved) or int(saved[index]["epoch"]) != epoch:
            return False
        saved[index].update(yielded=consumed, exhausted=False)
        st: LoaderState = self.registry.loader_state(loader)
        st.epoch = epoch - 1  # the next __iter__ is the saved epoch, not one passed through empty
        return True

    def stand_down_for_spawned_ranks(self) -> None:
        """This process starts the job's ranks (:mod:`.spawned`) and trains nothing itself: it
        closes its store (the timeline's lease goes to the ranks' rank 0), removes its patches
        and reports nothing at exit; the ranks each start their own runtime."""
        logger.debug("ravex: this process starts the ranks with torch.multiprocessing; they checkpoint, "
                     "it stands down")
        self.enabled = False  # nothing to report: shutdown reports only for an enabled runtime
        self.shutdown(final_checkpoint=False)
        reset_runtime()

    def framework_witness(self) -> ResumeWitness:
        """A witness for a framework that checkpoints and resumes the run itself (Lightning,
        whose checkpoints rank 0 alone writes): it records the steps after each of its saves and
        checks a resume of one, as this runtime's own witness does for its steps."""
        return ResumeWitness(self.config, 0, 1, self.last_loss)

    def hand_over(self, why: str) -> None:
        """A framework checkpoints and resumes this run itself (Lightning, through Ravex's
        CheckpointIO): this runtime stands down, restores nothing, takes no checkpoint and
        leaves the signals as it found them; its patches stay, for the framework's hooks."""
        if not self.enabled:
            return
        logger.info("ravex: %s; Ravex's own checkpoints stand down", why)
        self._stand_down()

    def ensure_restored(self, partial: bool = False) -> None:
        """:meth:`.resume.Resume.ensure_restored`. Where the step found is a Lightning Trainer's
        and no Trainer took the run over by the time it would be restored (the first forward pass
        or optimizer step, or a checkpoint), this runtime stands down, saying so once: it never
        restores Lightning's tree as its own, and its own steps, counted from 0, would land below
        Lightning's in the timeline, whose steps only increase (spec §14, A1)."""
        super().ensure_restored(partial)
        if self.lightning_step is not None and self.enabled:
            assert self.backend is not None  # the step was found through it
            self._say_for_job(
                logging.WARNING, "ravex: step %d, the newest of %s, is a Lightning Trainer's checkpoint and no "
                "Trainer took this run over: Ravex restores only steps of its own, so it restores and writes "
                "nothing for this run; `resume: <step>` resumes one of its own on a new timeline, another "
                "`storage` checkpoints this script on its own", self.lightning_step, self.backend.url)
            self._stand_down()

    def _stand_down(self) -> None:
        """Restore nothing, checkpoint nothing, leave the signals as they were; the patches stay."""
        self.enabled = False
        self.reading.candidates = []
        self.drop_triggers()
        self._clear_forward_hook()
        self.loop_position.stop()
        self.signals.restore()
        self._stop_watch()

    def _plan(self, backend: CheckpointBackend, st: LoaderState | None, reason: str) -> SavePlan:
        plan = super()._plan(backend, st, reason)
        if not self._integrations:
            return plan
        extra = {name: state() for name, state in self._integrations.items()}
        return dataclasses.replace(plan, tree={**plan.tree, "integrations": extra})

    def found_step(self) -> int | None:
        """The complete step this run found to resume from (the one read, once one was)."""
        if self.resumed_from is not None:
            return self.resumed_from
        return self.reading.candidates[0] if self.reading.candidates else None

    def restored_step(self) -> int | None:
        """The step restored into the live objects, None until (unless) that happened."""
        return self.resumed_from if self._restored else None

    def _report_resume(self) -> None:
        """At exit: a found step never restored is one line on stderr; the outcome is recorded."""
        found, restored = self.found_step(), self.restored_step()
        if found is not None and restored is None and not self.signals.crashed:
            assert self.backend is not None  # steps are found through an open backend
            logger.warning("ravex: checkpoint step %d in %s was found but NOT restored: %s",
                           found, self.backend.url, self._why_unrestored())
        record = runrecord.RunRecord(
            store=runrecord.store_key(self.config),
            ended=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            pid=self.pid, found=found, restored=restored, steps=self._steps_here,
            crashed=self.signals.crashed)
        try:
            runrecord.write(self.config, record)
        except OSError as exc:
            logger.warning("ravex: could not record this run's outcome for `ravex status`: %s", exc)

    def _why_unrestored(self) -> str:
        """The likely cause of an unrestored resume and its fix, in one sentence."""
        counts = self.registry.counts()
        if counts["models"] == 0 and counts["optimizers"] == 0:
            cause = ("no model or optimizer existed to restore into; create them before the loop, "
                     "after Ravex is active")
        elif self.reading.loaded:
            cause = ("every epoch the loop asked for had finished before the checkpoint, so it ran "
                     "no forward pass or optimizer step (an epoch range the checkpoint already "
                     "completed; or a framework with its own loop, such as HF Trainer, that took the "
                     "finished epoch for empty data and stopped)")
        else:
            cause = ("the script ran no forward pass or optimizer step after Ravex started (its loop "
                     "never ran: a range already complete, a condition never met); make the loop run "
                     "while Ravex is active")
        return (f"{cause}. This run trained nothing from the checkpoint, and anything it saved holds "
                "the state it started with; to start afresh on purpose, point `storage` at a new "
                "location (`resume: <step>` forks from another step)")

    def _scan_existing(self) -> None:
        """``activate()`` after the model was built: find what already exists (:mod:`.scan`)."""
        from ..state.scan import scan

        scan(self.registry)

    def _wrap_excepthook(self) -> None:
        """Mark the run crashed on an uncaught exception (no "final" checkpoint of a state
        that just raised). The hook holds the runtime weakly and :meth:`shutdown` puts the
        previous hook back when ours is still the one installed."""
        previous = sys.excepthook
        runtime = weakref.ref(self)

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            alive = runtime()
            if alive is not None:
                alive.signals.crashed = True
            if isinstance(value, RestoreError):  # a found checkpoint that does not fit: one line
                sys.stderr.write(f"ravex: {value}\n")
                return
            previous(kind, value, tb)

        sys.excepthook = hook
        self._excepthook = (hook, previous)

    def _unwrap_excepthook(self) -> None:
        installed, self._excepthook = self._excepthook, None
        if installed is not None and sys.excepthook is installed[0]:
            sys.excepthook = installed[1]

    def status(self) -> dict[str, Any]:
        backend = self.backend
        counts = self.registry.counts()
        return {
            "active": self.enabled,
            "step": self.step,
            "models": counts["models"],
            "optimizers": counts["optimizers"],
            "schedulers": counts["schedulers"],
            "scalers": counts["scalers"],
            "dataloaders": counts["loaders"],
            "resumed": self.restored_step() is not None,
            "resumed_from": self.restored_step(),
            "resume": {"found": self.found_step(), "restored": self.restored_step()},
            "backend": backend.name if backend is not None else None,
            "storage": backend.url if backend is not None else self.config.storage.url,
            "durable_tier": backend.durable_tier() if backend is not None else None,
            "last_checkpoint_step": self.last_checkpoint_step,
            "last_written_step": backend.last_written_step if backend is not None else None,
            "checkpoints_written": backend.written if backend is not None else 0,
            "write_in_flight": bool(backend is not None and backend.busy),
            "last_stall_seconds": self.last_stall,
            "last_write_seconds": backend.last_seconds if backend is not None else None,
            "staging_prepared": backend.prepared if backend is not None else None,
            "last_log_line": backend.last_line if backend is not None else None,
            "last_error": (self.checkpoint_error or self.backend_error
                           or (backend.last_error if backend is not None else None)),
            "failures": backend.failures if backend is not None else 0,
            "breaker": self.breaker.status(),
            "config": self.config.describe(),
        }


def _setup_logging(level: str) -> None:
    log = logging.getLogger("ravex")
    log.setLevel(level)
    if not any(getattr(h, "_ravex", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ravex = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False
