"""activate()'s object scan (type-cached) finds exactly what the per-object isinstance loop found."""

from __future__ import annotations

import gc
import warnings

import torch
from torch.optim.lr_scheduler import LRScheduler, StepLR
from torch.utils.data import DataLoader

from ravex.runtime.config import RavexConfig
from ravex.runtime.starting.lifecycle import RavexRuntime
from ravex.runtime.state.registry import KINDS, Registry


def _reference_scan(registry: Registry) -> None:
    """The loop ``_scan_existing`` used before the type cache (one isinstance per object)."""
    kinds = ((torch.nn.Module, "modules"), (torch.optim.Optimizer, "optimizers"),
             (LRScheduler, "schedulers"), (torch.amp.GradScaler, "scalers"))
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, DataLoader):
                registry.loader_state(obj)
                continue
            for cls, kind in kinds:
                if isinstance(obj, cls):
                    registry.add(kind, obj)
                    break


class _Sub(torch.nn.Linear):
    pass


def _found(registry: Registry) -> dict[str, list[int]]:
    found = {kind: [id(o) for o in registry.live(kind)] for kind in KINDS}
    found["all_modules"] = sorted(id(ref()) for _, ref in registry._modules.values() if ref() is not None)
    return found


def test_type_cached_scan_finds_the_same_objects_as_isinstance_per_object():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), _Sub(3, 2))
    other = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt2 = torch.optim.Adam(other.parameters())
    sched = StepLR(opt, 1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loader = DataLoader(list(range(8)), batch_size=2)
    # cyclic garbage: a dropped optimizer + scheduler must not be found by either scan
    dropped = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    StepLR(dropped, 1)
    del dropped

    reference = Registry()
    _reference_scan(reference)
    for seen in reference.live("loaders"):  # a loader is registered on its first sighting only
        seen.__dict__.pop("_ravex_state")
    runtime = RavexRuntime(RavexConfig())
    runtime._scan_existing()

    got, want = _found(runtime.registry), _found(reference)
    assert got == want
    assert {id(model), id(other)} <= set(got["models"])
    assert id(opt) in got["optimizers"] and id(opt2) in got["optimizers"]
    assert id(sched) in got["schedulers"] and id(scaler) in got["scalers"]
    assert id(loader) in got["loaders"]
    assert len(got["schedulers"]) == len(want["schedulers"])
