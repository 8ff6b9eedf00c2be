"""Staging memory made ready before the first checkpoint (``Stager.prepare``, issue 26): the
first stage takes the prepared buffers, stages the same bytes as without them, stops a prepare
still running rather than wait for it, and the runtime prepares at activation and at the first
training step.
How much it saves is measured in ``benchmarks/goodput.py``, not here."""

from __future__ import annotations

import threading

import numpy as np
import torch

import ravex
from ravex.saving import stager as _stager
from ravex.saving.stager import PREPARE_MIN_BYTES, Stager


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(1024, 512, generator=g),  # 2 MiB
        "half": torch.randn(1024, 1024, generator=g).to(torch.bfloat16),  # 2 MiB, another dtype
        "twin": torch.randn(512, 1024, generator=g),  # the same byte size as "w"
        "small": torch.randn(16, generator=g),  # under PREPARE_MIN_BYTES: left to the stage
    }


def _sizes(tree: dict[str, torch.Tensor]) -> list[int]:
    return [t.numel() * t.element_size() for t in tree.values()]


def test_the_first_stage_takes_the_prepared_buffers_and_the_bytes_are_the_same():
    tree = _state()
    s = Stager(as_numpy=False)
    s.prepare([*_sizes(tree), 3 << 20])  # a size the state has no tensor of: freed after the stage
    assert s._preparing is not None
    s._preparing.join()
    assert s.prepared is not None and s.prepared["bytes"] == sum(n for n in [*_sizes(tree), 3 << 20]
                                                                 if n >= PREPARE_MIN_BYTES)
    ready = {id(b) for bufs in s._ready.values() for b in bufs}
    ready_ptrs = {b.data_ptr() for bufs in s._ready.values() for b in bufs}
    out = s.stage(tree)
    for k, t in tree.items():
        assert out[k].dtype == t.dtype and out[k].shape == t.shape
        assert torch.equal(out[k].view(torch.uint8) if t.dtype == torch.bfloat16 else out[k],
                           t.view(torch.uint8) if t.dtype == torch.bfloat16 else t)
        if t.numel() * t.element_size() >= PREPARE_MIN_BYTES:
            assert out[k].data_ptr() in ready_ptrs, k  # a prepared buffer, not a fresh one
            assert out[k].data_ptr() % 4096 == 0  # page-aligned, as the writer's direct writes want
    assert ready and not s._ready  # what was left over is freed
    again = s.stage(tree)
    assert all(again[k].data_ptr() == out[k].data_ptr() for k in tree)  # reused, as before
    s.prepare(_sizes(tree))  # once only
    assert not s._ready
    s.release()


def test_a_second_prepare_adds_only_what_the_first_did_not_ask_for():
    tree = _state()
    sizes = _sizes(tree)
    s = Stager(as_numpy=True)
    s.prepare(sizes[:2])  # at activation: what exists then
    s.prepare(sizes)  # at the first step: all of it, the first two again among it
    assert s._preparing is not None
    s._preparing.join()  # the one thread, or the second where the first had ended already
    wanted = sorted(n for n in sizes if n >= PREPARE_MIN_BYTES)
    assert sorted(n for n, bufs in s._ready.items() for _ in bufs) == wanted
    assert s.prepared is not None and s.prepared["bytes"] == sum(wanted)
    out = s.stage(tree)
    for k, t in tree.items():
        assert np.array_equal(out[k].view(np.uint8), t.view(torch.uint8).numpy()), k
    s.release()


def test_a_prepare_still_running_is_stopped_by_the_first_stage(monkeypatch):
    """The first stage does not wait for the whole prepare: it stops it after the piece in
    hand, takes what is ready (a partly touched buffer too) and allocates the rest."""
    touched = threading.Event()
    real = _stager.touch
    tree = _state()
    s = Stager(as_numpy=True)

    def slow_touch(piece: np.ndarray) -> None:
        real(piece)
        touched.set()
        s._stop_preparing.wait(30)  # the piece in hand ends only once the stage asked

    monkeypatch.setattr(_stager, "touch", slow_touch)
    s.prepare(_sizes(tree))
    assert touched.wait(30)
    out = s.stage(tree)
    assert s.prepared is not None and s.prepared["stopped"] == 1.0
    assert s.prepared["bytes"] < sum(_sizes(tree))
    for k, t in tree.items():
        assert np.array_equal(out[k].view(np.uint8), t.view(torch.uint8).numpy()), k
    s.release()


