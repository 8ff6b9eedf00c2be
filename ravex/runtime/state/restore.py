"""Putting a checkpoint back into the live objects, checked first, read in place.

:func:`restore` puts a tree back into the registry's objects after checking that they are
the same objects (creation order, type, parameter shapes); a changed architecture is an
error, never a silent partial load.

A resume from the format backend hands :func:`restore` a *lazy* tree: model and optimizer
tensors are :class:`~ravex.format.ArrayRef` leaves, read only after every check passed,
straight into the live tensors' memory (one parallel read, no second copy, no fresh pages),
so ``load_state_dict`` then finds each tensor already in place. :func:`read_small` reads
the rest of such a tree (RNG, loaders, schedulers) when the step is chosen. The tree's
layout is :mod:`ravex.runtime.state.plan`'s.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from ravex.errors import RestoreError
from ravex.format import ArrayRef
from ravex.saving.dtypes import as_tensor, raw_view, torch_dtype
from ravex.saving.load import read_refs
from ravex.saving.tree import tree_map

from .names import WRAPPERS, load_plain, plain_state, stored_name, type_name
from .plan import TREE_FORMAT, loader_identity, optimizer_shapes, param_keys, param_names
from .registry import Registry
from .rng import restore_rng

logger = logging.getLogger("ravex")


def tensors_in(tree: Any, read: dict[str, torch.Tensor] | None = None) -> Any:
    """``tree`` with every array leaf turned into a tensor; an :class:`ArrayRef` leaf becomes
    the tensor ``read`` holds for its path (or is read now, on its own)."""
    found = read or {}

    def leaf(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return as_tensor(value)
        if isinstance(value, ArrayRef):
            tensor = found.get(value.path)
            return tensor if tensor is not None else as_tensor(value.read())
        return value

    return tree_map(leaf, tree)


# ── restore ─────────────────────────────────────────────────────────────


def restore(registry: Registry, tree: dict[str, Any], where: str, partial: bool = False) -> None:
    """Put ``tree`` back into the live objects; check everything before changing anything.
    ``partial``: a rerun skipping a finished run's training may not have created what only
    the training code creates (an optimizer built inside ``Trainer.run()``); the objects it
    has are restored, the checkpoint's later ones are not needed."""
    fmt = tree.get("ravex", {}).get("format")
    if fmt not in _READS:
        raise RestoreError(f"{where}: state tree format {fmt!r} is not one of {list(_READS)}; "
                           "written by an incompatible Ravex")
    models = registry.models()
    optimizers = registry.live("optimizers")
    schedulers = registry.live("schedulers")
    scalers = registry.live("scalers")
    if partial:
        tree = dict(tree)
        for key, live in (("models", models), ("optimizers", optimizers), ("schedulers", schedulers),
                          ("scalers", scalers)):
            tree[key] = tree[key][:len(live)]
    _check_counts(where, "model", models, tree["models"])
    _check_counts(where, "optimizer", optimizers, tree["optimizers"])
    _check_counts(where, "LR scheduler", schedulers, tree["schedulers"])
    _check_counts(where, "GradScaler", scalers, tree["scalers"])
    for i, (model, saved) in enumerate(zip(models, tree["models"], strict=True)):
        _check_model(where, i, model, saved)
    names = param_names(models)
    states = []  # each optimizer's saved state_dict, in its own numbering
    for i, (opt, saved) in enumerate(zip(optimizers, tree["optimizers"], strict=True)):
        _check_type(where, f"optimizer #{i}", opt, saved)
        if "param_groups" in saved:
            states.append(_by_index(f"{where}: optimizer #{i} ({type(opt).__name__})", opt, saved,
                                    param_keys(opt, names)))
            continue
        if optimizer_shapes(opt) != _as_lists(saved["shapes"]):
            raise RestoreError(
                f"{where}: optimizer #{i} ({type(opt).__name__}) holds parameters of shapes "
                f"{optimizer_shapes(opt)} but the checkpoint's has {_as_lists(saved['shapes'])}."
                + _FIX
            )
        states.append(saved["state"])
    for i, (obj, saved) in enumerate(zip(schedulers, tree["schedulers"], strict=True)):
        _check_type(where, f"LR scheduler #{i}", obj, saved)
    for i, (obj, saved) in enumerate(zip(scalers, tree["scalers"], strict=True)):
        _check_type(where, f"GradScaler #{i}", obj, saved)

    plan = _InPlace()
    for model, saved in zip(models, tree["models"], strict=True):
        own = plain_state(model, keep_vars=True)
        for key, value in saved["state"].items():
            if isinstance(value, ArrayRef):
                target = own[key]
                plan.add(value, target, target.device)
    for opt, state in zip(optimizers, states, strict=True):
        _plan_optimizer(plan, opt, state)
    read = plan.read(where)  # the only step that changes live memory before load_state_dict
    with torch.no_grad():  # a tensor already in place makes its copy_ a no-op
        for model, saved in zip(models, tree["models"], strict=True):
            load_plain(model, tensors_in(saved["state"], read))
    for opt, saved, state in zip(optimizers, tree["optimizers"], states, strict=True):
        opt.load_state_dict(tensors_in(state, read))
        registry.set_optimizer_steps(opt, int(saved["steps"]))
    _say_schedule_changes(where, schedulers, tree["schedulers"])
    for obj, saved in zip(schedulers, tree["schedulers"], strict=True):
        obj.load_state_dict(tensors_in(saved["state"]))
    for obj, saved in zip(scalers, tree["scalers"], strict=True):
        if saved["state"]:
            obj.load_state_dict(tensors_in(saved["state"]))
    restore_rng(tree["rng"])
    registry.appended.rewind(tree.get("appended", []), int(tree["ravex"]["step"]))


