"""The live training objects, in creation order.

A rerun of the same script creates the same objects in the same order, so "the second
optimizer created" is a stable name across runs where ``id()`` is not. Objects are held
weakly: the registry must never keep a model alive that the script dropped.

Models are the *root* modules that hold state: a submodule is saved as part of its
parent, and a stateless module (a loss) is not a model. Roots are worked out at
collection time, because a module only becomes a child once its parent assigns it.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .appended import AppendedFiles
from .names import layers

KINDS = ("models", "optimizers", "schedulers", "scalers", "loaders")
#: Attributes Ravex keeps on the objects themselves (held weakly here, they carry their own).
_LOADER_STATE = "_ravex_state"
_OPTIMIZER_STEPS = "_ravex_steps"


@dataclass(eq=False)
class LoaderState:
    """Where one DataLoader is: which epoch (``__iter__`` call) and how far into it."""

    index: int = -1  # set when collected
    epoch: int = -1  # 0-based count of __iter__ calls; -1 before the first
    yielded: int = 0  # batches handed out in the current epoch
    exhausted: bool = False  # the current epoch's iterator raised StopIteration
    epoch_rng: dict[str, Any] | None = None  # RNG states captured when this epoch began
    pending_skip: int = 0  # batches the next iterator must skip at the sampler
    #: positions of the epoch's global order consumed before this run's ranks took it over
    #: (a world-size change: :mod:`.sampler_epoch`), and the sampler record that order is of
    offset: int = 0
    offset_sampler: dict[str, Any] | None = None
    resume_checked: bool = False
    #: the epoch is drawn by explicit ``next()`` calls in a loop of the user's (not by a ``for``
    #: over it): its ``next()`` is no step boundary a rerun can return to; None until seen
    explicit_next: bool | None = None
    #: worker processes (:mod:`.workers`): the persistent iterator's base seed; whether this
    #: epoch reset that iterator instead of making one (no seed drawn); each worker's RNG
    #: streams after the last batch consumed from it
    workers_seed: int | None = None
    reused: bool = False
    worker_rng: dict[int, Any] = field(default_factory=dict)
    #: what the next iterator made takes over from a checkpoint instead of drawing or seeding
    pending_seed: int | None = None
    pending_workers: dict[int, Any] | None = None
    #: a wrapper that fetches ahead (:mod:`.lookahead`): its depth as last measured, and whether
    #: any epoch measured it; ``yielded`` when the iterator began, at the epoch's first use of the
    #: model, and at its last optimizer step before it ran out; the steps since its first use; the
    #: steps since it ran out, and the batches a step took; the last batches'
    #: ``((epoch, index), worker, RNG state)``
    ahead: int = 0
    ahead_known: bool = False
    ahead_start: int = 0
    ahead_first: int | None = None
    ahead_wait: int = 0
    step_yielded: int | None = None
    tail_steps: int = 0
    step_batches: int = 1
    worker_log: Any = None


@dataclass
class Registry:
    """Weak, ordered sets of the objects Ravex saves and restores."""

    _seq: Any = field(default_factory=itertools.count)
    _objects: dict[str, dict[int, tuple[int, weakref.ref[Any]]]] = field(
        default_factory=lambda: {k: {} for k in KINDS}
    )
    _modules: dict[int, tuple[int, weakref.ref[Any]]] = field(default_factory=dict)
    #: the files the script appends to (:mod:`.appended`)
    appended: AppendedFiles = field(default_factory=AppendedFiles)

    def add(self, kind: str, obj: Any) -> None:
        """Record ``obj`` (first sighting wins the position)."""
        table = self._modules if kind == "modules" else self._objects[kind]
        key = id(obj)
        entry = table.get(key)
        if entry is not None and entry[1]() is obj:
            return
        table[key] = (next(self._seq), weakref.ref(obj, _forgetter(table, key)))

    def any_module(self, predicate: Callable[[Any], bool]) -> bool:
        """Whether any live module, root or not, satisfies ``predicate`` (no tree walk)."""
        for _, ref in list(self._modules.values()):
            module = ref()
            if module is not None and predicate(module):
                return True
        return False

    def live(self, kind: str) -> list[Any]:
        """Live objects of ``kind`` in creation order."""
        if kind == "models":
            return self.models()
        return _ordered(self._objects[kind])

    def models(self) -> list[Any]:
        """Root modules with state, in the creation order of the plain modules they are or
        wrap (:mod:`.names`): a model compiled or wrapped in DDP after another was created is
        still where it was among them, as in a run that does not wrap it."""
        modules = _ordered(self._modules)
        inner: set[int] = set()
        for module in modules:
            if id(module) in inner:
                continue  # its descendants are already marked by its parent
            for child in module.modules():
                if child is not module:
                    inner.add(id(child))
        roots = [m for m in modules if id(m) not in inner and _has_state(m)]
        return sorted(roots, key=self._created)

    def _created(self, root: Any) -> int:
        """When the plain module ``root`` is or wraps was created, else ``root`` itself."""
        for module in reversed(layers(root)):
            entry = self._modules.get(id(module))
            if entry is not None and entry[1]() is module:
                return entry[0]
        return self._modules[id(root)][0]

    def counts(self) -> dict[str, int]:
        return {kind: len(self.live(kind)) for kind in KINDS}

    def loader_state(self, loader: Any) -> LoaderState:
        """``loader``'s state, registering the loader on first sight."""
        state = self.state_of(loader)
        if state is None:
            self.add("loaders", loader)
            state = LoaderState()
            loader.__dict__[_LOADER_STATE] = state
        return state

    @staticmethod
    def state_of(loader: Any) -> LoaderState | None:
        """``loader``'s state if it has been seen (kept on the loader: it lives as long)."""
        state: LoaderState | None = loader.__dict__.get(_LOADER_STATE)
        return state

    @staticmethod
    def optimizer_steps(optimizer: Any) -> int:
        """The steps ``optimizer`` has taken as Ravex counts them (restored on resume)."""
        return int(optimizer.__dict__.get(_OPTIMIZER_STEPS, 0))

    @staticmethod
    def set_optimizer_steps(optimizer: Any, steps: int) -> None:
        optimizer.__dict__[_OPTIMIZER_STEPS] = steps


def _forgetter(table: dict[int, Any], key: int) -> Callable[[weakref.ref[Any]], None]:
    """The weak reference's callback: the entry goes when the object does."""

    def forget(_ref: weakref.ref[Any]) -> None:
        table.pop(key, None)

    return forget


def _ordered(table: dict[int, tuple[int, weakref.ref[Any]]]) -> list[Any]:
    out = []
    for seq, ref in sorted(table.values(), key=lambda e: e[0]):
        obj = ref()
        if obj is not None:
            out.append(obj)
        del seq
    return out


def _has_state(module: Any) -> bool:
    for _ in itertools.chain(module.parameters(), module.buffers()):
        return True
    return False
