"""What to save: the live objects collected into one state tree, and the plan around it.

:func:`collect` turns the registry into one state tree (tensors live, not copied: the
backend stages them). Tree layout (lists are indexed by creation order)::

    ravex       {"step", "format": 2}
    models      [{"type", "name"?, "state": {name: tensor}}]
    optimizers  [{"type", "name"?, "shapes", "steps", "state": {param: {"exp_avg": ...}},
                  "param_groups": [{..., "params": [param, ...]}]}]
    schedulers  [{"type", "state"}]      scalers  [{"type", "state"}]
    loaders     [{"type", "length", "batch_size", "epoch", "yielded", "exhausted",
                  "active", "epoch_rng", "offset", "sampler", "generators", "workers_seed", "reused",
                  "worker_rng"}]  (:mod:`.sampler_epoch`, :mod:`.workers`); ``yielded`` counts
                the batches the loop consumed, not those a wrapper fetched ahead (:mod:`.lookahead`)
    loops       [{"site", "at", "boundary"}]   the ravex.loop positions, outermost first
    script      {"mode", "frames": [{"code", "line", "loops", "variables"}]}  the main
                script's loop position and the variables its loops carry (optional)
    rng         {"python", "numpy", "torch", "cuda": [...]}
    appended    [{"path", "size"}]   the files the script appends to, and their sizes (:mod:`.appended`)

A model is stored as the plain module it is or wraps (:mod:`.names`): a ``GPT`` under
``torch.compile`` or DDP is stored as ``GPT``, its tensors as ``transformer.wte.weight``, not
``_orig_mod.``- or ``module.``-prefixed (as DCP's ``get_model_state_dict`` names them), and
in the place of the plain module's creation among the models. So a plain module loads a
compiled run's state with ``strict=True``, and a compiled and an uncompiled run's steps
diff name by name. Trees written before hold the wrappers' names; a resume still matches
them (:func:`ravex.runtime.state.restore.with_plain_names`).

An optimizer's ``state_dict()`` is stored with each parameter under its name in the model
that holds it (``fc1.weight``, as DCP's ``get_optimizer_state_dict`` names it), so a tool
shows names a user knows and a resume finds each parameter's state even when the rerun
builds its param groups in another order; a parameter no model names (or two of one
optimizer sharing a name) keeps its index. ``name`` is the main script's module global
bound to the object (for a model, to it or a module it wraps), where there is one. Format 1
trees hold ``optimizer.state_dict()`` as it is under ``state`` (indexes only); restore
still reads them.
"""

from __future__ import annotations

import functools
import os
import sys
from collections import Counter
from typing import Any

import torch

from . import sampler_epoch, workers
from .lookahead import consumed_worker_rng, held
from .names import layers, plain_state, renamer, type_name
from .registry import LoaderState, Registry
from .rng import capture_generators, capture_rng

TREE_FORMAT = 2


