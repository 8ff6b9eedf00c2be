"""The zero-code cadence (:class:`_EveryN`) and the loop state Lightning's checkpoint lacks for an
exact resume: each rank's RNG streams and the train loader's place in its epoch, put back through
a patched ``DataLoader.__iter__`` (:func:`_loader_iter`).
"""

from __future__ import annotations

import math
import os
import re
import weakref
from typing import Any

from .plugin import RavexCheckpointIO
from .pointers import Ref, _split
from .settings import ZeroCode
from .witnessing import FrameworkWitness, WitnessFiles

#: the pointer file the zero-code take-over sets as a resuming Trainer's ``ckpt_path``
RESUME_POINTER = "resume.ckpt"


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

    def __init__(self, settings: ZeroCode, io: RavexCheckpointIO, witness: FrameworkWitness | None = None,
                 resumed: Ref | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.io = io
        #: rank 0's resume witness: the steps after each save recorded, a resume checked
        self.witness = witness
        self.resumed_ref = resumed  # the step Lightning restores, until its first batch starts
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
        ref, self.resumed_ref = self.resumed_ref, None
        if ref is not None and self.witness is not None:  # after the sanity check's forward passes
            self.witness.resumed(_split(ref)[1], WitnessFiles(self.io, ref), 1)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step, every = trainer.global_step, self.settings.every
        stepped, self.seen = step != self.seen, step  # an optimizer step ended this batch
        if stepped and self.witness is not None:
            self.witness.step_done(self.io.step_of(step))
        if every and stepped and step % every == 0 and step != self.last_step:
            self.due = True
        if self.due and stepped and not _ends_epoch_or_fit(trainer):
            self._save(trainer)

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        if self.due or (self.settings.on_exit and trainer.global_step != self.last_step):
            self._save(trainer, window=False)  # no step follows it to witness
        self.io.flush()  # every pointer on disk: the retention below sees them all
        self._prune(trainer, None)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """A resumed state no batch trained from (a finished run's rerun: Lightning still makes the
        train loader's iterator, which draws its seed, then finds the loop done): its RNG streams
        again, so that what the script does after ``fit`` sees those the first run ended with."""
        if stage == "fit" and self.witness is not None:
            self.witness.finish()
        resumed, self.resumed, self.pending = self.resumed, None, None
        if resumed is not None:
            rank = self._rank()
            _set_rng_state(_of_rank(resumed["rng"], rank))
            self.epoch_rng = _of_rank(resumed.get("epoch_rng"), rank)
        if stage == "fit" and trainer.ckpt_path == os.path.join(self.settings.pointers, RESUME_POINTER):
            # the take-over's resume, not the script's: a later test()/validate()/predict() picks
            # its checkpoint as in a run never stopped (Lightning keeps a ckpt_path set by hand)
            trainer.ckpt_path = None

    def _save(self, trainer: Any, window: bool = True) -> None:
        self.last_step, self.due = trainer.global_step, False
        name = f"step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(os.path.join(self.settings.pointers, name))
        if window and self.witness is not None:
            self.witness.checkpoint_taken(self.io.step_of(trainer.global_step), WitnessFiles(self.io))
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
