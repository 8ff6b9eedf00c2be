"""The CheckpointIO plugins: :class:`RavexCheckpointIO`, Lightning's checkpoints as Ravex steps,
and :class:`ZeroCodeIO`, which under ``ravex enable`` routes the cadence's saves to it and every
other save to Lightning's own CheckpointIO. Both are registered together as a ``CheckpointIO`` of
each Lightning imported (:func:`_register`). What a save writes, and how, is the package's doc.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from ravex.format import CheckpointStore, CommitStats, StepWriter, open_store
from ravex.format.storage.atomic import unlink_quietly
from ravex.saving.backend import LIGHTNING_KEY
from ravex.saving.logline import checkpoint_line, commit_text, copied_text, stall_text

from .pointers import Ref, _absolute, _is_pointer, _local, _ref, _split, _still_named, read_pointer, write_pointer

#: the manifest metadata member holding the step's Lightning global step (a decimal string)
GLOBAL_STEP_KEY = "global_step"

logger = logging.getLogger("ravex")

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

    def step_of(self, global_step: int) -> int:
        """The store's step number of a save at ``global_step`` (``numbering="global_step"``)."""
        return self._base + global_step

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
            step = self.step_of(int(tree["global_step"]))
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
