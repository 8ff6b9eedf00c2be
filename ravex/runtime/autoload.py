"""The autoloader that ``ravex enable`` installs: a one-line ``.pth`` runs this file.

It runs at every interpreter start, so it must cost nothing: it imports no torch and
no ravex (it is executed by path, not imported as part of the package, while ``site`` may
not have put ravex on ``sys.path`` yet), and without a
``ravex.yaml`` (in the working directory, or named by ``RAVEX_CONFIG``) it does nothing
at all. With one, it puts a finder on ``sys.meta_path`` that waits for torch's module to
execute; once torch has finished importing, it activates Ravex. Scripts that never import
torch never pay for Ravex.

Libraries ask the finders about torch without importing it (``datasets`` and
``transformers`` call ``importlib.util.find_spec("torch")`` at import): the finder answers
such a probe like any other and stays, marking the spec's loader; it activates Ravex when
that loader (or the loader of any later lookup) executes torch, whoever asked for it
(``import torch``, ``importlib.import_module``, a library, ``python -m``, ``exec``), and
leaves ``sys.meta_path`` then.

Where torch arrives without the finder seeing it execute (a finder ahead of it answers for
torch, a loader run directly), or the start fails and the script carries on, Ravex is not
running: :func:`_arm_exit_net` then counts optimizer steps and, at exit, says on stderr that
the process trained without a checkpoint, why, and what to do. Nothing of that is installed
where Ravex starts.

Standard library only, and only modules the interpreter has already loaded at start. Once
torch is being looked up, it imports the torch-free :mod:`ravex.runtime.finders` (how a finder
asks the others, shared with the frameworks' hook) and, for the net, ``atexit``.
"""

import _thread
import os
import sys

TYPE_CHECKING = False  # (no ``typing`` import: this file runs at every interpreter start)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

PTH_NAME = "ravex-autoload.pth"
MODULE_NAME = "_ravex_autoload"
#: where torch's optimizers live: the exit net counts their steps once it has executed
OPTIMIZER_MODULE = "torch.optim.optimizer"


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


def _after_exec(spec: "ModuleSpec", then: "Callable[[ModuleType], None]") -> None:
    """Make ``spec``'s loader call ``then(module)`` once it has executed ``spec.name``'s
    module without raising. A loader object may serve several modules, and several lookups
    may return the same one: it is marked once per name, and other modules pass through. A
    loader that is a class (the builtin and frozen importers) is left alone: marking it would
    mark every module it loads."""
    loader = spec.loader
    original = getattr(loader, "exec_module", None)
    if original is None or isinstance(loader, type) or _marked(spec):
        return
    name = spec.name

    def exec_module(module: "ModuleType") -> None:
        original(module)
        if module.__name__ == name:
            then(module)

    exec_module._ravex_name = name  # type: ignore[attr-defined]
    try:
        loader.exec_module = exec_module  # type: ignore[method-assign, union-attr]
    except (AttributeError, TypeError):  # a loader with __slots__: torch then arrives unseen
        pass


def _marked(spec: "ModuleSpec | None") -> bool:
    """Whether ``spec``'s loader calls back once it has executed ``spec.name``'s module."""
    run = getattr(getattr(spec, "loader", None), "exec_module", None)
    return spec is not None and getattr(run, "_ravex_name", None) == spec.name


