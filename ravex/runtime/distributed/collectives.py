"""Several ranks agreeing: who we are, one-int collectives, the poll, the resume step.

Nothing here runs in a single process: the runtime's single-process path is unchanged.
Under ``torchrun`` the rank and world size come from ``torch.distributed`` once it is
initialised, and from torchrun's ``RANK``/``WORLD_SIZE`` before that (``ravex.activate()``
usually runs before ``init_process_group``). Collectives run only on the training thread, at
points every rank reaches in the same order: the first restore trigger (or first
checkpoint), right after an optimizer step every so often when a time-based checkpoint or a
signal may be pending (:class:`Poll`), and once after the flush of the checkpoint that ends
the job on an agreed signal (no rank exits before all have flushed).

Resume: rank 0 alone lists the complete steps (reading every rank's manifests); it broadcasts
its fresh run id and its newest complete steps, a MIN all-reduce of "I hold it" marks keeps those
every rank holds (two fixed-size collectives), and the newest of them is tried first
(:func:`agree_on_steps`). Rank 0 then hands the chosen step's manifests to every rank
(:func:`broadcast_bytes`), so no other rank reads what another wrote: the requests a rank makes
to find and load its step do not grow with the world size (docs/SCALE.md).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

logger = logging.getLogger("ravex")

_MAX_CANDIDATES = 64


def initialized() -> Any:
    """``torch.distributed`` when its process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _torchrun() -> tuple[int, int]:
    """``(rank, world size)`` from torchrun's ``RANK``/``WORLD_SIZE``; ``(0, 1)`` unless
    both are set, consistent, and name several ranks."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return 0, 1
    return (rank, world) if world > 1 and 0 <= rank < world else (0, 1)


def launched_child() -> bool:
    """A rank other than the first that a framework's own launcher started (Lightning's DDP
    subprocesses set ``LOCAL_RANK``/``NODE_RANK`` but no ``RANK``): it runs the same script,
    so it must not act as the job's only process (take the timeline's lease, say things once)."""
    env = os.environ
    return "RANK" not in env and (env.get("LOCAL_RANK", "0") != "0" or env.get("NODE_RANK", "0") != "0")


def get_rank() -> int:
    """This process's rank: torch.distributed's, torchrun's ``RANK`` before that, else 0."""
    dist = initialized()
    return dist.get_rank() if dist is not None else _torchrun()[0]


def get_world_size() -> int:
    """The number of ranks: torch.distributed's, torchrun's ``WORLD_SIZE`` before that, else 1."""
    dist = initialized()
    return dist.get_world_size() if dist is not None else _torchrun()[1]


# ── collectives (training thread only) ───────────────────────────────────


def can_agree() -> bool:
    """True when the ranks can run a collective: several of them and an initialised group."""
    dist = initialized()
    return dist is not None and dist.get_world_size() > 1


def _device(dist: Any) -> str:
    if dist.get_backend() == "nccl":  # pragma: no cover - no GPU in CI
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _reduce(values: list[int], op: str) -> list[int]:
    """One all-reduce (``"min"`` or ``"max"``) of a few int64s; the values unchanged alone."""
    dist = initialized()
    if dist is None or dist.get_world_size() == 1:
        return list(values)
    import torch

    t = torch.tensor(values, dtype=torch.int64, device=_device(dist))
    dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def reduce_min(values: list[int]) -> list[int]:
    """Each value's minimum over the ranks (one MIN all-reduce of a few int64s)."""
    return _reduce(values, "min")


def all_ok(ok: bool) -> bool:
    """True when ``ok`` holds on every rank (one MIN all-reduce; no collective alone)."""
    return bool(_reduce([1 if ok else 0], "min")[0])


POLL_SECONDS = 1.0  # how often (rank 0's clock) the ranks compare notes when something may be pending


