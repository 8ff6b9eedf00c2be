"""A wrapped model is stored under its own names (issue 32, "names users know"): a model
under ``torch.compile`` (``_orig_mod.``), DDP (``module.``) or an activation-checkpoint
wrapper is saved as the plain module, with the plain module's type, in the model and in the
optimizer's parameter names; it resumes bitwise into a compiled or a plain module alike; a
store written before (with the wrappers' prefixes) still resumes; ``ravex.load`` of a
compiled run loads into the plain module with ``strict=True``.

``torch.compile(backend="eager")`` wraps exactly as the default backend does (the same
``OptimizedModule``), in a second instead of a C++ build.
"""

from __future__ import annotations

import signal

import pytest
import torch
from torch import nn

import ravex
from ravex.format import open_store
from ravex.runtime.state import names, plan

from . import harness

pytestmark = pytest.mark.usefixtures("ravex_clean")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return self.head(torch.tanh(self.embed(x)))


def _objects(seed: int, compiled: bool) -> tuple[nn.Module, Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.AdamW([{"params": net.embed.parameters(), "lr": 1e-2},
                             {"params": net.head.parameters(), "lr": 3e-3}])
    return (torch.compile(net, backend="eager") if compiled else net), net, opt


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _state(net: Net, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model {k}": v.clone() for k, v in net.state_dict().items()}
    names_of = {id(p): n for n, p in net.named_parameters()}
    for p, st in opt.state.items():
        out.update({f"opt {names_of[id(p)]} {k}": v.clone() for k, v in st.items()})
    return out


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def _reference() -> dict[str, torch.Tensor]:
    model, net, opt = _objects(seed=0, compiled=False)
    for i in range(5):
        _step(model, opt, seed=i)
    return _state(net, opt)


def _first_run(store: str, compiled: bool) -> None:
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    model, _, opt = _objects(seed=0, compiled=compiled)
    for i in range(3):
        _step(model, opt, seed=i)
    ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()


def _rerun(store: str, compiled: bool) -> dict[str, torch.Tensor]:
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    model, net, opt = _objects(seed=1, compiled=compiled)
    for i in range(3, 5):
        _step(model, opt, seed=i)  # the first forward restores step 3
    assert ravex.status()["resumed_from"] == 3
    return _state(net, opt)


def _written_before_names_were_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Ravex wrote before: the root module's own ``state_dict()`` names and type."""
    monkeypatch.setattr(plan, "plain_state", lambda m: dict(m.state_dict()))
    monkeypatch.setattr(plan, "type_name", lambda m: type(m).__name__)
    monkeypatch.setattr(plan, "renamer", lambda model: lambda name: name)


PLAIN = ["embed.weight", "embed.bias", "head.weight", "head.bias", "seen"]


def test_a_compiled_model_is_stored_under_the_plain_modules_names_and_type(tmp_path):
    store = str(tmp_path / "ck")
    _first_run(store, compiled=True)
    step = open_store(store).open_step(3)
    models = step.read(subtree="models")
    assert models[0]["type"] == "Net"
    assert sorted(models[0]["state"]) == sorted(PLAIN)
    assert not [p for p in step.arrays if "_orig_mod" in p]
    groups = step.read(subtree=("optimizers", 0, "param_groups"))
    assert [g["params"] for g in groups] == [["embed.weight", "embed.bias"], ["head.weight", "head.bias"]]
    assert "optimizers/0/state/head.weight/exp_avg" in step.arrays

    plain = Net()
    plain.load_state_dict(ravex.load(store)["models"][0]["state"], strict=True)
    assert torch.equal(plain.head.weight, torch.as_tensor(models[0]["state"]["head.weight"]))
    Net().load_state_dict(ravex.load(store, subtree=("models", 0, "state")), strict=True)


@pytest.mark.parametrize("first,rerun", [(True, False), (True, True), (False, True)],
                         ids=["compiled-to-plain", "compiled-to-compiled", "plain-to-compiled"])
def test_a_run_resumes_bitwise_into_a_compiled_or_a_plain_module_alike(tmp_path, first, rerun):
    want = _reference()
    store = str(tmp_path / "ck")
    _first_run(store, compiled=first)
    _assert_same(_rerun(store, compiled=rerun), want)


@pytest.mark.parametrize("rerun", [True, False], ids=["into-compiled", "into-plain"])
def test_a_store_written_with_orig_mod_prefixes_still_resumes(tmp_path, monkeypatch, rerun):
    want = _reference()
    store = str(tmp_path / "ck")
    with monkeypatch.context() as m:
        _written_before_names_were_plain(m)
        _first_run(store, compiled=True)
    step = open_store(store).open_step(3)
    assert step.read(subtree="models")[0]["type"] == "OptimizedModule"
    assert "models/0/state/_orig_mod.head.weight" in step.arrays
    assert "optimizers/0/state/_orig_mod.head.weight/exp_avg" in step.arrays
    _assert_same(_rerun(store, compiled=rerun), want)


def test_a_model_compiled_after_another_was_created_keeps_its_place(tmp_path):
    """Models are matched by creation order: the wrapper's creation does not move a model."""
    store = str(tmp_path / "ck")
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    torch.manual_seed(0)
    first, second = Net(), nn.Linear(2, 2)
    compiled = torch.compile(first, backend="eager")
    runtime = ravex.activate()
    assert runtime.registry.models() == [compiled, second]
    ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()
    assert [m["type"] for m in open_store(store).open_step(0).read(subtree="models")] == ["Net", "Linear"]


def test_a_submodule_called_module_keeps_its_name_and_a_compiled_submodule_loses_orig_mod():
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)
            self.block = torch.compile(nn.Linear(2, 3), backend="eager")

    model = Holder()
    assert set(names.plain_state(torch.compile(model, backend="eager"))) == {
        "module.weight", "module.bias", "block.weight", "block.bias"}
    assert names.type_name(torch.compile(model, backend="eager")) == "Holder"
    assert names.stored_name("module.module.weight", "DistributedDataParallel") == "module.weight"
    assert names.stored_name("module._orig_mod.block._orig_mod.weight", "DistributedDataParallel") \
        == "block.weight"
    assert names.stored_name("module.weight", "Holder") == "module.weight"


def test_activation_checkpoint_wrappers_leave_the_optimizers_names(tmp_path):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    store = str(tmp_path / "ck")
    ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
    torch.manual_seed(0)
    model = nn.Sequential(checkpoint_wrapper(nn.Linear(6, 5)), nn.Tanh(), nn.Linear(5, 3))
    assert "0._checkpoint_wrapped_module.weight" in dict(model.named_parameters())
    opt = torch.optim.AdamW(model.parameters())
    _step(model, opt, seed=0)
    ravex.checkpoint()
    ravex.flush()
    ravex.deactivate()
    step = open_store(store).open_step(1)
    groups = step.read(subtree=("optimizers", 0, "param_groups"))
    assert groups[0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert sorted(step.read(subtree="models")[0]["state"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of this process alone (world size 1)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_stores_the_plain_names_and_an_old_store_with_module_prefixes_resumes(
        tmp_path, monkeypatch, one_rank_group):
    from torch.nn.parallel import DistributedDataParallel

    want = _reference()
    store = str(tmp_path / "ck")

    def first_run() -> None:
        ravex.activate(storage=store, checkpoint_every=10**6, checkpoint_on_exit=False)
        _, net, opt = _objects(seed=0, compiled=False)
        model = DistributedDataParallel(net)
        for i in range(3):
            _step(model, opt, seed=i)
        ravex.checkpoint()
        ravex.flush()
        ravex.deactivate()

    first_run()
    step = open_store(store).open_step(3)
    models = step.read(subtree="models")
    assert models[0]["type"] == "Net" and sorted(models[0]["state"]) == sorted(PLAIN)
    assert "optimizers/0/state/head.weight/exp_avg" in step.arrays
    _assert_same(_rerun(store, compiled=False), want)
    ravex.deactivate()

    store = str(tmp_path / "old")
    with monkeypatch.context() as m:
        _written_before_names_were_plain(m)
        first_run()
    step = open_store(store).open_step(3)
    assert step.read(subtree="models")[0]["type"] == "DistributedDataParallel"
    assert "optimizers/0/state/module.head.weight/exp_avg" in step.arrays
    _assert_same(_rerun(store, compiled=False), want)


@pytest.mark.parametrize("rerun", ["eager", ""], ids=["rerun-compiled", "rerun-plain"])
def test_a_sigkilled_compiled_run_resumes_bitwise(tmp_path, reference, rerun):
    """The trainee compiled (``T_COMPILE``), SIGKILLed at step 13, rerun compiled or not: it
    ends as the uninterrupted uncompiled run does (``eager`` computes what the plain module does)."""
    ref, ref_state = reference(0)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    argv = [harness.PYTHON, str(harness.TRAINEE)]
    first = harness.run(argv, tmp_path, harness.child_env(T_ENTRY="activate", T_COMPILE="eager",
                                                          T_BLOCK_AT="step:13"), kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL, first.explain()
    assert first.losses == ref.losses[: len(first.losses)]
    assert not [p for p in open_store(tmp_path / "ckpt").open_step(10).arrays if "_orig_mod" in p]
    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(T_ENTRY="activate", T_COMPILE=rerun, T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == 10, second.explain()
    assert second.losses == ref.losses[10:]
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)
