"""The Stager skips tensors that cannot have changed (frozen parameters) and still never
stages stale bytes: what torch's version counter misses is caught by the probe, by the
periodic full stage, or by turning skipping off. Ends with a real 95%-frozen fine-tune,
SIGKILLed and resumed bitwise."""

from __future__ import annotations

import logging
import random
import re
import signal
import threading

import numpy as np
import pytest
import torch
from torch import nn

from ravex.errors import ConfigError
from ravex.runtime.config import RavexConfig
from ravex.saving.stager import Stager

from . import harness


def _fine_tune(fused: bool = False) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 4))
    model[:3].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, fused=fused)
    return model, opt


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 1) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()


def _tree(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _assert_staged_is_live(staged: dict, tree: dict) -> None:
    """Every staged buffer holds exactly the live tensor's bytes."""
    harness.assert_same_state({k: torch.from_numpy(np.asarray(v)) for k, v in staged["model"].items()},
                              {k: v for k, v in tree["model"].items()}, "model")
    for i, st in tree["optim"]["state"].items():
        for k, v in st.items():
            assert np.asarray(staged["optim"]["state"][i][k]).tobytes() == v.numpy().tobytes(), (i, k)


def test_frozen_tensors_are_copied_once_then_skipped():
    model, opt = _fine_tune()
    _train(model, opt)
    stager = Stager(as_numpy=True)
    tree = _tree(model, opt)
    stager.stage(tree)
    assert stager.full and stager.copied_bytes == stager.nbytes
    frozen = _nbytes(p for p in model.parameters() if not p.requires_grad)
    for _ in range(3):
        _train(model, opt)
        tree = _tree(model, opt)
        staged = stager.stage(tree)
        assert not stager.full
        assert stager.skipped_bytes == frozen  # the trainable head and AdamW's state: all copied
        assert stager.copied_bytes == stager.nbytes - frozen
        _assert_staged_is_live(staged, tree)
    assert stager.summary().startswith(f"copied {stager.tensors - 6}/{stager.tensors} tensors, ")


def test_a_sparse_data_write_is_caught_at_the_next_full_stage():
    """``.data`` writes do not bump ``_version``; a write the probe does not sample stays
    unseen until the periodic full stage (here every 3rd)."""
    model, opt = _fine_tune()
    stager = Stager(as_numpy=True, full_stage_every=3)
    stager.stage(_tree(model, opt))  # stage 0: full
    w = model[0].weight
    version = w._version
    w.data[0, 1] += 1.0  # element 1 is not one of the probed positions
    assert w._version == version, "torch now bumps .data writes: update the Stager's docstring"
    staged = stager.stage(_tree(model, opt))  # stage 1: skipped, stale (the documented limit)
    assert staged["model"]["0.weight"][0, 1] != w[0, 1].item()
    stager.stage(_tree(model, opt))  # stage 2: still stale
    staged = stager.stage(_tree(model, opt))  # stage 3: full
    assert stager.full and staged["model"]["0.weight"][0, 1] == w[0, 1].item()


def test_a_dense_write_the_counter_misses_is_caught_by_the_probe(caplog):
    model, opt = _fine_tune()
    stager = Stager(as_numpy=True)
    stager.stage(_tree(model, opt))
    model[1].weight.data.mul_(2)  # no version bump, every element moves
    with caplog.at_level(logging.WARNING, logger="ravex"):
        staged = stager.stage(_tree(model, opt))
    assert np.array_equal(staged["model"]["1.weight"], model[1].weight.detach().numpy())
    assert "'model/1.weight' changed without bumping its version counter" in caplog.text
    assert stager.skipped_bytes == stager.nbytes - _nbytes([model[1].weight])  # no step: the rest sat still


def test_the_batched_device_probe_on_mixed_dtypes(monkeypatch, caplog):
    """The GPU path of the probe (samples gathered where they live, one transfer), run on
    CPU tensors: only the tensors written behind the counter's back are copied again."""
    import ravex.saving.stager as saver

    monkeypatch.setattr(saver, "_gather_on_device", lambda t: True)
    tree = {"bf": torch.randn(300, 7).to(torch.bfloat16), "i": torch.arange(1000), "b": torch.ones(5, dtype=torch.bool),
            "s": torch.tensor(3.0), "t": torch.randn(40, 50).T, "h": torch.randn(100, dtype=torch.float16)}
    stager = Stager(as_numpy=True)
    stager.stage(tree)
    tree["i"].data.add_(1)
    tree["t"].data.mul_(2)  # a non-contiguous view: sampled by multi-index
    with caplog.at_level(logging.WARNING, logger="ravex"):
        staged = stager.stage(tree)
    assert stager.copied_tensors == 2 and "'i' changed" in caplog.text and "'t' changed" in caplog.text
    for k, v in tree.items():
        assert np.asarray(staged[k]).tobytes() == v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), k


def test_a_fused_optimizer_turns_skipping_off(caplog):
    """Fused kernels write params and moments without bumping their counters."""
    model, opt = _fine_tune(fused=True)
    _train(model, opt)
    stager = Stager(as_numpy=True)
    stager.stage(_tree(model, opt))
    head = model[3].weight
    version = head._version
    _train(model, opt)
    assert head._version == version, "fused optimizers now bump _version: update the Stager's docstring"
    with caplog.at_level(logging.WARNING, logger="ravex"):
        tree = _tree(model, opt)
        staged = stager.stage(tree)
    assert stager.full and stager.copied_bytes == stager.nbytes and "fused optimizer" in caplog.text
    _assert_staged_is_live(staged, tree)


