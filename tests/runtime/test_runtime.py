"""The runtime in-process: API semantics, failures that must not stop training, restore
errors, fallbacks, and what each checkpoint reports. A "rerun" here is a fresh set of
objects under a fresh activation in the same process (the subprocess tests kill for real).
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ravex
from ravex.errors import RestoreError
from ravex.format import open_store
from ravex.format.storage import LocalStorage

from . import harness


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith("RAVEX_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no stray ravex.yaml
    original = nn.Module.__init__
    yield
    ravex.deactivate()
    assert nn.Module.__init__ is original, "deactivate() must undo every patch"


def _objects(width: int = 8, workers: int = 0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.Dropout(0.1), nn.Linear(width, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=workers)
    return model, opt, sched, loader


def _train(model, opt, sched, loader, epochs: int = 2, stop_after: int | None = None):
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            if stop_after is not None and len(losses) == stop_after:
                return losses
    return losses


def test_activate_twice_is_harmless_and_overrides_after_activation_raise(tmp_path):
    first = ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=2)
    assert ravex.activate() is first and ravex.is_active()
    with pytest.raises(RuntimeError, match="already active"):
        ravex.activate(checkpoint_every=3)
    ravex.deactivate()
    assert not ravex.is_active() and ravex.status() == {"active": False}
    with pytest.raises(TypeError, match="did you mean 'keep_last'"):
        ravex.activate(keep_lst=1)


def test_a_deactivated_runtime_is_freed(tmp_path):
    """Nothing of a runtime outlives deactivate(): the exit hook used to hold every runtime
    ever started (and with it its backend and whatever its saver's callbacks referenced)."""
    import gc
    import weakref

    model, opt, sched, loader = _objects()

    def one_round(store: str) -> tuple[weakref.ref, weakref.ref]:
        # In a function of its own: a checkpoint reads the variables of the user's frames
        # around the loop, and CPython keeps that snapshot of a frame's locals (f_locals) for
        # as long as the frame runs, as under any tracer; this test asks what Ravex keeps.
        runtime = ravex.activate(storage=store, checkpoint_every=2)
        _train(model, opt, sched, loader, epochs=1)
        refs = (weakref.ref(runtime), weakref.ref(runtime.backend))
        ravex.deactivate()
        return refs

    refs = [one_round(str(tmp_path / f"ck{round_}")) for round_ in range(2)]
    gc.collect()
    assert all(r() is None and b() is None for r, b in refs)


def test_in_process_resume_is_bitwise_and_restores_before_first_forward(tmp_path):
    store = str(tmp_path / "ck")
    reference = _train(*_objects())  # no ravex
    ravex.activate(storage=store, checkpoint_every=4, checkpoint_on_exit=False)
    first = _train(*_objects(), stop_after=13)  # checkpoint of step 12 taken at the 13th next()
    ravex.flush()
    assert ravex.status()["last_written_step"] == 12
    ravex.deactivate()

    ravex.activate(storage=store, checkpoint_every=4)
    model, opt, sched, loader = _objects()
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(opt.state_dict()["state"] != {}))
    second = _train(model, opt, sched, loader)
    assert seen[0], "the first forward of the rerun must see restored state"
    assert ravex.status()["resumed_from"] == 12 and ravex.step() == 20
    assert first == reference[:13] and second == reference[12:]


def test_storage_error_is_logged_kept_in_status_and_retried(tmp_path, monkeypatch):
    failing = {"on": True}
    original = LocalStorage.write

    def write(self, key, data):
        if failing["on"] and key.startswith("steps/"):
            raise OSError(28, "No space left on device")
        return original(self, key, data)

    monkeypatch.setattr(LocalStorage, "write", write)
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=2, checkpoint_on_exit=False)
    model, opt, sched, loader = _objects()
    _train(model, opt, sched, loader, epochs=1, stop_after=5)  # checkpoints of 2 and 4 fail
    ravex.flush()
    status = ravex.status()
    assert status["failures"] >= 1 and "No space left on device" in status["last_error"]
    assert status["last_written_step"] is None
    failing["on"] = False
    _train(model, opt, sched, loader, epochs=1)  # training went on; the next interval retries
    ravex.flush()
    status = ravex.status()
    assert status["last_error"] is None and status["last_written_step"] == status["step"] - 1 - (status["step"] - 1) % 2


