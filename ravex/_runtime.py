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

from ravex import _distributed, _patches, _state
from ravex._registry import LoaderState, Registry
from ravex.runtime.config import RavexConfig

logger = logging.getLogger("ravex")

_runtime: RavexRuntime | None = None


def get_runtime(create: bool = False) -> RavexRuntime | None:
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
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - Python < 3.9
        atexit.register(_shutdown_at_exit)
        return
    try:
        register(_shutdown_at_exit)
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
        self.rank = _distributed.get_rank()
        self.world_size = _distributed.get_world_size()
        self.backend: Any = None
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
        self._patches: _patches.Patches | None = None
        self._triggers: list[Any] = []
        self._signals: dict[int, Any] = {}
        self._prepared_writes = False
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
        self._patches = _patches.install(self)
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
        """``activate()`` after the model was built: find what already exists (``_scan``)."""
        from ravex import _scan

        _scan.scan(self.registry)

    def _open_backend(self) -> bool:
        from ravex.backends import get_backend

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
            self._triggers = _patches.install_restore_triggers(self)

    def _load_resume(self) -> dict[str, Any] | None:
        """Read the newest readable candidate step; corrupt ones fall back with a warning."""
        if self._resume_loaded:
            return self._resume_tree
        self._resume_loaded = True
        candidates = self._candidates
        if self.world_size > 1:  # one collective: the steps every rank holds, and the run id
            candidates = _distributed.agree_on_steps(candidates, self.backend, self.rank,
                                                     self.world_size)
        for i, step in enumerate(candidates):
            started = time.perf_counter()
            try:
                if self.world_size == 1 and getattr(self.backend, "name", None) == "zarr":
                    tree = self.backend.load_step(step, lazy=True)  # tensors read at restore
                else:
                    tree = self.backend.load_step(step)
                if tree is None:
                    raise FileNotFoundError(f"step {step} vanished")
                if _distributed.is_lazy(tree):  # several ranks or shards: read what is ours
                    tree = _distributed.resolve(self.registry, tree)
                else:  # model/optimizer tensors go straight into the live ones at restore
                    tree = _state.read_small(tree)
                failed: Exception | None = None
            except Exception as exc:
                failed = exc
            if self.world_size > 1 and not _distributed.all_ok(failed is None) and failed is None:
                failed = RuntimeError("another rank could not read it")
            if failed is not None:
                exc = failed
                nxt = candidates[i + 1] if i + 1 < len(candidates) else None
                logger.warning("ravex: checkpoint step %d in %s is unreadable (%s: %s); %s",
                               step, self.backend.url, type(exc).__name__, exc,
                               f"falling back to step {nxt}" if nxt is not None
                               else "no older step left, starting fresh")
                continue
            self.resumed_from = step
            self._resume_tree = tree
            self._resume_loaders = list(tree.get("loaders", []))
            self._load_seconds = time.perf_counter() - started
            return tree
        return None

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
        where = f"checkpoint step {self.resumed_from} in {self.backend.url!r}"
        _state.restore(self.registry, tree, where)
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
        _state.check_loader(f"checkpoint step {self.resumed_from} in {self.backend.url!r}",
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
            current = _state.capture_epoch_rng(loader) if was_restored else None
            _state.restore_epoch_rng(loader, entry["epoch_rng"])
            st.exhausted = False
            st.pending_skip = st.yielded
            iterator = original(loader)
            if current is not None:
                _state.restore_epoch_rng(loader, current)
            else:
                self.ensure_restored()  # sets every RNG to the checkpoint's
            return iterator
        st.epoch, st.yielded, st.exhausted = epoch, 0, False
        st.epoch_rng = _state.capture_epoch_rng(loader)
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
        n = optimizer.__dict__.get("_ravex_steps", 0) + 1
        optimizer.__dict__["_ravex_steps"] = n
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

        Under torchrun both are decided collectively (:class:`_distributed.Poll`): at a step
        every rank reaches, rank 0's clock and any rank's caught signal are exchanged in one
        tiny all-reduce, so every rank checkpoints (or exits after) the same step. The first
        call at a new step comes from the optimizer step hook; later calls at that step
        (DataLoader boundaries) find the poll done and change nothing.
        """
        seconds = self.config.checkpoint_every_seconds
        time_due = bool(seconds and self.step != self.last_checkpoint_step
                        and time.monotonic() - self._last_time >= seconds)
        poll = getattr(self, "_poll", None)
        if poll is None or not (seconds or self._signals) or not _distributed.can_agree():
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
            _distributed.all_ok(True)
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
        from ravex._registry import KINDS

        for kind in KINDS:
            for obj in self.registry.live(kind):
                self._keepalive.setdefault(id(obj), obj)

    def _loader_active(self) -> bool:
        for loader in self.registry.live("loaders"):
            st = loader.__dict__.get("_ravex_state")
            if st is not None and st.epoch >= 0 and not st.exhausted:
                return True
        return False

    def checkpoint(self, force: bool = True) -> bool:
        """``ravex.checkpoint()``: take one now. True if it was handed to the writer."""
        return self._checkpoint_now(None, reason="manual", force=force)

    def _checkpoint_now(self, st: LoaderState | None, reason: str, force: bool = False) -> bool:
        """Take a checkpoint unless the storage breaker is cooling down (ravex._breaker):
        then a due or manual one is skipped (False). The exit and signal checkpoints are
        the last chance and always try. With several ranks all skip when any rank's
        breaker would (one small all-reduce per checkpoint).
        """
        self._due = False
        self._last_time = time.monotonic()
        if not force and self.step == self.last_checkpoint_step:
            return False
        from ravex import _breaker

        breaker = _breaker.of(self, self.config.storage.url)
        agree = _distributed.all_ok if self.world_size > 1 else None
        if not (reason == "exit" or self._exit_signal is not None or breaker.allow(agree)):
            return False  # storage down (here or on another rank): skipped at no cost, training goes on
        if not self._open_backend():
            self.checkpoint_error = self.backend_error
            breaker.failed(self.step)
            return False
        try:
            self.ensure_restored()
            if not self._prepared_writes:
                self.backend.prepare_writes(self.resumed_from)
                self._prepared_writes = True
            tree = _state.collect(self.registry, self.step, st)
            if getattr(self.backend, "name", None) == "zarr":  # ranks, shards: who writes what
                tree = _distributed.prepare_save(tree, self.rank, self.world_size)
            self._keep_alive()
            metadata = {"reason": reason, "time": time.time(), "pid": self.pid,
                        "ravex": _version()}
            self.backend.breaker = breaker  # the writer thread reports the outcome to it
            self.last_stall = self.backend.save(self.step, tree, metadata)
        except _state.RestoreError:
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

    def flush(self) -> None:
        if self.backend is not None:
            self.backend.flush()

    # ── signals and exit ────────────────────────────────────────────────

    def _install_signals(self) -> None:
        if self.world_size > 1:  # decisions all ranks must share go through one poll
            self._poll = _distributed.Poll(self.config.checkpoint_every_seconds)
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
        poll = getattr(self, "_poll", None)
        shared = poll is not None and _distributed.can_agree()
        if (os.getpid() != self.pid or self._exit_signal is not None or not training
                or (shared and poll.pending)):
            previous = self._signals.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        if shared:
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
        from ravex import _breaker

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
            "breaker": _breaker.of(self, self.config.storage.url).status(),
            "config": self.config.describe(),
        }


def _version() -> str:
    from ravex import __version__

    return __version__


def _setup_logging(level: str) -> None:
    log = logging.getLogger("ravex")
    log.setLevel(level)
    if not any(getattr(h, "_ravex", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ravex = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False
