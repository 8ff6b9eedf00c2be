"""The names a user knows: a model is saved under its own names and type, not its wrappers'.

``torch.compile`` returns an ``OptimizedModule`` that holds the model as ``_orig_mod``; DDP and
``DataParallel`` hold it as ``module``, FSDP as ``_fsdp_wrapped_module``, the activation-checkpoint
wrappers as ``_checkpoint_wrapped_module``. Each puts that attribute into the name of every
tensor and parameter it holds (``_orig_mod.transformer.wte.weight``): a checkpoint stored under
those names does not load into the plain module, and a diff against an uncompiled run sees
every name changed. Ravex names them as DCP's ``get_model_state_dict`` does: each wrapper's segment left
out, found by walking the name down the live modules, so that a submodule the user called
``module`` keeps its name. The stored type is the plain module's (``GPT``, not
``OptimizedModule``).

A wrapper is known by its class name among torch's own classes: recognising one imports
neither ``torch._dynamo`` nor FSDP (seconds each) into a run that uses neither.

Stores written before names were plain hold the wrappers' segments; :func:`stored_name` is
how a resume still matches them (see :func:`ravex.runtime.state.restore.with_plain_names`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: torch's wrapper classes (their subclasses too) -> the attribute holding the wrapped module.
WRAPPERS = {
    "OptimizedModule": "_orig_mod",
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
    "CheckpointWrapper": "_checkpoint_wrapped_module",
    "OffloadWrapper": "_checkpoint_wrapped_module",
}
_SEGMENTS = frozenset(WRAPPERS.values())
#: Segments no plain module has: only a wrapper uses these private names.
_PRIVATE = frozenset(s for s in _SEGMENTS if s.startswith("_"))


def _wrapper_attr(cls: type) -> str | None:
    """The attribute a torch wrapper class (or a subclass of one) holds the wrapped module in."""
    return next((WRAPPERS[base.__name__] for base in cls.__mro__
                 if base.__name__ in WRAPPERS and base.__module__.startswith("torch.")), None)


def _held(module: torch.nn.Module) -> str | None:
    """The attribute under which ``module``, if it is a torch wrapper, holds the module it wraps."""
    attr = _wrapper_attr(type(module))
    return attr if attr is not None and isinstance(module._modules.get(attr), torch.nn.Module) else None


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model`` and the modules it wraps, outermost first; the last is the plain module."""
    out = [model]
    while (attr := _held(out[-1])) is not None:
        inner = out[-1]._modules[attr]
        assert inner is not None  # _held checked it
        out.append(inner)
    return out


def type_name(model: torch.nn.Module) -> str:
    """The type a checkpoint records for ``model``: the plain module's, whatever wraps it."""
    return type(layers(model)[-1]).__name__


def renamer(model: torch.nn.Module) -> Callable[[str], str]:
    """The plain name of each name of ``model.state_dict()`` or ``model.named_parameters()``:
    without the segments the wrappers along it insert (DCP's ``_get_fqns``). The wrappers
    around the root are worked out once (at every checkpoint, for every tensor: this is on the
    training loop's stall), so that each name costs a prefix and a substring test; only a name
    holding a wrapper's segment further in is walked down the modules."""
    chain = layers(model)
    prefix = "".join(f"{_held(m)}." for m in chain[:-1])

    def rename(name: str) -> str:
        node = model
        if prefix and name.startswith(prefix):
            name, node = name[len(prefix):], chain[-1]
        if not any(segment in name for segment in _SEGMENTS):
            return name
        return _walk(node, name.split("."))

    return rename


def _walk(model: torch.nn.Module, parts: list[str]) -> str:
    """``parts`` joined without a wrapper's segment wherever the modules along them have one.
    Where a wrapper's own state-dict hook already left its segment out (the checkpoint
    wrapper's), the walk goes on inside it."""
    kept = []
    node: torch.nn.Module | None = model
    for part in parts:
        if node is not None and _held(node) == part:
            node = node._modules[part]
            continue
        kept.append(part)
        node = layers(node)[-1]._modules.get(part) if node is not None else None
    return ".".join(kept)


def plain_state(model: torch.nn.Module, keep_vars: bool = False) -> dict[str, Any]:
    """``model.state_dict()`` under plain names."""
    rename = renamer(model)
    return {rename(k): v for k, v in model.state_dict(keep_vars=keep_vars).items()}


def load_plain(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """``model.load_state_dict(strict=True)`` of a state under plain names."""
    rename = renamer(model)
    own = {rename(k): k for k in model.state_dict(keep_vars=True)}
    model.load_state_dict({own.get(k, k): v for k, v in state.items()}, strict=True)


def stored_name(name: str, stored_type: str) -> str:
    """A name as a store written before names were plain holds it, made plain: without the
    leading segment of the wrapper ``stored_type`` names (``module.`` of a model stored as a
    ``DistributedDataParallel``) nor any segment only a wrapper uses (``_orig_mod``). A plain
    name is returned as it is."""
    parts = name.split(".")
    if parts[:-1] and parts[0] == WRAPPERS.get(stored_type):
        parts = parts[1:]
    return ".".join(p for p in parts if p not in _PRIVATE)
