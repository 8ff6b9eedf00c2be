"""``activate()`` after the model was built: find the training objects that already exist.

Two costs dominated this scan with torch loaded (~300k objects on the heap): one
``isinstance`` chain per object, and a full ``gc.collect()`` (~1.5 us per object here,
0.5 s) run only so that cyclic garbage, say a dropped optimizer and its scheduler, is not
mistaken for a live object. Instead:

* objects are classified by their exact type, against every subclass of the five kinds
  (``__subclasses__``), in one comprehension over the heap;
* each object found is first proven live the cheap way: reached by strong references from
  a running frame or ``__main__`` (:func:`_all_reachable`, which stops as soon as all are
  found and after a bounded walk). Only when something stays unproven does the full
  collect run; the garbage among the finds then drops out of the weak registry by itself.

The heap is read oldest generation first, which is close to allocation order: the order
a rerun of the same script creates the objects in, too.
"""

from __future__ import annotations

import gc
import inspect
import sys
import types
from collections import deque
from typing import Any

import torch

from .registry import Registry

#: Objects visited at most while proving the finds live; past it, ``gc.collect()`` decides.
WALK_LIMIT = 50_000


def _kinds() -> tuple[tuple[type, str], ...]:
    from torch.optim.lr_scheduler import LRScheduler
    from torch.utils.data import DataLoader

    return ((DataLoader, "loaders"), (torch.nn.Module, "modules"), (torch.optim.Optimizer, "optimizers"),
            (LRScheduler, "schedulers"), (torch.amp.GradScaler, "scalers"))


def kind_of_types() -> dict[type, str]:
    """Every class now defined that is one of the kinds, mapped to its kind (the first kind
    that matches, in the order ``isinstance`` was tried before)."""
    out: dict[type, str] = {}
    for base, kind in _kinds():
        stack = [base]
        while stack:
            cls = stack.pop()
            if cls not in out:
                out[cls] = kind
                stack.extend(type.__subclasses__(cls))
    return out


def scan(registry: Registry) -> None:
    """Register every live model, optimizer, scheduler, scaler and DataLoader."""
    pending = _register(registry)  # ids only: the garbage among the finds must stay collectable
    if pending and not _all_reachable(pending):
        gc.collect()  # the registry is weak: what this frees leaves it


def _register(registry: Registry) -> set[int]:
    kinds = kind_of_types()
    found: list[Any] = []
    for generation in (2, 1, 0):  # oldest first
        found.extend([obj for obj in gc.get_objects(generation) if type(obj) in kinds])
    for obj in found:
        kind = kinds[type(obj)]
        if kind == "loaders":
            registry.loader_state(obj)
        else:
            registry.add(kind, obj)
    return {id(obj) for obj in found}


def _roots() -> list[Any]:
    """The locals of running frames outside Ravex, innermost first, then ``__main__``'s namespace."""
    roots: list[Any] = []
    for top in sys._current_frames().values():
        frame: types.FrameType | None = top
        while frame is not None:
            name = frame.f_globals.get("__name__") or ""
            if name != "ravex" and not name.startswith("ravex."):  # our frames hold the heap list
                roots.append(_locals_of(frame))
            frame = frame.f_back
    main = sys.modules.get("__main__")
    if main is not None and isinstance(getattr(main, "__dict__", None), dict):
        roots.append(main.__dict__)
    return roots


def _locals_of(frame: types.FrameType) -> list[Any]:
    """A running function's local values. (The gc does not see them: a running frame is a root.)

    Before Python 3.13 ``f_locals`` of a function is a snapshot dict the frame keeps; left
    filled, it would keep a local the function later drops alive (and "live" to Ravex).
    So it is emptied again unless someone else holds it too (a ``locals()`` result); the
    next ``locals()`` refills it.
    """
    snapshot = frame.f_locals
    values = list(snapshot.values())
    if frame.f_code.co_flags & inspect.CO_OPTIMIZED and sys.version_info < (3, 13) \
            and sys.getrefcount(snapshot) <= 3:  # the frame, this name, the call's argument
        snapshot.clear()
    return values


def _all_reachable(pending: set[int], limit: int = WALK_LIMIT) -> bool:
    """Whether every object whose id is in ``pending`` is reached from :func:`_roots`.

    Sound, not complete: True only on a found chain of strong references; False can mean
    "not found within the limit", and the caller then collects. Module namespaces other
    than ``__main__``'s, classes, code and tensors are not walked into (each is a hub to much
    of the heap or holds nothing of interest); a live module proves all its submodules, and
    optimizers and DataLoaders (their state, their dataset) are not walked into.
    """
    left = set(pending)
    seen: set[int] = set()
    queue: deque[Any] = deque()
    for root in _roots():
        seen.add(id(root))
        queue.append(root)
    opaque = (type, types.ModuleType, types.CodeType, torch.Tensor)
    stop = (torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader)
    visited = 0
    while queue and visited < limit:
        visited += 1
        for child in gc.get_referents(queue.popleft()):
            if not gc.is_tracked(child):
                continue  # atoms (str, int, float) hold no references
            key = id(child)
            if key in seen:
                continue
            seen.add(key)
            if key in left:
                left.discard(key)
                if isinstance(child, torch.nn.Module):
                    for sub in child.modules():
                        left.discard(id(sub))
                        seen.add(id(sub))
                if not left:
                    return True
                if isinstance(child, stop):
                    continue
            if not isinstance(child, opaque) and not (type(child) is dict and "__spec__" in child):
                queue.append(child)  # (a dict with __spec__ is a module's namespace)
    return not left
