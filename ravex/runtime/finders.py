"""Watching an import from ``sys.meta_path``: a finder that only waits for a module (to install
something once it has executed) asks the other finders for its spec and wraps the loader's
``exec_module``.

Standard library only, and nothing of the runtime: code that runs before torch is imported
(the autoloader's finder, the frameworks' import hook, a harness's ``sitecustomize``) uses it
without importing torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def spec_from_others(me: Any, fullname: str, path: Sequence[str] | None,
                     target: ModuleType | None) -> ModuleSpec | None:
    """The spec the first finder on ``sys.meta_path`` other than ``me`` gives for ``fullname``."""
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if finder is me or find is None:
            continue
        spec: ModuleSpec | None = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def after_exec(spec: ModuleSpec | None, then: Callable[[], None]) -> ModuleSpec | None:
    """``spec``, its loader made to call ``then()`` once it has executed the module; a spec
    without such a loader is returned as it is."""
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    original = spec.loader.exec_module

    def exec_module(module: ModuleType) -> None:
        original(module)
        then()

    spec.loader.exec_module = exec_module  # type: ignore[method-assign]
    return spec
