"""The autoloader that ``ravex enable`` installs: a one-line ``.pth`` runs this file.

It runs at every interpreter start, so it must cost nothing: it imports no torch and
no ravex (it is executed by path, not imported as part of the package), and without a
``ravex.yaml`` (in the working directory, or named by ``RAVEX_CONFIG``) it does nothing
at all. With one, it puts a finder on ``sys.meta_path`` that waits for ``import torch``;
once torch has finished importing, it activates Ravex. Scripts that never import torch
never pay for Ravex.

Standard library only, and only modules the interpreter has already loaded at start.
"""

import os
import sys

TYPE_CHECKING = False  # (no ``typing`` import: this file runs at every interpreter start)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

PTH_NAME = "ravex-autoload.pth"
MODULE_NAME = "_ravex_autoload"


def pth_line(path: str) -> str:
    """The ``.pth`` line that executes this file, by path, if it still exists."""
    name = MODULE_NAME
    return (
        f"import os, sys, types; p = {path!r}; os.path.exists(p) and {name!r} not in sys.modules"
        f" and exec(compile(open(p).read(), p, 'exec'),"
        f" sys.modules.setdefault({name!r}, types.ModuleType({name!r})).__dict__)\n"
    )


def source_file() -> str:
    """This file's path, for the ``.pth`` line (called only when imported as a module)."""
    return os.path.abspath(__file__)


def config_path() -> "str | None":
    """``$RAVEX_CONFIG`` or ``./ravex.yaml`` if present: one stat, no parsing."""
    named = os.environ.get("RAVEX_CONFIG")
    if named:
        return named
    candidate = os.path.join(os.getcwd(), "ravex.yaml")
    return candidate if os.path.isfile(candidate) else None


class TorchImportHook:
    """A meta path finder that fires once, when ``torch`` is imported."""

    def find_spec(self, fullname: str, path: "Sequence[str] | None" = None,
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        if fullname != "torch":
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module: "ModuleType") -> None:
            original(module)
            _activate()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


#: ``python -m <one of these>`` is torchrun's launcher (``torch.distributed.launch``: its old name)
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def _in_launcher() -> bool:
    """torchrun's launcher imports torch to start the ranks but trains nothing itself. A runtime
    there would find the ranks' checkpoints, restore none, say so at exit and, exiting after
    the ranks, replace rank 0's record of the run (``ravex status``) with that verdict.

    Asked when torch is imported, not at interpreter start: ``sys.argv`` does not exist while
    ``.pth`` files run. ``python -m``'s ``sys.argv[0]`` is ``-m`` while the module (and so torch,
    its package) is being imported; the module's name is then the last of the interpreter's own
    arguments in ``sys.orig_argv``."""
    argv = getattr(sys, "argv", None) or [""]  # an embedding interpreter may set none
    if os.path.basename(argv[0]).removesuffix(".exe") == "torchrun":
        return True
    if argv[0] != "-m":
        return False
    orig = getattr(sys, "orig_argv", [])  # Python 3.10+
    interpreter = orig[:len(orig) - len(argv) + 1]
    return bool(interpreter) and interpreter[-1].removeprefix("-m") in LAUNCHERS


def _activate() -> None:
    if _in_launcher():
        return
    try:
        from ravex.runtime import lifecycle, spawned
        from ravex.runtime.config import RavexConfig

        if spawned.in_child():  # a DataLoader worker, a spawned rank: ravex.runtime.spawned
            if spawned.defers(None):
                spawned.defer_to_process_group(lambda: lifecycle.start_or_exit(RavexConfig.load()))
            return
        lifecycle.start_from_autoloader()
    except Exception as exc:  # a bad ravex.yaml must stop the run, in one line
        sys.stderr.write(f"ravex: {exc}\n")
        raise SystemExit(2) from None


def install() -> None:
    if os.environ.get("RAVEX_DISABLE") or config_path() is None:
        return
    if "torch" in sys.modules:  # imported before us (odd, but possible): act now
        _activate()
        return
    if not any(isinstance(f, TorchImportHook) or type(f).__name__ == "TorchImportHook"
               for f in sys.meta_path):
        sys.meta_path.insert(0, TorchImportHook())


if __name__ == MODULE_NAME:
    install()
