"""The resume witness (spec §22) for Lightning zero-code: Lightning checkpoints and resumes the
run itself, so the cadence callback (:class:`.loop._EveryN`) hands the runtime's witness its
saves, its steps and its resume, and this module is where the witness's files go: beside the
Lightning steps, written on the plugin's own writer thread after the step they follow, so a
witness never lands before its step's manifest nor makes the loop wait.
"""

from __future__ import annotations

from typing import Protocol

from ravex.format.history.witness import Witness, read_witness, write_witness

from .plugin import RavexCheckpointIO
from .pointers import Ref


class FrameworkWitness(Protocol):
    """What the callback asks of the runtime's witness (:class:`ravex.runtime.recording.witness.ResumeWitness`)."""

    def checkpoint_taken(self, step: int, backend: WitnessFiles) -> None: ...

    def step_done(self, step: int) -> None: ...

    def resumed(self, step: int, backend: WitnessFiles, saved_world_size: int, finished: bool = False) -> None: ...

    def finish(self) -> None: ...


class WitnessFiles:
    """Rank 0's witnesses of the steps ``io`` writes, and of the step ``resumed`` names."""

    def __init__(self, io: RavexCheckpointIO, resumed: Ref | None = None) -> None:
        self.io = io
        self.resumed = resumed

    def write_witness(self, witness: Witness) -> None:
        """Queued behind the save of its step, on the plugin's writer thread (at once, where the
        plugin writes synchronously); nothing where that save did not land."""
        def job() -> None:
            view = self.io._writing()
            if view.storage.exists(view.manifest_key(witness.step, 0)):
                write_witness(view.storage, view.steps_prefix, witness)

        self.io._run(job)

    def read_witness(self, step: int, rank: int) -> Witness | None:
        """The witness of the step this run resumed (``step`` is its number)."""
        if self.resumed is None:
            return None
        owner, number = self.io._open().locate(self.resumed)
        return read_witness(owner.storage, owner.steps_prefix, number, rank)
