"""Putting each DataLoader back where it was: epochs already finished pass through empty (the
outer ``for epoch`` loop runs on), and the interrupted epoch replays the RNG state it started
with, so the shuffle order and worker seeds are the same, then skips the consumed batches at
the sampler.

Apart from :class:`.resume.Resume` because it is the one part of a resume that runs at every
``iter()`` of a DataLoader, for the whole run: it places loaders from the step's entries
(:class:`.reading.StepReader`) and asks the resume it serves (:class:`Resuming`) to restore
where an epoch it replays begins.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from ravex.saving.backend import CheckpointBackend

from ..position import LoopPosition, Reentry, innermost_frame
from ..state import restore, rng, workers
from ..state.lookahead import LookAhead
from ..state.registry import LoaderState, Registry
from .reading import StepReader


class Resuming(Protocol):
    """What placing the loaders asks of the resume it is part of (:class:`.resume.Resume`)."""

    enabled: bool
    backend: CheckpointBackend | None
    registry: Registry
    loop_position: LoopPosition
    lookahead: LookAhead
    reading: StepReader
    #: the script resumed its loop itself: its loaders start their epochs where it asks
    loaders_elsewhere: bool

    @property
    def restored(self) -> bool: ...

    @property
    def loops_skipped(self) -> bool: ...

    def restore_here(self) -> None: ...

    def position_lost(self, why: str) -> None: ...


class _Empty:
    """The iterator of an epoch that already finished before the resume."""

    def __iter__(self) -> _Empty:
        return self

    def __next__(self) -> Any:
        raise StopIteration

    def __len__(self) -> int:
        return 0


class LoaderResume:
    """Each DataLoader's epochs across a resume: counted, passed through, or replayed."""

    def __init__(self, resume: Resuming) -> None:
        self.resume = resume

    def loader_iter(self, loader: Any, original: Any) -> Any:
        """``DataLoader.__iter__``: count the epoch; on resume, skip or replay it."""
        run = self.resume
        st = run.registry.loader_state(loader)
        if not run.enabled:
            return original(loader)
        if run.loop_position.reentry is not None and not run.restored:
            entry = self._reentered_loader(loader, st)
        else:
            entry = self._loader_entry(loader, st)
        epoch = st.epoch + 1
        if entry is not None and run.loops_skipped and st.epoch < 0:
            epoch = max(epoch, int(entry["epoch"]))  # the wrapped loops skipped its finished epochs
        if entry is not None and epoch <= entry["epoch"]:
            if epoch < entry["epoch"]:  # finished before the kill: pass through empty
                st.resume_checked = False  # look again at the next epoch
                st.epoch, st.yielded, st.exhausted = epoch, 0, True
                return _Empty()
            st.epoch, st.yielded, st.epoch_rng = epoch, int(entry["yielded"]), entry["epoch_rng"]
            st.offset, st.offset_sampler = int(entry.get("offset", 0)), entry.get("sampler")
            length = entry.get("length")
            if entry["exhausted"] or (length is not None and st.yielded >= length):
                st.exhausted = True
                _after_finished_epoch(loader, st, entry)
                run.restore_here()
                return _Empty()
            # Replay the epoch's start: same worker seeds, same shuffle order.
            # restored already, or at a loop head still to come: the RNG streams stay as they are
            reentry = run.loop_position.reentry
            later = reentry is not None and reentry.mode in ("head", "end")
            current = rng.capture_epoch_rng(loader) if run.restored or later else None
            rng.restore_epoch_rng(loader, entry["epoch_rng"])
            st.exhausted = False
            st.pending_skip = st.yielded
            st.reused = False  # until the iterator takes the first run's persistent one's seed
            st.pending_seed = entry.get("workers_seed") if entry.get("reused") else None
            st.pending_workers = workers.from_tree(entry.get("worker_rng"))
            iterator = original(loader)
            run.lookahead.epoch_began(st)
            if run.loop_position.enumerate is not None:
                run.loop_position.enumerate.expect(iterator, st.yielded)
            if current is not None:
                rng.restore_epoch_rng(loader, current)
            else:
                run.restore_here()  # sets every RNG to the checkpoint's
            return iterator
        st.epoch, st.yielded, st.exhausted = epoch, 0, False
        st.reused = bool(loader.persistent_workers and loader.num_workers and loader._iterator is not None)
        st.epoch_rng = rng.capture_epoch_rng(loader)
        st.pending_skip, st.offset, st.offset_sampler = 0, 0, None
        iterator = original(loader)
        run.lookahead.epoch_began(st)
        return iterator

    def sync(self, tree: dict[str, Any]) -> None:
        """Back at a recorded loop position, the loaders' epoch counts continue the saved
        run's (the rerun skipped the epochs that counted them), but the one resumed mid-epoch."""
        registry = self.resume.registry
        for loader, entry in zip(registry.live("loaders"), tree.get("loaders", []), strict=False):
            st = registry.loader_state(loader)
            if st.resume_checked:
                continue
            st.resume_checked = True
            st.epoch, st.yielded, st.exhausted = int(entry["epoch"]), int(entry["yielded"]), True
            _after_finished_epoch(loader, st, entry)
        self.resume.reading.loaders = None

    def _loader_entry(self, loader: Any, st: LoaderState, force: bool = False) -> dict[str, Any] | None:
        run = self.resume
        reading = run.reading
        if run.loaders_elsewhere:
            return None
        if not force and (st.resume_checked or (run.restored and reading.loaders is None)):
            return None
        st.resume_checked = True
        reading.load(run.backend)
        if not reading.loaders:
            return None
        index = next(i for i, obj in enumerate(run.registry.live("loaders")) if obj is loader)
        if index >= len(reading.loaders):
            return None
        entry = reading.loaders[index]
        assert run.backend is not None  # a checkpoint was read through it
        restore.check_loader(f"checkpoint step {reading.resumed_from} in {run.backend.url!r}",
                             index, loader, entry)
        return entry

    def _reentered_loader(self, loader: Any, st: LoaderState) -> dict[str, Any] | None:
        """With a recorded loop position: the saved entry of the loader whose epoch the
        checkpoint interrupted, when this ``iter()`` is that loop's; None for any other."""
        run = self.resume
        reentry = run.loop_position.reentry
        if reentry is None or run.restored:
            return None
        if reentry.mode in ("head", "end"):  # "end": a finished run's loop, restored at its head too
            return self._drawn_loader(loader, st, reentry)
        if not reentry.at_loader():
            return None
        st.resume_checked = True
        entry = self._loader_entry(loader, st, force=True)
        if entry is None or not entry.get("active"):
            run.position_lost("the DataLoader of that loop is not the one the checkpoint was taken in")
            return None
        st.epoch = int(entry["epoch"]) - 1
        return entry

    def _drawn_loader(self, loader: Any, st: LoaderState, reentry: Reentry) -> dict[str, Any] | None:
        """A position at a loop's head (or a finished run's loop, whose iterator may be
        mid-epoch too: an endless sampler's), whose loop draws its batches with ``next(it)``
        from an iterator made before it (``data_iter = iter(loader)`` above a ``while True:``):
        that ``iter()``, called from a recorded frame, of the loader the checkpoint interrupted
        mid-epoch, resumes the epoch (replayed, consumed batches skipped); the restore waits
        for the loop's head. Any other loader starts its epoch as the first run did."""
        if not reentry.holds(innermost_frame(sys._getframe(3))):
            return None
        entry = self._loader_entry(loader, st, force=True)
        if entry is None or entry.get("exhausted") or int(entry["epoch"]) < 0:
            st.resume_checked = False  # counted on from the checkpoint once restored
            return None
        st.epoch = int(entry["epoch"]) - 1
        return entry


def _after_finished_epoch(loader: Any, st: LoaderState, entry: dict[str, Any]) -> None:
    """A checkpoint after a finished epoch, which this run passes by: its loader's generators
    as they stood, and the first run's persistent workers, which went on to the next epoch:
    the iterator this run makes for it takes their base seed and streams (:mod:`.workers`)."""
    rng.restore_generators(loader, entry.get("generators") or {})
    seed = entry.get("workers_seed")
    if seed is not None:
        st.workers_seed = st.pending_seed = int(seed)
        st.pending_workers = workers.from_tree(entry.get("worker_rng"))