#: scheduler state that moves as it steps, not a setting it was built with
_SCHEDULE_PROGRESS = frozenset({"last_epoch", "best", "num_bad_epochs", "cooldown_counter"})


def _say_schedule_changes(where: str, schedulers: list[Any], saved: list[dict[str, Any]]) -> None:
    """Say once which numbers an LR scheduler was built with in this run (``T_max``,
    ``total_steps``: a finished run extended with a larger bound) that the checkpoint's state
    puts back as the first run had them: the schedule goes on as that run set it."""
    changed = []
    for i, (obj, entry) in enumerate(zip(schedulers, saved, strict=True)):
        theirs = entry["state"]
        for key, mine in obj.state_dict().items():
            if key.startswith("_") or key in _SCHEDULE_PROGRESS or type(mine) not in (int, float):
                continue
            if type(theirs.get(key)) is type(mine) and theirs[key] != mine:
                changed.append(f"#{i} ({type(obj).__name__}) {key}={theirs[key]} (built with {mine} by this run)")
    if changed:
        logger.warning("ravex: %s restores LR scheduler %s: the schedule goes on as the run that wrote it set "
                       "it, not as this run's arguments describe", where, ", ".join(changed))


def check_loader(where: str, index: int, loader: Any, saved: dict[str, Any]) -> None:
    """A DataLoader must be the same one: type, length and batch size."""
    mine = loader_identity(loader)
    theirs = {k: saved.get(k) for k in mine}
    if mine != theirs:
        raise RestoreError(
            f"{where}: DataLoader #{index} is {mine} in this run but {theirs} in the checkpoint; "
            "the dataset or batch size changed." + _FIX
        )


#: Tree formats this Ravex restores: 1 keeps optimizer state by parameter index only.
_READS = (1, TREE_FORMAT)

_FIX = (" To start afresh on purpose, point `storage` at a new location (`resume: <step>` "
        "forks from another step).")


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
    """Same type (the plain module's: a store written before names were plain records a
    wrapper's, which says nothing of it) and the same tensors by plain name, shape and dtype."""
    mine = type_name(model)
    if saved["type"] not in WRAPPERS and mine != saved["type"]:
        raise RestoreError(
            f"{where}: model #{index} is a {mine} in this run but a {saved['type']} in the "
            "checkpoint." + _FIX
        )
    own = plain_state(model, keep_vars=True)
    live = {k: tuple(v.shape) for k, v in own.items()}
    stored = {k: tuple(_shape(v)) for k, v in saved["state"].items()}
    missing = sorted(set(stored) - set(live))
    extra = sorted(set(live) - set(stored))
    if missing or extra:
        raise RestoreError(
            f"{where}: model #{index} ({mine}) does not match the checkpoint: "
            f"not in this model {missing[:5]}, not in the checkpoint {extra[:5]}." + _FIX
        )
    for key, shape in live.items():
        if stored[key] != shape:
            raise RestoreError(
                f"{where}: model #{index} ({mine}) tensor {key!r} has shape "
                f"{list(shape)} but {list(stored[key])} in the checkpoint." + _FIX
            )
    for key, tensor in own.items():
        theirs = torch_dtype(saved["state"][key])
        if theirs is not None and theirs != tensor.dtype:
            raise RestoreError(
                f"{where}: model #{index} ({mine}) tensor {key!r} is {tensor.dtype} "
                f"but {theirs} in the checkpoint (a resume would not be exact)." + _FIX
            )


