"""HuggingFace ``transformers.Trainer`` resumes exactly through Ravex, zero-code.

Under ``ravex enable`` (or after ``ravex.activate()``) Ravex already saves and restores what
the Trainer builds from torch: the model, the optimizer and LR scheduler it creates, the RNG
streams and the DataLoader's position. What only the Trainer knows is its own loop's
position: ``TrainerState`` (``global_step``, ``epoch``, ``max_steps``, the log history, the
stateful callbacks). This module, installed by the runtime when ``transformers.trainer`` is
imported (:mod:`ravex.runtime.starting.frameworks`), keeps that in every checkpoint and, on a rerun,
feeds it to the Trainer's own resume path, the one ``train(resume_from_checkpoint=...)``
takes, without a checkpoint directory:

- ``Trainer._init_training_state`` loads the saved ``TrainerState`` and returns the epochs
  done and the batches done in the current epoch, computed as the Trainer computes them
  from ``global_step``: its epoch loop starts at the interrupted epoch (no finished epoch
  runs empty, which the Trainer would take for an empty dataset and stop);
- ``Trainer._run_epoch`` of that epoch runs as a resumed one (its step counter, fractional
  epoch and number of update steps continue), while the batches are skipped by Ravex at
  the sampler, after replaying the epoch's RNG state (the ``skip_first_batches`` the Trainer
  calls, directly or through ``get_resumed_dataloader``, hands the loader back unchanged and
  ``_load_rng_state`` leaves the restored RNG alone);
- the DataLoader's position is the batches the Trainer *consumed* (its ``global_step``),
  not those fetched: accelerate's loader reads one batch ahead, so the fetched count is one
  too many, and the batch in its look-ahead would be lost.

A *finished* run rerun (a resubmitted job: ``global_step`` had reached ``max_steps``) trains
nothing: no epoch runs (a mid-epoch ``max_steps`` would otherwise run one more step before the
Trainer's callback stops it). Ravex restores at a run's first forward pass or optimizer step,
and such a rerun has neither before ``train()`` returns, while the Trainer builds its optimizer
and scheduler only inside ``train()``: ``Trainer._finalize_training`` restores the checkpoint
then, so what the script does after ``train()`` (``save_model``, ``evaluate``) sees the trained
state, not the freshly initialised one. It also fixes the Trainer's state as ``train()`` leaves
it for every later checkpoint: the step's checkpoint may be taken at the next batch of an
``evaluate`` or at exit, when the Trainer has already logged this call's metrics into its
history or is no longer alive to ask.

A ``train(resume_from_checkpoint=...)`` call is left to the Trainer's own resume. A
transformers whose Trainer lacks one of these methods is left alone, with one warning line:
Ravex still restores the torch objects, but not the Trainer's position.

Needs the ``hf`` extra: ``pip install 'ravex[hf]'`` (the transformers and accelerate it pins).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("ravex")

EXTRA = "ravex[hf]"
#: the checkpoint's ``integrations/<NAME>`` entry: ``{"trainer_state": <TrainerState JSON>}``
NAME = "hf_trainer"

Replace = Callable[[Any, str, Callable[[Any], Any]], None]


class TrainerRuntime(Protocol):
    """What this integration asks of the runtime (:class:`ravex.runtime.starting.lifecycle.RavexRuntime`)."""

    def track_integration(self, name: str, state: Callable[[], Any]) -> None: ...

    def integration_state(self, name: str) -> Any: ...

    def position_loader(self, loader: Any, epoch: int, consumed: int) -> bool: ...

    def ensure_restored(self) -> None: ...


class _FromRavex(str):
    """The ``resume_from_checkpoint`` the resumed epoch runs with: no directory, Ravex's step."""


FROM_RAVEX = _FromRavex("<ravex checkpoint>")


#: set while a Ravex-resumed epoch runs: the Trainer's ``skip_first_batches`` skips nothing then
_SKIPPING: contextvars.ContextVar[bool] = contextvars.ContextVar("ravex_hf_skipping", default=False)

#: set by ``_init_training_state`` when Ravex, not ``resume_from_checkpoint``, resumes this train()
_OWNS_RESUME = "_ravex_owns_resume"

#: what :func:`install` wraps: the Trainer's methods of its resume path
METHODS = ("_init_training_state", "_run_epoch", "_finalize_training", "_load_rng_state")