@functools.cache
def script_name() -> str | None:
    """What names this run's script in its steps (``train.py``): a rerun of another script
    (an evaluation beside the training, ``python -c``, a notebook, pytest) is not the run
    that wrote them. None where the process has no main script file. Read once, at
    activation: the interpreter removes ``__main__.__file__`` before the exit checkpoint."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.basename(path) if isinstance(path, str) else None


def staged_sizes(registry: Registry) -> list[int]:
    """Byte sizes of the CPU tensors :func:`collect` would hold from the models and optimizers
    (the bulk of a checkpoint), for staging memory prepared before the first checkpoint; a
    size that turns out wrong only costs that tensor the allocation it would have had anyway."""
    tensors: list[torch.Tensor] = [t for m in registry.models() for t in m.state_dict().values()
                                   if isinstance(t, torch.Tensor)]
    for o in registry.live("optimizers"):
        tensors.extend(v for state in o.state.values() if isinstance(state, dict)
                       for v in state.values() if isinstance(v, torch.Tensor))
    return [t.numel() * t.element_size() for t in tensors
            if t.device.type == "cpu" and t.layout == torch.strided and not t.is_meta]


def collect(registry: Registry, step: int, active_loader: LoaderState | None,
            loops: list[dict[str, Any]], script: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole training state as one tree, tensors aliasing live memory; ``loops`` are
    the wrapped loops' positions (:mod:`.loops`), ``script`` the main script's loop
    position and variables (:mod:`.position`)."""
    tree: dict[str, Any] = {"ravex": {"step": step, "format": TREE_FORMAT, "script": script_name()}}
    named = script_names()
    models = registry.models()
    tree["models"] = [
        {"type": type_name(m), **_name_of(m, named), "state": plain_state(m)} for m in models
    ]
    names = param_names(models)
    tree["optimizers"] = [
        {
            "type": type(o).__name__,
            **_name_of(o, named),
            "shapes": optimizer_shapes(o),
            "steps": registry.optimizer_steps(o),
            **by_name(o.state_dict(), param_keys(o, names)),
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
        consumed = st.yielded - held(st)  # a wrapper's look-ahead is not consumed yet
        loaders.append(
            {
                **loader_identity(loader),
                "epoch": st.epoch,
                "yielded": consumed,
                "exhausted": st.exhausted and consumed == st.yielded,
                "active": st is active_loader,
                "epoch_rng": st.epoch_rng,
                "offset": st.offset,
                "sampler": sampler_epoch.describe(loader),
                "generators": capture_generators(loader),
                "workers_seed": st.workers_seed,
                "reused": st.reused,
                "worker_rng": workers.for_tree(consumed_worker_rng(st, consumed)),
            }
        )
    tree["loaders"] = loaders
    tree["loops"] = loops
    if script is not None:
        tree["script"] = script
    tree["rng"] = capture_rng()
    tree["appended"] = registry.appended.capture()
    return tree


def drained_ahead(registry: Registry) -> LoaderState | None:
    """The loader a wrapper drained ahead of the loop, where the batch the loop just drew is
    one the wrapper still counts as held: a checkpoint at the loop's head is then the loop's
    header (``"drawn"``, :func:`.position.capture.capture`), taken in that loader's epoch,
    whose next draw a rerun's loader gives back, as at a DataLoader's ``next()``."""
    for loader in registry.live("loaders"):
        st = registry.state_of(loader)
        if st is not None and st.exhausted and held(st) > 0:
            return st
    return None


def script_names() -> dict[int, str]:
    """``id(object)`` -> the name of a module global of the main script bound to it."""
    main = sys.modules.get("__main__")
    found: dict[int, str] = {}
    for name, value in list(vars(main).items()) if main is not None else []:
        if not name.startswith("_"):
            found.setdefault(id(value), name)
    return found


def _name_of(obj: Any, named: dict[int, str]) -> dict[str, str]:
    """The script's name for ``obj`` or, for a model, for the first module it wraps that has one."""
    for candidate in layers(obj) if isinstance(obj, torch.nn.Module) else [obj]:
        name = named.get(id(candidate))
        if name is not None:
            return {"name": name}
    return {}


def param_names(models: list[torch.nn.Module]) -> dict[int, str]:
    """``id(parameter)`` -> its plain name (:mod:`.names`) in the first of ``models`` that holds it."""
    names: dict[int, str] = {}
    for model in models:
        rename = renamer(model)
        for name, param in model.named_parameters():
            if id(param) not in names:
                names[id(param)] = rename(name)
    return names


def param_keys(opt: torch.optim.Optimizer, names: dict[int, str]) -> list[str | int]:
    """The key of each parameter of ``opt``, in ``state_dict()``'s numbering: its name, or
    its index where no model names it or another parameter of ``opt`` has the same name."""
    params = [p for group in opt.param_groups for p in group["params"]]
    found = [names.get(id(p)) for p in params]
    counts = Counter(found)
    keys: list[str | int] = [n if n is not None and counts[n] == 1 else i for i, n in enumerate(found)]
    indexes = {str(k) for k in keys if isinstance(k, int)}
    if any(isinstance(k, str) and k in indexes for k in keys):  # a name "3" beside index 3
        return list(range(len(params)))
    return keys


def by_name(state: dict[str, Any], keys: list[str | int]) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` with parameters under ``keys`` (:func:`param_keys`),
    as the entry's ``state`` and ``param_groups``; one this layout does not fit (a custom
    ``state_dict``) as it is, under ``state``."""
    groups, per_param = state.get("param_groups"), state.get("state")
    numbers = range(len(keys))
    if set(state) != {"state", "param_groups"} or not isinstance(per_param, dict) or not isinstance(groups, list) \
            or any(k not in numbers for k in per_param) \
            or any(not isinstance(g, dict) or any(i not in numbers for i in g.get("params", ())) for g in groups):
        return {"state": state}
    return {
        "state": {keys[i]: value for i, value in per_param.items()},
        "param_groups": [{**g, "params": [keys[i] for i in g["params"]]} for g in groups],
    }


def optimizer_shapes(opt: torch.optim.Optimizer) -> list[list[list[int]]]:
    return [[list(p.shape) for p in group["params"]] for group in opt.param_groups]


def loader_identity(loader: Any) -> dict[str, Any]:
    try:
        length: int | None = len(loader)
    except TypeError:
        length = None
    return {"type": type(loader).__name__, "length": length, "batch_size": loader.batch_size}
