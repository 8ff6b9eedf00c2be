"""Frameworks with a training loop of their own get their integration when they are imported.

Ravex's patches see torch objects; a framework's loop also keeps a position of its own (global
step, epoch) that a rerun must continue. The integration for each framework lives in
:mod:`ravex.integrations` and is installed here, zero-code, the moment the framework's module
finishes importing (or at once when it was imported before Ravex started). Nothing here imports
a framework: an unused one costs one ``sys.meta_path`` lookup per import.

- HuggingFace ``Trainer`` (:mod:`ravex.integrations.hf`): Ravex saves and restores the torch
  objects as for any script; the integration adds the Trainer's state and puts its loop there.
- Lightning's ``Trainer`` (:mod:`ravex.integrations.lightning`), imported as ``lightning`` or as
  the standalone ``pytorch_lightning``: Lightning's own checkpoint is the whole state, so its
  ``RavexCheckpointIO`` writes it at the configured cadence into the configured store and
  Lightning's own restore resumes it; the runtime's checkpoints and restores stand down
  (``hand_over``). The runtime tells Lightning's steps from its own by their manifests' metadata
  and never restores one. Its pointer files go in ``.ravex/`` (:func:`pointer_folder`); the store
  earlier versions wrote these steps to is still resumed from (:func:`former_lightning_store`).

The integration reaches the runtime only through what it is handed: the runtime itself (a
``Protocol`` in each integration says which methods it calls), what ``ravex.yaml`` asks of it,
and the undoable ``replace`` of :class:`.patches.Patches`, so ``deactivate()`` takes it out again.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .. import finders
from ..config import RavexConfig
from ..patches import Patches
from ..recording.runrecord import RECORD_DIR, store_key

logger = logging.getLogger("ravex")


def _install_hf(runtime: Any, patches: Patches) -> None:
    from ravex.integrations import hf

    hf.install(runtime, patches.replace)


def _install_lightning(package: str, runtime: Any, patches: Patches) -> None:
    """``package``: which Lightning was imported (``lightning.pytorch`` or ``pytorch_lightning``):
    one integration, given the classes of the package the script uses."""
    from ravex.integrations import lightning

    config: RavexConfig = runtime.config
    settings = lightning.ZeroCode(
        url=config.storage.url, pointers=pointer_folder(config), every=config.fixed_every,
        keep_last=config.keep_last, resume=config.resume, on_exit=config.checkpoint_on_exit,
        compression=config.compression, storage_options=config.storage.storage_options(),
        former=former_lightning_store(config))
    if config.local is not None:
        logger.warning("ravex: `local:` is Ravex's own fast tier; a Lightning Trainer's checkpoints go to "
                       "`storage:` (%s) only", config.storage.url)
    if config.checkpoint_every == "auto":
        logger.warning("ravex: `checkpoint_every: auto` sets Ravex's own cadence; a Lightning Trainer saves at the "
                       "end of fit and at exit only: set `checkpoint_every` to a number of global steps")
    lightning.install(runtime, settings, patches.replace, package)


def former_lightning_store(config: RavexConfig) -> str:
    """``<storage>-lightning``, beside the configured store: where earlier versions of Ravex
    wrote a zero-code Lightning run's steps. A run that finds no Lightning step in the configured
    store resumes the newest one there (and says so); its own saves go to the configured store."""
    return config.storage.url.rstrip("/") + "-lightning"


def pointer_folder(config: RavexConfig) -> str:
    """Where a zero-code Lightning run keeps the pointer files Lightning loads from: in ``.ravex/``
    beside the ``ravex.yaml`` (or the working directory), one folder per store. Not in the store:
    every byte there belongs to the format. ``.ravex/`` ignores itself in git."""
    base = os.path.dirname(config.config_file) if config.config_file else os.getcwd()
    digest = hashlib.sha256(store_key(config).encode("utf-8")).hexdigest()[:16]
    records = os.path.join(base, RECORD_DIR)
    if not os.path.isdir(records):
        os.makedirs(records, exist_ok=True)
        with open(os.path.join(records, ".gitignore"), "w") as fh:
            fh.write("# Ravex's records and Lightning's pointer files: never versioned.\n*\n")
    return os.path.join(records, f"lightning-{digest}")


#: module whose import installs an integration -> how
INSTALLERS: dict[str, Callable[[Any, Patches], None]] = {
    "transformers.trainer": _install_hf,
    # Lightning under either name: the `lightning` package's copy, and the standalone `pytorch_lightning`
    "lightning.pytorch.trainer.trainer": functools.partial(_install_lightning, "lightning.pytorch"),
    "pytorch_lightning.trainer.trainer": functools.partial(_install_lightning, "pytorch_lightning"),
}


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
        runtime, patches, installer = self.runtime, self.patches, INSTALLERS[fullname]
        return finders.after_exec(finders.spec_from_others(self, fullname, path, target),
                                  lambda: installer(runtime, patches))

    def remove(self) -> None:
        """The undo of :func:`watch`: leave ``sys.meta_path``."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
