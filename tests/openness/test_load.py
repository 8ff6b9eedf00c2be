"""ravex.load: a step's state tree with torch tensors, one line into a model."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from open_helpers import same, torch_numpy

import ravex
from ravex.format import open_store

_NUMPY_OF = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """What the runtime hands the format: a numpy array, through the bits for bf16/float8."""
    t = t.detach().cpu().contiguous()
    if t.dtype in _NUMPY_OF:
        bits, np_type = _NUMPY_OF[t.dtype]
        return t.view(bits).numpy().view(np_type)
    return t.numpy()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(7, 5)
        self.emb = torch.nn.Embedding(11, 4).to(torch.bfloat16)
        self.norm = torch.nn.LayerNorm(5)
        self.register_buffer("steps", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("scale8", torch.linspace(-1, 1, 6).to(torch.float8_e4m3fn))


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.steps.fill_(42)
    tree = {"model": {k: to_numpy(v) for k, v in model.state_dict().items()}, "epoch": 3, "lr": 1e-3}
    store = open_store(tmp_path / "ckpt", create=True)
    with store.writer(compression="zstd") as w:
        w.commit(10, tree)
    return tmp_path / "ckpt", model


def test_load_state_dict_in_one_line(saved):
    path, model = saved
    fresh = Net()
    fresh.load_state_dict(ravex.load(path)["model"])
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert a.dtype == b.dtype and same(torch_numpy(a), torch_numpy(b)), name


def test_subtree_device_and_plain_values(saved):
    path, _ = saved
    state = ravex.load(str(path), step="latest")
    assert state["epoch"] == 3 and state["lr"] == 1e-3
    assert state["model"]["emb.weight"].dtype == torch.bfloat16
    assert state["model"]["scale8"].dtype == torch.float8_e4m3fn
    assert state["model"]["steps"].shape == () and int(state["model"]["steps"]) == 42
    model_only = ravex.load(path, step=10, subtree="model", device="cpu")
    assert set(model_only) == set(state["model"]) and model_only["fc.weight"].device.type == "cpu"


def test_lists_of_plain_values_and_lists_with_tensors(tmp_path):
    """tree_to_torch leaves lists of plain values as they are (fast path) and still turns the
    arrays inside mixed lists and tuples into tensors."""
    store = open_store(tmp_path / "ckpt", create=True)
    with store.writer() as w:
        w.commit(1, {"rng": [3, list(range(625)), None], "ints": list(range(625)),
                     "mixed": [np.arange(3, dtype=np.int32), 2.5, "x"], "tup": (np.ones(2), 1)})
    tree = ravex.load(tmp_path / "ckpt")
    assert tree["ints"] == list(range(625)) and tree["rng"] == [3, list(range(625)), None]
    assert isinstance(tree["mixed"][0], torch.Tensor) and tree["mixed"][1:] == [2.5, "x"]
    assert isinstance(tree["tup"], tuple) and isinstance(tree["tup"][0], torch.Tensor) and tree["tup"][1] == 1