class TorchImportHook:
    """A meta path finder that activates Ravex once torch's module has executed.

    It answers every lookup of ``torch`` with the other finders' spec, its loader marked, so
    a probe that never loads leaves it in place; asking them, it skips itself and declines
    lookups its own thread makes meanwhile (a finder that asks ``importlib`` again would
    otherwise lead back here). While it waits it also sees the lookup of torch's optimizer
    module: one made while the torch being imported is not a marked one means torch arrived
    another way, and Ravex will not start (:func:`_arm_exit_net`)."""

    def __init__(self) -> None:
        self._asking: set[int] = set()  # threads inside this finder's own lookup
        self.fired = False

    def find_spec(self, fullname: str, path: "Sequence[str] | None" = None,
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        if fullname == "torch":
            spec = self._ask_others(fullname, path, target)
            if spec is not None and not self.fired:
                _after_exec(spec, self._torch_executed)
            return spec
        if fullname == OPTIMIZER_MODULE and not self.fired:
            torch = sys.modules.get("torch")
            if torch is None or _marked(getattr(torch, "__spec__", None)):
                return None
            spec = self._ask_others(fullname, path, target)
            if spec is not None:
                cause = self._unseen_cause()
                _after_exec(spec, lambda module: _arm_exit_net(cause, module))
                self._leave()
            return spec
        return None

    def _ask_others(self, fullname: str, path: "Sequence[str] | None",
                    target: "ModuleType | None") -> "ModuleSpec | None":
        me = _thread.get_ident()
        if me in self._asking:
            return None
        self._asking.add(me)
        try:
            from ravex.runtime.finders import spec_from_others  # torch is being looked up: see the module doc

            return spec_from_others(self, fullname, path, target)
        finally:
            self._asking.discard(me)

    def _unseen_cause(self) -> str:
        ahead = sys.meta_path[:sys.meta_path.index(self)] if self in sys.meta_path else []
        if ahead:
            names = ", ".join(type(f).__name__ for f in ahead)
            return (f"torch was imported through a finder put ahead of the autoloader's on "
                    f"sys.meta_path: {names}")
        return "torch's loader was run without the finders, where the autoloader never saw it"

    def _torch_executed(self, module: "ModuleType") -> None:
        if self.fired:
            return
        self.fired = True
        self._leave()
        _activate()

    def _leave(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


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


def _ravex_importing() -> bool:
    """Whether torch executed for a ravex module being imported (``import ravex;
    ravex.activate()`` at the top of a script imports the runtime, which imports torch): the
    runtime cannot be started half-imported, and the call that imports it starts it."""
    return any((name == "ravex" or name.startswith("ravex."))
               and getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()))


def _activate() -> None:
    if _in_launcher():
        return
    if _ravex_importing():
        _arm_exit_net(RAVEX_FIRST, sys.modules.get(OPTIMIZER_MODULE))
        return
    try:
        from ravex.runtime.config import RavexConfig
        from ravex.runtime.starting import lifecycle, spawned

        if spawned.in_child():  # a DataLoader worker, a spawned rank: ravex.runtime.starting.spawned
            if spawned.defers(None):
                spawned.defer_to_process_group(lambda: lifecycle.start_or_exit(RavexConfig.load()))
            return
        lifecycle.start_from_autoloader()
    except Exception as exc:  # a bad ravex.yaml must stop the run, in one line
        sys.stderr.write(f"ravex: {exc}\n")
        _arm_exit_net(f"{FAILED}: {exc}", sys.modules.get(OPTIMIZER_MODULE))
        raise SystemExit(2) from None


# ── the exit net: only where torch arrived and Ravex did not start ──

FAILED = "it failed to start"
RAVEX_FIRST = ("torch was first imported by a call into ravex, which the autoloader leaves to start "
               "Ravex, and it did not")


class _Net:
    """What the net knows: why Ravex did not start, and the optimizer steps taken since."""

    cause: "str | None" = None
    steps = 0
    quiet = False  # Ravex started after the net was armed: nothing to count or say


def _arm_exit_net(cause: str, optimizer_module: "ModuleType | None") -> None:
    """Count this process's optimizer steps (torch's global post-step hook), and at exit say
    that it trained without Ravex: once, and only if it did, Ravex did not start after all
    (``ravex.activate()``) and it is neither torchrun's launcher nor a child of
    ``multiprocessing`` (DataLoader workers; ranks, which their runtime or framework covers)."""
    if _Net.cause is not None:
        return
    _Net.cause = cause
    register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
    if register is not None:
        register(_count_step)
    import atexit

    atexit.register(_say_if_trained)


def _count_step(*_: object) -> None:
    """One more step without Ravex. Once Ravex runs (``ravex.activate()`` after all), a flag
    makes this a no-op: torch runs the hooks from the dict a removal would change."""
    if _Net.quiet:
        return
    if _ravex_started():
        _Net.quiet = True
        return
    _Net.steps += 1


def _ravex_started() -> bool:
    lifecycle = sys.modules.get("ravex.runtime.starting.lifecycle")
    return bool(lifecycle is not None and lifecycle.ever_started())


def _in_multiprocessing_child() -> bool:
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return False
    try:
        return mp.parent_process() is not None or bool(getattr(mp.current_process(), "_inheriting", False))
    except Exception:  # a half-torn-down interpreter: not ours to judge
        return True


def _say_if_trained() -> None:
    steps = _Net.steps
    if not steps or _ravex_started() or _in_launcher() or _in_multiprocessing_child():
        return
    sys.stderr.write(
        f"ravex: this process ran {steps} optimizer step{'' if steps == 1 else 's'} but Ravex never "
        f"started ({_Net.cause}): no checkpoint was taken. {_fix()}\n")


def _fix() -> str:
    if (_Net.cause or "").startswith(FAILED):
        return "Fix that and run again"
    if _Net.cause == RAVEX_FIRST:
        return "Call `ravex.activate()` before anything else of ravex, or import torch first"
    return "Put `import ravex; ravex.activate()` at the top of the script: it needs no import hook"


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