def test_changed_architecture_is_a_clear_error(tmp_path):
    store = str(tmp_path / "ck")
    ravex.activate(storage=store, checkpoint_every=2)
    _train(*_objects(), epochs=1, stop_after=3)
    ravex.flush()
    ravex.deactivate()
    ravex.activate(storage=store)
    model, opt, sched, loader = _objects(width=16)
    with pytest.raises(RestoreError, match=r"model #0 \(Sequential\) tensor '0.weight' has shape \[16, 4\] "
                                           r"but \[8, 4\].*new location"):
        _train(model, opt, sched, loader, epochs=1)


def test_corrupt_latest_step_falls_back_to_newest_good_one(tmp_path):
    store = tmp_path / "ck"
    ravex.activate(storage=str(store), checkpoint_every=2, keep_last=5, checkpoint_on_exit=False)
    _train(*_objects(), epochs=1, stop_after=5)
    ravex.flush()
    ravex.deactivate()
    manifest = store / "steps" / "4" / "rank-0.json"
    manifest.write_text(manifest.read_text()[:40])  # truncated
    ravex.activate(storage=str(store), checkpoint_every=2)
    _train(*_objects(), epochs=1, stop_after=1)
    assert ravex.status()["resumed_from"] == 2


def test_each_checkpoint_logs_phases_and_new_vs_reused_bytes(tmp_path):
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=2)
    model, opt, sched, loader = _objects()
    model[0].weight.requires_grad_(False)  # a frozen layer is reused, not rewritten
    _train(model, opt, sched, loader, epochs=1, stop_after=5)
    ravex.flush()
    line = ravex.status()["last_log_line"]
    for word in ("checkpoint step 4", "stall", "wait", "stage", "hash", "encode", "write",
                 "manifest", "new", "reused"):
        assert word in line, line
    stall = ravex.status()["last_stall_seconds"]
    assert set(stall) == {"wait", "stage"}


def test_torch_save_backend_resumes(tmp_path):
    store = str(tmp_path / "ck")
    reference = _train(*_objects())
    ravex.activate(storage=store, checkpoint_every=3, backend="torch_save", checkpoint_on_exit=False)
    _train(*_objects(), stop_after=8)
    ravex.flush()
    assert ravex.status()["backend"] == "torch_save"
    ravex.deactivate()
    assert sorted(os.listdir(store))[-1] == "step_000000000006.pt"
    ravex.activate(storage=store, checkpoint_every=3, backend="torch_save")
    assert _train(*_objects()) == reference[6:]


def test_checkpoint_on_exit_then_a_finished_run_passes_through(tmp_path):
    store = str(tmp_path / "ck")
    runtime = ravex.activate(storage=store, checkpoint_every=100)
    model, opt, sched, loader = _objects()
    _train(model, opt, sched, loader)
    final = {k: v.clone() for k, v in model.state_dict().items()}
    del model, opt, sched, loader
    runtime.shutdown()  # what interpreter exit runs: checkpoint_on_exit takes step 20
    ravex.deactivate()

    ravex.activate(storage=store)
    model, opt, sched, loader = _objects()
    assert _train(model, opt, sched, loader) == []  # both epochs pass through empty
    assert ravex.status()["resumed_from"] == 20 and ravex.step() == 20
    harness.assert_same_state(dict(model.state_dict()), final)