class Poll:
    """Decisions that must be the same on every rank, taken at the same step by all of them.

    A time-based checkpoint (rank 0's clock decides) and a caught signal (any rank may have
    it: ``kill`` reaches one process, torchrun's forwarding reaches all) are exchanged in one
    MAX all-reduce of three int64s ``[time due on rank 0, signal number, next interval]`` right
    after an optimizer step, a point every rank reaches in the same order. Not every step: rank
    0 measures its step time and sets the next interval so that polls are about
    ``POLL_SECONDS`` apart (and four per ``checkpoint_every_seconds``); the interval at most
    doubles per poll, so a job starts polling every step and settles within a few polls.
    Every rank applies the interval it got back, so the schedule is identical on all ranks.
    """

    def __init__(self, every_seconds: float | None) -> None:
        self.target = min(POLL_SECONDS, every_seconds / 4) if every_seconds else POLL_SECONDS
        self.pending = 0  # a signal caught on this rank, not yet exchanged
        self.next_step: int | None = None  # None: poll at the first step seen
        self.interval = 1
        self.polls = 0
        self._mark: tuple[float, int] | None = None

    def due(self, step: int) -> bool:
        return self.next_step is None or step >= self.next_step

    def exchange(self, step: int, rank: int, time_due: bool) -> tuple[bool, int]:
        """The agreed ``(checkpoint now, signal to exit with or 0)``; a collective on every rank."""
        proposal = 0
        if rank == 0:
            now = time.monotonic()
            proposal = 1
            if self._mark is not None and step > self._mark[1]:
                per_step = (now - self._mark[0]) / (step - self._mark[1])
                proposal = max(1, min(2 * self.interval, int(self.target / max(per_step, 1e-9))))
            self._mark = (now, step)
        out = _reduce([int(time_due) if rank == 0 else 0, self.pending, proposal], "max")
        self.polls += 1
        self.interval = max(1, out[2])
        self.next_step = step + self.interval
        return bool(out[0]), out[1]


def _run_id_ints(run: str) -> list[int]:
    """A 128-bit hex run id as two signed int64s (what a tensor holds)."""
    value = int(run, 16)
    halves = [value >> 64, value & ((1 << 64) - 1)]
    return [h - (1 << 64) if h >= 1 << 63 else h for h in halves]


def _run_id_str(hi: int, lo: int) -> str:
    return f"{((hi & ((1 << 64) - 1)) << 64) | (lo & ((1 << 64) - 1)):032x}"


def broadcast_bytes(payload: bytes) -> bytes:
    """Rank 0's ``payload`` on every rank (two broadcasts: its length, then its bytes); the
    payload unchanged alone. Empty on rank 0 is empty everywhere (one broadcast)."""
    dist = initialized()
    if dist is None or dist.get_world_size() == 1:
        return payload
    import torch

    device = _device(dist)
    rank0 = dist.get_rank() == 0
    size = torch.tensor([len(payload) if rank0 else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    n = int(size.item())
    if n == 0:
        return b""
    if rank0:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(n, dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=0)
    return payload if rank0 else bytes(buf.cpu().numpy().tobytes())


def agree_on_steps(candidates: list[int], rank: int, world: int,
                   follow: bool = False) -> tuple[list[int], str | None]:
    """The resume candidates every rank holds, newest first, and the run id every rank's
    manifests carry (rank 0's fresh one).

    Two small collectives, whatever the world size: rank 0 broadcasts its run id and its
    newest ``_MAX_CANDIDATES`` complete steps (a fixed-size int64 tensor); every rank marks
    which of them it holds too, and a MIN all-reduce of those marks leaves the steps every
    rank holds. No rank writes before these collectives, so rank 0 may drop a crashed run's
    partial steps just before them.

    ``follow``: the ranks other than 0 did not list the steps (they would read every rank's
    manifests to: ``W`` requests each); they take rank 0's steps as held, and a step one of them
    then cannot read is dropped by the read's own agreement (``all_ok``), as a corrupt one is.
    """
    dist = initialized()
    if dist is None or dist.get_world_size() == 1:
        if world > 1:
            logger.warning("ravex: WORLD_SIZE=%d but torch.distributed is not initialised; ranks "
                           "cannot agree on a run id or a resume step (call init_process_group "
                           "before training)", world)
        return sorted(candidates, reverse=True), uuid.uuid4().hex if rank == 0 else None
    import torch

    device = _device(dist)
    mine = sorted(candidates, reverse=True)[:_MAX_CANDIDATES]
    head = torch.full((3 + _MAX_CANDIDATES,), -1, dtype=torch.int64)  # run id (2), count, steps
    if rank == 0:
        head[:2] = torch.tensor(_run_id_ints(uuid.uuid4().hex), dtype=torch.int64)
        head[2] = len(mine)
        head[3:3 + len(mine)] = torch.tensor(mine, dtype=torch.int64)
    head = head.to(device)
    dist.broadcast(head, src=0)
    values = head.tolist()
    run_id = _run_id_str(values[0], values[1])
    offered = values[3:3 + values[2]]
    held = set(offered) if follow and rank != 0 else set(candidates)
    marks = torch.tensor([1 if s in held else 0 for s in offered] or [1], dtype=torch.int8, device=device)
    dist.all_reduce(marks, op=dist.ReduceOp.MIN)
    agreed = [s for s, ok in zip(offered, marks.tolist(), strict=False) if ok]
    if candidates and not (follow and rank != 0) and (not agreed or agreed[0] != max(candidates)):
        logger.warning("ravex: rank %d sees step %s but not every rank does; resuming from %s",
                       rank, max(candidates), agreed[0] if agreed else "nothing (fresh start)")
    return agreed, run_id
