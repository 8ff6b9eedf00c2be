"""What to save: the live objects collected into one state tree, and the plan around it.

:func:`collect` turns the registry into one state tree (tensors live, not copied: the
backend stages them). Tree layout (lists are indexed by creation order)::

    ravex       {"step", "format": 1}
    models      [{"type", "state": {name: tensor}}]
    optimizers  [{"type", "shapes", "steps", "state": optimizer.state_dict()}]
    schedulers  [{"type", "state"}]      scalers  [{"type", "state"}]
    loaders     [{"type", "length", "batch_size", "epoch", "yielded", "exhausted",
                  "active", "epoch_rng"}]
    loops       [{"site", "at", "boundary"}]   the ravex.loop positions, outermost first
    rng         {"python", "numpy", "torch", "cuda": [...]}
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import LoaderState, Registry
from .rng import capture_rng

TREE_FORMAT = 1


def collect(registry: Registry, step: int, active_loader: LoaderState | None,
            loops: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole training state as one tree, tensors aliasing live memory; ``loops`` are
    the wrapped loops' positions (:mod:`.loops`)."""
    tree: dict[str, Any] = {"ravex": {"step": step, "format": TREE_FORMAT}}
    tree["models"] = [
        {"type": type(m).__name__, "state": dict(m.state_dict())} for m in registry.models()
    ]
    tree["optimizers"] = [
        {
            "type": type(o).__name__,
            "shapes": optimizer_shapes(o),
            "steps": registry.optimizer_steps(o),
            "state": o.state_dict(),
        }
        for o in registry.live("optimizers")
    ]
    tree["schedulers"] = [
        {"type": type(s).__name__, "state": s.state_dict()} for s in registry.live("schedulers")
    ]
    tree["scalers"] = [
        {"type": type(s).__name__, "state": s.state_dict()} for s in registry.live("scalers")
    ]
    loaders = []
    for loader in registry.live("loaders"):
        st = registry.loader_state(loader)
        loaders.append(
            {
                **loader_identity(loader),
                "epoch": st.epoch,
                "yielded": st.yielded,
                "exhausted": st.exhausted,
                "active": st is active_loader,
                "epoch_rng": st.epoch_rng,
            }
        )
    tree["loaders"] = loaders
    tree["loops"] = loops
    tree["rng"] = capture_rng()
    return tree


def optimizer_shapes(opt: torch.optim.Optimizer) -> list[list[list[int]]]:
    return [[list(p.shape) for p in group["params"]] for group in opt.param_groups]


def loader_identity(loader: Any) -> dict[str, Any]:
    try:
        length: int | None = len(loader)
    except TypeError:
        length = None
    return {"type": type(loader).__name__, "length": length, "batch_size": loader.batch_size}
