"""The runtime: counts steps, decides when to checkpoint, and resumes a rerun exactly.

Where a checkpoint is taken matters as much as what is in it. The optimizer step only
marks a checkpoint *due*; it is taken at the next step boundary, which is the next
``next()`` on a DataLoader iterator, before the batch is fetched. By then the whole loop
body of the finished step has run (``scheduler.step()``, logging, RNG draws after the
optimizer step), so the saved state is exactly "between two steps". Loops without a
DataLoader get theirs at the next forward pass (a loop that runs a forward between two
optimizers' steps is then checkpointed between them; give it a DataLoader for exactness).

A rerun restores that state before its first forward pass. A DataLoader resumes where
it was: epochs already finished pass through empty (the outer ``for epoch`` loop runs
on), and the interrupted epoch replays the RNG state it started with, so the shuffle
order and worker seeds are the same, then skips the consumed batches at the sampler.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any

from ravex.errors import RestoreError
from ravex.saving.backend import CheckpointBackend
from ravex.saving.plan import SavePlan
from ravex.version import __version__

from . import patches, restore, rng
from .breaker import CircuitBreaker
from .chunking import chunk_bytes_for
from .config import RavexConfig
from .distributed import collectives, layout
from .plan import collect
from .registry import KINDS, LoaderState, Registry

logger = logging.getLogger("ravex")

_runtime: RavexRuntime | None = None


def get_runtime() -> RavexRuntime | None:
    """The process's runtime, None before :func:`start` and after :func:`reset_runtime`."""
    return _runtime


def reset_runtime() -> None:
    global _runtime
    _runtime = None


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


class _Empty:
    """The iterator of an epoch that already finished before the resume."""

    def __iter__(self) -> _Empty:
        return self

    def __next__(self) -> Any:
        raise StopIteration

    def __len__(self) -> int:
        return 0


