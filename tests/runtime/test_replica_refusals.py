"""``replicas:`` where it cannot work is a one-line error at start naming the fix (issue 33
item 2): ``local:`` on several machines without ``replicas: 1``, ``replicas: 1`` without
``local:``, on one machine, on machines of unequal size, or on more machines than it takes.
``replicas`` is read from the yaml, the environment and ``activate()`` like every key."""

from __future__ import annotations

import pytest

from ravex.format import RavexError
from ravex.runtime.config import RavexConfig
from ravex.saving.selection import get_backend
from ravex.saving.steps.replicas import MAX_MACHINES, partners_of


def _config(tmp_path, **keys) -> RavexConfig:
    return RavexConfig.load(overrides={"storage": str(tmp_path / "durable"), **keys}, environ={})


def _refused(monkeypatch, config, world: int, per_machine: int, match: str) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_machine))
    with pytest.raises(RavexError, match=match) as info:
        get_backend(config, rank=0, world_size=world)
    assert "\n" not in str(info.value)


def test_local_on_several_machines_names_replicas_as_the_fix(tmp_path, monkeypatch):
    _refused(monkeypatch, _config(tmp_path, local=str(tmp_path / "local")), 4, 2,
             r"run on several machines.*Set 'replicas: 1'")


def test_replicas_without_local_is_refused(tmp_path, monkeypatch):
    _refused(monkeypatch, _config(tmp_path, replicas=1), 4, 2, r"replicas: 1 .*'local:' is not set")


def test_replicas_on_one_machine_is_refused(tmp_path, monkeypatch):
    _refused(monkeypatch, _config(tmp_path, local=str(tmp_path / "local"), replicas=1), 2, 2,
             r"all 2 rank\(s\) run on this one: drop 'replicas: 1'")


def test_replicas_on_machines_of_unequal_size_is_refused(tmp_path, monkeypatch):
    _refused(monkeypatch, _config(tmp_path, local=str(tmp_path / "local"), replicas=1), 5, 2,
             r"replicas: 1 needs machines \(torchrun nodes\) of equal size.*same --nproc-per-node")


def test_replicas_on_more_machines_than_it_takes_is_refused(tmp_path, monkeypatch):
    _refused(monkeypatch, _config(tmp_path, local=str(tmp_path / "local"), replicas=1), 2 * (MAX_MACHINES + 1), 2,
             rf"on {MAX_MACHINES + 1} machines \({MAX_MACHINES + 1} copies.*takes up to {MAX_MACHINES} machines: drop "
             r"'local:' and 'replicas:'")


@pytest.mark.parametrize(("rank", "world", "per_machine", "partners"), [
    (0, 2, 1, [1]), (1, 2, 1, [0]), (1, 4, 2, [3]), (0, 3, 1, [1, 2]), (2, 3, 1, [0, 1]),
    (1, 6, 2, [3, 5]), (5, 8, 2, [7, 1, 3])])
def test_each_rank_partners_with_its_local_rank_on_every_other_machine(rank, world, per_machine, partners):
    assert partners_of(rank, world, per_machine) == partners


def test_replicas_comes_from_env_and_activate(tmp_path):
    assert RavexConfig.load(environ={"RAVEX_REPLICAS": "1"}, cwd=str(tmp_path)).replicas == 1
    config = RavexConfig.load(overrides={"replicas": 1}, environ={}, cwd=str(tmp_path))
    assert config.replicas == 1 and config.source_of("replicas") == "activate()"
    assert RavexConfig.load(environ={}, cwd=str(tmp_path)).replicas == 0
