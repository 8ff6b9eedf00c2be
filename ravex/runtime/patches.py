"""What Ravex patches in torch, and how it is undone.

Every patch is recorded in :class:`Patches` with the original, and :meth:`Patches.undo`
puts them back in reverse order, so ``deactivate()`` leaves torch as it found it.

==================================  ============================================
patched                             why
==================================  ============================================
``nn.Module.__init__``              register models in creation order
``Optimizer.__init__``              register optimizers
``LRScheduler.__init__``            register schedulers (ReduceLROnPlateau too)
``amp.GradScaler.__init__``         register AMP scalers
``DataLoader.__init__``/``__iter__``  register loaders; count epochs; resume mid-epoch
``_BaseDataLoaderIter.__init__``    skip resumed batches *at the sampler*; workers (:mod:`.workers`)
``_BaseDataLoaderIter.__next__``    the step boundary where checkpoints are taken
global optimizer step post hook     count steps (torch's own hook, no patch)
``torch.autograd.backward``         keep the loss (:mod:`.loss`; ``Tensor.backward`` calls it)
``amp.GradScaler.scale``            which scaled tensor stands for which loss
``torch.save``                      a found checkpoint is restored before the script saves
                                    (never an untrained model over the user's file)
global forward / step pre hooks     restore before the first forward (removed after)
``open`` (``builtins``, ``io``)     note the files opened for appending (:mod:`.state.appended`)
==================================  ============================================

Between checkpoints the cost is one Python call per batch, per backward pass and per optimizer
step.
"""

from __future__ import annotations

import builtins
import functools
import io
import itertools
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import dataloader as _dl

from .state import rng, sampler_epoch, workers
from .state.lookahead import log_worker_batch

_END = object()


