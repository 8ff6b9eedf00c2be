"""What to save, and how to put it back: the plan half of DCP's plan/storage split.

:func:`collect` turns the registry into one state tree (tensors live, not copied: the
backend stages them). :func:`restore` puts a tree back into the registry's objects after
checking that they are the same objects (creation order, type, parameter shapes); a
changed architecture is an error, never a silent partial load.

Tree layout (lists are indexed by creation order)::

    ravex       {"step", "format": 1}
    models      [{"type", "state": {name: tensor}}]
    optimizers  [{"type", "shapes", "steps", "state": optimizer.state_dict()}]
    schedulers  [{"type", "state"}]      scalers  [{"type", "state"}]
    loaders     [{"type", "length", "batch_size", "epoch", "yielded", "exhausted",
                  "active", "epoch_rng"}]
    rng         {"python", "numpy", "torch", "cuda": [...]}
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ravex._registry import LoaderState, Registry
from ravex.errors import RestoreError

TREE_FORMAT = 1


# ── RNG ─────────────────────────────────────────────────────────────────


def capture_rng() -> dict[str, Any]:
    """Every RNG stream a training step draws from. CUDA only if already initialised."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    cuda: list[torch.Tensor] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = list(torch.cuda.get_rng_state_all())
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": keys, "pos": int(pos), "has_gauss": int(has_gauss),
                  "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(as_tensor(state["torch"]).to(torch.uint8))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([as_tensor(s).to(torch.uint8) for s in state["cuda"]])


def capture_epoch_rng(loader: Any) -> dict[str, Any]:
    """The RNG a DataLoader draws from when an epoch starts (worker seed, shuffle order)."""
    out: dict[str, Any] = {"torch": torch.get_rng_state()}
    for name, gen in _loader_generators(loader):
        out[name] = gen.get_state()
    return out


def restore_epoch_rng(loader: Any, state: dict[str, Any]) -> None:
    torch.set_rng_state(as_tensor(state["torch"]).to(torch.uint8))
    for name, gen in _loader_generators(loader):
        if state.get(name) is not None:
            gen.set_state(as_tensor(state[name]).to(torch.uint8))


def _loader_generators(loader: Any) -> list[tuple[str, torch.Generator]]:
    gens = []
    seen: set[int] = set()
    for name, owner in (("generator", loader), ("sampler_generator", getattr(loader, "sampler", None)),
                        ("batch_sampler_generator",
                         getattr(getattr(loader, "batch_sampler", None), "sampler", None))):
        gen = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(gen, torch.Generator) and id(gen) not in seen:
            seen.add(id(gen))
            gens.append((name, gen))
    return gens


# ── tensors ─────────────────────────────────────────────────────────────


def as_tensor(value: Any) -> torch.Tensor:
    """A tensor from a restored leaf: a tensor (torch_save) or a numpy array (format)."""
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value)
    view = _ML_DTYPES.get(arr.dtype.name)
    if view is not None:
        int_np, torch_dtype = view
        arr = arr.view(int_np)
        return torch.from_numpy(np.array(arr, copy=not arr.flags.writeable)).view(torch_dtype)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)


_ML_DTYPES = {
    "bfloat16": (np.int16, torch.bfloat16),
    "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
    "float8_e5m2": (np.uint8, torch.float8_e5m2),
}


