"""Another script is another run: an evaluation script started where a training's
``ravex.yaml`` lies (under ``ravex enable`` or with ``ravex.activate()``) is not the run that
wrote the store. Nothing is restored into it, it writes nothing into the training's
timeline, and it never fails because of the store; it is told so once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from . import harness

SHAPES = Path(__file__).with_name("shapes")

EVAL = '''
from probe import entry
entry()
import torch
from torch import nn
torch.manual_seed(5)
model = nn.Sequential(nn.Embedding(40, 16), nn.Dropout(0.2), nn.Linear(16, 40))
with torch.no_grad():
    for p in model.parameters():
        p.fill_(0.01)
if {optimizer}:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.zeros(2, 3, dtype=torch.long)).sum().backward()
    opt.step()
model.eval()
out = model(torch.arange(6).view(2, 3)).sum().item()
print("EVAL", out.hex())
'''


@pytest.mark.parametrize("optimizer", [False, True])
def test_an_evaluation_script_beside_a_training_store_is_its_own_run(tmp_path, optimizer):
    shutil.copy(SHAPES / "probe.py", tmp_path)
    shutil.copy(SHAPES / "while_globals.py", tmp_path)
    (tmp_path / "eval.py").write_text(EVAL.format(optimizer=optimizer))
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    train = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert train.returncode == 0, train.explain()
    steps = sorted(p.name for p in (tmp_path / "ckpt" / "steps").iterdir())
    plain = harness.run([harness.PYTHON, "eval.py"], tmp_path, harness.child_env(T_ENTRY="none"))
    ran = harness.run([harness.PYTHON, "eval.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert ran.returncode == 0, ran.explain()
    assert [line for line in ran.stdout if line.startswith("EVAL")] == [
        line for line in plain.stdout if line.startswith("EVAL")], ran.explain()
    told = [line for line in ran.stderr.splitlines() if "is not the script that wrote" in line]
    assert len(told) == 1 and "while_globals.py" in told[0] and "eval.py" in told[0], ran.explain()
    assert sorted(p.name for p in (tmp_path / "ckpt" / "steps").iterdir()) == steps
    again = harness.run([harness.PYTHON, "while_globals.py"], tmp_path, harness.child_env(T_ENTRY="activate"))
    assert again.returncode == 0 and again.resumed_from is not None, again.explain()
    assert "is not the script" not in again.stderr, again.explain()