@pytest.mark.parametrize("options", [{"skip_unchanged": False}, {"full_stage_every": 1}])
def test_skipping_off_copies_every_tensor(options):
    model, opt = _fine_tune()
    stager = Stager(as_numpy=True, **options)
    for _ in range(3):
        _train(model, opt)
        stager.stage(_tree(model, opt))
        assert stager.full and stager.skipped_bytes == 0 and stager.copied_bytes == stager.nbytes


def test_a_new_tensor_at_a_freed_address_is_not_taken_for_the_old_one():
    """Same path, data_ptr, shape and version, different bytes off the probed positions:
    only the weak reference to the old (dead) storage tells them apart."""
    stager = Stager(as_numpy=True)
    ptrs = []
    for value in (0.0, 5.0, 7.0):
        t = torch.zeros(1 << 18)
        t[1] = value  # version 1 every time
        ptrs.append(t.data_ptr())
        staged = stager.stage({"t": t})
        assert staged["t"][1] == value
        del t
    assert stager.copied_bytes == stager.nbytes


def test_numpy_and_inference_tensors_are_always_copied():
    with torch.inference_mode():
        frozen = torch.ones(1000)
    arr = np.ones(1000, dtype=np.float32)
    stager = Stager(as_numpy=True)
    stager.stage({"i": frozen, "a": arr})
    arr[500] = 2.0
    with torch.inference_mode():
        frozen[500] = 2.0
    staged = stager.stage({"i": frozen, "a": arr})
    assert stager.copied_bytes == stager.nbytes and staged["a"][500] == 2.0 and staged["i"][500] == 2.0


def test_version_counter_on_this_torch():
    """The Stager's docstring lists what bumps ``_version``; this fails if torch changes it."""
    model, opt = _fine_tune()
    _train(model, opt)
    head = model.state_dict()["3.weight"]  # the detached alias a checkpoint sees
    moment = opt.state_dict()["state"][0]["exp_avg"]

    def bumps(fn, t=head) -> bool:
        before = t._version
        fn()
        return t._version != before

    assert bumps(lambda: _train(model, opt)) and bumps(lambda: _train(model, opt), moment)
    with torch.no_grad():
        assert bumps(lambda: model[3].weight.add_(1)) and bumps(lambda: model[3].weight.copy_(head * 0))
    assert bumps(lambda: model.load_state_dict(model.state_dict()))
    assert not bumps(lambda: model[3].weight.data.add_(1))
    assert not bumps(lambda: model[3].weight.detach().numpy().__iadd__(1))
    assert not bumps(lambda: opt.load_state_dict(opt.state_dict()), moment)


def test_config_keys_yaml_env_and_errors(tmp_path):
    config = RavexConfig.load(path=None, environ={})
    assert config.skip_unchanged is True and config.full_stage_every == 10
    path = tmp_path / "ravex.yaml"
    path.write_text("skip_unchanged: false\nfull_stage_every: 4\n")
    config = RavexConfig.load(path=str(path), environ={"RAVEX_FULL_STAGE_EVERY": "2"})
    assert config.skip_unchanged is False and config.full_stage_every == 2
    assert config.sources["full_stage_every"] == "env RAVEX_FULL_STAGE_EVERY"
    assert Stager.for_config(True, config).skip_unchanged is False
    for bad in ("0", "-1", "true", "ten"):
        with pytest.raises(ConfigError, match=r"'full_stage_every'.*integer >= 1") as info:
            RavexConfig.load(path=None, environ={"RAVEX_FULL_STAGE_EVERY": bad})
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"'skip_unchanged'.*true or false"):
        RavexConfig.load({"skip_unchanged": "sometimes"}, path=None, environ={})


def test_frozen_fine_tune_sigkilled_resumes_bitwise_while_skipping(tmp_path):
    """T_FROZEN: a frozen trunk and AdamW on the head. Only the first stage of each process
    is full (full_stage_every 100), so every later checkpoint is built from skipped buffers."""
    seed = random.SystemRandom().randrange(1, 2**31)
    kill_step = random.Random(seed).randrange(16, 34)
    print(f"kill step {kill_step}")
    argv = [harness.PYTHON, str(harness.TRAINEE)]
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    refs: list[harness.Result] = []  # the reference (no Ravex) runs beside the killed run: two cores
    ref_env = harness.child_env(T_ENTRY="none", T_FROZEN="1", T_OUT=str(ref_dir / "final.pt"))
    reference = threading.Thread(target=lambda: refs.append(harness.run(argv, ref_dir, ref_env)))
    reference.start()
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\nfull_stage_every: 100\n")
    env = dict(T_ENTRY="activate", T_FROZEN="1")
    first = harness.run(argv, tmp_path, harness.child_env(**env, T_BLOCK_AT=f"step:{kill_step}"), kill_on="BLOCKED")
    reference.join()
    ref = refs[0]
    assert ref.returncode == 0, ref.explain()
    assert first.returncode == -signal.SIGKILL, first.explain()
    lines = re.findall(r"checkpoint step \d+: .*; copied (\d+)/(\d+) tensors, .* of .* MiB(, full)?\)", first.stderr)
    assert len(lines) >= 3 and lines[0][2] and lines[0][0] == lines[0][1], first.explain()
    # the frozen trunk (2 weights, 2 biases) and whatever else sat still (an epoch's RNG)
    assert all(int(total) - int(copied) >= 4 and not full for copied, total, full in lines[1:]), first.explain()
    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(**env, T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == (kill_step - 1) // 5 * 5, second.explain()
    assert second.losses == ref.losses[second.resumed_from:]
    harness.assert_same_state(torch.load(out, weights_only=False), torch.load(ref_dir / "final.pt",
                                                                                 weights_only=False))
