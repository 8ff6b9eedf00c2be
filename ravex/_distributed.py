"""Several ranks: who we are, what each rank writes, agreeing on a resume step, resharding.

Nothing here runs in a single process (world size 1 without DTensors): the runtime's
single-process path is unchanged. Under ``torchrun`` the rank and world size come from
``torch.distributed`` once it is initialised, and from torchrun's ``RANK``/``WORLD_SIZE``
before that (``ravex.activate()`` usually runs before ``init_process_group``). Collectives
run only on the training thread, at points every rank reaches in the same order: the first
restore trigger (or first checkpoint), right after an optimizer step every so often when a
time-based checkpoint or a signal may be pending (:class:`Poll`), and once after the flush of
the checkpoint that ends the job on an agreed signal (no rank exits before all have flushed).

Tree layout with several ranks (each rank's manifest holds its own tree)::

    ravex, distributed {"world_size", "rank", "layout": 1}
    models, optimizers, schedulers, scalers   replicated or DTensor-sharded: every rank
        names every tensor; a replicated tensor's chunks are written by exactly one rank
        (deterministic assignment balanced by bytes: a tensor of several chunks is split
        across ranks in contiguous chunk ranges, smaller ones go whole to the least loaded
        rank), the others record an empty shard of it. A DTensor sharded on dim 0 is
        written as its global array, each rank writing the chunks of its own rows.
        0-d tensors (Adam's ``step``) are a few bytes inline in every manifest.
    rank-<r> {"rng", "loaders"}   per-rank state, under a path no other rank writes

Resume: every rank lists its complete steps; rank 0 broadcasts its fresh run id and its
newest complete steps, a MIN all-reduce of "I hold it" marks keeps those every rank holds
(two fixed-size collectives), and the newest of them is tried first.
Each rank then reads the replicated tensors, its own rows of sharded ones (only the
overlapping chunks) and its own ``rank-<r>`` subtree; a MIN all-reduce of "read ok" keeps
the ranks in step when one of them has to fall back to an older step.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import uuid
from typing import Any

import numpy as np

logger = logging.getLogger("ravex")

LAYOUT = 1
REPLICATED = ("models", "optimizers", "schedulers", "scalers")
PER_RANK = ("rng", "loaders")
_SHARD = "__ravex_shard__"
_MAX_CANDIDATES = 64


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def get_rank() -> int:
    """This process's rank: torch.distributed's, torchrun's ``RANK`` before that, else 0."""
    dist = _dist()
    if dist is not None:
        return dist.get_rank()
    world, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
    return rank if world and world > 1 and rank is not None and 0 <= rank < world else 0


def get_world_size() -> int:
    """The number of ranks: torch.distributed's, torchrun's ``WORLD_SIZE`` before that, else 1."""
    dist = _dist()
    if dist is not None:
        return dist.get_world_size()
    world, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
    return world if world and world > 1 and rank is not None and 0 <= rank < world else 1


# ── collectives (training thread only) ───────────────────────────────────


def can_agree() -> bool:
    """True when the ranks can run a collective: several of them and an initialised group."""
    dist = _dist()
    return dist is not None and dist.get_world_size() > 1


