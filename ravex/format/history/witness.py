"""A step's witness: what the first steps after a checkpoint did (spec/FORMAT.md §22, since 1.4).

A resumed run can only claim to go on exactly where the stopped one was if it can check that
claim. The run that wrote step ``s`` records, for each of the next few steps it trains, the
training loss's exact value and a digest of the input batch that reached the model; a run that
resumes from ``s`` computes the same for its own first steps and compares. State no checkpoint
holds (a file the loop reads from, an RNG object nobody registered, a loader wrapper that looks
ahead) then shows up as a difference instead of passing unsaid.

The witness is one small document per rank in the step's folder, ``witness-<r>.json``, so it is
collected with its step. Only rank ``r`` writes it; it replaces it with a longer version after
each step it records (a run killed one step after a checkpoint still leaves one entry), and
never after the last. This module reads and writes the document and checks its shape; what the
entries hold is measured by the runtime (``ravex/runtime/recording/witness.py``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .._version import check_header
from ..errors import ManifestError
from ..objects.names import step_dir
from ..storage import Storage
from .jsondoc import load_document

WITNESS_FORMAT = "ravex-witness"
#: The spec version that defines the witness.
WITNESS_VERSION = "1.4"
#: How a batch digest is made (spec §22): XXH3-128 over the batch's tensors and plain values.
BATCH_DIGEST = "xxh3-128"
_WITNESS_NAME = re.compile(r"witness-(0|[1-9][0-9]{0,8})\.json")
_DIGEST = re.compile(r"[0-9a-f]{32}")


def witness_key(step: int, rank: int, steps: str) -> str:
    """Storage key of rank ``rank``'s witness of ``step``: ``<steps>/<step>/witness-<r>.json``."""
    return f"{step_dir(step, steps)}/witness-{rank}.json"


def witness_ranks(names: list[str] | tuple[str, ...]) -> list[int]:
    """The ranks whose witness is among a step folder's file names, ascending."""
    return sorted(int(m.group(1)) for m in map(_WITNESS_NAME.fullmatch, names) if m)


@dataclass(frozen=True)
class WitnessEntry:
    """One step after the checkpoint: its loss (the shortest text that reads back as the same
    binary64, or None where no backward pass ran) and its input batch's digest (None where no
    model call was seen), with how many model calls the digest covers."""

    step: int
    loss: str | None
    batch: str | None
    calls: int

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss, "batch": self.batch, "calls": self.calls}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> WitnessEntry:
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: a witness entry is {type(doc).__name__}, not an object")
        step, loss, batch, calls = doc.get("step"), doc.get("loss"), doc.get("batch"), doc.get("calls")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ManifestError(f"{where}: witness entry step {step!r} is not an integer >= 0")
        if loss is not None:
            if not isinstance(loss, str):
                raise ManifestError(f"{where}: witness loss {loss!r} is not a string")
            try:
                float(loss)
            except ValueError:
                raise ManifestError(f"{where}: witness loss {loss!r} is not a number") from None
        if batch is not None and (not isinstance(batch, str) or not _DIGEST.fullmatch(batch)):
            raise ManifestError(f"{where}: witness batch {batch!r} is not 32 lowercase hex digits")
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ManifestError(f"{where}: witness calls {calls!r} is not an integer >= 0")
        return cls(step, loss, batch, calls)


@dataclass(frozen=True)
class Witness:
    """Rank ``rank``'s witness of checkpoint ``step``, written by run ``run``."""

    step: int
    rank: int
    run: str
    entries: tuple[WitnessEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"format": WITNESS_FORMAT, "version": WITNESS_VERSION, "step": self.step, "rank": self.rank,
                "run": self.run, "digest": BATCH_DIGEST, "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Witness:
        """Parse and check a witness; a malformed one is a :class:`ManifestError` naming what is wrong."""
        check_header(doc, where, WITNESS_FORMAT, f"not a Ravex witness (format != {WITNESS_FORMAT!r})",
                     "digest", BATCH_DIGEST, f"batch digest {{got}} is not {BATCH_DIGEST!r}")
        step, rank = _count(doc.get("step"), "step", where), _count(doc.get("rank"), "rank", where)
        run, entries = doc.get("run"), doc.get("entries")
        if not isinstance(run, str):
            raise ManifestError(f"{where}: witness run {run!r} is not a string")
        if not isinstance(entries, list):
            raise ManifestError(f"{where}: witness entries are {type(entries).__name__}, not a list")
        parsed = tuple(WitnessEntry.from_json(e, f"{where} entries[{i}]") for i, e in enumerate(entries))
        if [e.step for e in parsed] != list(range(step + 1, step + 1 + len(parsed))):
            raise ManifestError(f"{where}: witness entries are not steps {step + 1}, {step + 2}, ... in order")
        return cls(step, rank, run, parsed)


def _count(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{where}: witness {name} {value!r} is not an integer >= 0")
    return value


def write_witness(storage: Storage, steps: str, witness: Witness) -> str:
    """Write (or replace with a longer one) rank ``witness.rank``'s witness of its step; its key."""
    key = witness_key(witness.step, witness.rank, steps)
    storage.write(key, json.dumps(witness.to_json(), indent=1).encode("utf-8") + b"\n")
    return key


def read_witness(storage: Storage, steps: str, step: int, rank: int) -> Witness | None:
    """Rank ``rank``'s witness of ``step``; None where there is none (no step after it finished
    before its run stopped, a store written before 1.4). A malformed one is a :class:`ManifestError`."""
    key = witness_key(step, rank, steps)
    try:
        data = storage.read(key)
    except FileNotFoundError:
        return None
    where = f"{storage.url}/{key}"
    witness = Witness.from_json(load_document(data, where, detail=True), where)
    if witness.step != step or witness.rank != rank:
        raise ManifestError(f"{where}: holds step {witness.step} rank {witness.rank}, not step {step} rank {rank}")
    return witness
