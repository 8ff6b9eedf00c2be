"""Loading never executes code from the store: the torch_save backend unpickles with
``weights_only=True``, so a planted ``step_<n>.pt`` whose pickle would run code is refused."""

from __future__ import annotations

import builtins
import os

import numpy as np
import pytest
import torch

from ravex.errors import CorruptObjectError
from ravex.runtime.config import RavexConfig
from ravex.saving.plan import SavePlan
from ravex.saving.torch_save import TorchSaveBackend


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: the file appearing proves code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


@pytest.fixture
def backend(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./ravex.yaml, no RAVEX_* from the outside
    config = RavexConfig.load({"storage": str(tmp_path / "ck"), "backend": "torch_save"}, environ={})
    b = TorchSaveBackend(config)
    yield b
    b.close()


def test_malicious_pickle_is_refused_and_never_runs(backend, tmp_path):
    marker = tmp_path / "pwned"
    path = backend._path(7)
    torch.save({"models": [{"state": {"w": torch.ones(2)}}], "evil": _Payload(str(marker))}, path)
    assert backend.complete_steps() == [7]

    with pytest.raises(CorruptObjectError, match=r"refused to load step 7: its pickle names code .*weights_only=True"
                                                 r".*builtins|io"):
        backend.load_step(7)
    assert not marker.exists()
    with pytest.raises(OSError):  # CorruptObjectError is also an OSError
        backend.load_latest()
    assert not marker.exists()

    # the same file through a plain unpickler does run the payload: the test above can fail
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_what_ravex_writes_loads_with_weights_only(backend):
    """Tensors, nested containers, the plain values a state tree holds, and numpy data (allowed
    for this load only) come back; nothing else needs allowing."""
    tree = {
        "models": [{"type": "Linear", "state": {"w": torch.arange(6.0).reshape(2, 3)}}],
        "rng": {"python": (3, tuple(range(5)), None), "torch": torch.get_rng_state()},
        "schedulers": [{"state": {"last_epoch": 4, "base_lrs": [0.1], "best": float("inf")}}],
        "custom": {"array": np.arange(4, dtype=np.uint32), "scalar": np.float64(0.25)},
    }
    backend.save(SavePlan(3, tree, {"step": 3}))
    backend.flush()
    assert backend.last_error is None, backend.last_error
    got = backend.load_step(3)
    assert torch.equal(got["models"][0]["state"]["w"], tree["models"][0]["state"]["w"])
    assert got["rng"]["python"] == (3, (0, 1, 2, 3, 4), None)
    assert got["schedulers"][0]["state"]["best"] == float("inf")
    assert got["custom"]["array"].tolist() == [0, 1, 2, 3] and got["custom"]["scalar"] == 0.25
    assert "_ravex_metadata" not in got


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "not a dict"])
def test_truncated_or_foreign_pt_is_a_one_line_error(backend, damage):
    path = backend._path(5)
    torch.save({"w": torch.ones(1000)}, path)
    data = open(path, "rb").read()
    if damage == "truncated":
        open(path, "wb").write(data[: len(data) // 2])
    elif damage == "not a zip":
        open(path, "wb").write(b"\x00" * 100)
    else:
        torch.save([1, 2, 3], path)
    with pytest.raises(CorruptObjectError, match=r"step_000000000005.pt: step 5 (is truncated or corrupt|holds a list)"
                       ) as info:
        backend.load_step(5)
    assert "\n" not in str(info.value)
    assert os.path.exists(path)  # reported, not deleted