def _device(dist: Any) -> str:
    if dist.get_backend() == "nccl":  # pragma: no cover - no GPU in CI
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _reduce(values: list[int], op: str) -> list[int]:
    """One all-reduce (``"min"`` or ``"max"``) of a few int64s; the values unchanged alone."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return list(values)
    import torch

    t = torch.tensor(values, dtype=torch.int64, device=_device(dist))
    dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


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


def agree_on_steps(candidates: list[int], backend: Any, rank: int, world: int) -> list[int]:
    """The resume candidates every rank holds, newest first; also fixes the run id.

    Two small collectives, whatever the world size: rank 0 broadcasts its run id and its
    newest ``_MAX_CANDIDATES`` complete steps (a fixed-size int64 tensor); every rank marks
    which of them it holds too, and a MIN all-reduce of those marks leaves the steps every
    rank holds. Before that, rank 0 drops the manifests of incomplete steps newer than its
    newest complete one (a crashed run's partial steps): no rank can write before the
    collective, so none of this run's manifests is ever dropped.
    """
    if rank == 0:
        _discard_partial(backend)
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        if world > 1:
            logger.warning("ravex: WORLD_SIZE=%d but torch.distributed is not initialised; ranks "
                           "cannot agree on a run id or a resume step (call init_process_group "
                           "before training)", world)
        backend.run_id = uuid.uuid4().hex if rank == 0 else None
        backend.writes_agreed = True
        return sorted(candidates, reverse=True)
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
    backend.run_id = _run_id_str(values[0], values[1])
    backend.writes_agreed = True
    offered = values[3:3 + values[2]]
    held = set(candidates)
    marks = torch.tensor([1 if s in held else 0 for s in offered] or [1], dtype=torch.int8, device=device)
    dist.all_reduce(marks, op=dist.ReduceOp.MIN)
    agreed = [s for s, ok in zip(offered, marks.tolist(), strict=False) if ok]
    if candidates and (not agreed or agreed[0] != max(candidates)):
        logger.warning("ravex: rank %d sees step %s but not every rank does; resuming from %s",
                       rank, max(candidates), agreed[0] if agreed else "nothing (fresh start)")
    return agreed


def start_writes(backend: Any, rank: int, world: int) -> None:
    """Before the first write when no resume agreement ran (``resume: never``)."""
    if getattr(backend, "writes_agreed", False):
        return
    agree_on_steps([], backend, rank, world)


def _discard_partial(backend: Any) -> None:
    store = getattr(backend, "store", None)
    if store is None:
        return
    try:
        dropped = store.discard_incomplete_above(store.latest_step())
    except Exception as exc:  # a stale partial step costs space, not correctness
        logger.warning("ravex: could not drop incomplete steps in %s: %s", backend.url, exc)
        return
    if dropped:
        logger.info("ravex: dropped incomplete steps %s (a crashed run's partial writes)", dropped)


# ── saving ────────────────────────────────────────────────────────────────


def _is_dtensor(value: Any) -> bool:
    """Without importing DTensor (~1 s): if the user never loaded it, nothing is one."""
    module = sys.modules.get("torch.distributed.tensor")
    cls = getattr(module, "DTensor", None) if module is not None else None
    return cls is not None and isinstance(value, cls)


def _map(tree: Any, fn: Any) -> Any:
    if isinstance(tree, dict) and _SHARD not in tree:
        return {k: _map(v, fn) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_map(v, fn) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_map(v, fn) for v in tree)
    return fn(tree)


def _any(tree: Any, pred: Any) -> bool:
    if isinstance(tree, dict):
        return any(_any(v, pred) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(_any(v, pred) for v in tree)
    return bool(pred(tree))


def prepare_save(tree: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Training thread, before staging: per-rank state under ``rank-<r>``, DTensors as
    shard records (their local tensor is what gets staged). Unchanged in one process."""
    if world == 1 and "torch.distributed.tensor" not in sys.modules:
        return tree  # one process, no DTensor anywhere: the tree as it always was
    sections = {k: tree[k] for k in REPLICATED if k in tree}
    if world == 1 and not _any(sections, _is_dtensor):
        return tree
    out = dict(tree)
    for key, value in sections.items():
        out[key] = _map(value, _shard_record)
    if world > 1:
        out[f"rank-{rank}"] = {k: out.pop(k) for k in PER_RANK if k in out}
    out["distributed"] = {"world_size": world, "rank": rank, "layout": LAYOUT}
    return out


def _shard_record(value: Any) -> Any:
    if not _is_dtensor(value):
        return value
    from torch.distributed.tensor import Replicate, Shard

    from ravex.format.reshard import aligned_chunk_rows

    mesh, placements = value.device_mesh, tuple(value.placements)
    if all(isinstance(p, Replicate) for p in placements):
        return value.to_local()
    if mesh.ndim != 1 or placements != (Shard(0),) or value.dim() == 0:
        logger.warning("ravex: DTensor with placements %s on a %d-D mesh is gathered to every "
                       "rank (only Shard(0) on a 1-D mesh is written shard by shard)",
                       placements, mesh.ndim)
        return value.full_tensor()
    world = mesh.size()
    local = value.to_local()
    shape = tuple(value.shape)
    from ravex.format.reshard import shard_rows

    rows = shard_rows(shape[0], world, mesh.get_local_rank())
    if local.shape[0] != rows.stop - rows.start:
        raise ValueError(f"DTensor shard of {local.shape[0]} rows where torch.chunk gives "
                         f"{rows.stop - rows.start}: unsupported sharding")
    return {_SHARD: 1, "local": local, "shape": list(shape),
            "offset": rows.start if rows.stop > rows.start else 0,
            "rows": aligned_chunk_rows(shape, world, local.element_size())}


def plan_write(tree: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Background thread, on the staged tree: which rank writes which chunks.

    Replicated arrays become an :class:`~ravex.format.ArrayShard` of this rank's assigned
    rows (empty on ranks that write none of it); shard records become this rank's shard.
    """
    from ravex.format import ArrayShard

    out = dict(tree)
    sections = {k: tree[k] for k in REPLICATED if k in tree}
    arrays: list[np.ndarray] = []

    def note(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim >= 1:
            arrays.append(value)
        return value

    _map(sections, note)
    plan = assign([(a.shape, a.dtype.itemsize) for a in arrays], world)
    mine = {id(a): plan[i][rank] for i, a in enumerate(arrays)}

    def place(value: Any) -> Any:
        if isinstance(value, dict) and _SHARD in value:
            local = np.ascontiguousarray(value["local"])
            return ArrayShard(local, tuple(value["shape"]), int(value["offset"]), int(value["rows"]))
        if isinstance(value, np.ndarray) and id(value) in mine:
            rows, (lo, hi) = mine[id(value)]
            return ArrayShard(value[lo:hi] if hi > lo else value[:0], value.shape, lo if hi > lo else 0, rows)
        return value

    for key, value in sections.items():
        out[key] = _map(value, place)
    return out


def chunk_rows_of(shape: tuple[int, ...], itemsize: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk of a replicated array: the writer's own rule, so assignments fall on its chunks."""
    from ravex.format.writer import DEFAULT_CHUNK_BYTES, rows_per_chunk

    return rows_per_chunk(shape, itemsize, chunk_bytes or DEFAULT_CHUNK_BYTES)


def assign(
    arrays: list[tuple[tuple[int, ...], int]], world: int, chunk_bytes: int | None = None
) -> list[list[tuple[int, tuple[int, int]]]]:
    """For each array (shape, itemsize): per rank, ``(chunk_rows, (row_lo, row_hi))``.

    Deterministic from the shapes alone, so every rank computes the same plan. An array of
    at least ``world`` chunks is split into contiguous chunk ranges over all ranks; the
    rest go whole, largest first, to the rank with the fewest bytes so far (ties: lowest
    rank). Each row of each array is written by exactly one rank.
    """
    from ravex.format.reshard import shard_rows

    load = [0] * world
    plan: list[list[tuple[int, tuple[int, int]]]] = [[] for _ in arrays]
    order = sorted(range(len(arrays)), key=lambda i: (-math.prod(arrays[i][0]) * arrays[i][1], i))
    for i in order:
        shape, itemsize = arrays[i]
        rows = chunk_rows_of(shape, itemsize, chunk_bytes)
        n_rows = shape[0]
        row_bytes = math.prod(shape[1:]) * itemsize
        n_chunks = math.ceil(n_rows / rows) if n_rows else 0
        per = [(rows, (0, 0))] * world
        if n_chunks >= world and world > 1:
            for r in range(world):
                c = shard_rows(n_chunks, world, r)
                lo, hi = min(n_rows, c.start * rows), min(n_rows, c.stop * rows)
                per[r] = (rows, (lo, hi))
                load[r] += (hi - lo) * row_bytes
        else:
            r = min(range(world), key=lambda k: (load[k], k))
            per[r] = (rows, (0, n_rows))
            load[r] += n_rows * row_bytes
        plan[i] = per
    return plan


# ── loading ───────────────────────────────────────────────────────────────


def load_tree(store: Any, step: int, rank: int, world: int) -> dict[str, Any]:
    """A step's tree for this rank: per-rank state read, replicated/sharded tensors left as
    :class:`~ravex.format.ArrayRef` for :func:`resolve` (which knows the live objects)."""
    reader = store.open_step(step)
    saved_world = reader.world_size
    src = rank if rank < saved_world else 0
    tree = dict(reader.tree(src))
    per_rank = tree.pop(f"rank-{src}", None)
    if per_rank is None:
        per_rank = {k: tree.pop(k) for k in PER_RANK if k in tree}
    else:
        for k in PER_RANK:
            tree.pop(k, None)
    from ravex import _state

    per_rank = _state.read_refs(per_rank)  # (one reader: the refs all come from reader.tree)
    own = src == rank
    if saved_world != world:
        logger.warning("ravex: step %d was written by %d rank(s), this run has %d: model and "
                       "optimizer state are resharded exactly; data loaders resume at the same "
                       "number of samples, the RNG streams of %s", step, saved_world, world,
                       "this rank are restored" if own else f"rank {rank} start fresh")
        for entry in per_rank.get("loaders", []):
            entry["yielded"] = int(entry["yielded"]) * saved_world // world
    if not own:
        per_rank["rng"] = _state.capture_rng()  # no saved stream for a new rank: keep ours
    tree.update(per_rank)
    tree.setdefault("distributed", {"world_size": saved_world, "rank": src, "layout": LAYOUT})
    tree["_reader"] = reader
    tree["_world_changed"] = saved_world != world
    return tree


def is_lazy(tree: Any) -> bool:
    return isinstance(tree, dict) and "_reader" in tree


def resolve(registry: Any, tree: dict[str, Any]) -> dict[str, Any]:
    """Read the tensors of a :func:`load_tree` tree: replicated ones whole, a tensor the
    live object holds as a ``Shard(0)`` DTensor only for this rank's rows."""
    from ravex.format import ArrayRef

    reader = tree.pop("_reader")
    _note_ddp_buckets(registry)
    if tree.pop("_world_changed", False):  # a loader's length per rank follows the world size
        for loader, entry in zip(registry.live("loaders"), tree.get("loaders", []), strict=False):
            try:
                entry["length"] = len(loader)
            except TypeError:
                pass
    live_of: dict[int, Any] = {}  # id(ArrayRef) -> live DTensor it must match
    models = registry.models()
    for model, saved in zip(models, tree.get("models", []), strict=False):
        live = model.state_dict()
        for key, ref in saved.get("state", {}).items():
            if isinstance(ref, ArrayRef) and _is_dtensor(live.get(key)):
                live_of[id(ref)] = live[key]
    for opt, saved in zip(registry.live("optimizers"), tree.get("optimizers", []), strict=False):
        params = [p for group in opt.param_groups for p in group["params"]]
        for pid, st in (saved.get("state", {}).get("state", {}) or {}).items():
            try:
                param = params[int(pid)]
            except (ValueError, IndexError):
                continue
            if not _is_dtensor(param) or not isinstance(st, dict):
                continue
            for ref in st.values():
                if isinstance(ref, ArrayRef) and ref.shape and tuple(ref.shape) == tuple(param.shape):
                    live_of[id(ref)] = param
    whole: list[str] = []

    def collect(value: Any) -> Any:
        if isinstance(value, ArrayRef) and id(value) not in live_of:
            whole.append(value.path)
        return value

    sections = {k: tree[k] for k in REPLICATED if k in tree}
    _map(sections, collect)
    arrays = reader.read_arrays(sorted(set(whole))) if whole else {}

    def fill(value: Any) -> Any:
        if not isinstance(value, ArrayRef):
            return value
        live = live_of.get(id(value))
        if live is None:
            return arrays[value.path]
        return _read_shard(reader, value, live)

    for key, value in sections.items():
        tree[key] = _map(value, fill)
    return tree


def _note_ddp_buckets(registry: Any) -> None:
    """Say why a resumed DDP run at 3+ ranks is not bitwise (tests/distributed/test_ddp.py).

    DDP rebuilds its gradient buckets after a process's first backward; the first step after
    a restart all-reduces the initial layout, the uninterrupted run the rebuilt one, and at
    3+ ranks a ring all-reduce's summation order follows the layout. Nothing in the
    checkpoint can carry that over; ``find_unused_parameters=True`` never rebuilds.
    """
    dist = _dist()
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    if dist is None or dist.get_world_size() < 3 or ddp_module is None:
        return
    for model in registry.models():
        if isinstance(model, ddp_module.DistributedDataParallel) and not model.find_unused_parameters:
            logger.info("ravex: DDP at %d ranks: the first step after this resume sums gradients in "
                        "another order than an uninterrupted run (DDP rebuilds its buckets after a "
                        "process's first step), so results match it to rounding, not bitwise; "
                        "DDP(find_unused_parameters=True) keeps one bucket layout and is bitwise",
                        dist.get_world_size())
            return


def _read_shard(reader: Any, ref: Any, live: Any) -> Any:
    from torch.distributed.tensor import DTensor, Shard

    from ravex import _state
    from ravex.format.reshard import shard_rows

    mesh, placements = live.device_mesh, tuple(live.placements)
    if mesh.ndim != 1 or placements != (Shard(0),):
        full = _state.as_tensor(reader.read_array(ref.path))
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(live.device), mesh, placements)
    rows = shard_rows(ref.shape[0], mesh.size(), mesh.get_local_rank())
    local = _state.as_tensor(reader.read_array(ref.path, rows=rows)).to(live.device)
    return DTensor.from_local(local, mesh, placements, run_check=False,
                              shape=live.shape, stride=live.stride())
