"""``ravex.runtime.state.sampler_epoch``: a ``DistributedSampler`` epoch dealt out again over another
world size, in process (each "rank" is a DataLoader over a sampler given its rank): the
positions before the change plus every rank's batches after it hold each sample once,
through two changes in one epoch, padded and truncated ends included; a sampler of the
user's is carried by counting batches, and that is said."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from ravex.runtime.state import sampler_epoch

BATCH = 4


def _loader(n: int, world: int, rank: int, epoch: int = 3, drop_last: bool = False) -> DataLoader:
    data = torch.arange(n)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return DataLoader(data, batch_size=BATCH, sampler=sampler)


def _entry(loader: DataLoader, yielded: int, offset: int = 0) -> dict:
    return {"epoch": 3, "yielded": yielded, "exhausted": False, "batch_size": BATCH, "offset": offset,
            "sampler": sampler_epoch.describe(loader)}


def _batches(loader: DataLoader, offset: int, saved: dict | None) -> list[list[int]]:
    rest = sampler_epoch.remaining_batches(loader, offset, saved)
    assert rest is not None
    return [list(b) for b in rest]


@pytest.mark.parametrize(("n", "world", "steps", "new_world", "more", "last_world"), [
    (64, 4, 2, 2, 3, 4),  # 4 -> 2 -> 4
    (64, 2, 1, 4, 1, 1),  # a remainder 4 ranks cannot split into whole batches
    (48, 3, 2, 2, 1, 1),
])
def test_the_positions_before_and_after_two_changes_hold_each_sample_once(n, world, steps, new_world, more, last_world):
    seen: Counter[int] = Counter()
    for rank in range(world):  # the first run: ``steps`` batches on each of its ranks
        seen.update(i for b in list(_loader(n, world, rank))[:steps] for i in b.tolist())
    entry = _entry(_loader(n, world, 0), steps)
    assert sampler_epoch.carry_over(entry, _loader(n, new_world, 0), world, new_world) is None
    assert entry["yielded"] == 0 and entry["offset"] == world * steps * BATCH
    for rank in range(new_world):  # the second: ``more`` batches each, then killed again
        seen.update(i for b in _batches(_loader(n, new_world, rank), entry["offset"], entry["sampler"])[:more]
                    for i in b)
    again = _entry(_loader(n, new_world, 0), more, offset=entry["offset"])
    sampler_epoch.carry_over(again, _loader(n, last_world, 0), new_world, last_world)
    for rank in range(last_world):  # the third finishes the epoch
        seen.update(i for b in _batches(_loader(n, last_world, rank), again["offset"], again["sampler"]) for i in b)
    assert seen == Counter(range(n))


def test_an_uneven_rest_is_padded_or_truncated_as_the_sampler_does():
    n, offset = 50, 8  # 42 left over 4 ranks: 11 each padded, 10 each truncated
    padded = [_batches(_loader(n, 4, r), offset, _entry(_loader(n, 4, 0), 0)["sampler"]) for r in range(4)]
    assert [sum(len(b) for b in bs) for bs in padded] == [11] * 4
    assert set().union(*({i for b in bs for i in b} for bs in padded)) == set(_order(n)[offset:])
    cut = [_batches(_loader(n, 4, r, drop_last=True), offset, _entry(_loader(n, 4, 0, drop_last=True), 0)["sampler"])
           for r in range(4)]
    assert [sum(len(b) for b in bs) for bs in cut] == [10] * 4


def _order(n: int) -> list[int]:
    s = DistributedSampler(torch.arange(n), num_replicas=1, rank=0, seed=5, shuffle=True)
    s.set_epoch(3)
    return list(s)


def test_another_epoch_than_the_checkpoints_is_said_and_counted_instead(caplog):
    loader = _loader(64, 2, 0, epoch=4)
    assert sampler_epoch.remaining_batches(loader, 8, _entry(_loader(64, 2, 0), 1)["sampler"]) is None
    assert "set_epoch" in caplog.text


def test_a_sampler_of_the_users_resumes_by_counting_batches_and_says_so():
    data = torch.arange(64)
    loader = DataLoader(data, batch_size=BATCH, sampler=RandomSampler(data))
    entry = {"epoch": 0, "yielded": 3, "exhausted": False, "batch_size": BATCH, "sampler": None}
    said = sampler_epoch.carry_over(entry, loader, 4, 2)
    assert said is not None and "RandomSampler" in said and "DistributedSampler" in said
    assert entry["yielded"] == 6
