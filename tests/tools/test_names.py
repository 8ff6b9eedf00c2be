"""Names a user knows: a model or optimizer the script named (a global of its main script) is
shown by that name in ``show``, ``diff`` and the inspector, and found by it; RNG streams and
loader bookkeeping are not counted as tensors and sit apart in the diff."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ravex.cli import main
from ravex.format import open_store
from ravex.format.steps.sections import is_bookkeeping, named, object_names
from ravex.tui.model import step_leaves


def _tree(k: float) -> dict:
    """Step state as the runtime lays it out (ravex.runtime.state.plan), one model and optimizer named."""
    weight = np.arange(12, dtype=np.float32).reshape(3, 4) * k
    return {
        "ravex": {"step": int(k), "format": 2},
        "models": [{"type": "Net", "name": "netG", "state": {"fc1.weight": weight, "fc1.bias": np.ones(3, np.float32)}},
                   {"type": "Net", "state": {"fc1.weight": weight + 1}}],
        "optimizers": [{"type": "AdamW", "name": "optimizerG", "shapes": [[[3, 4]]], "steps": int(k),
                        "state": {"fc1.weight": {"exp_avg": weight * 0.1, "step": np.float32(k)}},
                        "param_groups": [{"lr": 1e-3, "params": ["fc1.weight"]}]}],
        "loaders": [{"type": "DataLoader", "yielded": int(k) * 4, "epoch_rng": {"torch": np.full(8, k, np.uint8)}}],
        "rng": {"torch": np.full(16, k, np.uint8), "python": [3, int(k)]},
    }


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "ck"
    with open_store(root, create=True).writer() as w:
        w.commit(1, _tree(1.0))
        w.commit(2, _tree(2.0))
    return root


def test_sections_of_a_path():
    assert is_bookkeeping("rng/torch") and is_bookkeeping("loaders/0/epoch_rng/torch")
    assert is_bookkeeping("rank-1/rng/torch") and is_bookkeeping("rank-0/rank-0/loaders/0/yielded")
    assert is_bookkeeping("script/frames/0/variables/X/ravex_tensor")  # the script loop position
    assert not is_bookkeeping("models/0/state/rng") and not is_bookkeeping("rngs/x")
    names = object_names(_tree(1.0))
    assert names == {"models/0": "models/netG", "optimizers/0": "optimizers/optimizerG"}
    assert named("optimizers/0/state/fc1.weight/exp_avg", names) == "optimizers/optimizerG/state/fc1.weight/exp_avg"
    assert named("models/1/state/fc1.weight", names) == "models/1/state/fc1.weight"


def test_show_names_and_counts(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["show", f"{store}@2"]) == 0
    out = capsys.readouterr().out
    assert "(1 rank(s), 5 tensors, 2 of RNG and loader state)" in out
    assert "netG" in out and "optimizerG" in out and "fc1.weight" in out
    assert main(["show", f"{store}@2", "optimizers/optimizerG/state/fc1.weight/exp_avg", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["tensors"]
    assert entry["path"] == "optimizers/0/state/fc1.weight/exp_avg"
    assert entry["name"] == "optimizers/optimizerG/state/fc1.weight/exp_avg" and entry["bookkeeping"] is False


def test_diff_keeps_rng_and_loader_state_apart(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["diff", f"{store}@1", f"{store}@2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(t["name"] for t in doc["bookkeeping"]) == ["loaders/0/epoch_rng/torch", "rng/torch"]
    assert not [t for t in doc["tensors"] if is_bookkeeping(t["name"])]
    assert doc["summary"] == {"changed": 4, "unchanged": 1}  # training tensors only
    assert {v["name"] for v in doc["bookkeeping_values"]} == {"loaders/0/yielded", "rng/python/1"}
    assert "loaders/0/yielded" not in {v["name"] for v in doc["values"]}
    assert main(["diff", f"{store}@1", f"{store}@2"]) == 0
    out = capsys.readouterr().out
    training, _, apart = out.partition("RNG and loader state")
    assert "models/netG/state/fc1.weight" in training and "optimizers/optimizerG/state/fc1.weight/exp_avg" in training
    assert "rng/torch" in apart and "rng/torch" not in training and "loaders/0/yielded" in apart


def test_inspector_leaves_show_the_names(store):
    leaves = {leaf.name: leaf for leaf in step_leaves(open_store(store).open_step(2))}
    assert leaves["models/netG/state/fc1.weight"].path == "models/0/state/fc1.weight"
    assert leaves["optimizers/optimizerG/param_groups/0/lr"].path == "optimizers/0/param_groups/0/lr"
    assert "models/1/state/fc1.weight" in leaves
