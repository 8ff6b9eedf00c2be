"""A resume reads the checkpoint straight into the live tensors: same memory before and after,
no full-size temporary, bitwise the saved values; and a checkpoint that does not fit, or a
damaged one, is still refused clearly (before anything live changes, where that is possible).
Also the object scan of ``activate()``: garbage stays out, and the full ``gc.collect()`` runs
only when some object found cannot be proven live.
"""

from __future__ import annotations

import gc
import os
import tracemalloc

import pytest
import torch
from torch import nn

import ravex
from ravex.errors import RestoreError
from ravex.format import open_store
from ravex.runtime.state import scan
from ravex.runtime.state.registry import Registry

pytestmark = pytest.mark.usefixtures("ravex_clean")


WIDTH = 512  # 1 MiB per weight matrix: a full-size temporary would show


def _objects(dtype: torch.dtype = torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4), nn.BatchNorm1d(4)).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _step(model, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, WIDTH, generator=g, dtype=next(model.parameters()).dtype)
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _saved(store) -> tuple[dict, dict]:
    """Train 3 steps under Ravex, checkpoint at step 3; the state as saved (cloned)."""
    ravex.activate(storage=str(store), checkpoint_every=10**6, checkpoint_on_exit=False)
    model, opt = _objects()
    for i in range(3):
        _step(model, opt, seed=i)
    ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()})


def _pointers(model, opt) -> dict[str, int]:
    out = {f"model {k}": v.data_ptr() for k, v in model.state_dict().items()}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        out.update({f"opt {i} {k}": v.data_ptr() for k, v in opt.state[p].items()})
    return out


def _assert_bitwise(model, opt, saved_model, saved_opt) -> None:
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved_model[k]) and v.dtype == saved_model[k].dtype, k
    state = opt.state_dict()["state"]
    assert state.keys() == saved_opt.keys()
    for pid, entry in saved_opt.items():
        for key, v in entry.items():
            assert torch.equal(state[pid][key], v), (pid, key)


def test_resume_writes_into_the_live_tensors_without_a_full_size_temporary(tmp_path):
    store = tmp_path / "ck"
    saved_model, saved_opt = _saved(store)
    model, opt = _objects(seed=1)  # different values, same shapes
    _step(model, opt, seed=9)  # the optimizer's state exists (as in the benchmark's rerun)
    before = _pointers(model, opt)
    versions = [t._version for s in opt.state.values() for t in s.values()]
    ravex.activate(storage=str(store), checkpoint_on_exit=False)  # finds them: the scan
    runtime = ravex.runtime.starting.lifecycle.get_runtime()
    assert not runtime._restored
    preparing = runtime.backend._stager._preparing
    if preparing is not None:  # staging buffers prepared from activate() on, on an idle-priority
        preparing.join()  # thread: on a loaded machine they are allocated late, inside the window
    tracemalloc.start()  # numpy's buffers are traced: a read into fresh arrays would show
    try:
        runtime.ensure_restored()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert runtime.resumed_from == 3
    assert _pointers(model, opt) == before, "restore must write into the live tensors' memory"
    after = [t._version for s in opt.state.values() for t in s.values()]
    assert all(a > b for a, b in zip(after, versions, strict=True)), "in-place writes bump _version"
    _assert_bitwise(model, opt, saved_model, saved_opt)
    weights = WIDTH * WIDTH * 4
    assert peak < weights // 2, f"{peak} bytes allocated during the restore (one weight is {weights})"


def test_rerun_before_the_first_step_restores_bitwise_and_keeps_parameter_memory(tmp_path):
    store = tmp_path / "ck"
    saved_model, saved_opt = _saved(store)
    ravex.activate(storage=str(store), checkpoint_on_exit=False)
    model, opt = _objects(seed=1)  # a rerun: AdamW has no state yet
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    model.eval()(torch.zeros(2, WIDTH))  # the first forward restores
    assert ravex.status()["resumed_from"] == 3
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == before
    _assert_bitwise(model, opt, saved_model, saved_opt)
    _step(model.train(), opt, seed=3)  # and training goes on from there


