"""Optimizer state is stored under the parameter's name (``optimizers/0/state/fc1.weight/exp_avg``)
and restored by name: a rerun that builds its param groups in another order resumes bitwise; a
store written with index names (tree format 1) still resumes; the main script's module global
bound to a model or optimizer is recorded as its name."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import ravex
from ravex.errors import RestoreError
from ravex.format import open_store
from ravex.runtime.state import plan

pytestmark = pytest.mark.usefixtures("ravex_clean")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _objects(seed: int, order: str = "as written"):
    torch.manual_seed(seed)
    net = Net()
    first = {"params": [net.fc1.weight, net.fc1.bias], "lr": 1e-2}
    second = {"params": [net.fc2.weight, net.fc2.bias], "lr": 3e-3, "weight_decay": 0.1}
    if order == "reversed":  # groups swapped, parameters within each swapped
        first["params"].reverse()
        second["params"].reverse()
        first, second = second, first
    return net, torch.optim.AdamW([first, second])


def _step(net: Net, opt: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    net(x).square().mean().backward()
    opt.step()


def _by_name(net: Net, opt: torch.optim.Optimizer) -> dict[str, object]:
    """Parameters, their optimizer state and their group's hyperparameters, by parameter name."""
    names = {id(p): n for n, p in net.named_parameters()}
    out: dict[str, object] = {f"param {n}": p.detach().clone() for n, p in net.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            out[f"lr {names[id(p)]}"] = (group["lr"], group["weight_decay"])
            out.update({f"state {names[id(p)]} {k}": v.clone() for k, v in opt.state[p].items()})
    return out


def _assert_same(got: dict[str, object], want: dict[str, object]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        other = got[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor) and torch.equal(other, value), key
        else:
            assert other == value, key


def _reference() -> dict[str, object]:
    net, opt = _objects(seed=0)
    for i in range(5):
        _step(net, opt, seed=i)
    return _by_name(net, opt)


def _first_run(store: str) -> None:
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    net, opt = _objects(seed=0)
    for i in range(3):
        _step(net, opt, seed=i)
    ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()


def _rerun(store: str, order: str) -> dict[str, object]:
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    net, opt = _objects(seed=1, order=order)
    for i in range(3, 5):
        _step(net, opt, seed=i)  # the first forward restores step 3
    assert ravex.status()["resumed_from"] == 3
    return _by_name(net, opt)


def test_state_is_stored_by_name_and_a_rerun_with_groups_reordered_resumes_bitwise(tmp_path):
    want = _reference()
    store = str(tmp_path / "ck")
    _first_run(store)
    reader = open_store(store).open_step(3)
    assert "optimizers/0/state/fc1.weight/exp_avg" in reader.arrays
    assert "optimizers/0/state/fc2.bias/exp_avg_sq" in reader.arrays
    assert not [p for p in reader.arrays if p.startswith("optimizers/0/state/state/")]
    groups = reader.read(subtree=("optimizers", 0, "param_groups"))
    assert [g["params"] for g in groups] == [["fc1.weight", "fc1.bias"], ["fc2.weight", "fc2.bias"]]
    _assert_same(_rerun(store, order="reversed"), want)


def test_a_store_with_index_names_still_resumes(tmp_path, monkeypatch):
    want = _reference()
    store = str(tmp_path / "ck")
    with monkeypatch.context() as m:  # what Ravex 1.0 wrote: format 1, the state_dict as it is
        m.setattr(plan, "TREE_FORMAT", 1)
        m.setattr(plan, "by_name", lambda state, keys: {"state": state})
        _first_run(store)
    reader = open_store(store).open_step(3)
    assert reader.read(subtree="ravex")["format"] == 1
    assert "optimizers/0/state/state/0/exp_avg" in reader.arrays
    _assert_same(_rerun(store, order="as written"), want)


def test_a_parameter_the_checkpoint_lacks_is_named(tmp_path):
    store = str(tmp_path / "ck")
    _first_run(store)
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    net = Net()
    opt = torch.optim.AdamW([{"params": [net.fc1.weight, net.fc1.bias, net.fc2.bias]},
                             {"params": [net.fc2.weight]}])
    with pytest.raises(RestoreError, match=r"optimizer #0 \(AdamW\): no param group of the checkpoint holds "
                                           r"exactly the parameters \['fc1.weight', 'fc1.bias', 'fc2.bias'\]"):
        _step(net, opt, seed=3)


def test_the_main_scripts_global_names_the_model_and_optimizer(tmp_path, monkeypatch):
    store = str(tmp_path / "ck")
    main = sys.modules["__main__"]
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    net, opt = _objects(seed=0)
    monkeypatch.setattr(main, "netG", net, raising=False)
    monkeypatch.setattr(main, "optimizerG", opt, raising=False)
    _step(net, opt, seed=0)
    ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()
    tree = open_store(store).open_step(1).read(subtree="models")
    assert tree[0]["name"] == "netG"
    assert open_store(store).open_step(1).read(subtree="optimizers")[0]["name"] == "optimizerG"