def tensors_in(tree: Any) -> Any:
    """``tree`` with every array leaf turned into a tensor."""
    if isinstance(tree, dict):
        return {k: tensors_in(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [tensors_in(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(tensors_in(v) for v in tree)
    if isinstance(tree, np.ndarray):
        return as_tensor(tree)
    return tree


# ── collect ─────────────────────────────────────────────────────────────


def collect(registry: Registry, step: int, active_loader: LoaderState | None) -> dict[str, Any]:
    """The whole training state as one tree, tensors aliasing live memory."""
    tree: dict[str, Any] = {"ravex": {"step": step, "format": TREE_FORMAT}}
    tree["models"] = [
        {"type": type(m).__name__, "state": dict(m.state_dict())} for m in registry.models()
    ]
    tree["optimizers"] = [
        {
            "type": type(o).__name__,
            "shapes": _optimizer_shapes(o),
            "steps": int(o.__dict__.get("_ravex_steps", 0)),
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
                **_loader_identity(loader),
                "epoch": st.epoch,
                "yielded": st.yielded,
                "exhausted": st.exhausted,
                "active": st is active_loader,
                "epoch_rng": st.epoch_rng,
            }
        )
    tree["loaders"] = loaders
    tree["rng"] = capture_rng()
    return tree


def _optimizer_shapes(opt: torch.optim.Optimizer) -> list[list[list[int]]]:
    return [[list(p.shape) for p in group["params"]] for group in opt.param_groups]


def _loader_identity(loader: Any) -> dict[str, Any]:
    try:
        length: int | None = len(loader)
    except TypeError:
        length = None
    return {"type": type(loader).__name__, "length": length, "batch_size": loader.batch_size}


# ── restore ─────────────────────────────────────────────────────────────


def restore(registry: Registry, tree: dict[str, Any], where: str) -> None:
    """Put ``tree`` back into the live objects; check everything before changing anything."""
    fmt = tree.get("ravex", {}).get("format")
    if fmt != TREE_FORMAT:
        raise RestoreError(f"{where}: state tree format {fmt!r} is not {TREE_FORMAT}; "
                           "written by an incompatible Ravex")
    models = registry.models()
    optimizers = registry.live("optimizers")
    schedulers = registry.live("schedulers")
    scalers = registry.live("scalers")
    _check_counts(where, "model", models, tree["models"])
    _check_counts(where, "optimizer", optimizers, tree["optimizers"])
    _check_counts(where, "LR scheduler", schedulers, tree["schedulers"])
    _check_counts(where, "GradScaler", scalers, tree["scalers"])
    for i, (model, saved) in enumerate(zip(models, tree["models"], strict=True)):
        _check_model(where, i, model, saved)
    for i, (opt, saved) in enumerate(zip(optimizers, tree["optimizers"], strict=True)):
        _check_type(where, f"optimizer #{i}", opt, saved)
        if _optimizer_shapes(opt) != _as_lists(saved["shapes"]):
            raise RestoreError(
                f"{where}: optimizer #{i} ({type(opt).__name__}) holds parameters of shapes "
                f"{_optimizer_shapes(opt)} but the checkpoint's has {_as_lists(saved['shapes'])}."
                + _FIX
            )
    for i, (obj, saved) in enumerate(zip(schedulers, tree["schedulers"], strict=True)):
        _check_type(where, f"LR scheduler #{i}", obj, saved)
    for i, (obj, saved) in enumerate(zip(scalers, tree["scalers"], strict=True)):
        _check_type(where, f"GradScaler #{i}", obj, saved)

    with torch.no_grad():
        for model, saved in zip(models, tree["models"], strict=True):
            model.load_state_dict(tensors_in(saved["state"]), strict=True)
    for opt, saved in zip(optimizers, tree["optimizers"], strict=True):
        opt.load_state_dict(tensors_in(saved["state"]))
        opt.__dict__["_ravex_steps"] = int(saved["steps"])
    for obj, saved in zip(schedulers, tree["schedulers"], strict=True):
        obj.load_state_dict(tensors_in(saved["state"]))
    for obj, saved in zip(scalers, tree["scalers"], strict=True):
        if saved["state"]:
            obj.load_state_dict(tensors_in(saved["state"]))
    restore_rng(tree["rng"])


def check_loader(where: str, index: int, loader: Any, saved: dict[str, Any]) -> None:
    """A DataLoader must be the same one: type, length and batch size."""
    mine = _loader_identity(loader)
    theirs = {k: saved.get(k) for k in mine}
    if mine != theirs:
        raise RestoreError(
            f"{where}: DataLoader #{index} is {mine} in this run but {theirs} in the checkpoint; "
            "the dataset or batch size changed." + _FIX
        )


_FIX = (" Start a fresh run: point `storage` at a new location, or set `resume: never` "
        "(RAVEX_RESUME=never).")


def _check_counts(where: str, what: str, live: list[Any], saved: list[Any]) -> None:
    if len(live) != len(saved):
        raise RestoreError(
            f"{where}: the checkpoint holds {len(saved)} {what}(s) but this run has created "
            f"{len(live)} by the first training step ({[type(o).__name__ for o in live]} vs "
            f"{[s['type'] for s in saved]})." + _FIX
        )


def _check_type(where: str, what: str, obj: Any, saved: dict[str, Any]) -> None:
    if type(obj).__name__ != saved["type"]:
        raise RestoreError(
            f"{where}: {what} is a {type(obj).__name__} in this run but a {saved['type']} in the "
            "checkpoint." + _FIX
        )


def _check_model(where: str, index: int, model: torch.nn.Module, saved: dict[str, Any]) -> None:
    _check_type(where, f"model #{index}", model, saved)
    live = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    stored = {k: tuple(_shape(v)) for k, v in saved["state"].items()}
    missing = sorted(set(stored) - set(live))
    extra = sorted(set(live) - set(stored))
    if missing or extra:
        raise RestoreError(
            f"{where}: model #{index} ({type(model).__name__}) does not match the checkpoint: "
            f"not in this model {missing[:5]}, not in the checkpoint {extra[:5]}." + _FIX
        )
    for key, shape in live.items():
        if stored[key] != shape:
            raise RestoreError(
                f"{where}: model #{index} ({type(model).__name__}) tensor {key!r} has shape "
                f"{list(shape)} but {list(stored[key])} in the checkpoint." + _FIX
            )


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(getattr(value, "shape", ()))


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value