class RavexRuntime:
    """One per process. Public behaviour is reached through :mod:`ravex`."""

    def __init__(self, config: RavexConfig) -> None:
        self.config = config
        self.registry = Registry()
        self.enabled = False
        self.step = 0
        self.pid = os.getpid()
        self.rank = collectives.get_rank()
        self.world_size = collectives.get_world_size()
        self.backend: CheckpointBackend | None = None
        #: skips due checkpoints while the storage is down; a test may put its own here
        self.breaker = CircuitBreaker(where=config.storage.url)
        self.backend_error: str | None = None
        self.checkpoint_error: str | None = None
        self.last_stall: dict[str, float] | None = None
        self.last_checkpoint_step: int | None = None
        self.resumed_from: int | None = None
        self._due = False
        self._steps_here = 0
        self._last_time = time.monotonic()
        self._exit_signal: int | None = None
        self._crashed = False
        self._patches: patches.Patches | None = None
        self._triggers: list[Any] = []
        self._signals: dict[int, Any] = {}
        self._prepared_writes = False
        self._run_agreed = False  # several ranks: run id and resume steps agreed
        self._poll: collectives.Poll | None = None  # several ranks: shared decisions
        self._load_seconds = 0.0
        self._candidates: list[int] = []
        self._resume_tree: dict[str, Any] | None = None
        self._resume_loaders: list[dict[str, Any]] | None = None
        self._resume_loaded = False
        self._restored = True
        self._shut = False
        self._keepalive: dict[int, Any] = {}
        self._forward_hook: Any = None
        self._excepthook: tuple[Any, Any] | None = None

    # ── lifecycle ───────────────────────────────────────────────────────

    def activate(self, scan_existing: bool = True) -> None:
        _setup_logging(self.config.log_level)
        self._patches = patches.install(self)
        if scan_existing:
            self._scan_existing()
        self._open_backend()
        self._plan_resume()
        self._install_signals()
        self._wrap_excepthook()
        self.enabled = True

    def shutdown(self, final_checkpoint: bool = True) -> None:
        """Final checkpoint (``checkpoint_on_exit``), flush, close; remove patches."""
        if self._shut or os.getpid() != self.pid:
            return
        self._shut = True
        try:
            if (final_checkpoint and self.enabled and self.config.checkpoint_on_exit
                    and not self._crashed and self._steps_here > 0
                    and self.step != self.last_checkpoint_step):
                self._checkpoint_now(None, reason="exit")
            if self.backend is not None:
                self.backend.flush()
                self.backend.close()
        finally:
            self.enabled = False
            for handle in self._triggers:
                handle.remove()
            self._triggers.clear()
            self._keepalive.clear()
            self._clear_forward_hook()
            self._restore_signals()
            self._unwrap_excepthook()
            if self._patches is not None:
                self._patches.undo()
                self._patches = None

    def _scan_existing(self) -> None:
        """``activate()`` after the model was built: find what already exists (:mod:`.scan`)."""
        from .scan import scan

        scan(self.registry)

    def _open_backend(self) -> bool:
        from ravex.saving.selection import get_backend

        if self.backend is not None:
            return True
        try:
            self.backend = get_backend(self.config, self.rank, self.world_size)
            self.backend_error = None
            return True
        except Exception as exc:
            self.backend_error = f"{type(exc).__name__}: {exc}"
            logger.error("ravex: cannot open storage %s (%s); training continues, "
                         "the next checkpoint interval retries", self.config.storage.url,
                         self.backend_error)
            return False

    # ── resume ──────────────────────────────────────────────────────────

    def _plan_resume(self) -> None:
        resume = self.config.resume
        if resume == "never" or self.backend is None:
            return
        steps = self.backend.complete_steps()
        if resume == "auto":
            self._candidates = sorted(steps, reverse=True)
        else:
            if resume not in steps:
                from ravex.format.errors import StepNotFoundError

                raise StepNotFoundError(
                    f"resume: {resume} but {self.backend.url!r} has no complete step {resume}; "
                    f"it has {steps[-5:]}{' (newest five)' if len(steps) > 5 else ''}"
                )
            self._candidates = [resume]
        if self._candidates or self.world_size > 1:  # every rank joins the resume agreement
            self._restored = False
            self._triggers = patches.install_restore_triggers(self)

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
            try:
                loaded = backend.read_step(step, self.rank, self.world_size)
                if loaded is None:
                    raise FileNotFoundError(f"step {step} vanished")
                if loaded.reader is not None:  # several ranks or shards: read what is ours
                    tree = layout.resolve(self.registry, loaded, self.rank, self.world_size)
                else:  # model/optimizer tensors go straight into the live ones at restore
                    tree = restore.read_small(loaded.tree)
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
            self._resume_tree = tree
            self._resume_loaders = list(tree.get("loaders", []))
            self._load_seconds = time.perf_counter() - started
            return tree
        return None

    def _agree_on_steps(self, backend: CheckpointBackend, candidates: list[int]) -> list[int]:
        """Several ranks, before anyone writes: rank 0 drops a crashed run's partial steps
        (newer than its newest complete one), then the ranks agree on the resume candidates
        and the run id their manifests share."""
        if self.rank == 0:
            try:
                dropped = backend.discard_incomplete_above(backend.latest_step())
            except Exception as exc:  # a stale partial step costs space, not correctness
                logger.warning("ravex: could not drop incomplete steps in %s: %s", backend.url, exc)
            else:
                if dropped:
                    logger.info("ravex: dropped incomplete steps %s (a crashed run's partial writes)",
                                dropped)
        agreed, run_id = collectives.agree_on_steps(candidates, self.rank, self.world_size)
        backend.set_run(run_id)
        self._run_agreed = True
        return agreed

    def ensure_restored(self) -> None:
        """Restore the checkpoint into the live objects, once, before training touches them."""
        if self._restored:
            return
        self._restored = True
        for handle in self._triggers:
            handle.remove()
        self._triggers.clear()
        tree = self._load_resume()
        if tree is None:
            return
        started = time.perf_counter()
        assert self.backend is not None
        where = f"checkpoint step {self.resumed_from} in {self.backend.url!r}"
        restore.restore(self.registry, tree, where)
        self.step = int(tree["ravex"]["step"])
        self.last_checkpoint_step = self.step
        self._resume_tree = None  # the tensors now live in the model; drop the copy
        logger.info("ravex: resumed from step %d of %s (read %.1f ms, restore %.1f ms)",
                    self.step, self.backend.url, self._load_seconds * 1000,
                    (time.perf_counter() - started) * 1000)

    def _loader_entry(self, loader: Any, st: LoaderState) -> dict[str, Any] | None:
        if st.resume_checked or (self._restored and self._resume_loaders is None):
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

    def loader_iter(self, loader: Any, original: Any) -> Any:
        """``DataLoader.__iter__``: count the epoch; on resume, skip or replay it."""
        st = self.registry.loader_state(loader)
        if not self.enabled:
            return original(loader)
        epoch = st.epoch + 1
        entry = self._loader_entry(loader, st)
        if entry is not None and epoch <= entry["epoch"]:
            if epoch < entry["epoch"]:  # finished before the kill: pass through empty
                st.resume_checked = False  # look again at the next epoch
                st.epoch, st.yielded, st.exhausted = epoch, 0, True
                return _Empty()
            st.epoch, st.yielded, st.epoch_rng = epoch, int(entry["yielded"]), entry["epoch_rng"]
            length = entry.get("length")
            if entry["exhausted"] or (length is not None and st.yielded >= length):
                st.exhausted = True
                self.ensure_restored()
                return _Empty()
            # Replay the epoch's start: same worker seeds, same shuffle order.
            was_restored = self._restored
            current = rng.capture_epoch_rng(loader) if was_restored else None
            rng.restore_epoch_rng(loader, entry["epoch_rng"])
            st.exhausted = False
            st.pending_skip = st.yielded
            iterator = original(loader)
            if current is not None:
                rng.restore_epoch_rng(loader, current)
            else:
                self.ensure_restored()  # sets every RNG to the checkpoint's
            return iterator
        st.epoch, st.yielded, st.exhausted = epoch, 0, False
        st.epoch_rng = rng.capture_epoch_rng(loader)
        st.pending_skip = 0
        return original(loader)

    # ── saving ──────────────────────────────────────────────────────────

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global optimizer post-step hook: count, and checkpoint when due.

        With several optimizers stepping once per iteration each, the step count is the
        most any one of them has taken: one per iteration, not one per optimizer.
        """
        if not self.enabled:
            return
        n = self.registry.optimizer_steps(optimizer) + 1
        self.registry.set_optimizer_steps(optimizer, n)
        if n <= self.step:
            return
        self.step = n
        self._steps_here += 1
        if self._steps_here == 1:
            self._keep_alive()
        every = self.config.checkpoint_every
        if every and n % every == 0:
            self._due = True
        self._check_time()
        if (self._due or self._exit_signal is not None) and not self._loader_active():
            self._await_next_forward()

    def _await_next_forward(self) -> None:
        """No DataLoader to mark the step boundary: use the next forward pass instead.

        Right after ``optimizer.step()`` the iteration is not over (a second optimizer,
        ``scaler.update()``, ``scheduler.step()`` may follow); the next forward pass is the
        first point where it surely is. The hook exists only while a checkpoint is due.
        """
        if self._forward_hook is not None:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook

        def before_forward(module: Any, args: Any) -> None:
            self._clear_forward_hook()
            if self.enabled and (self._due or self._exit_signal is not None):
                self._boundary(None)

        self._forward_hook = register_module_forward_pre_hook(before_forward)

    def _clear_forward_hook(self) -> None:
        hook, self._forward_hook = self._forward_hook, None
        if hook is not None:
            hook.remove()

    def at_boundary(self, st: LoaderState) -> None:
        """``next()`` on a DataLoader iterator, before the batch is fetched."""
        if not self.enabled:
            return
        if not self._due:
            self._check_time()
        if self._due or self._exit_signal is not None:
            self._clear_forward_hook()
            self._boundary(st)

    def _check_time(self) -> None:
        """Time-based checkpoint due? With several ranks also: a signal caught by any rank?

        Under torchrun both are decided collectively (:class:`.collectives.Poll`): at a step
        every rank reaches, rank 0's clock and any rank's caught signal are exchanged in one
        tiny all-reduce, so every rank checkpoints (or exits after) the same step. The first
        call at a new step comes from the optimizer step hook; later calls at that step
        (DataLoader boundaries) find the poll done and change nothing.
        """
        seconds = self.config.checkpoint_every_seconds
        time_due = bool(seconds and self.step != self.last_checkpoint_step
                        and time.monotonic() - self._last_time >= seconds)
        poll = self._poll
        if poll is None or not (seconds or self._signals) or not collectives.can_agree():
            if time_due:
                self._due = True
            return
        if self._steps_here == 0 or not poll.due(self.step):
            return
        due, signum = poll.exchange(self.step, self.rank, time_due)
        if due:
            self._due = True
        if signum and self._exit_signal is None:
            self._exit_signal = signum
            logger.warning("ravex: %s caught by a rank; every rank checkpoints step %d at the next "
                           "step boundary, then exits", signal.Signals(signum).name, self.step)

    def _boundary(self, st: LoaderState | None) -> None:
        if self._exit_signal is not None:
            self._checkpoint_now(st, reason=signal.Signals(self._exit_signal).name)
            if self.backend is not None:
                self.backend.flush()
            # Every rank is here at the same step (the signal was agreed on): wait until all
            # have flushed, or the first rank to exit makes torchrun SIGTERM the others
            # before their manifests are written, leaving the step incomplete.
            collectives.all_ok(True)
            code = 128 + self._exit_signal
            logger.warning("ravex: checkpoint of step %d flushed; exiting with status %d",
                           self.step, code)
            raise SystemExit(code)
        self._checkpoint_now(st, reason="interval")

    def _keep_alive(self) -> None:
        """Hold the training objects until exit, so the exit checkpoint can still save them.

        The registry is weak, and a script whose model is a local of ``main()`` has
        dropped it by the time ``atexit`` runs. Taken at the first step and at each
        checkpoint: nothing per step.
        """
        for kind in KINDS:
            for obj in self.registry.live(kind):
                self._keepalive.setdefault(id(obj), obj)

    def _loader_active(self) -> bool:
        for loader in self.registry.live("loaders"):
            st = self.registry.state_of(loader)
            if st is not None and st.epoch >= 0 and not st.exhausted:
                return True
        return False

    def checkpoint(self, force: bool = True) -> bool:
        """``ravex.checkpoint()``: take one now. True if it was handed to the writer."""
        return self._checkpoint_now(None, reason="manual", force=force)

    def _checkpoint_now(self, st: LoaderState | None, reason: str, force: bool = False) -> bool:
        """Take a checkpoint unless the storage breaker is cooling down (:mod:`.breaker`):
        then a due or manual one is skipped (False). The exit and signal checkpoints are
        the last chance and always try. With several ranks all skip when any rank's
        breaker would (one small all-reduce per checkpoint).
        """
        self._due = False
        self._last_time = time.monotonic()
        if not force and self.step == self.last_checkpoint_step:
            return False
        breaker = self.breaker
        agree = collectives.all_ok if self.world_size > 1 else None
        if not (reason == "exit" or self._exit_signal is not None or breaker.allow(agree)):
            return False  # storage down (here or on another rank): skipped at no cost, training goes on
        if not self._open_backend():
            self.checkpoint_error = self.backend_error
            breaker.failed(self.step)
            return False
        backend = self.backend
        assert backend is not None
        try:
            self.ensure_restored()
            if not self._prepared_writes:
                self._prepare_writes(backend)
                self._prepared_writes = True
            self.last_stall = backend.save(self._plan(backend, st, reason), breaker)
        except RestoreError:
            raise
        except Exception as exc:
            self.checkpoint_error = f"step {self.step}: {type(exc).__name__}: {exc}"
            logger.error("ravex: checkpoint of step %d failed before writing, training "
                         "continues: %s", self.step, self.checkpoint_error)
            breaker.failed(self.step)
            return False
        self.checkpoint_error = None
        self.last_checkpoint_step = self.step
        return True

    def _prepare_writes(self, backend: CheckpointBackend) -> None:
        """Once, before this process's first write: drop a crashed run's partial steps. With
        several ranks that is part of their agreement (run without a resume, ``resume:
        never``, it runs here)."""
        if self.world_size > 1:
            if backend.multi_rank_steps and not self._run_agreed:
                self._agree_on_steps(backend, [])
            return
        latest = backend.latest_step()
        backend.discard_incomplete_above(max(s for s in (self.resumed_from, latest, -1) if s is not None))

    def _plan(self, backend: CheckpointBackend, st: LoaderState | None, reason: str) -> SavePlan:
        """The live objects as this checkpoint's :class:`~ravex.saving.plan.SavePlan`: the
        tree, this rank's layout, and the chunk size of each sparsely updated table."""
        tree = collect(self.registry, self.step, st)
        rank_layout = None
        if backend.multi_rank_steps:  # ranks, shards: who writes what
            tree, rank_layout = layout.lay_out(tree, self.rank, self.world_size)
        self._keep_alive()
        metadata = {"reason": reason, "time": time.time(), "pid": self.pid, "ravex": __version__}
        chunk_bytes = chunk_bytes_for(self.registry, tree) if rank_layout is None else {}
        return SavePlan(self.step, tree, metadata, rank_layout, chunk_bytes)

    def flush(self) -> None:
        if self.backend is not None:
            self.backend.flush()

    # ── signals and exit ────────────────────────────────────────────────

    def _install_signals(self) -> None:
        if self.world_size > 1:  # decisions all ranks must share go through one poll
            self._poll = collectives.Poll(self.config.checkpoint_every_seconds)
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.config.checkpoint_on_signal:
            signum = getattr(signal, name)
            try:
                self._signals[signum] = signal.signal(signum, self._on_signal)
            except (ValueError, OSError) as exc:  # pragma: no cover
                logger.warning("ravex: cannot handle %s: %s", name, exc)

    def _restore_signals(self) -> None:
        for signum, previous in self._signals.items():
            try:
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous)
            except (ValueError, OSError):  # pragma: no cover
                pass
        self._signals.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Checkpoint at the next step boundary, then exit with 128+signum.

        The handler runs between two bytecodes, possibly halfway through
        ``optimizer.step()``, so it only sets a flag. Outside a training loop, or on a
        second signal, the signal gets its previous behaviour at once. With several ranks
        the flag waits for the next poll (:meth:`_check_time`), where every rank learns of
        it: a signal that reached one rank alone still stops all of them at the same step.
        """
        training = self._steps_here > 0
        poll = self._poll
        shared = poll is not None and collectives.can_agree()
        if (os.getpid() != self.pid or self._exit_signal is not None or not training
                or (poll is not None and shared and poll.pending)):
            previous = self._signals.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        if poll is not None and shared:
            poll.pending = signum
            logger.warning("ravex: %s received at step %d on rank %d; all ranks checkpoint at "
                           "the step they next agree on, then exit", signal.Signals(signum).name,
                           self.step, self.rank)
            return
        self._exit_signal = signum
        logger.warning("ravex: %s received at step %d; checkpointing at the next step "
                       "boundary, then exiting", signal.Signals(signum).name, self.step)

    def _wrap_excepthook(self) -> None:
        """Mark the run crashed on an uncaught exception (no "final" checkpoint of a state
        that just raised). The hook holds the runtime weakly and :meth:`shutdown` puts the
        previous hook back when ours is still the one installed."""
        previous = sys.excepthook
        runtime = weakref.ref(self)

        def hook(*args: Any) -> None:
            alive = runtime()
            if alive is not None:
                alive._crashed = True
            previous(*args)

        sys.excepthook = hook
        self._excepthook = (hook, previous)

    def _unwrap_excepthook(self) -> None:
        installed, self._excepthook = self._excepthook, None
        if installed is not None and sys.excepthook is installed[0]:
            sys.excepthook = installed[1]

    # ── reporting ───────────────────────────────────────────────────────

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
            "resumed": self.resumed_from is not None,
            "resumed_from": self.resumed_from,
            "backend": backend.name if backend is not None else None,
            "storage": backend.url if backend is not None else self.config.storage.url,
            "last_checkpoint_step": self.last_checkpoint_step,
            "last_written_step": backend.last_written_step if backend is not None else None,
            "checkpoints_written": backend.written if backend is not None else 0,
            "write_in_flight": bool(backend is not None and backend.busy),
            "last_stall_seconds": self.last_stall,
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