def _by_index(what: str, opt: torch.optim.Optimizer, saved: dict[str, Any],
              keys: list[str | int]) -> dict[str, Any]:
    """A saved optimizer entry with parameters by key (:func:`ravex.runtime.state.plan.by_name`)
    as the ``state_dict`` ``opt`` loads: each key at the live parameter's index, each live
    param group given the saved group that holds the same parameters, whatever their order."""
    saved_groups = saved["param_groups"]
    shapes = {k: list(shape) for g, group in zip(saved_groups, _as_lists(saved["shapes"]), strict=True)
              for k, shape in zip(g["params"], group, strict=True)}
    live_groups = [[keys[i] for i in range(start, start + len(g["params"]))]
                   for start, g in zip(_starts(opt), opt.param_groups, strict=True)]
    params = [p for g in opt.param_groups for p in g["params"]]
    missing = sorted(map(str, set(keys) - set(shapes)))
    extra = sorted(map(str, set(shapes) - set(keys)))
    if missing or extra:
        raise RestoreError(f"{what} does not match the checkpoint: parameters not in the checkpoint "
                           f"{missing[:5]}, not in this optimizer {extra[:5]}." + _FIX)
    for key, param in zip(keys, params, strict=True):
        if list(param.shape) != shapes[key]:
            raise RestoreError(f"{what}: parameter {key!r} has shape {list(param.shape)} but "
                               f"{shapes[key]} in the checkpoint." + _FIX)
    index = {k: i for i, k in enumerate(keys)}
    groups = []
    for live in live_groups:
        match = [g for g in saved_groups if sorted(map(str, g["params"])) == sorted(map(str, live))]
        if len(match) != 1:
            raise RestoreError(f"{what}: no param group of the checkpoint holds exactly the parameters "
                               f"{[str(k) for k in live][:5]} (its groups: "
                               f"{[[str(k) for k in g['params']][:3] for g in saved_groups]})." + _FIX)
        groups.append({**match[0], "params": [index[k] for k in live]})
    return {"state": {index[k]: v for k, v in saved["state"].items()}, "param_groups": groups}


def _starts(opt: torch.optim.Optimizer) -> list[int]:
    """Where each param group's parameters start in ``state_dict()``'s numbering."""
    starts, at = [], 0
    for group in opt.param_groups:
        starts.append(at)
        at += len(group["params"])
    return starts


def saved_param_states(opt: torch.optim.Optimizer, saved: dict[str, Any],
                       names: dict[int, str]) -> list[tuple[torch.Tensor, Any]]:
    """Each per-parameter state of a saved optimizer entry with the live parameter it
    belongs to, matched by key (format 2) or index (format 1); keys ``opt`` lacks are
    skipped (:func:`restore` names them)."""
    params = [p for group in opt.param_groups for p in group["params"]]
    if "param_groups" in saved:
        where = {k: p for k, p in zip(param_keys(opt, names), params, strict=True)}
        return [(where[k], st) for k, st in (saved.get("state") or {}).items() if k in where]
    per_param = (saved.get("state") or {}).get("state") or {}
    return [(params[k], st) for k, st in per_param.items() if isinstance(k, int) and 0 <= k < len(params)]


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(getattr(value, "shape", ()))


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


# ── lazy trees: reading into the live tensors ─────────────────────────────

#: Tensor classes whose memory is exactly what ``numpy()`` shows (no DTensor, no wrappers).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _deferred(tree: dict[str, Any]) -> list[ArrayRef]:
    """The leaves :func:`restore` reads in place: model and optimizer state tensors."""
    refs = [v for m in tree.get("models", []) for v in (m.get("state") or {}).values()]
    for opt in tree.get("optimizers", []):
        per_param = opt.get("state") or {}
        if "param_groups" not in opt:  # format 1: the whole state_dict
            per_param = per_param.get("state") or {}
        for entry in per_param.values():
            if isinstance(entry, dict):
                refs.extend(entry.values())
    return [r for r in refs if isinstance(r, ArrayRef)]


def read_small(tree: dict[str, Any]) -> dict[str, Any]:
    """A lazy tree made ready for :func:`restore`: every array read except the model and
    optimizer tensors, whose objects are checked present instead. A step with a missing or
    truncated object is thus rejected here, before anything live has changed, and the
    runtime can fall back to an older one."""
    tree = with_plain_names(tree)
    deferred = _deferred(tree)
    if deferred:
        deferred[0].reader.check_objects([r.path for r in deferred])
    small: dict[str, Any] = read_refs(tree, keep={id(r) for r in deferred})
    return small


