"""The resume witness: every resume checks itself (spec/FORMAT.md §22).

Ravex restores what it knows of: tensors, RNG streams, loaders, the script's loop. A script can
hold state it does not know of (a file it reads batches from, an RNG object of its own, a loader
wrapper that fetches ahead), and then a resume that looks right trains on other data. Rather than
guess at every such shape, each resume is checked against the run that wrote its step:

- After each checkpoint, the run records its next :data:`WITNESS_STEPS` steps: the exact training
  loss (the tensor ``backward()`` last ran on) and a digest of what reached the model (the inputs
  of the first module called in the step, every call of it, so gradient accumulation is covered).
  The backend writes it beside the step, off the training thread.
- A resumed run records the same for its own first steps and compares. Rank 0 says once for the
  job ``ravex: resume verified`` or ``ravex: resume diverged at step N``, with what differed and
  the likely cause; the verdict goes into the run's record (``ravex ls``, ``show``, the TUI).

Nothing is recorded outside those few steps: the hook that digests inputs exists only then.
Reading the loss and digesting a batch on a GPU costs a device synchronisation each, a few times
per checkpoint interval, never inside the checkpoint's stall.

``witness: tolerant`` is for non-deterministic kernels (GPU atomics, cuDNN autotuning): the
input batches must still match exactly, and each loss within ``witness_tolerance`` (relative);
the line says how far apart the losses were.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from ravex.format.history.runs import ResumeCheck
from ravex.format.history.witness import Witness, WitnessEntry

from ..distributed import collectives

if TYPE_CHECKING:
    from ..config import RavexConfig
    from .loss import LastLoss

logger = logging.getLogger("ravex")


class WitnessStore(Protocol):
    """Where witnesses go and come from: the run's backend, or a framework's own writer
    (Lightning's, :mod:`ravex.integrations.lightning`)."""

    def write_witness(self, witness: Witness) -> None: ...

    def read_witness(self, step: int, rank: int) -> Witness | None: ...

#: Steps recorded after each checkpoint, and compared after a resume.
WITNESS_STEPS = 3
#: a divergence's kind, in the order a job's verdict prefers them (the batch explains the loss)
BATCH, CALLS, LOSS = 0, 1, 2


def batch_digest_of(hasher: Any, value: Any) -> None:
    """Feed ``value`` (a model call's arguments: tensors, plain values, and lists, tuples and
    mappings of them) into ``hasher``: dtype, shape and bytes of each tensor, the text of each
    plain value, the type's name of anything else."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.layout != torch.strided or t.device.type == "meta":
            hasher.update(f"<{t.layout} {t.device.type} {t.dtype} {tuple(t.shape)}>".encode())
            return
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        hasher.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            hasher.update(t.reshape(-1).view(torch.uint8).numpy().data)
    elif value is None or isinstance(value, (bool, int, float, str, bytes)):
        hasher.update(f"V{value!r}".encode())
    elif isinstance(value, Mapping):
        hasher.update(b"{")
        for key, item in value.items():
            hasher.update(f"K{key!r}".encode())
            batch_digest_of(hasher, item)
        hasher.update(b"}")
    elif isinstance(value, (list, tuple)):
        hasher.update(b"[")
        for item in value:
            batch_digest_of(hasher, item)
        hasher.update(b"]")
    else:
        hasher.update(f"<{type(value).__qualname__}>".encode())


def _call_kwargs(module: Any) -> Mapping[str, Any]:
    """The keyword arguments of ``module``'s call, whose global forward pre-hook is running:
    torch hands those hooks the positional ones only, and ``model(**batch)`` passes none. Read
    from the frame of ``Module._call_impl`` (or its ``inner``), a few frames up."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            break
        if frame.f_code.co_name in ("inner", "_call_impl"):
            local = frame.f_locals
            kwargs = local.get("kwargs")
            if local.get("self") is module and isinstance(kwargs, Mapping):
                return kwargs
        frame = frame.f_back
    return {}


@dataclass
class _Check:
    """A resumed run comparing its first steps with the stored witness of ``step``."""

    step: int
    stored: tuple[WitnessEntry, ...]  # empty: nothing to compare (said why in ``why_not``)
    length: int  # the steps this run records before it concludes (the same on every rank)
    why_not: str = ""
    mine: list[WitnessEntry] = field(default_factory=list)
    #: the step a finished run ended with: said only once a step trains after it (a larger bound)
    finished: bool = False


class ResumeWitness:
    """Records the steps after each checkpoint and checks a resume against them."""

    def __init__(self, config: RavexConfig, rank: int, world_size: int, last_loss: LastLoss) -> None:
        self.enabled = config.witness != "off"
        self.tolerance = config.witness_tolerance if config.witness == "tolerant" else None
        every = config.fixed_every
        #: steps recorded per window: a checkpoint inside the window starts the next one
        self.length = WITNESS_STEPS if not every else min(WITNESS_STEPS, every)
        self.rank = rank
        self.world_size = world_size
        self.last_loss = last_loss
        self.backend: WitnessStore | None = None
        self.verdict: ResumeCheck | None = None  # the resumed run's, once concluded
        self._writing: tuple[int, list[WitnessEntry]] | None = None  # (checkpoint step, entries so far)
        self._check: _Check | None = None
        self._hook: Any = None
        self._top: int | None = None  # id of the module the step called first
        self._hasher: Any = None
        self._calls = 0

    @property
    def recording(self) -> bool:
        return self._writing is not None or self._check is not None

    # ── the run that writes a step ──────────────────────────────────────

    def checkpoint_taken(self, step: int, backend: WitnessStore) -> None:
        """A checkpoint of ``step`` was handed to ``backend``: record the steps that follow."""
        if not self.enabled:
            return
        self.backend = backend
        self._writing = (step, [])
        self._start()

    # ── the run that resumes one ────────────────────────────────────────

    def resumed(self, step: int, backend: WitnessStore, saved_world_size: int, finished: bool = False) -> None:
        """The checkpoint of ``step`` was restored: compare the next steps with its witness.
        ``finished``: the step a finished run ended with, which no step followed; a rerun that
        trains on past it (a larger bound) says that its resume is not verified, one that trains
        nothing says nothing."""
        if not self.enabled:
            return
        self.backend = backend
        why_not = ""
        stored: tuple[WitnessEntry, ...] = ()
        if finished:
            why_not = (f"step {step} is where the run that wrote it finished, so no step after it was "
                       "recorded to compare; the added steps start from its exact state")
        elif saved_world_size != self.world_size:
            why_not = (f"the world size changed ({saved_world_size} -> {self.world_size} ranks), so each "
                       "rank's batches differ by design")
        else:
            try:
                witness = backend.read_witness(step, self.rank)
            except Exception as exc:
                witness = None
                why_not = f"its witness is unreadable ({type(exc).__name__}: {exc})"
            if witness is not None:
                stored = witness.entries[:self.length]
            if not stored and not why_not:
                why_not = f"no step after step {step} had finished when the run that wrote it stopped"
        self._check = _Check(step, stored, self.length, why_not, finished=finished)
        self._start()

    # ── both: one step's record ─────────────────────────────────────────

    def step_done(self, step: int) -> None:
        """Optimizer step ``step`` is done: its entry, for the windows open."""
        if self._hook is None:
            return
        entry = WitnessEntry(step, self._loss_text(), self._hasher.hexdigest() if self._calls else None,
                             self._calls)
        self._next_step()
        writing = self._writing
        if writing is not None and step > writing[0]:
            writing[1].append(entry)
            if self.backend is not None:
                self.backend.write_witness(Witness(writing[0], self.rank, "", tuple(writing[1])))
            if len(writing[1]) >= self.length:
                self._writing = None
        check = self._check
        if check is not None and step > check.step:
            check.mine.append(entry)
            if len(check.mine) >= check.length:
                self._conclude(agree=True)
        if not self.recording:
            self._stop()

    def forward(self, module: Any, args: Any, kwargs: Mapping[str, Any] | None = None) -> None:
        """A module is called (the global forward pre-hook, or a restore trigger that ran first):
        digest its inputs if it is the step's first module, or that module again."""
        import torch

        if torch.compiler.is_compiling():
            return
        if self._top is None:
            self._top = id(module)
        elif id(module) != self._top:
            return
        self._calls += 1
        batch_digest_of(self._hasher, args)
        batch_digest_of(self._hasher, _call_kwargs(module) if kwargs is None else kwargs)

    def finish(self) -> None:
        """The run ends: a check still open concludes with the steps it has (no collective:
        the other ranks may be gone)."""
        if self._check is not None and (self._check.mine or not self._check.finished):
            self._conclude(agree=False)
        self._writing = None
        self._stop()

    # ── internals ───────────────────────────────────────────────────────

    def _start(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._next_step()
        if self._hook is None:
            self._hook = register_module_forward_pre_hook(lambda module, args: self.forward(module, args))

    def _stop(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        self._hasher = None

    def _next_step(self) -> None:
        import xxhash

        self._top = None
        self._calls = 0
        self._hasher = xxhash.xxh3_128()

    def _loss_text(self) -> str | None:
        value = self.last_loss.value()
        return None if value is None else repr(value)

    def _conclude(self, agree: bool) -> None:
        check, self._check = self._check, None
        assert check is not None
        first, detail, worst = _compare(check, self.tolerance)
        code = None if first is None else (*first, self.rank)
        compared = min(len(check.stored), len(check.mine))
        if agree and self.world_size > 1 and collectives.can_agree():
            # one small all-reduce, at the same step on every rank: the job's first divergence
            # (step, kind, rank packed so that the smallest is the earliest), the fewest compared,
            # and the first rank that had no record to compare
            mine = _NONE if code is None else (code[0] * 4 + code[1]) * self.world_size + self.rank
            unrecorded = self.world_size if check.stored else self.rank
            job, fewest, lacking = collectives.reduce_min([mine, compared, unrecorded])
            if job != mine:
                code, detail = None if job == _NONE else _unpack(job, self.world_size), ""
            compared = fewest
            if not compared and check.stored and lacking < self.world_size:
                check.why_not = (f"rank {lacking} found no record of the steps after it (the run that wrote it "
                                 f"stopped before that rank's next step, or that rank's witness did not reach "
                                 f"the tier it resumed from)")
        steps = tuple(range(check.step + 1, check.step + 1 + compared))
        self.verdict = self._say(check, code, detail, worst, steps)

    def _say(self, check: _Check, code: tuple[int, int, int] | None, detail: str, worst: float,
             steps: tuple[int, ...]) -> ResumeCheck:
        ranks = f" on {self.world_size} ranks" if self.world_size > 1 else ""
        if code is not None:
            offset, kind, rank = code
            at = check.step + offset
            where = f"rank {rank}" if self.world_size > 1 else ""
            what = detail or _CAUSES[kind]
            if kind == LOSS and not detail and self.world_size >= 3:
                what += _DDP_ORDER
            if self.rank == 0 or rank == self.rank:
                logger.log(logging.WARNING if self.rank == 0 else logging.DEBUG,
                           "ravex: resume diverged at step %d (resumed from step %d%s): %s", at, check.step,
                           f", {where}" if where else "", what)
            return ResumeCheck(check.step, "diverged", steps, at, what)
        if not steps:
            why = check.why_not or "the run ended before a step after the resume finished"
            logger.log(logging.INFO if self.rank == 0 else logging.DEBUG,
                       "ravex: resume not verified (resumed from step %d): %s", check.step, why)
            return ResumeCheck(check.step, "unverified", (), None, why)
        span = f"step {steps[0]} matches" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]} match"
        how = ("the same input batches and loss bits" if self.tolerance is None else
               f"the same input batches, losses within {worst:.1e} relative (witness_tolerance "
               f"{self.tolerance:g})")
        logger.log(logging.INFO if self.rank == 0 else logging.DEBUG,
                   "ravex: resume verified: after step %d, %s the run that wrote it%s (%s)",
                   check.step, span, ranks, how)
        return ResumeCheck(check.step, "verified", steps, None, how)


_NONE = 2**62  # no divergence, in the packed all-reduce of :meth:`ResumeWitness._conclude`

_CAUSES = {
    BATCH: ("the input batch differs: the data the loop reads was not put back where it was (a file, a "
            "generator or a loader wrapper Ravex does not hold), so this run trains on other data than an "
            "uninterrupted one. Fix: feed the loop from a DataLoader, or wrap its source in ravex.loop"),
    CALLS: ("the model was called a different number of times in the step: the loop's own state (a counter "
            "or schedule Ravex does not hold) was not put back"),
    LOSS: ("the same input batch gave another loss: state outside the checkpoint (an RNG object of the "
           "script's own, a tensor changed outside the optimizer) or non-deterministic kernels (on a GPU: "
           "torch.use_deterministic_algorithms(True), or `witness: tolerant` to accept small differences)"),
}


#: a cause of another loss that only 3+ ranks have (``runtime/distributed/layout.py`` says it at restore)
_DDP_ORDER = ("; or, with DDP at 3+ ranks without find_unused_parameters, the order the first step after the "
              "resume sums gradients in (DDP rebuilds its buckets after a process's first step): a rounding "
              "difference, DDP(find_unused_parameters=True) avoids it")


def _unpack(packed: int, world: int) -> tuple[int, int, int]:
    rank = packed % world
    offset, kind = divmod(packed // world, 4)
    return offset, kind, rank


def _compare(check: _Check, tolerance: float | None) -> tuple[tuple[int, int] | None, str, float]:
    """The first difference as (offset from the checkpoint, kind) with its words, and the
    largest relative loss difference accepted (``witness: tolerant``)."""
    worst = 0.0
    for i, (old, new) in enumerate(zip(check.stored, check.mine, strict=False)):
        offset = old.step - check.step
        if old.batch is not None and new.batch is not None and old.batch != new.batch:
            if i == 0:
                return (offset, BATCH), _CAUSES[BATCH], worst
            return (offset, BATCH), (
                f"the input batch differs, after {i} step{'s' if i > 1 else ''} whose batches matched: the data "
                "order after the resume is not the stopped run's (a DataLoader with persistent_workers, a "
                "sampler or dataset with an RNG of its own, a loader wrapper that fetches ahead)"), worst
        if old.calls != new.calls and old.batch is not None and new.batch is not None:
            return (offset, CALLS), f"{_CAUSES[CALLS]} ({new.calls} calls, {old.calls} before)", worst
        if old.loss != new.loss:
            if old.loss is None or new.loss is None:
                return (offset, LOSS), "a backward pass ran in one run's step and not in the other's", worst
            a, b = float(old.loss), float(new.loss)
            gap = abs(a - b) / max(abs(a), abs(b), 1e-30) if math.isfinite(a) and math.isfinite(b) else math.inf
            if tolerance is None or gap > tolerance:
                return (offset, LOSS), f"{_CAUSES[LOSS]} (loss {new.loss}, {old.loss} before)", worst
            worst = max(worst, gap)
    return None, "", worst