class Patches:
    """Installed patches and hook handles, undoable."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def handle(self, handle: Any) -> None:
        self._undo.append(handle.remove)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _as_caller(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, with the warnings it raises that would point at this file
    (a ``stacklevel=2`` warning of the function a patch wraps) pointing at the line of the
    user's code that called the wrapper instead. Only for wrappers of calls made a few times
    (constructors, an epoch's iterator, ``torch.save``): catching warnings costs microseconds."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call(*args, **kwargs)
    for w in caught:
        if w.filename == __file__:
            where = sys._getframe(2).f_globals
            filename, lineno = sys._getframe(2).f_code.co_filename, sys._getframe(2).f_lineno
        else:  # re-issued as the warnings machinery would have: its module's name and registry
            where = next((vars(m) for m in list(sys.modules.values())
                          if getattr(m, "__file__", None) == w.filename), {})
            filename, lineno = w.filename, w.lineno
        warnings.warn_explicit(w.message, w.category, filename, lineno, module=where.get("__name__"),
                               registry=where.setdefault("__warningregistry__", {}) if where else None,
                               source=w.source)
    return result


def _register_after(kind: str, runtime: Any) -> Callable[[Any], Any]:
    """Wrap an ``__init__`` so that the object is registered as it is created."""

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            runtime.registry.add(kind, self)
            _as_caller(original, self, *args, **kwargs)

        return __init__

    return make


def _noting_appends(runtime: Any) -> Callable[[Any], Any]:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = original(file, mode, *args, **kwargs)
            runtime.registry.appended.opened(file, mode, handle)  # it keeps those opened for appending
            return handle

        return open

    return make


def install(runtime: Any) -> Patches:
    """Install every patch for ``runtime``; returns the undo record."""
    patches = Patches()
    patches.replace(torch.nn.Module, "__init__", _register_after("modules", runtime))
    patches.replace(torch.optim.Optimizer, "__init__", _register_after("optimizers", runtime))
    patches.replace(torch.optim.lr_scheduler.LRScheduler, "__init__",
                    _register_after("schedulers", runtime))
    if "__init__" in torch.optim.lr_scheduler.ReduceLROnPlateau.__dict__ and not issubclass(
        torch.optim.lr_scheduler.ReduceLROnPlateau, torch.optim.lr_scheduler.LRScheduler
    ):  # pragma: no cover - torch < 2.2
        patches.replace(torch.optim.lr_scheduler.ReduceLROnPlateau, "__init__",
                        _register_after("schedulers", runtime))
    patches.replace(torch.amp.GradScaler, "__init__", _register_after("scalers", runtime))
    real_open = io.open
    noting_open = _noting_appends(runtime)(real_open)  # builtins.open is io.open: one wrapper for both,
    for owner in (builtins, io):  # so that pickle, which finds it as io.open, pickles it by that name
        patches.replace(owner, "open", lambda original: noting_open if original is real_open
                        else _noting_appends(runtime)(original))

    def loader_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            runtime.registry.loader_state(self)
            _as_caller(original, self, *args, **kwargs)

        return __init__

    def loader_iter(original: Any) -> Any:
        @functools.wraps(original)
        def __iter__(self: Any) -> Any:
            return runtime.loader_iter(self, original)

        return __iter__

    def base_iter_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, loader: Any) -> None:
            st = runtime.registry.state_of(loader)
            seed = None
            if st is not None and runtime.enabled:
                seed, st.pending_seed = st.pending_seed, None
            before = None if seed is None else rng.capture_epoch_rng(loader)
            _as_caller(original, self, loader)  # once an epoch: its warnings point where torch's do
            if st is None or not runtime.enabled:
                # a runtime that stood down (a framework resumes the run: Lightning) leaves the
                # iterator lazy, as torch makes it: Lightning sets a DistributedSampler's epoch
                # after iter(), and an eager one would draw the order of the epoch before
                return
            self._ravex_state = st
            skip, st.pending_skip = st.pending_skip, 0
            adopted, st.pending_workers = st.pending_workers, None
            if before is not None:  # the first run reset its persistent iterator here: no draw
                rng.restore_epoch_rng(loader, before)
                self._base_seed, st.reused = seed, True
            st.workers_seed = self._base_seed if loader.persistent_workers and self._num_workers else None
            st.worker_rng, st.worker_log = dict(adopted or {}), None
            if workers.tracks(self):
                self._collate_fn = workers.Reporting(self._collate_fn)
                if adopted or skip % self._num_workers:
                    workers.resume_workers(self, loader, adopted or {}, skip)
            if self._dataset_kind == _dl._DatasetKind.Iterable:
                self._ravex_discard = skip  # no sampler to skip at: drop whole batches
                return
            # Draw the shuffle order now, under the epoch's RNG, and skip at the sampler:
            # indices only, no sample of the skipped batches is ever loaded.
            inner = self._index_sampler
            if st.offset:  # the rest of an epoch other ranks began, dealt out over this run's
                rest = sampler_epoch.remaining_batches(loader, st.offset, st.offset_sampler)
                inner = inner if rest is None else rest
            self._index_sampler = _PrimedSampler(inner, skip)
            self._sampler_iter = iter(self._index_sampler)

        return __init__

    def iter_next(original: Any) -> Any:
        @functools.wraps(original)
        def __next__(self: Any) -> Any:
            st = self.__dict__.get("_ravex_state")
            if st is None:
                return original(self)
            runtime.at_boundary(st)
            discard = self.__dict__.get("_ravex_discard", 0)
            lookahead = runtime.lookahead
            lookahead.fetching += 1
            try:
                while discard:
                    original(self)
                    discard -= 1
                    self._ravex_discard = discard
                data = original(self)
            except StopIteration:
                st.exhausted = True
                lookahead.ran_out(st)
                raise
            finally:
                lookahead.fetching -= 1
            st.yielded += 1
            if type(data) is workers.Batch:
                log_worker_batch(st, data.worker, data.rng)
            return workers.unwrap(data, st.worker_rng)

        return __next__

    def autograd_backward(original: Any) -> Any:
        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            runtime.last_loss.seen(tensors)  # a reference, no sync: read when a checkpoint is taken
            return original(tensors, *args, **kwargs)

        return backward

    def scaler_scale(original: Any) -> Any:
        @functools.wraps(original)
        def scale(self: Any, outputs: Any) -> Any:
            result = original(self, outputs)
            if result is not outputs and isinstance(outputs, torch.Tensor):
                runtime.last_loss.scaled(result, outputs)
            return result

        return scale

    def save(original: Any) -> Any:
        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            runtime.before_user_save()
            return _as_caller(original, *args, **kwargs)

        return save

    patches.replace(torch, "save", save)
    patches.replace(torch.autograd, "backward", autograd_backward)
    patches.replace(torch.amp.GradScaler, "scale", scaler_scale)
    patches.replace(torch.utils.data.DataLoader, "__init__", loader_init)
    patches.replace(torch.utils.data.DataLoader, "__iter__", loader_iter)
    patches.replace(_dl._BaseDataLoaderIter, "__init__", base_iter_init)
    patches.replace(_dl._BaseDataLoaderIter, "__next__", iter_next)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    patches.handle(register_optimizer_step_post_hook(runtime.on_optimizer_step))
    return patches


def install_restore_triggers(runtime: Any, forward: bool = True) -> list[Any]:
    """Hooks that restore before the first forward pass (unless ``forward`` is False) or
    optimizer step; the caller removes them."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def before_forward(module: Any, args: Any) -> None:
        recording = runtime.witness.recording
        runtime.ensure_restored()
        if runtime.witness.recording and not recording:  # its hook starts with the next call
            runtime.witness.forward(module, args)

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        runtime.ensure_restored()

    hooks = [register_optimizer_step_pre_hook(before_step)]
    if forward:
        hooks.append(register_module_forward_pre_hook(before_forward))
    return hooks


class _PrimedSampler:
    """An index sampler whose iterators are eager; the first one skips ``skip`` items.

    Eager, so that a shuffling sampler draws its seed when the epoch starts (where the
    epoch's RNG state is known) rather than at the first ``next()``; a resumed run can
    then replay that draw exactly. The multi-process iterator asks for ``iter()`` twice
    while starting (base ``__init__`` and ``_reset``): until an item is taken, the same
    prepared iterator is handed out, so the seed is drawn once.
    """

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner = inner
        self._skip = skip
        self._current: _Prepared | None = None

    def __iter__(self) -> Any:
        if self._current is None or self._current.started:
            skip, self._skip = self._skip, 0
            self._current = _Prepared(self.inner, skip)
        return self._current

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)


class _Prepared:
    """The iterator of :class:`_PrimedSampler`: skipped and first item drawn up front."""

    def __init__(self, inner: Any, skip: int) -> None:
        self.started = False
        it = iter(inner)
        for _ in range(skip):  # indices only: no sample of a skipped batch is loaded
            if next(it, _END) is _END:
                break
        first: Any = next(it, _END)
        self._it = iter(()) if first is _END else itertools.chain((first,), it)

    def __iter__(self) -> _Prepared:
        return self

    def __next__(self) -> Any:
        self.started = True
        return next(self._it)
