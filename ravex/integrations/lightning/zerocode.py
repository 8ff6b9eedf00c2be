"""Zero-code, under ``ravex enable``: each Trainer created gets the plugins and the cadence, and
the run resumes from the newest Lightning step of the store (:func:`install`, :func:`_start`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable
from typing import Any, Protocol

from torch.utils.data import DataLoader

from ravex.errors import RestoreError
from ravex.format import CheckpointStore, open_store
from ravex.format.history.timelines import split_ref
from ravex.saving.backend import LIGHTNING_KEY

from .loop import _PATCHED, RESUME_POINTER, _EveryN, _loader_iter
from .plugin import GLOBAL_STEP_KEY, PACKAGES, RavexCheckpointIO, ZeroCodeIO, _register
from .pointers import Ref, _ref, write_pointer
from .settings import ZeroCode
from .witnessing import FrameworkWitness

Replace = Callable[[Any, str, Callable[[Any], Any]], None]


class TrainingLoss(Protocol):
    def value(self) -> float | None: ...


class LightningRuntime(Protocol):
    """What the zero-code integration asks of the runtime (:class:`ravex.runtime.starting.lifecycle.RavexRuntime`)."""

    @property
    def last_loss(self) -> TrainingLoss:
        """The loss ``backward()`` last ran on (the runtime keeps it, handed over or not)."""

    def framework_witness(self) -> FrameworkWitness: ...

    def hand_over(self, why: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class _Lightning:
    """The classes of the one Lightning package a Trainer comes from: ``lightning.pytorch`` and
    ``pytorch_lightning`` are separate copies, and a Trainer of one checks for its own."""

    trainer: type
    torch_io: type  #: its fabric's ``TorchCheckpointIO``, the default a Trainer gets
    cadence: type  #: :class:`_EveryN` as a ``Callback`` of this package


@functools.cache
def _package(name: str) -> _Lightning:
    """``name`` (a key of :data:`PACKAGES`), imported: its Trainer has finished importing by now."""
    trainer = importlib.import_module(f"{name}.trainer.trainer").Trainer
    callback = importlib.import_module(f"{name}.callbacks").Callback
    torch_io = importlib.import_module(f"{PACKAGES[name]}.plugins.io.torch_io").TorchCheckpointIO
    _register()
    cadence = type("_EveryN", (_EveryN, callback), {"__module__": __package__, "__qualname__": "_EveryN"})
    return _Lightning(trainer, torch_io, cadence)


def install(runtime: LightningRuntime, settings: ZeroCode, replace: Replace,
            package: str = "lightning.pytorch") -> None:
    """Every Trainer of ``package`` (``lightning.pytorch`` or ``pytorch_lightning``) created from now
    on checkpoints into the Ravex store and resumes from it (``replace`` records the undo).

    A Trainer with the default ``TorchCheckpointIO`` gets :class:`ZeroCodeIO` (a
    :class:`RavexCheckpointIO` on the configured store for the cadence's saves, its own
    ``TorchCheckpointIO`` for every other), a callback saving every ``checkpoint_every`` global
    steps (and at the end of ``fit``), and, when the store holds a step the plugin wrote, that
    step as its ``ckpt_path``: Lightning's own restore puts back everything, loops included. A
    Trainer with a CheckpointIO of the script's own keeps it. Either way the runtime's own
    checkpoints and restores stand down (:meth:`LightningRuntime.hand_over`): Lightning's
    checkpoint is the whole state, and two restores would fight."""
    lightning = _package(package)

    def make(original: Any) -> Any:
        # the Trainer's own signature shows through: LightningCLI (jsonargparse) reads the
        # parameters it accepts from it
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            _take_over(runtime, settings, self, lightning)

        return __init__

    replace(lightning.trainer, "__init__", make)
    if not getattr(DataLoader.__iter__, _PATCHED, False):  # both packages imported: one patch serves both
        replace(DataLoader, "__iter__", _loader_iter)


def _take_over(runtime: LightningRuntime, settings: ZeroCode, trainer: Any, lightning: _Lightning) -> None:
    current = trainer.strategy.checkpoint_io
    if type(current) is not lightning.torch_io:
        runtime.hand_over(f"a Lightning Trainer with its own {type(current).__name__} saves and resumes this run")
        return
    io = RavexCheckpointIO(settings.url, compression=settings.compression, storage_options=settings.storage_options,
                           numbering="global_step", loss=runtime.last_loss.value)
    start = _start(settings)
    io._timeline, io._base = start.timeline, start.base
    if start.fork:
        io._fork_at = start.step  # the steps after it are another history: this run's go to a new timeline
    trainer.strategy.checkpoint_io = ZeroCodeIO(io, current, settings.pointers)
    witness = runtime.framework_witness() if trainer.is_global_zero else None  # rank 0 alone writes the steps
    resumed = start.step if start.url is None else None  # a former store's steps have no witness
    trainer.callbacks.append(lightning.cadence(settings, io, witness, resumed))
    runtime.hand_over(f"Lightning saves this run into {settings.url} through RavexCheckpointIO{start.describe()}")
    if start.step is not None and trainer.ckpt_path is None:
        path = os.path.join(settings.pointers, RESUME_POINTER)
        write_pointer(path, start.url or settings.url, start.step)  # every rank the same bytes, atomically: no wait
        trainer.ckpt_path = path


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where a zero-code run begins (:func:`_start`)."""

    step: Ref | None = None  #: the Lightning step it resumes; None: none
    url: str | None = None  #: the store holding that step when it is not the configured one (``former``)
    timeline: str | None = None  #: the timeline its saves go to (None: a store not created yet, main)
    fork: bool = False  #: ``step`` is not the newest of that timeline: the saves go to a new one forked from it
    base: int = 0  #: added to each save's global step to number its step: above every step the timeline holds

    def describe(self) -> str:
        """The resume, as the end of the line that says who checkpoints the run."""
        if self.step is None:
            return ""
        if self.url is None:
            return f"; resuming from step {self.step}"
        return f"; resuming from step {self.step} of {self.url}, where an earlier Ravex kept Lightning's steps"


