"""What a checkpoint is handed to the backend as: the collected tree laid out for this rank,
its metadata (reason, time, the step's loss), the chunk size of each sparsely updated table and,
once per run, the run's record; and the training objects held alive until the exit checkpoint.

Apart from :class:`.cadence.Cadence`, which decides *when* a checkpoint is taken and *where*
the loops stand: this is the same whenever and wherever it is taken.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ravex.format.history.runs import RunRecord
from ravex.saving.backend import CheckpointBackend
from ravex.saving.plan import SavePlan
from ravex.version import __version__

from ..config import RavexConfig
from ..distributed import layout
from ..recording import provenance
from ..recording.loss import LastLoss
from ..recording.witness import ResumeWitness
from ..state.chunking import chunk_bytes_for
from ..state.plan import staged_sizes
from ..state.registry import KINDS, Registry

logger = logging.getLogger("ravex")


@dataclasses.dataclass(eq=False)
class CheckpointContents:
    """Each checkpoint's :class:`~ravex.saving.plan.SavePlan`, and the objects it must find."""

    config: RavexConfig
    registry: Registry
    rank: int
    world_size: int
    pid: int
    last_loss: LastLoss
    witness: ResumeWitness
    _keepalive: dict[int, Any] = dataclasses.field(default_factory=dict, init=False, repr=False)
    #: rank 0: what this run was, gathered once
    _run_record: RunRecord | None = dataclasses.field(default=None, init=False, repr=False)

    def plan(self, backend: CheckpointBackend, step: int, tree: dict[str, Any], reason: str) -> SavePlan:
        """The collected ``tree`` of ``step`` as its :class:`~ravex.saving.plan.SavePlan`: the
        tree, this rank's layout, and the chunk size of each sparsely updated table."""
        rank_layout = None
        if backend.multi_rank_steps:  # ranks, shards: who writes what
            tree, rank_layout = layout.lay_out(tree, self.rank, self.world_size)
        self.keep_alive()
        metadata = {"reason": reason, "time": time.time(), "pid": self.pid, "ravex": __version__}
        loss = self.last_loss.value()  # the one device sync for the loss, once per checkpoint
        if loss is not None:
            metadata["loss"] = repr(loss)  # shortest round-trip text: parses back bit for bit
        chunk_bytes = chunk_bytes_for(self.registry, tree) if rank_layout is None else {}
        if self._run_record is None and self.rank == 0 and backend.records_runs:
            record = provenance.gather(self.config, self.world_size)
            self._run_record = dataclasses.replace(record, resume=self.witness.verdict)
        return SavePlan(step, tree, metadata, rank_layout, chunk_bytes, self._run_record)

    def prepare_staging(self, backend: CheckpointBackend | None) -> None:
        """At activation (what already exists: a model built before ``activate()``) and at the
        first step (the optimizer's state exists by then): have the backend fault in the
        staging memory of the state's CPU tensors in the background, so that the first
        checkpoint stalls no longer than the later ones (issue 26). It holds no more memory
        than the first checkpoint would allocate; nothing is done without a backend (one that
        failed to open at activation opens at the first checkpoint)."""
        if backend is None:
            return
        try:
            backend.prepare(staged_sizes(self.registry))
        except Exception as exc:  # an optimisation: the first checkpoint allocates as before
            logger.debug("ravex: staging memory not prepared: %s", exc)

    def keep_alive(self) -> None:
        """Hold the training objects until exit, so the exit checkpoint can still save them.

        The registry is weak, and a script whose model is a local of ``main()`` has
        dropped it by the time ``atexit`` runs. Taken at the first step and at each
        checkpoint: nothing per step.
        """
        for kind in KINDS:
            for obj in self.registry.live(kind):
                self._keepalive.setdefault(id(obj), obj)

    def release(self) -> None:
        """The run is over: the training objects are the script's alone again."""
        self._keepalive.clear()
