"""Ravex — transparent checkpointing for PyTorch training.

Two ways in.

**Zero code changes** (what the project is for). Install the autoloader once, drop a
``ravex.yaml`` next to your code, and run your script unchanged::

    ravex enable
    python train.py

**One line**, when you would rather be explicit::

    import ravex
    ravex.activate()

Either way, every ``optimizer.step()`` is counted, a checkpoint is written every
``checkpoint_every`` steps, and rerunning the same script picks up where the last one
stopped — model, optimizer, LR scheduler, AMP scaler, RNG streams and DataLoader
position included — bit for bit.

This module imports nothing heavy: torch is imported by the calls that need it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from ravex.version import __version__

T = TypeVar("T")

__all__ = [
    "__version__",
    "activate",
    "checkpoint",
    "deactivate",
    "flush",
    "is_active",
    "load",
    "loop",
    "status",
    "step",
    "tag",
]


def activate(**overrides: Any) -> Any:
    """Install the PyTorch patches and start checkpointing.

    Keyword arguments override ``ravex.yaml`` and ``RAVEX_*`` settings, e.g.
    ``ravex.activate(checkpoint_every=100, backend="torch_save")``. Calling it twice is
    harmless; changing options once active raises :class:`RuntimeError` (they are
    baked into the patches and the open store). An unknown option raises
    :class:`TypeError`, naming the nearest valid one.

    When another run still writes the timeline this run would write (a requeued job whose
    predecessor is alive, the same script launched twice), this run must not train: the one
    line naming that run (host, pid, start) goes to stderr and the process exits with status 2,
    as under ``ravex enable`` (catch ``SystemExit`` to do otherwise). So does ``resume: never``
    on a storage that already holds this timeline's steps, naming them and the fixes.

    In a process ``multiprocessing`` started that has no process group yet (a rank of
    ``torch.multiprocessing.spawn`` importing the script again, a DataLoader worker started by
    spawn), it starts nothing and returns None: Ravex starts when the process creates its
    process group, with its rank, and never in a DataLoader worker (``ravex.runtime.starting.spawned``).
    """
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    if runtime is not None:
        if overrides:
            raise RuntimeError(
                "Ravex is already active; configuration cannot be changed after activation. "
                "Set the options in ravex.yaml or RAVEX_* environment variables instead."
            )
        return runtime
    from ravex.runtime.config import RavexConfig
    from ravex.runtime.starting import spawned

    if spawned.defers(sys._getframe(1).f_globals.get("__name__")):
        spawned.defer_to_process_group(lambda: activate(**overrides))  # a spawned rank or DataLoader worker
        return None
    return lifecycle.start_or_exit(RavexConfig.load(overrides), scan_existing=True)


def deactivate() -> None:
    """Flush, stop checkpointing and remove every patch. Mostly for tests."""
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    if runtime is not None:
        runtime.shutdown(final_checkpoint=False)
    lifecycle.reset_runtime()


def is_active() -> bool:
    """Whether the runtime is installed and checkpointing."""
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    return runtime is not None and runtime.enabled


def checkpoint() -> bool:
    """Take a checkpoint now, outside the cadence. False if inactive or it failed."""
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    return runtime.checkpoint() if runtime is not None else False


def flush() -> None:
    """Block until every pending checkpoint write has landed (or failed)."""
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    if runtime is not None:
        runtime.flush()


def tag(name: str) -> str | None:
    """Name the **last** checkpoint so that retention (``keep_last``) and ``ravex gc`` never collect it.

    Waits for the write in flight, then tags the newest step of the timeline this run writes:
    the last checkpoint this run took (call :func:`checkpoint` first to tag the state as it is
    now), or, before its first, the step it resumed from. Returns what was tagged (``"60"``, or
    ``"exp@60"`` on another timeline); None on ranks other than 0, which tag nothing. Inactive,
    a bad or taken name, or no step yet: a one-line error. ``ravex tag NAME STEP`` tags any step.
    """
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    if runtime is None or runtime.backend is None:
        raise RuntimeError("ravex.tag() needs an active run (ravex.activate() or `ravex enable`); "
                           "`ravex tag NAME STEP` tags a step of a store")
    runtime.flush()
    return runtime.backend.tag(name)


def step() -> int:
    """The optimizer-step count as Ravex sees it (restored on resume)."""
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    return runtime.step if runtime is not None else 0


def loop(iterable: Iterable[T]) -> Iterable[T]:
    """``iterable``, its position saved with every checkpoint and resumed on a rerun::

        for epoch in ravex.loop(range(epochs)):
            for batch, i in ravex.loop(enumerate(range(0, n, bptt))):

    For loops whose position Ravex cannot see (a ``range``, batches sliced by hand): a
    rerun skips the iterations that had finished, restores the checkpoint where it was
    taken, at the start of an iteration, and runs on from there. Each iteration start is a
    step boundary, and a loop with no ``torch.optim`` optimizer counts the innermost
    wrapped loop's iterations as its steps. Wrap the whole iterable (``enumerate``
    included). Inactive, it returns ``iterable`` itself.
    """
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    if runtime is None or not runtime.enabled:
        return iterable
    from ravex.runtime.position.loops import Loop, call_site

    return Loop(runtime, iterable, call_site(sys._getframe(1)))


def status() -> dict[str, Any]:
    """What the runtime is doing: step, objects, store, last checkpoint, last error."""
    from ravex.runtime.starting import lifecycle

    runtime = lifecycle.get_runtime()
    if runtime is None:
        return {"active": False}
    return runtime.status()


def load(store: Any, step: int | str = "latest", subtree: Any = None, device: Any = None) -> Any:
    """A checkpoint's state tree with torch tensors, for evaluation, inference or fine-tuning.

    ``store`` is a path or fsspec URL; ``step`` a number or ``"latest"`` of the current
    timeline (the one a plain rerun continues), or ``"exp@60"``; ``subtree`` a key
    or keys (``("models", 0, "state")``) to read only that part; ``device`` where the tensors go::

        model.load_state_dict(ravex.load("./ckpt")["models"][0]["state"])

    A model is stored under the plain module's names, so this loads a run that trained it
    under ``torch.compile`` or DDP (``ravex.runtime.state.names``).

    Nothing is unpickled. Without torch, ``ravex.format.open_store(path).read(step)``
    gives the same tree with numpy arrays.
    """
    from ravex.saving.load import load as load_tree

    return load_tree(store, step, subtree=subtree, device=device)
