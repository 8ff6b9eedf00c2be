"""A ``DistributedSampler`` epoch carried across a change of world size, every sample once.

Each rank of a ``DistributedSampler`` draws the positions ``rank, rank + W, rank + 2W, ...``
of the epoch's one global order (``randperm(N)`` seeded by ``seed + epoch``, the same on every
rank). After ``k`` batches of ``B`` on every one of ``W`` ranks, the job has consumed exactly
the first ``W * k * B`` positions of that order, whatever ``W`` was. A rerun at ``W'`` ranks
therefore deals out the rest of the order, ``order[offset:]``, over its own ranks as the
sampler would (padded or truncated as it pads or truncates); ``offset`` is saved with the
loader's position, so a checkpoint taken inside such an epoch resumes from it too, at any
world size.

A sampler that is not torch's own ``DistributedSampler`` (a subclass with its own order, a
sampler of the user's) cannot be dealt out again: its epoch resumes at the same number of
samples across the job, and the rerun says once that samples may be skipped or seen twice.
"""

from __future__ import annotations

import logging
from typing import Any

from torch.utils.data import BatchSampler, DistributedSampler

logger = logging.getLogger("ravex")


def _plain(loader: Any) -> DistributedSampler[Any] | None:
    """``loader``'s sampler when it is torch's own ``DistributedSampler`` (its order known)
    under torch's own ``BatchSampler``; None otherwise."""
    sampler = getattr(loader, "sampler", None)
    batches = getattr(loader, "batch_sampler", None)
    if not isinstance(sampler, DistributedSampler) or type(batches) is not BatchSampler:
        return None
    return sampler if type(sampler).__iter__ is DistributedSampler.__iter__ else None


def describe(loader: Any) -> dict[str, Any] | None:
    """What a checkpoint records of ``loader``'s sampler to deal its epoch out again."""
    sampler = _plain(loader)
    if sampler is None:
        return None
    return {"replicas": sampler.num_replicas, "epoch": sampler.epoch, "seed": sampler.seed,
            "shuffle": sampler.shuffle, "samples": len(sampler.dataset)}  # type: ignore[arg-type]


def carry_over(entry: dict[str, Any], loader: Any, saved_world: int, world: int) -> str | None:
    """Fit a saved loader position (``entry``, changed in place) to this run's world size.

    A ``DistributedSampler`` epoch interrupted mid-way becomes an ``offset`` into its global
    order and starts afresh at this run's ranks. Any other loader resumes at the same
    number of samples across the job; the returned line says what that costs (None: exact)."""
    saved, sampler = entry.get("sampler"), _plain(loader)
    if entry.get("exhausted") or int(entry.get("epoch", -1)) < 0:
        return None
    if saved is not None and sampler is not None and saved["samples"] == len(sampler.dataset):  # type: ignore[arg-type]
        batch = int(entry["batch_size"])
        consumed = int(entry.get("offset", 0)) + int(saved["replicas"]) * int(entry["yielded"]) * batch
        entry["offset"], entry["yielded"] = consumed, 0
        if consumed >= int(saved["samples"]):
            entry["exhausted"] = True
        return None
    entry["yielded"] = int(entry["yielded"]) * saved_world // world
    what = type(getattr(loader, "sampler", None)).__name__
    return (f"its sampler ({what}) is not torch's DistributedSampler, so Ravex cannot deal the rest of "
            f"the epoch out over {world} ranks: it resumes at batch {entry['yielded']} of this rank's "
            f"order, and samples of the interrupted epoch may be skipped or seen twice (fix: "
            f"torch.utils.data.DistributedSampler, or resume at {saved_world} ranks)")


def remaining_batches(loader: Any, offset: int, saved: dict[str, Any] | None) -> BatchSampler | None:
    """The batches of this rank for the rest of an epoch whose first ``offset`` positions
    were consumed (at any world size); None where the loader's sampler is no longer the
    one that drew that epoch's order (the caller resumes by counting batches instead)."""
    sampler = _plain(loader)
    if sampler is None or saved is None:
        return None
    drawn = (sampler.epoch, sampler.seed, sampler.shuffle)
    if drawn != (saved["epoch"], saved["seed"], saved["shuffle"]):
        logger.warning("ravex: the DistributedSampler of the resumed epoch draws (epoch, seed, shuffle) "
                       "= %s where the checkpoint's drew %s: the epoch resumes by counting batches, "
                       "and samples may be skipped or seen twice (fix: call sampler.set_epoch(epoch) "
                       "before iterating, as the run that wrote it did)", drawn,
                       (saved["epoch"], saved["seed"], saved["shuffle"]))
        return None
    whole: DistributedSampler[Any] = DistributedSampler(sampler.dataset, num_replicas=1, rank=0,
                                                        shuffle=sampler.shuffle, seed=sampler.seed)
    whole.set_epoch(sampler.epoch)  # the epoch's one global order, as torch draws it for every rank
    rest = list(whole)[offset:]
    replicas = sampler.num_replicas
    if sampler.drop_last:
        rest = rest[: len(rest) - len(rest) % replicas]
    elif rest and len(rest) % replicas:
        pad = replicas - len(rest) % replicas
        rest += (rest * (pad // len(rest) + 1))[:pad]
    batches = loader.batch_sampler
    return BatchSampler(rest[sampler.rank::replicas], batches.batch_size, batches.drop_last)