def install(runtime: TrainerRuntime, replace: Replace) -> None:
    """Wrap the Trainer's resume path (``replace`` records the undo), or warn and wrap nothing
    when this transformers has not the methods it consists of."""
    import transformers
    from transformers import trainer as trainer_module

    trainer = trainer_module.Trainer
    missing = [name for name in METHODS if name not in trainer.__dict__]
    if "skip_first_batches" not in trainer_module.__dict__:
        missing.append("skip_first_batches")
    if missing:
        logger.warning("ravex: transformers %s has no Trainer %s: the Trainer's step and epoch are not resumed "
                       "(install the version Ravex pins: pip install '%s')",
                       transformers.__version__, ", ".join(missing), EXTRA)
        return
    replace(trainer, "_init_training_state", lambda original: _init_training_state(runtime, original))
    replace(trainer, "_run_epoch", lambda original: _run_epoch(runtime, original))
    replace(trainer, "_finalize_training", lambda original: _finalize_training(runtime, original))
    replace(trainer, "_load_rng_state", _load_rng_state)
    replace(trainer_module, "skip_first_batches", _skip_first_batches)


@dataclasses.dataclass(frozen=True)
class _Position:
    """Where a resumed Trainer stands, as ``Trainer`` computes it from ``global_step``."""

    epoch: int
    batches: int  # batches consumed in ``epoch``


def _init_training_state(runtime: TrainerRuntime, original: Any) -> Any:
    def wrapper(self: Any, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int,
                resume_from_checkpoint: str | None, trial: Any) -> tuple[int, int]:
        done: tuple[int, int] = original(self, max_steps, num_update_steps_per_epoch, num_train_epochs,
                                         resume_from_checkpoint, trial)
        trainer = weakref.ref(self)
        runtime.track_integration(NAME, lambda: _snapshot(trainer()))
        self.__dict__[_OWNS_RESUME] = resume_from_checkpoint is None
        saved = runtime.integration_state(NAME)
        if resume_from_checkpoint is not None or not saved:
            return done
        from transformers import TrainerState

        self.state = TrainerState(**json.loads(saved["trainer_state"]))
        self._load_callback_state()
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        if self.state.global_step >= max_steps:  # finished: no epoch runs, not even a last step
            return num_train_epochs, 0
        epochs = self.state.global_step // num_update_steps_per_epoch
        batches = 0
        if not self.args.ignore_data_skip:
            batches = self.state.global_step % num_update_steps_per_epoch * self.args.gradient_accumulation_steps
        self.__dict__["_ravex_position"] = _Position(epochs, batches)
        return epochs, batches

    return wrapper


def _run_epoch(runtime: TrainerRuntime, original: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        position: _Position | None = self.__dict__.get("_ravex_position")
        if position is None or kwargs.get("epoch") != position.epoch:
            return original(self, *args, **kwargs)
        del self.__dict__["_ravex_position"]
        dataloader = kwargs["train_dataloader"]
        loader = getattr(dataloader, "base_dataloader", dataloader)  # accelerate's wrapper iterates it
        if not runtime.position_loader(loader, position.epoch, position.batches) or not position.batches:
            return original(self, *args, **kwargs)
        kwargs.update(resume_from_checkpoint=FROM_RAVEX, epochs_trained=position.epoch,
                      steps_trained_in_current_epoch=position.batches)
        token = _SKIPPING.set(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            _SKIPPING.reset(token)

    return wrapper


def _finalize_training(runtime: TrainerRuntime, original: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The state train() ends with, before it logs this call's metrics: a rerun that resumes
        # it runs no epoch and logs its own, so its history has the first run's length.
        ended = _snapshot(self)
        runtime.track_integration(NAME, lambda: ended)
        self.__dict__.pop("_ravex_position", None)  # a finished run's rerun ran no epoch to take it
        if self.__dict__.pop(_OWNS_RESUME, False):
            runtime.ensure_restored()  # a no-op unless no forward pass or step of train() did it
        return original(self, *args, **kwargs)

    return wrapper


def _skip_first_batches(original: Any) -> Any:
    def wrapper(dataloader: Any, num_batches: int = 0) -> Any:
        if _SKIPPING.get():
            return dataloader  # Ravex skips at the sampler, under the epoch's replayed RNG
        return original(dataloader, num_batches)

    return wrapper


def _load_rng_state(original: Any) -> Any:
    def wrapper(self: Any, checkpoint: str | None) -> None:
        if checkpoint is FROM_RAVEX:
            return  # Ravex restored every RNG stream with the step
        original(self, checkpoint)

    return wrapper


def _snapshot(trainer: Any) -> dict[str, Any] | None:
    """The Trainer's state as ``trainer_state.json`` holds it, callbacks' states refreshed."""
    if trainer is None:
        return None
    from transformers.trainer_callback import ExportableState

    state = dataclasses.asdict(trainer.state)
    exported: dict[str, Any] = {}
    for cb in [*trainer.callback_handler.callbacks, trainer.control]:
        if isinstance(cb, ExportableState):
            name = type(cb).__name__
            if name in exported:
                previous = exported[name]
                exported[name] = [*(previous if isinstance(previous, list) else [previous]), cb.state()]
            else:
                exported[name] = cb.state()
    state["stateful_callbacks"] = exported
    return {"trainer_state": json.dumps(state, sort_keys=True)}