def test_manual_checkpoint_and_step(tmp_path):
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=1000)
    model, opt, sched, loader = _objects()
    _train(model, opt, sched, loader, epochs=1, stop_after=3)
    assert ravex.step() == 3
    assert ravex.checkpoint() is True
    ravex.flush()
    assert ravex.status()["last_written_step"] == 3


def test_two_optimizers_count_one_step_per_iteration_and_scaler_is_restored(tmp_path):
    store = str(tmp_path / "ck")

    def build():
        torch.manual_seed(1)
        g, d = nn.Linear(3, 3), nn.Linear(3, 1)
        og = torch.optim.Adam(g.parameters(), lr=1e-2)
        od = torch.optim.SGD(d.parameters(), lr=1e-2, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
        return g, d, og, od, scaler

    def run(g, d, og, od, scaler, n):
        for _ in range(n):
            og.zero_grad()
            od.zero_grad()
            scaler.scale(d(g(torch.ones(2, 3))).sum()).backward()
            scaler.step(og)
            scaler.step(od)
            scaler.update()

    ravex.activate(storage=store, checkpoint_every=2, checkpoint_on_exit=False)
    g, d, og, od, scaler = build()
    run(g, d, og, od, scaler, 4)
    assert ravex.step() == 4  # iterations, not optimizer.step() calls
    expected = (scaler.get_scale(), og.state_dict()["state"][0]["exp_avg"].clone())
    # no DataLoader: step 4's checkpoint waits for the next forward, when the whole
    # iteration (second optimizer, scaler.update()) is done
    run(g, d, og, od, scaler, 1)
    ravex.flush()
    assert ravex.status()["last_written_step"] == 4
    del g, d, og, od, scaler
    ravex.deactivate()

    ravex.activate(storage=store)
    g, d, og, _od, scaler = build()
    d(g(torch.ones(1, 3)))  # the first forward restores
    assert ravex.status()["resumed_from"] == 4 and ravex.status()["scalers"] == 1
    assert scaler.get_scale() == expected[0] != 1024.0
    assert torch.equal(og.state_dict()["state"][0]["exp_avg"], expected[1])


def test_time_based_checkpoints_and_retention(tmp_path):
    store = tmp_path / "ck"
    ravex.activate(storage=str(store), checkpoint_every=None, checkpoint_every_seconds=1e-9,
                   keep_last=2, checkpoint_on_exit=False)
    _train(*_objects(), epochs=1, stop_after=6)
    ravex.flush()
    steps = sorted(int(p) for p in os.listdir(store / "steps"))
    assert steps == [4, 5]  # one per step boundary, the last two kept


def test_resume_never_and_resume_at_a_given_step(tmp_path):
    store = str(tmp_path / "ck")
    ravex.activate(storage=store, checkpoint_every=2, keep_last=10, checkpoint_on_exit=False)
    _train(*_objects(), epochs=1, stop_after=7)
    ravex.flush()
    ravex.deactivate()
    # a fresh run on a timeline with steps writes a root timeline of its own beside them
    # (tests/runtime/test_resume_never.py runs it as a script)
    ravex.activate(storage=store, resume="never", checkpoint_on_exit=False)
    _train(*_objects(), epochs=1, stop_after=1)
    assert ravex.status()["resumed_from"] is None and ravex.step() == 1
    ravex.deactivate()
    assert open_store(store).current().timeline.name == "fresh"
    assert open_store(store).timelines()["fresh"].parent is None
    ravex.activate(storage=store, resume="main@4", checkpoint_on_exit=False)
    _train(*_objects(), epochs=1, stop_after=1)
    assert ravex.status()["resumed_from"] == 4 and ravex.step() == 5
    ravex.deactivate()
    from ravex.errors import StepNotFoundError

    # the timeline the resume from 4 started, main-4, holds no step 5 (nor its lineage)
    with pytest.raises(StepNotFoundError, match=r"step main-4@5 .* has no complete step"):
        ravex.activate(storage=store, resume=5)