def _two_steps(tmp_path, width: int, **config: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Two Linear(width) layers and AdamW, Ravex active on ``tmp_path / "ck"``, two steps taken
    (the caller deactivates)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, width)
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=None, resume="never",
                   checkpoint_on_exit=False, checkpoint_on_signal=[], log_level="WARNING", **config)
    for _ in range(2):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def test_the_runtime_prepares_what_exists_at_activation(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)  # built before activate(): the scan finds it
    try:
        ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=None, resume="never",
                       checkpoint_on_exit=False, checkpoint_on_signal=[], log_level="WARNING")
        stager = ravex.runtime.starting.lifecycle.get_runtime().backend._stager
        assert stager._asked == [4 << 20]  # the weight; the bias is under the threshold
    finally:
        ravex.deactivate()
    del model


def test_the_runtime_prepares_at_the_first_step_and_resumes_bitwise(tmp_path):
    try:
        model, _ = _two_steps(tmp_path, 512)
        assert ravex.checkpoint()
        ravex.flush()
        st = ravex.status()
        assert st["last_error"] is None and st["checkpoints_written"] == 1
        # the 1 MiB weights and their two AdamW moments (the biases are under the threshold), or
        # less where the checkpoint came before the idle thread was done and stopped it
        assert st["staging_prepared"] is not None and 0 <= st["staging_prepared"]["bytes"] <= 6 * (1 << 20)
        assert set(st["last_write_seconds"]) >= {"stage", "wait", "hash", "write", "manifest", "background"}
        saved = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        ravex.deactivate()
    loaded = ravex.load(str(tmp_path / "ck"))
    got = loaded["models"][0]["state"]
    for k, v in saved.items():
        assert torch.equal(torch.as_tensor(np.asarray(got[k])), v), k


def test_over_the_cap_tensors_are_handed_over_live():
    tree = _state()
    s = Stager(as_numpy=True, max_bytes=(2 << 20) + 63)
    s.prepare(_sizes(tree))  # no more than the cap: the first 2 MiB
    s._preparing.join()
    assert s.prepared["bytes"] == 2 << 20
    out = s.stage(tree)
    staged = [k for k in tree if not np.shares_memory(out[k], tree[k].view(torch.uint8).numpy())]
    assert staged == ["w"]  # in the tree's order until the cap; "small" (64 bytes) no longer fits
    assert s.live_bytes == sum(_sizes(tree)) - (2 << 20)
    assert s._held == 2 << 20
    for k, t in tree.items():
        assert np.array_equal(out[k].view(np.uint8), t.view(torch.uint8).numpy()), k
    s.release()


def test_a_capped_checkpoint_waits_for_the_writer_and_loads_back_equal(tmp_path):
    try:
        model, opt = _two_steps(tmp_path, 256, staging_max_bytes=1 << 18)
        assert ravex.checkpoint()
        st = ravex.status()
        assert "live" in st["last_stall_seconds"]  # it waited for the writer to read the live tensors
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        moments = [v.clone() for s in opt.state.values() for v in s.values() if v.ndim]
        for p in model.parameters():  # training goes on: the write must not see this
            p.data.add_(1.0)
        ravex.flush()
        assert ravex.status()["last_error"] is None
    finally:
        ravex.deactivate()
    loaded = ravex.load(str(tmp_path / "ck"))
    for k, v in saved.items():
        assert torch.equal(torch.as_tensor(np.asarray(loaded["models"][0]["state"][k])), v), k
    got = [torch.as_tensor(np.asarray(v)) for s in loaded["optimizers"][0]["state"].values()
           for v in s.values() if np.ndim(v)]
    assert len(got) == len(moments) and all(torch.equal(a, b) for a, b in zip(got, moments, strict=True))


def test_the_first_stage_says_what_its_new_staging_memory_cost():
    """The first stage faults its new buffers in before copying and its line says so, once; a
    buffer copied at once (a strided tensor) is not touched after its copy (that would zero a
    byte per page of it); a prepared buffer is not new."""
    tree = {"w": torch.randn(1 << 20), "strided": torch.randn(512, 1024).T}
    s = Stager(as_numpy=True)
    out = s.stage(tree)
    assert s.fresh_bytes == 4 << 20 and s.fault_s > 0
    assert "; 4.0 MiB of new staging memory faulted in: " in s.summary()
    for k, t in tree.items():
        assert torch.equal(torch.from_numpy(out[k]), t), k
    tree["w"].add_(1)
    s.stage(tree)
    assert s.fresh_bytes == 0 and "faulted" not in s.summary()
    s.release()

    prepared = Stager(as_numpy=True)
    prepared.prepare(_sizes({"w": tree["w"]}))
    prepared._preparing.join()
    prepared.stage(tree)
    assert prepared.fresh_bytes == 0 and "faulted" not in prepared.summary()
    prepared.release()