@pytest.mark.parametrize("change", ["dtype", "shape"])
def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_changes(tmp_path, change):
    store = tmp_path / "ck"
    _saved(store)
    ravex.activate(storage=str(store), checkpoint_on_exit=False)
    if change == "dtype":
        model, opt = _objects(dtype=torch.float64, seed=1)
        match = r"model #0 \(Sequential\) tensor '0.weight' is torch.float64 but torch.float32 in the checkpoint"
    else:
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(WIDTH, WIDTH + 1), nn.Tanh(), nn.Linear(WIDTH + 1, 4), nn.BatchNorm1d(4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        match = r"tensor '0.weight' has shape \[513, 512\] but \[512, 512\] in the checkpoint"
    untouched = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RestoreError, match=match + r".*new location"):
        model(torch.zeros(2, WIDTH, dtype=next(model.parameters()).dtype))
    for k, v in model.state_dict().items():
        assert torch.equal(v, untouched[k]), f"{k} changed although the restore was refused"
    del opt


def _objects_of(store, step: int, path: str | None = None) -> set[str]:
    reader = open_store(str(store)).open_step(step)
    entries = [reader.arrays[path]] if path else reader.arrays.values()
    return {ref.object for entry in entries for ref in entry.chunks.values() if ref.object}


def test_a_missing_object_falls_back_to_an_older_step_before_touching_the_model(tmp_path):
    store = tmp_path / "ck"
    ravex.activate(storage=str(store), checkpoint_every=10**6, keep_last=5, checkpoint_on_exit=False)
    model, opt = _objects()
    for i in range(4):
        _step(model, opt, seed=i)
        if i % 2 == 1:
            ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()
    assert open_store(str(store)).complete_steps() == [2, 4]
    step_two = open_store(str(store)).open_step(2).read(subtree="models")[0]["state"]["0.weight"]
    for name in _objects_of(store, 4, "models/0/state/0.weight") - _objects_of(store, 2):
        os.remove(store / "objects" / name[:2] / name)
    ravex.activate(storage=str(store), checkpoint_on_exit=False)
    model, opt = _objects(seed=1)
    model.eval()(torch.zeros(2, WIDTH))
    assert ravex.status()["resumed_from"] == 2
    assert torch.equal(model[0].weight.detach(), torch.from_numpy(step_two))


def test_a_corrupt_object_met_midway_is_a_clear_error(tmp_path):
    store = tmp_path / "ck"
    _saved(store)
    for ref in open_store(str(store)).open_step(3).arrays["models/0/state/0.weight"].chunks.values():
        path = store / "objects" / ref.object[:2] / ref.object
        data = bytearray(path.read_bytes())
        data[(ref.offset or 0) + 100] ^= 0xFF  # same size: only the digest can tell
        path.write_bytes(bytes(data))
    ravex.activate(storage=str(store), checkpoint_on_exit=False)
    model, _opt = _objects(seed=1)
    with pytest.raises(RestoreError, match=r"reading the checkpoint failed midway .*does not match its digest.*"
                                           r"partly overwritten"):
        model(torch.zeros(2, WIDTH))


def _ids(registry: Registry) -> dict[str, list[int]]:
    return {kind: [id(o) for o in registry.live(kind)] for kind in ("models", "optimizers", "schedulers")}


def test_scan_proves_locals_live_without_a_collect():
    model, opt = _objects()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert scan._all_reachable({id(model), id(model[0]), id(opt), id(sched)})
    dropped = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    torch.optim.lr_scheduler.StepLR(dropped, 1)  # scheduler <-> optimizer: cyclic garbage
    dropped_id = id(dropped)
    del dropped
    assert not scan._all_reachable({id(opt), dropped_id}), "garbage cannot be proven live"
    gc.collect()


def test_scan_collects_when_a_find_may_be_garbage_and_leaves_the_garbage_out():
    model, opt = _objects()
    dropped = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    torch.optim.lr_scheduler.StepLR(dropped, 1)  # scheduler <-> optimizer: cyclic garbage
    dropped_id = id(dropped)
    del dropped
    registry = Registry()
    scan.scan(registry)
    found = _ids(registry)
    assert found["optimizers"] == [id(opt)] and dropped_id not in found["optimizers"]
    assert found["schedulers"] == []
    assert id(model) in found["models"]
