"""Frameworks with a training loop of their own get their integration when they are imported.

Ravex's patches see torch objects; a framework's loop (HuggingFace ``Trainer``) also keeps a
position of its own (global step, epoch) that a rerun must continue. The integration for
each framework lives in :mod:`ravex.integrations` and is installed here, zero-code, the
moment the framework's module finishes importing (or at once when it was imported before
Ravex started). Nothing here imports a framework: an unused one costs one
``sys.meta_path`` lookup per import.

The integration reaches the runtime only through what it is handed: the runtime itself
(:class:`ravex.integrations.hf.TrainerRuntime` says which methods it calls) and the undoable
``replace`` of :class:`.patches.Patches`, so ``deactivate()`` takes it out again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .patches import Patches


def _install_hf(runtime: Any, patches: Patches) -> None:
    from ravex.integrations import hf

    hf.install(runtime, patches.replace)


#: module whose import installs an integration -> how
INSTALLERS: dict[str, Callable[[Any, Patches], None]] = {"transformers.trainer": _install_hf}


def watch(runtime: Any, patches: Patches) -> None:
    """Install each framework's integration now if imported, else when it is (undone with ``patches``)."""
    waiting = []
    for name, installer in INSTALLERS.items():
        if name in sys.modules:
            installer(runtime, patches)
        else:
            waiting.append(name)
    if waiting:
        hook = _ImportHook(runtime, patches, waiting)
        sys.meta_path.insert(0, hook)
        patches.handle(hook)


class _ImportHook:
    """A meta path finder that installs an integration after its module has executed."""

    def __init__(self, runtime: Any, patches: Patches, names: list[str]) -> None:
        self.runtime = runtime
        self.patches = patches
        self.names = set(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        self.names.discard(fullname)
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module
        runtime, patches, installer = self.runtime, self.patches, INSTALLERS[fullname]

        def exec_module(module: ModuleType) -> None:
            original(module)
            installer(runtime, patches)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def remove(self) -> None:
        """The undo of :func:`watch`: leave ``sys.meta_path``."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
