"""Several ranks' layout of a checkpoint: what each rank saves, and what it reads back.

Tree layout with several ranks (each rank's manifest holds its own tree)::

    ravex, distributed {"world_size", "rank", "layout": 1}
    models, optimizers, schedulers, scalers   replicated or DTensor-sharded: every rank
        names every tensor; a replicated tensor's chunks are written by exactly one rank
        (:mod:`ravex.saving.ranks`). A DTensor sharded on dim 0 is written as its global
        array, each rank writing the chunks of its own rows. 0-d tensors (Adam's ``step``)
        are a few bytes inline in every manifest.
    rank-<r> {"rng", "loaders"}   per-rank state, under a path no other rank writes

On resume each rank reads the replicated tensors, its own rows of sharded ones (only the
overlapping chunks) and its own ``rank-<r>`` subtree, resharding when the world size
changed.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ravex.format import ArrayRef
from ravex.format.writing.reshard import aligned_chunk_rows, shard_rows
from ravex.saving.backend import LoadedStep
from ravex.saving.dtypes import as_tensor
from ravex.saving.plan import RankLayout, RowShard
from ravex.saving.ranks import REPLICATED
from ravex.saving.tree import leaves, tree_map
from ravex.saving.zarr import PER_RANK

from ..state import sampler_epoch
from ..state.names import plain_state
from ..state.plan import param_names
from ..state.registry import Registry
from ..state.restore import saved_param_states, with_plain_names
from ..state.rng import capture_rng
from .collectives import initialized

logger = logging.getLogger("ravex")

#: The multi-rank tree layout's version, recorded under ``distributed``.
LAYOUT = 1


def _is_dtensor(value: Any) -> bool:
    """Without importing DTensor (~1 s): if the user never loaded it, nothing is one."""
    module = sys.modules.get("torch.distributed.tensor")
    cls = getattr(module, "DTensor", None) if module is not None else None
    return cls is not None and isinstance(value, cls)


def lay_out(tree: dict[str, Any], rank: int, world: int) -> tuple[dict[str, Any], RankLayout | None]:
    """Training thread, before staging: per-rank state under ``rank-<r>``, DTensors as
    :class:`~ravex.saving.plan.RowShard` (their local tensor is what gets staged), and the
    layout the writer applies. The tree unchanged and no layout in one process without
    DTensors."""
    if world == 1 and "torch.distributed.tensor" not in sys.modules:
        return tree, None  # one process, no DTensor anywhere: the tree as it always was
    sections = {k: tree[k] for k in REPLICATED if k in tree}
    if world == 1 and not any(_is_dtensor(leaf) for leaf in leaves(sections)):
        return tree, None
    out = dict(tree)
    for key, value in sections.items():
        out[key] = tree_map(_shard_of, value)
    if world > 1:
        out[f"rank-{rank}"] = {k: out.pop(k) for k in PER_RANK if k in out}
    out["distributed"] = {"world_size": world, "rank": rank, "layout": LAYOUT}
    return out, RankLayout(rank, world)


def _shard_of(value: Any) -> Any:
    if not _is_dtensor(value):
        return value
    from torch.distributed.tensor import Replicate, Shard

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
    rows = shard_rows(shape[0], world, mesh.get_local_rank())
    if local.shape[0] != rows.stop - rows.start:
        raise ValueError(f"DTensor shard of {local.shape[0]} rows where torch.chunk gives "
                         f"{rows.stop - rows.start}: unsupported sharding")
    return RowShard(local, shape, rows.start if rows.stop > rows.start else 0,
                 aligned_chunk_rows(shape, world, local.element_size()))


def resolve(registry: Registry, loaded: LoadedStep, rank: int, world: int) -> dict[str, Any]:
    """This rank's tree of a multi-rank (or sharded) step: its per-rank state made to fit
    this world size, then the tensors read: replicated ones whole, a tensor the live object
    holds as a ``Shard(0)`` DTensor only for this rank's rows."""
    tree, reader = with_plain_names(loaded.tree), loaded.reader
    saved_world, src = loaded.saved_world_size, loaded.saved_rank
    if saved_world != world:
        if rank == 0:
            new = f"rank {saved_world} starts" if world == saved_world + 1 else f"ranks {saved_world}-{world - 1} start"
            fresh = f"{new} fresh ones" if world > saved_world else "each rank's restored"
            logger.warning("ravex: step %d was written by %d rank(s), this run has %d: model and "
                           "optimizer state are resharded exactly; a DistributedSampler's epoch goes on "
                           "with the samples the job has not seen, each once; RNG streams: %s",
                           reader.step, saved_world, world, fresh)
        for index, (loader, entry) in enumerate(zip(registry.live("loaders"), tree.get("loaders", []),
                                                    strict=False)):
            inexact = sampler_epoch.carry_over(entry, loader, saved_world, world)
            if inexact is not None and rank == 0:
                logger.warning("ravex: DataLoader #%d of step %d: %s", index, reader.step, inexact)
            try:  # a loader's length per rank follows the world size
                entry["length"] = len(loader)
            except TypeError:
                pass
    if src != rank:
        tree["rng"] = capture_rng()  # no saved stream for a new rank: keep ours
    tree.setdefault("distributed", {"world_size": saved_world, "rank": src, "layout": LAYOUT})
    _note_ddp_buckets(registry)
    live_of: dict[int, Any] = {}  # id(ArrayRef) -> live DTensor it must match
    models = registry.models()
    for model, saved in zip(models, tree.get("models", []), strict=False):
        live = plain_state(model)
        for key, ref in saved.get("state", {}).items():
            if isinstance(ref, ArrayRef) and _is_dtensor(live.get(key)):
                live_of[id(ref)] = live[key]
    names = param_names(models)
    for opt, saved in zip(registry.live("optimizers"), tree.get("optimizers", []), strict=False):
        for param, st in saved_param_states(opt, saved, names):
            if not _is_dtensor(param) or not isinstance(st, dict):
                continue
            for ref in st.values():
                if isinstance(ref, ArrayRef) and ref.shape and tuple(ref.shape) == tuple(param.shape):
                    live_of[id(ref)] = param
    sections = {k: tree[k] for k in REPLICATED if k in tree}
    whole = [v.path for v in leaves(sections) if isinstance(v, ArrayRef) and id(v) not in live_of]
    arrays = reader.read_arrays(sorted(set(whole))) if whole else {}

    def fill(value: Any) -> Any:
        if not isinstance(value, ArrayRef):
            return value
        live = live_of.get(id(value))
        if live is None:
            return arrays[value.path]
        return _read_shard(reader, value, live)

    for key, value in sections.items():
        tree[key] = tree_map(fill, value)
    return tree


def _note_ddp_buckets(registry: Registry) -> None:
    """Say why a resumed DDP run at 3+ ranks is not bitwise (tests/distributed/test_ddp.py).

    DDP rebuilds its gradient buckets after a process's first backward; the first step after
    a restart all-reduces the initial layout, the uninterrupted run the rebuilt one, and at
    3+ ranks a ring all-reduce's summation order follows the layout. Nothing in the
    checkpoint can carry that over; ``find_unused_parameters=True`` never rebuilds.
    """
    dist = initialized()
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    if dist is None or dist.get_world_size() < 3 or ddp_module is None or dist.get_rank() != 0:
        return  # said once, by rank 0
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

    mesh, placements = live.device_mesh, tuple(live.placements)
    if mesh.ndim != 1 or placements != (Shard(0),):
        full = as_tensor(reader.read_array(ref.path))
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(live.device), mesh, placements)
    rows = shard_rows(ref.shape[0], mesh.size(), mesh.get_local_rank())
    local = as_tensor(reader.read_array(ref.path, rows=rows)).to(live.device)
    return DTensor.from_local(local, mesh, placements, run_check=False,
                              shape=live.shape, stride=live.stride())