def _start(settings: ZeroCode) -> _Start:
    """Where this run begins: the newest Lightning step of the store's current timeline (spec §19,
    the one a plain rerun continues), or ``resume``'s (``60``, ``exp@60``); with neither, the newest
    of ``settings.former``. Steps of the runtime's own on the timeline are never resumed, and each
    save's step number is its global step raised above every step the timeline holds (spec §14, A1:
    a timeline's steps only increase): a Lightning step older than the timeline's newest forks a
    new timeline for this run, as ``resume:`` does."""
    from ravex.format import StoreNotFoundError

    try:
        store = open_store(settings.url, storage_options=settings.storage_options)
    except StoreNotFoundError:
        return _former(settings, None, 0) if settings.resume == "auto" else _Start()
    name, _ = split_ref(str(settings.resume))
    view = store.current() if name is None else store.on_timeline(name)
    history = view.lineage_steps()
    top = history[-1][1] if history else 0
    found = _found(settings, view, history)
    if found is None:
        fresh = _Start(timeline=view.timeline.name, base=top)
        return _former(settings, view.timeline.name, top) if settings.resume == "auto" else fresh
    owner, step = found
    at_newest = bool(history) and (owner.timeline.name, step) == (history[-1][0].timeline.name, top)
    return _Start(_ref(owner, step), timeline=view.timeline.name, fork=not at_newest,
                  base=step - _global_step(owner, step))


def _found(settings: ZeroCode, view: CheckpointStore,
           history: list[tuple[CheckpointStore, int]]) -> tuple[CheckpointStore, int] | None:
    """The Lightning step this run resumes on the timeline ``view`` (whose steps are ``history``):
    the newest (``resume: auto``), none (``never``), or the one ``resume`` names, which must be one."""
    if settings.resume == "never":
        return None
    if settings.resume == "auto":
        return next(((owner, step) for owner, step in reversed(history) if _is_lightning(owner, step)), None)
    owner, step = view.locate(split_ref(str(settings.resume))[1])
    if not _is_lightning(owner, step):
        raise RestoreError(f"resume: {settings.resume} names a step of Ravex's own in {settings.url}, not a "
                           "Lightning Trainer's checkpoint: a Lightning run resumes Lightning's steps only "
                           "(`resume: auto` finds the newest)")
    return owner, step


def _is_lightning(owner: CheckpointStore, step: int) -> bool:
    """Whether ``step`` of the timeline ``owner`` is a Lightning checkpoint (its manifest's metadata)."""
    return LIGHTNING_KEY in owner.manifest(step, 0).metadata


def _former(settings: ZeroCode, timeline: str | None, top: int) -> _Start:
    """A run that finds no Lightning step in the configured store, whose newest step is ``top`` (0:
    none): the newest Lightning step of ``settings.former``, where earlier versions of Ravex kept
    them, when that store has one; this run's saves go to the configured store all the same,
    numbered above ``top``."""
    from ravex.format import StoreNotFoundError

    fresh = _Start(timeline=timeline, base=top)
    if settings.former is None:
        return fresh
    try:
        view = open_store(settings.former, storage_options=settings.storage_options).current()
    except StoreNotFoundError:
        return fresh
    for owner, step in reversed(view.lineage_steps()):
        if _is_lightning(owner, step):
            return _Start(_ref(owner, step), url=settings.former, timeline=timeline,
                          base=max(top - _global_step(owner, step), 0))
    return fresh


def _global_step(owner: CheckpointStore, step: int) -> int:
    """The Lightning global step of ``step`` (its manifest's metadata; a step written without it
    was numbered by its global step)."""
    return int(owner.manifest(step, 0).metadata.get(GLOBAL_STEP_KEY, step))
