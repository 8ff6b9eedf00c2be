"""PyTorch Lightning checkpoints in a Ravex store: ``RavexCheckpointIO``, a ``CheckpointIO`` plugin.

    >>> trainer = Trainer(plugins=[RavexCheckpointIO("./store")],
    ...                   callbacks=[ModelCheckpoint(dirpath="ckpts", save_last=True, every_n_train_steps=50)])
    >>> trainer.fit(model, loader, ckpt_path="last")

Either Lightning works: ``lightning`` (``lightning.pytorch``) and the standalone
``pytorch_lightning`` are separate copies of the same code, each checking its own classes, so this
module names neither in its classes: the plugins are registered as a ``CheckpointIO`` of each
Lightning imported (an ABC registration), and the zero-code callback is made, once per package,
from that package's ``Callback``.

**What a save writes.** Lightning's whole checkpoint dict (weights, optimizer and scheduler
states, the loops' progress, callbacks' states, hyper-parameters) becomes one Ravex step of the
store at ``url``: tensors as arrays under their keys (``state_dict/net.0.weight``,
``optimizer_states/0/state/0/exp_avg``), everything else as typed JSON (int keys, tuples and
floats kept exactly). A value typed JSON cannot hold (an object in ``hyper_parameters``) is
refused, naming its key: nothing is pickled, and nothing is unpickled on load. Each save is the
next step number (or, ``numbering="global_step"``, the step of its global step). One writer serves
every save, so each step is a delta on the one before: chunks that did not change (frozen weights,
the second save of a step as ``last.ckpt``) are reused, not written again. ``loss``, when given,
is read at each save and recorded as the step's training loss (``ravex ls`` shows it).

**Async.** A save copies the tensors to CPU on the caller's thread (the training loop may change
them right after) and returns; a background thread writes the step, then the pointer file. Saves
and removals run in the order Lightning asked for them. At most ``max_queued`` saves wait or run
at once (each holds a copy of the state): one more waits for the oldest, so a cadence faster than
storage slows training rather than filling memory. Loading, ``teardown`` (the end of ``fit``)
and :meth:`RavexCheckpointIO.flush` wait for what is queued, and a failed write is raised there
or by the next save. ``async_writes=False`` writes within the call. A process killed mid-write
leaves the pointer files naming the previous durable steps, never a partial one.

**The file Lightning sees.** At the path Lightning names (``ckpts/last.ckpt``,
``ckpts/epoch=0-step=50.ckpt``) the plugin writes a small JSON pointer, atomically, once the step
is durable: the store's URL and the step (and Lightning's epoch and global step in it). So
Lightning's own file logic keeps working: ``ckpt_path="last"`` finds the newest ``last*.ckpt``,
``save_top_k`` removes files. A step no pointer names any more (its file removed, or replaced as
``last.ckpt`` is at each save) loses its manifest too; ``ravex gc`` reclaims its objects.
``ravex ls``, ``show``, ``diff`` and ``inspect`` read the store. Loading reads only the step the
pointer names. Pointer files live on a local path; the store may be remote.

**Zero-code.** Under ``ravex enable`` (:mod:`ravex.runtime.frameworks`) :func:`install` gives each
Trainer with Lightning's default CheckpointIO a callback that saves every ``checkpoint_every``
global steps into the configured store through this plugin, one step per global step, numbered
by it (raised above any steps of the runtime's own the timeline already holds) and carrying the
training loss, and the newest of them as its ``ckpt_path``. Each step's manifest says it is
Lightning's (:data:`~ravex.saving.backend.LIGHTNING_KEY`): the runtime, which reads the store when
it starts, before any Trainer exists, never restores one as a tree of its own. A store with no
Lightning step is resumed from ``<storage>-lightning`` when earlier versions of Ravex left steps
there. Every save logs the line every Ravex checkpoint logs (``ravex: checkpoint step N: stall
... -> <store>``, on the ``ravex`` logger, which ``ravex enable`` shows) from the rank that
writes: rank 0, the one Lightning hands its checkpoint to under DDP. Every other save
(``ModelCheckpoint``'s, the script's own ``trainer.save_checkpoint``) stays the file Lightning's
own CheckpointIO writes (:class:`ZeroCodeIO`): the script's files are what they were without Ravex.
The callback also makes the resume exact where Lightning's checkpoint alone is not: it carries
each rank's RNG streams and the train loader's place in its epoch, so a plain shuffled DataLoader
(or the DistributedSampler Lightning gives it under DDP) resumes mid-epoch on the same order, and
a finished run rerun trains nothing and leaves the state as the first run left it.

Needs the ``lightning`` extra: ``pip install 'ravex[lightning]'`` (``lightning``, which brings
``pytorch_lightning``; either one alone is enough).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from torch.utils.data import DataLoader

from ravex.errors import RestoreError
from ravex.format import CheckpointStore, CommitStats, StepWriter, open_store
from ravex.format.history.timelines import MAIN, split_ref
from ravex.format.storage.atomic import atomic_write, unlink_quietly
from ravex.saving.backend import LIGHTNING_KEY
from ravex.saving.logline import checkpoint_line, commit_text, copied_text, stall_text

EXTRA = "ravex[lightning]"
POINTER_FORMAT = 1
#: the manifest metadata member holding the step's Lightning global step (a decimal string)
GLOBAL_STEP_KEY = "global_step"

logger = logging.getLogger("ravex")

Replace = Callable[[Any, str, Callable[[Any], Any]], None]
#: a step as a pointer names it: its number (a step of ``main``) or ``<timeline>@<number>``
Ref = int | str

#: each way Lightning is imported (the package its Trainer comes from) -> its fabric package
PACKAGES: dict[str, str] = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}


class RavexCheckpointIO:
    """Lightning's checkpoints as steps of the Ravex store at ``url`` (a path or fsspec URL).

    ``numbering``: ``"next"``, each save the step after the newest; ``"global_step"``, each save
    the step of its global step, for a caller that saves at most once per global step (the
    zero-code cadence): a save at a step the store already holds is not written (a warning says
    so). ``loss``: called at each save, on the caller's thread; its value is the step's
    training loss (``metadata["loss"]``, spec §20)."""

    def __init__(self, url: str | os.PathLike[str], compression: str = "none",
                 storage_options: dict[str, Any] | None = None, async_writes: bool = True,
                 max_queued: int = 2, numbering: str = "next",
                 loss: Callable[[], float | None] | None = None) -> None:
        if max_queued < 1:
            raise ValueError(f"RavexCheckpointIO: max_queued={max_queued}; it must be 1 or more")
        if numbering not in ("next", "global_step"):
            raise ValueError(f"RavexCheckpointIO: numbering={numbering!r}; it must be 'next' or 'global_step'")
        _register()  # a Lightning imported after this module: its CheckpointIO knows the plugin too
        self.url = os.fspath(url)
        self.compression = compression
        self.storage_options = storage_options
        self.async_writes = async_writes
        self.max_queued = max_queued
        self.numbering = numbering
        self.loss = loss
        #: what each save's commit did, in order (new and reused chunks, bytes)
        self.stats: list[CommitStats] = []
        self._store: CheckpointStore | None = None  # the store (its main timeline): what pointers name
        self._view: CheckpointStore | None = None  # the timeline this plugin writes
        self._timeline: str | None = None  # its name, when not main (zero-code: the current one)
        self._fork_at: Ref | None = None  # a step to fork a new timeline from at the first write
        self._base = 0  # numbering="global_step": added to each global step (zero-code: above the steps there)
        self._writer: StepWriter | None = None
        self._next_step: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []  # saves and removals queued
        self._saves: list[Future[None]] = []  # saves queued
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    # ---- Lightning's CheckpointIO ---------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError("RavexCheckpointIO.save_checkpoint takes no storage_options; pass them to "
                            "RavexCheckpointIO(url, storage_options=...)")
        path = _local(path)
        started = time.perf_counter()
        while len(self._saves) >= self.max_queued:
            wait([self._saves.pop(0)])
        waited = time.perf_counter() - started
        self._raise_failed()
        loss = self.loss() if self.loss is not None else None
        tree = to_tree(checkpoint, copy=self.async_writes)
        stall = stall_text(waited, time.perf_counter() - started - waited, _copied(checkpoint, self.async_writes))
        done = self._run(functools.partial(self._write, tree, path, loss, _Handoff(stall)))
        if done is not None:
            self._saves.append(done)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        self.flush()
        url, step = read_pointer(_local(path))
        store = self._open() if url == _absolute(self.url) else open_store(url, storage_options=self.storage_options)
        tree: dict[str, Any] = from_tree(store.read(step), map_location)
        return tree

    def remove_checkpoint(self, path: Any) -> None:
        path = _local(path)
        self._run(lambda: self._remove(path))

    def teardown(self) -> None:
        """Wait for the queued writes (Lightning calls this at the end of ``fit``) and close."""
        try:
            self.flush()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def flush(self) -> None:
        """Wait until every queued save and removal is done; raise the first that failed."""
        pending, self._pending, self._saves = self._pending, [], []
        wait(pending)  # a failure is recorded by _guarded, and raised once, here
        self._raise_failed()

    # ---- the work, on the writer thread ----------------------------------------------------

    def _run(self, job: Callable[[], None]) -> Future[None] | None:
        """``job`` now, or queued on the writer thread (its future)."""
        if not self.async_writes:
            job()
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ravex-lightning")
        self._pending = [f for f in self._pending if not f.done()]
        self._saves = [f for f in self._saves if not f.done()]
        future = self._executor.submit(self._guarded, job)
        self._pending.append(future)
        return future

    def _guarded(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as exc:
            with self._lock:
                self._error = self._error or exc
            raise

    def _raise_failed(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _open(self) -> CheckpointStore:
        if self._store is None:
            self._store = open_store(self.url, create=True, storage_options=self.storage_options)
        return self._store

    def _writing(self) -> CheckpointStore:
        """The timeline the saves go to: ``main``, the one zero-code chose, or (first write of a
        run resumed from an older step) a new one forked from that step, so that its steps never
        collide with the steps after it (spec §19). Only a rank that writes forks."""
        if self._view is None:
            self._view = self._open() if self._timeline is None else self._open().on_timeline(self._timeline)
        if self._fork_at is not None:
            fork_at, self._fork_at = self._fork_at, None
            owner, step = self._open().locate(fork_at)
            self._view = owner.fork(step)
            logger.info("ravex: step %s is not the newest of its timeline: this run's Lightning steps go to "
                        "the new timeline %r of %s", fork_at, self._view.timeline.name, self.url)
        return self._view

    def _write(self, tree: Any, path: str, loss: float | None, handoff: _Handoff) -> None:
        view = self._writing()
        if self._writer is None:
            self._writer = view.writer(compression=self.compression)
        if self.numbering == "global_step":
            step = self._base + int(tree["global_step"])
            if view.step_info(step).complete:
                logger.warning("ravex: %s already holds step %d (global step %d of an earlier run): this save "
                               "is not written; a run that starts over needs a store of its own",
                               self.url, step, tree["global_step"])
                return
        else:
            if self._next_step is None:
                self._next_step = max(view.step_numbers(), default=-1) + 1
            step, self._next_step = self._next_step, self._next_step + 1
        where = {k: v for k in ("epoch", "global_step") if isinstance(v := tree.get(k), int)}
        metadata = {LIGHTNING_KEY: os.path.basename(path)}
        if "global_step" in where:
            metadata[GLOBAL_STEP_KEY] = str(where["global_step"])
        if loss is not None:
            metadata["loss"] = repr(loss)  # shortest round-trip text, as the runtime's steps (spec §20)
        stats = self._writer.commit(step, tree, metadata=metadata)
        self.stats.append(stats)
        try:
            replaced: tuple[str, Ref] | None = read_pointer(path)
        except (OSError, ValueError):
            replaced = None
        write_pointer(path, self.url, _ref(view, step), where)
        if replaced is not None:
            self._drop_unnamed(os.path.dirname(path) or ".", *replaced)
        logger.info("%s", checkpoint_line(step, handoff.stall, commit_text(stats),
                                          time.perf_counter() - handoff.submitted, view.url))

    def _remove(self, path: str) -> None:
        try:
            url, step = read_pointer(path)
        except FileNotFoundError:
            return
        unlink_quietly(path)
        self._drop_unnamed(os.path.dirname(path) or ".", url, step)

    def _drop_unnamed(self, directory: str, url: str, ref: Ref) -> None:
        """Delete step ``ref`` unless a pointer in ``directory`` still names it: only a step of the
        timeline this plugin writes (another timeline's steps are another run's history)."""
        if url != _absolute(self.url) or _still_named(directory, url, ref):
            return
        name, number = _split(ref)
        view = self._writing()
        if name == view.timeline.name:
            view.delete_step(number)


@dataclasses.dataclass(frozen=True)
class _Handoff:
    """A save as the training loop handed it to the writer: what it paid (the log line's stall)
    and when, for the line's time to durable."""

    stall: str
    submitted: float = dataclasses.field(default_factory=time.perf_counter)


def _copied(checkpoint: Any, every: bool) -> str:
    """What :func:`to_tree` copied of ``checkpoint``'s tensors, for the log line: all of them
    (``every``: a write that runs after the caller goes on) or those not in CPU memory."""
    import torch

    from ravex.saving.tree import leaves

    tensors = [v for v in leaves(checkpoint) if isinstance(v, torch.Tensor)]
    copied = [t for t in tensors if every or t.device.type != "cpu"]
    return copied_text(len(copied), len(tensors), sum(t.numel() * t.element_size() for t in copied),
                       sum(t.numel() * t.element_size() for t in tensors))


class ZeroCodeIO:
    """The CheckpointIO of a Trainer under ``ravex enable``: the cadence's saves (the pointer files
    in ``folder``) go to the Ravex store through ``ravex``; every other save, load and removal
    (``ModelCheckpoint``'s files, the script's ``trainer.save_checkpoint``) goes to Lightning's own
    CheckpointIO ``own``, as without Ravex, and a pointer file, wherever it is, loads from the store.
    So the store holds one step per global step, and what a script writes stays its own."""

    def __init__(self, ravex: RavexCheckpointIO, own: Any, folder: str) -> None:
        self.ravex = ravex
        self.own = own
        self.folder = os.path.abspath(folder)

    @property
    def stats(self) -> list[CommitStats]:
        """What each of the cadence's saves wrote (:attr:`RavexCheckpointIO.stats`)."""
        return self.ravex.stats

    def _ours(self, path: Any) -> bool:
        path = os.fspath(path)
        return "://" not in path and os.path.dirname(os.path.abspath(path)) == self.folder

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if self._ours(path):
            self.ravex.save_checkpoint(checkpoint, path, storage_options)
        else:
            self.own.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if _is_pointer(path):
            return self.ravex.load_checkpoint(path, map_location, weights_only)
        loaded: dict[str, Any] = self.own.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        if self._ours(path):
            self.ravex.remove_checkpoint(path)
        else:
            self.own.remove_checkpoint(path)

    def teardown(self) -> None:
        try:
            self.ravex.teardown()
        finally:
            self.own.teardown()


_REGISTERED: set[type] = set()


def _register() -> None:
    """Make :class:`RavexCheckpointIO` and :class:`ZeroCodeIO` instances, for ``isinstance``, of
    the ``CheckpointIO`` of each Lightning imported so far (``lightning.fabric``'s,
    ``lightning_fabric``'s): Lightning checks a plugin against its own copy of the class."""
    for fabric in PACKAGES.values():
        module = sys.modules.get(f"{fabric}.plugins.io.checkpoint_io")
        base = getattr(module, "CheckpointIO", None)
        if base is not None and base not in _REGISTERED:
            base.register(RavexCheckpointIO)
            base.register(ZeroCodeIO)
            _REGISTERED.add(base)


def to_tree(checkpoint: Any, copy: bool = False) -> Any:
    """Lightning's dict with every tensor as a numpy array on CPU (dtype kept); ``copy``: a copy
    even of a CPU tensor, for a write that runs after the caller goes on."""
    import torch

    from ravex.saving.dtypes import numpy_view
    from ravex.saving.tree import tree_map

    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            value = value.detach()
            on_cpu = value.to("cpu")
            if copy and on_cpu.data_ptr() == value.data_ptr():
                on_cpu = on_cpu.clone()
            return numpy_view(on_cpu.contiguous())
        return value

    return tree_map(leaf, checkpoint)


def from_tree(tree: Any, map_location: Any = None) -> Any:
    """A step's tree with torch tensors, on ``map_location`` when it is a device or a string."""
    import torch

    from ravex.saving.load import tree_to_torch

    device = map_location if isinstance(map_location, (str, torch.device)) else None
    return _interned(tree_to_torch(tree, device))


def _interned(tree: Any) -> Any:
    """``tree`` with each string the interned one (``sys.intern``): the objects Lightning restores
    from it keep these strings (an optimizer's state keys, a scheduler's ``__dict__``, a callback's
    paths), and ``torch.save`` pickles a string seen before as a reference to it, by identity. As
    in the run that saved them (keys are the code's own, interned, literals; a path assigned to
    two attributes is one object), a script's ``trainer.save_checkpoint`` after a resume writes
    the same bytes."""
    if isinstance(tree, str):
        return sys.intern(tree)
    if isinstance(tree, dict):
        return {_interned(k): _interned(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_interned(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_interned(v) for v in tree)
    return tree


def write_pointer(path: str, url: str, step: Ref, where: dict[str, int] | None = None) -> None:
    """The file Lightning sees at ``path``: which step of which store holds its checkpoint (its
    number, or ``<timeline>@<number>`` for a step of another timeline than ``main``), and
    (``where``) Lightning's epoch and global step in it, for a person or a script to read."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    doc: dict[str, Any] = {"ravex_checkpoint": POINTER_FORMAT, "store": _absolute(url), "step": step, **(where or {})}
    atomic_write(path, json.dumps(doc).encode() + b"\n")


def read_pointer(path: str) -> tuple[str, Ref]:
    """The store URL and step a pointer file names; a one-line error for any other file."""
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        doc = json.loads(head)
        step = doc["step"]
        return str(doc["store"]), step if isinstance(step, str) and "@" in step else int(step)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path} is not a RavexCheckpointIO checkpoint (a torch.save file? load it without "
                         "the RavexCheckpointIO plugin)") from None


def _is_pointer(path: Any) -> bool:
    """Whether ``path`` is a local pointer file (a file Lightning's own CheckpointIO never wrote)."""
    try:
        read_pointer(_local(path))
    except (OSError, ValueError):
        return False
    return True


def _ref(view: CheckpointStore, step: int) -> Ref:
    """How a pointer names ``step`` of the timeline ``view``: a bare number on ``main`` (as every
    pointer written before timelines did)."""
    return step if view.timeline.name == MAIN else f"{view.timeline.name}@{step}"


def _split(ref: Ref) -> tuple[str, int]:
    """A pointer's step as (timeline, number)."""
    if isinstance(ref, int):
        return MAIN, ref
    name, text = split_ref(ref)
    return name or MAIN, int(text)


def _still_named(directory: str, url: str, step: Ref) -> bool:
    """Whether another pointer file in ``directory`` names the same step."""
    for name in os.listdir(directory):
        if name.endswith(".ckpt"):
            try:
                if read_pointer(os.path.join(directory, name)) == (url, step):
                    return True
            except (OSError, ValueError):
                continue
    return False


def _local(path: Any) -> str:
    path = os.fspath(path)
    if "://" in path:
        raise ValueError(f"RavexCheckpointIO keeps its pointer files on a local path, not {path!r}: give "
                         "ModelCheckpoint a local dirpath (the store itself, RavexCheckpointIO(url), may be remote)")
    return str(path)


def _absolute(url: str) -> str:
    return url if "://" in url else os.path.abspath(url)



# ---- zero-code, under ``ravex enable`` ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ZeroCode:
    """What ``ravex.yaml`` asks of a Lightning run that names no Ravex in its code."""

    url: str  #: the store (``storage``), which the runtime's own steps may share: their metadata tells them apart
    pointers: str  #: a local folder for the pointer files Lightning loads from
    every: int | None  #: ``checkpoint_every``: a checkpoint each time the global step is a multiple
    keep_last: int | None  #: the newest steps this run's saves keep (older ones lose their manifest)
    resume: str | int = "auto"  #: ``auto`` (the newest step the plugin wrote), ``never``, or a step
    on_exit: bool = True  #: ``checkpoint_on_exit``: one more at the end of ``fit``
    compression: str = "none"
    storage_options: dict[str, Any] | None = None
    #: the store beside ``url`` that earlier versions of Ravex wrote these steps to: ``resume: auto``
    #: resumes its newest Lightning step when ``url`` holds none (this run's saves go to ``url``)
    former: str | None = None


class TrainingLoss(Protocol):
    def value(self) -> float | None: ...


class LightningRuntime(Protocol):
    """What the zero-code integration asks of the runtime (:class:`ravex.runtime.lifecycle.RavexRuntime`)."""

    @property
    def last_loss(self) -> TrainingLoss:
        """The loss ``backward()`` last ran on (the runtime keeps it, handed over or not)."""

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
    cadence = type("_EveryN", (_EveryN, callback), {"__module__": __name__, "__qualname__": "_EveryN"})
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
    trainer.callbacks.append(lightning.cadence(settings, io))
    runtime.hand_over(f"Lightning saves this run into {settings.url} through RavexCheckpointIO{start.describe()}")
    if start.step is not None and trainer.ckpt_path is None:
        path = os.path.join(settings.pointers, "resume.ckpt")
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


class _EveryN:
    """Saves every ``checkpoint_every`` global steps (and at the end of ``fit``) to a pointer file
    per step in ``settings.pointers``, keeping the newest ``keep_last`` of them. (A ``Callback`` of
    the Trainer's own package: :func:`_package` makes one from this class.)

    A save due at an epoch's last batch waits for the first optimizer step of the next epoch (or
    the end of ``fit``): resumed from an epoch's last batch, Lightning counts that epoch as done
    without running its end (its hooks, its epoch-interval LR step). So the last step of a finished
    run is the state ``fit`` ended with, and a rerun of it trains nothing.

    What Lightning's checkpoint lacks for an exact resume travels in this callback's state (so
    in every checkpoint of the Trainer, ``ModelCheckpoint``'s too): each rank's RNG streams (torch,
    CUDA, Python, NumPy) when the checkpoint was taken and its torch RNG when the train loader's
    epoch began, the batches the loop had consumed of it, and ``should_stop`` (an early stop is not
    in Lightning's checkpoint). On resume the train loader's next ``__iter__`` replays that epoch's
    start (the sampler at its epoch, as a ``DistributedSampler``) and skips those batches at the
    sampler (Lightning itself would start a loader without ``state_dict`` on a new epoch's order),
    then the RNG streams are put back as they were at the checkpoint; a rerun that iterates nothing
    (a finished run) gets them back at the end of ``fit``."""

    def __init__(self, settings: ZeroCode, io: RavexCheckpointIO) -> None:
        super().__init__()
        self.settings = settings
        self.io = io
        self.last_step: int | None = None  # the global step of the last save (or of the step resumed)
        self.seen: int | None = None  # the global step at the previous batch end
        self.due = False  # a save is due at the next batch end that steps and ends no epoch
        self.trainer: Any = None
        self.epoch_rng: Any = None  # torch's RNG when the train loader's current epoch began
        self.pending: dict[str, Any] | None = None  # the resumed position, until the loader's next epoch
        self.resumed: dict[str, Any] | None = None  # the state resumed, until a batch trains
        _RESUMABLE.add(self)

    @property
    def state_key(self) -> str:
        return "_EveryN"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            return {}
        ranks = _every_rank({"rng": _rng_state(), "epoch_rng": self.epoch_rng})
        return {"rng": [r["rng"] for r in ranks], "epoch_rng": [r["epoch_rng"] for r in ranks],
                "consumed": int(trainer.fit_loop.epoch_loop.batch_progress.current.ready),
                "batches": trainer.num_training_batches if math.isfinite(trainer.num_training_batches) else -1,
                "global_step": int(trainer.global_step), "should_stop": bool(trainer.should_stop)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rng") is None:
            self.pending = self.resumed = None
            return
        self.pending, self.resumed = dict(state), dict(state)
        self.epoch_rng = _of_rank(state.get("epoch_rng"), self._rank())
        if isinstance(state.get("global_step"), int):
            self.last_step = self.seen = state["global_step"]  # its save is done: not written again
        if state.get("should_stop") and self.trainer is not None:
            self.trainer.should_stop = True  # an early-stopped run stays stopped

    def _rank(self) -> int:
        return int(getattr(self.trainer, "global_rank", 0) or 0)

    def owns(self, loader: Any) -> bool:
        """Whether ``loader`` is the train loader of this callback's Trainer."""
        combined = getattr(getattr(self.trainer, "fit_loop", None), "_combined_loader", None)
        return combined is not None and any(dl is loader for dl in combined.flattened)

    def iterate(self, loader: Any, original: Any) -> Any:
        """The train loader's ``__iter__``: the resumed epoch's when one is pending."""
        import torch

        pending, self.pending = self.pending, None
        if pending is None:
            self.epoch_rng = torch.get_rng_state()
            return original(loader)
        rank = self._rank()
        rng, epoch_rng = _of_rank(pending["rng"], rank), _of_rank(pending["epoch_rng"], rank)
        consumed, batches = int(pending["consumed"]), int(pending["batches"])
        if 0 < consumed and (batches < 0 or consumed < batches) and not _stateful(loader):
            # Lightning sets the sampler's epoch only after this iter() (FitLoop.setup_data, then
            # on_advance_start): the skip below draws from the sampler now, so set it first.
            _set_sampler_epoch(loader, self.trainer.fit_loop.epoch_progress.current.processed)
            self.epoch_rng = epoch_rng
            torch.set_rng_state(epoch_rng)
            iterator = original(loader)
            _skip(iterator, consumed)
            _set_rng_state(rng)
            return iterator
        _set_rng_state(rng)  # a new epoch begins (or the loader places itself)
        self.epoch_rng = torch.get_rng_state() if consumed == 0 or consumed >= batches >= 0 else epoch_rng
        return original(loader)

    def on_train_start(self, trainer: Any, *args: Any) -> None:
        self.seen = trainer.global_step

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self.resumed = None

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step, every = trainer.global_step, self.settings.every
        stepped, self.seen = step != self.seen, step  # an optimizer step ended this batch
        if every and stepped and step % every == 0 and step != self.last_step:
            self.due = True
        if self.due and stepped and not _ends_epoch_or_fit(trainer):
            self._save(trainer)

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        if self.due or (self.settings.on_exit and trainer.global_step != self.last_step):
            self._save(trainer)
        self.io.flush()  # every pointer on disk: the retention below sees them all
        self._prune(trainer, None)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """A resumed state no batch trained from (a finished run's rerun: Lightning still makes the
        train loader's iterator, which draws its seed, then finds the loop done): its RNG streams
        again, so that what the script does after ``fit`` sees those the first run ended with."""
        resumed, self.resumed, self.pending = self.resumed, None, None
        if resumed is not None:
            rank = self._rank()
            _set_rng_state(_of_rank(resumed["rng"], rank))
            self.epoch_rng = _of_rank(resumed.get("epoch_rng"), rank)

    def _save(self, trainer: Any) -> None:
        self.last_step, self.due = trainer.global_step, False
        name = f"step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(os.path.join(self.settings.pointers, name))
        self._prune(trainer, name)

    def _prune(self, trainer: Any, saving: str | None) -> None:
        """Remove all but the newest ``keep_last`` pointers of the folder (and their steps), over
        this run's saves and those of the runs before it. ``saving``: the one just queued (a
        queued write is not on disk yet; one queued before it stays until the next prune)."""
        keep, folder = self.settings.keep_last, self.settings.pointers
        if keep is None:
            return
        names = [*(os.listdir(folder) if os.path.isdir(folder) else []), *([saving] if saving else [])]
        saved = {m.group(0): int(m.group(1)) for n in names if (m := _POINTER.fullmatch(n))}
        for old in sorted(saved, key=saved.__getitem__)[:-keep]:
            trainer.strategy.remove_checkpoint(os.path.join(folder, old))


_POINTER = re.compile(r"step=(\d+)\.ckpt")


def _ends_epoch_or_fit(trainer: Any) -> bool:
    """Whether the batch that just ended is its epoch's last, or the last of ``fit`` (``max_steps``)."""
    if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
        return True
    max_steps = trainer.max_steps
    return max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps


#: the zero-code callbacks alive, each watching its Trainer's train loader
_RESUMABLE: weakref.WeakSet[_EveryN] = weakref.WeakSet()
#: marks the DataLoader.__iter__ patch, so that a second Lightning package does not wrap it again
_PATCHED = "_ravex_lightning"


def _loader_iter(original: Any) -> Any:
    def __iter__(self: Any) -> Any:
        for callback in list(_RESUMABLE):
            if callback.owns(self):
                return callback.iterate(self, original)
        return original(self)

    setattr(__iter__, _PATCHED, True)
    return __iter__


def _every_rank(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """``mine`` from every rank, in rank order (one process: ``[mine]``). Every rank builds a
    checkpoint's dict (only rank 0 writes it), so each can hand in its own RNG streams."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


def _of_rank(value: Any, rank: int) -> Any:
    """This rank's entry of a per-rank list (rank 0's for a rank the saving run did not have; a
    checkpoint written before per-rank states holds one value for all)."""
    if isinstance(value, list):
        return value[rank] if rank < len(value) else (value[0] if value else None)
    return value


def _set_sampler_epoch(loader: Any, epoch: int) -> None:
    """What Lightning does at each epoch's start: ``set_epoch`` on the loader's sampler and its
    batch sampler's sampler, where they have one (a ``DistributedSampler`` shuffles by epoch)."""
    samplers = {id(s): s for s in (getattr(loader, "sampler", None),
                                   getattr(getattr(loader, "batch_sampler", None), "sampler", None)) if s is not None}
    for sampler in samplers.values():
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def _stateful(loader: Any) -> bool:
    """Whether Lightning places ``loader`` itself (its ``state_dict``/``load_state_dict`` protocol)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _skip(iterator: Any, batches: int) -> None:
    """Past the first ``batches`` of a fresh DataLoader iterator: at the sampler (no data read)
    in the main process; with workers, whose indices are already queued, by reading them."""
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    for _ in range(batches):
        if isinstance(iterator, _SingleProcessDataLoaderIter):
            next(iterator._sampler_iter)
            iterator._num_yielded += 1
        else:
            next(iterator)


def _rng_state() -> dict[str, Any]:
    """The RNG streams, as tensors and plain Python values only: this state is in every checkpoint
    of the Trainer, ``ModelCheckpoint``'s ``torch.save`` files too, and those must still load with
    ``torch.load(weights_only=True)`` (a numpy array would not)."""
    import random

    import numpy as np
    import torch

    numpy = np.random.get_state(legacy=False)
    numpy["state"] = {**numpy["state"], "key": [int(k) for k in numpy["state"]["key"]]}
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy}
    cuda: Any = torch.cuda
    if cuda.is_available() and cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state({**numpy, "state": {**numpy["state"], "key": np.asarray(numpy["state"]["key"], np.uint32)}})
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _import_lightning() -> None:
    """At import, after every name above exists (a Lightning imported here may run
    :mod:`ravex.runtime.frameworks`' installer, which uses this module): the Lightning a script
    imported, or else one that is installed; none is the one-line error naming the extra."""
    if not any(f"{fabric}.plugins.io.checkpoint_io" in sys.modules for fabric in PACKAGES.values()):
        for fabric in PACKAGES.values():
            try:
                importlib.import_module(f"{fabric}.plugins.io.checkpoint_io")
                break
            except ImportError:
                continue
        else:
            raise ImportError(f"ravex.integrations.lightning needs PyTorch Lightning: pip install '{EXTRA}'")
    _register()


_import_lightning()
