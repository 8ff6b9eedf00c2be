"""Processes that ``multiprocessing`` starts: the ranks of ``torch.multiprocessing.spawn``
(``mp.spawn(main, nprocs=N)``, the launcher of PyTorch's DDP tutorials and ImageNet example),
and DataLoader workers started with the spawn or forkserver method (the default on macOS and
Windows; ``multiprocessing_context="spawn"`` anywhere).

Such a process imports the main script again (as ``__mp_main__``): a ``ravex.activate()`` at its
top, or ``ravex enable``'s hook at its ``import torch``, would start a runtime there that takes
itself for the job's one process. In a DataLoader worker such a runtime would find the timeline
held by the training process and stop the worker (exit 2: "DataLoader worker exited
unexpectedly"), crashing the training; in a spawned rank it would not know its rank yet. So:

- In such a process a runtime starts only when the process creates its process group
  (:func:`defer_to_process_group`): a rank then knows its rank and world size, and finds what
  the script built before (``activate()``'s scan). A DataLoader worker never creates one, so it
  never starts a runtime.
- The process that spawns the ranks (the script the user runs) trains nothing itself: when it
  calls ``start_processes`` (what ``mp.spawn`` calls) before a step of its own, its runtime
  stands down for good (:func:`watch`), releasing the timeline's lease for the ranks' rank 0 and
  saying nothing at exit, and marks the ranks it starts (:data:`SPAWNED_ENV`) so that ``ravex
  enable``'s hook defers in them too (it leaves other ``multiprocessing`` children alone: a
  framework that checkpoints its spawned ranks itself, Lightning's ``ddp_spawn``).

A process that spawns processes for other work first (``mp.spawn`` of a preprocessing step) and
then trains itself is not checkpointed after that: it stood down at the spawn.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from ..patches import Patches

#: set by the process that stood down for the ranks it spawns; inherited by them
SPAWNED_ENV = "_RAVEX_SPAWNED_RANKS"
#: the name ``multiprocessing`` gives the main script when a spawned process imports it again
MP_MAIN = "__mp_main__"


def in_child() -> bool:
    """Whether ``multiprocessing`` started this process (any start method)."""
    import multiprocessing as mp

    try:
        current = mp.current_process()
        return bool(getattr(current, "_inheriting", False)) or mp.parent_process() is not None
    except Exception:  # an embedding interpreter, a half-initialised process
        return False


def _group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def defers(caller_module: str | None) -> bool:
    """Whether ``activate()`` called from module ``caller_module`` waits for the process group:
    in a ``multiprocessing`` child that has none yet, when the call comes from the main script
    being imported again, or in a rank spawned by a process that stood down for it. (A child
    that calls ``activate()`` from its own function, with no rank of a job to learn, starts then.)"""
    if _group_exists() or not in_child():
        return False
    return caller_module == MP_MAIN or bool(os.environ.get(SPAWNED_ENV))


def defer_to_process_group(start: Callable[[], object]) -> None:
    """Call ``start`` (it starts the runtime) right after this process's first
    ``torch.distributed.init_process_group``."""
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_ravex_deferred", False):
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        dist.init_process_group = original  # once: a later group is not a new run
        start()
        return result

    init_process_group._ravex_deferred = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def watch(runtime: Any, patches: Patches, start: Callable[[], object]) -> None:
    """The process that calls ``torch.multiprocessing.start_processes`` before a training step of
    its own hands the run to the processes it starts (see the module docstring); ``start``
    starts a runtime in a rank forked from it."""
    import importlib

    import torch.multiprocessing as torch_mp

    spawn = importlib.import_module("torch.multiprocessing.spawn")  # (the package's `spawn` is the function)

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def start_processes(*args: Any, **kwargs: Any) -> Any:
            if runtime.enabled and runtime.steps_here == 0:
                os.environ[SPAWNED_ENV] = "1"
                runtime.stand_down_for_spawned_ranks()
                defer_to_process_group(start)  # ranks forked from here inherit it
            return original(*args, **kwargs)

        return start_processes

    exported = torch_mp.__dict__.get("start_processes") is spawn.start_processes
    patches.replace(spawn, "start_processes", make)  # what mp.spawn calls
    if exported:
        patches.replace(torch_mp, "start_processes", make)