def with_plain_names(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with the names of a store written before names were plain (:mod:`.names`) made
    plain: each model's tensors by :func:`~ravex.runtime.state.names.stored_name`, each optimizer's
    parameters as the model tensor they equal is renamed (or by ``stored_name`` alone). Such a
    store resumes into a plain or a wrapped model alike; any other tree keeps its names."""
    renamed: dict[str, str] = {}
    models = []
    for entry in tree.get("models", []):
        state = entry.get("state") or {}
        names = {k: stored_name(k, entry.get("type", "")) for k in state}
        for old, new in names.items():
            renamed.setdefault(old, new)
        models.append({**entry, "state": {names[k]: v for k, v in state.items()}})

    def key(k: Any) -> Any:
        return renamed.get(k, stored_name(k, "")) if isinstance(k, str) else k

    optimizers = [
        {**opt, "state": {key(k): v for k, v in (opt.get("state") or {}).items()},
         "param_groups": [{**g, "params": [key(k) for k in g["params"]]} for g in opt["param_groups"]]}
        if "param_groups" in opt else opt  # format 1 keys parameters by index
        for opt in tree.get("optimizers", [])
    ]
    out = dict(tree)
    if "models" in tree:
        out["models"] = models
    if "optimizers" in tree:
        out["optimizers"] = optimizers
    return out


def _plan_optimizer(plan: _InPlace, opt: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Targets for an optimizer's saved state: its live state tensors where they exist and
    match (after a step), else new tensors on the CPU (before the first step)."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for pid, entry in (saved.get("state") or {}).items():
        if not isinstance(entry, dict) or not isinstance(pid, int) or not 0 <= pid < len(params):
            continue
        param = params[pid]
        live = opt.state.get(param) or {}
        for key, value in entry.items():
            if isinstance(value, ArrayRef):
                plan.add(value, live.get(key), param.device)


class _InPlace:
    """Where each deferred array of a lazy tree lands, then one parallel read into all of them.

    A live CPU tensor of the same shape and dtype is the destination itself (its numpy view);
    anything else (a CUDA tensor, optimizer state not created yet, a non-contiguous or
    wrapped tensor) gets a new CPU tensor, pinned when it is bound for a GPU, which
    ``load_state_dict`` then copies or adopts as it always did.
    """

    def __init__(self) -> None:
        self.refs: list[ArrayRef] = []
        self.outs: dict[str, np.ndarray] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.live: list[torch.Tensor] = []  # written behind autograd's back: versions to bump
        self._claimed: set[int] = set()

    def add(self, ref: ArrayRef, live: Any, device: torch.device) -> None:
        dtype = torch_dtype(ref)
        if dtype is None:
            return  # read on its own by tensors_in
        if self._fits(live, ref, dtype):
            target = live
            self.live.append(live)
            if live.numel():
                self._claimed.add(live.data_ptr())  # tied weights: the second one reads apart
        else:
            pin = device.type == "cuda" and torch.cuda.is_available()
            target = torch.empty(ref.shape, dtype=dtype, pin_memory=pin)
        self.refs.append(ref)
        self.outs[ref.path] = raw_view(target)
        self.tensors[ref.path] = target

    def _fits(self, live: Any, ref: ArrayRef, dtype: torch.dtype) -> bool:
        return (
            type(live) in _PLAIN
            and live.device.type == "cpu"
            and live.dtype == dtype
            and tuple(live.shape) == tuple(ref.shape)
            and live.is_contiguous()
            and not live.is_conj() and not live.is_neg()
            and (live.numel() == 0 or live.data_ptr() not in self._claimed)
        )

    def read(self, where: str) -> dict[str, torch.Tensor]:
        """Read every planned array into its target; the tensors, by path."""
        by_reader: dict[int, list[ArrayRef]] = {}
        for ref in self.refs:
            by_reader.setdefault(id(ref.reader), []).append(ref)
        for refs in by_reader.values():
            try:
                refs[0].reader.read_arrays([r.path for r in refs], outs={r.path: self.outs[r.path] for r in refs})
            except Exception as exc:
                raise RestoreError(
                    f"{where}: reading the checkpoint failed midway ({type(exc).__name__}: {exc}); the "
                    "model and optimizer are partly overwritten, so this run cannot go on. Run `ravex "
                    "validate`, then resume from a good step (`resume: <step>`) or start fresh."
                ) from exc
        for tensor in self.live:  # as an in-place copy_ would: whoever caches by _version sees it
            increment_version(tensor)
        return self.tensors


