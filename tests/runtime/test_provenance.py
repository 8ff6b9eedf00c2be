"""What a run was: the run record and each step's training loss, written by real training runs.

A seeded training script in a temporary git repository prints the loss of every step; the
store's steps must hold exactly those losses (bit for bit), the run's record must name the
repository's commit (dirty once a tracked file changes) and the command line, and no secret
given to the run (in ``ravex.yaml``, the environment or the command line) may appear in any
byte of the store.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import torch

from ravex.format import open_store
from ravex.format.history.runs import NOT_A_CHECKOUT, read_run
from ravex.runtime.config import RavexConfig
from ravex.runtime.recording import provenance

from . import harness

SCRIPT = '''\
import os
import ravex
ravex.activate()
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
step = 0
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        os.write(1, f"LOSS {step} {loss.item().hex()}\\n".encode())
'''

YAML_SECRET = "yaml-secret-Zq81x"
ENV_SECRET = "env-token-Pw93kd"
ARGV_SECRET = "argv-password-Lm27c"


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          cwd=repo, check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding the training script, committed."""
    path = tmp_path / "project"
    path.mkdir()
    (path / "train.py").write_text(SCRIPT)
    (path / "notes.txt").write_text("first\n")
    _git(path, "init", "-q", ".")
    _git(path, "add", "train.py", "notes.txt")
    _git(path, "commit", "-qm", "the script")
    return path


def _train(repo: Path, store: Path) -> harness.Result:
    (repo / "ravex.yaml").write_text(
        f"storage:\n  url: {store}\n  access_key: AKIAEXAMPLE\n  secret_key: {YAML_SECRET}\n"
        "checkpoint_every: 3\nkeep_last: 0\n")
    env = harness.child_env(GITHUB_TOKEN=ENV_SECRET)
    result = harness.run([harness.PYTHON, "train.py", "--password", ARGV_SECRET], repo, env)
    assert result.returncode == 0, result.explain()
    return result


def _losses(result: harness.Result) -> dict[int, str]:
    return {int(line.split()[1]): line.split()[2] for line in result.stdout if line.startswith("LOSS ")}


def test_each_step_holds_its_loss_and_the_run_record_says_what_the_run_was(repo: Path, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    result = _train(repo, store_dir)
    printed = _losses(result)
    store = open_store(store_dir)
    steps = sorted(store.complete_steps())
    assert steps == [3, 6, 9, 12, 15, 16], steps  # every 3 steps, and the exit checkpoint
    runs = set()
    for step in steps:
        reader = store.open_step(step)
        assert float(reader.metadata["loss"]).hex() == printed[step], step  # bit for bit
        runs.add(store.manifest(step, 0).run)
    assert len(runs) == 1, runs  # one run wrote them all

    record = read_run(store.storage, runs.pop())
    assert record is not None
    assert record.argv == ("train.py", "--password", "***")
    assert record.script == str(repo / "train.py") and record.cwd == str(repo)
    assert record.git.commit == _git(repo, "rev-parse", "HEAD") and record.git.dirty is False
    assert record.hostname == socket.gethostname() and record.world_size == 1
    assert record.versions["torch"] == torch.__version__
    assert record.config["checkpoint_every"] == (3, f"{repo / 'ravex.yaml'}")
    assert record.config["storage.url"][0] == str(store_dir)
    assert record.config["storage.secret_key"][0] == record.config["storage.access_key"][0] == "***"
    for path in store_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (YAML_SECRET, ENV_SECRET, ARGV_SECRET, "AKIAEXAMPLE"):
                assert secret.encode() not in data, f"{secret} written to {path}"

    (repo / "notes.txt").write_text("changed\n")  # a tracked file differs from the commit
    _train(repo, tmp_path / "second")
    second = open_store(tmp_path / "second")
    record = read_run(second.storage, second.manifest(second.latest_step() or 0, 0).run)
    assert record is not None and record.git.commit == _git(repo, "rev-parse", "HEAD")
    assert record.git.dirty is True


def test_git_state_outside_a_checkout_and_with_an_uncommitted_script(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert provenance.git_state(str(plain)).to_json() == {"unavailable": NOT_A_CHECKOUT}
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a")
    _git(repo, "init", "-q", ".")
    assert provenance.git_state(str(repo)).unavailable == "a git checkout with no commit yet"
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-qm", "a")
    (repo / "new.py").write_text("print()")
    assert provenance.git_state(str(repo)).dirty is False  # an untracked file elsewhere is not dirt
    assert provenance.git_state(str(repo), str(repo / "new.py")).dirty is True  # the script itself is


def test_secrets_are_masked_wherever_they_appear() -> None:
    config = RavexConfig.load(
        {"storage": {"url": "s3://AK:hunter2hunter2@bucket/run", "secret_key": "sk-123456789"}},
        environ={"AWS_ACCESS_KEY_ID": "AKIA0000", "HF_TOKEN": "hf_abcdefgh", "HOME": "/home/u"},
        cwd="/nonexistent")
    record = provenance.gather(config, 1, environ={"HF_TOKEN": "hf_abcdefgh", "HOME": "/home/u"},
                               argv=["train.py", "--api-key=k-Qx7", "--lr", "0.1", "--hub", "x-hf_abcdefgh-y",
                                     "--token", "t-Vb2", "s3://u:p@h/x"])
    text = repr(record.to_json())
    for secret in ("hunter2hunter2", "sk-123456789", "AKIA0000", "hf_abcdefgh", "k-Qx7", "t-Vb2", ":p@"):
        assert secret not in text, secret
    assert record.argv == ("train.py", "--api-key=***", "--lr", "0.1", "--hub", "x-***-y",
                           "--token", "***", "s3://***@h/x")
    assert record.config["storage.url"] == ("s3://***@bucket/run", "activate()")
    assert record.config["storage.access_key"] == ("***", "env AWS_ACCESS_KEY_ID")


@pytest.mark.usefixtures("ravex_clean")
def test_the_loss_under_amp_is_the_unscaled_one_and_a_non_scalar_backward_is_not_a_loss(tmp_path: Path) -> None:
    """``scaler.scale(loss).backward()`` records ``loss``, not ``loss * scale``; a later backward
    through a non-scalar output (with an explicit gradient) leaves the loss in place."""
    import ravex

    ravex.activate(storage=str(tmp_path / "store"), checkpoint_every=2, keep_last=0)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    losses = []
    for _ in range(4):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        out = model(torch.randn(3, 4))
        out.backward(torch.ones_like(out))  # not a loss: three elements
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    ravex.checkpoint()
    ravex.flush()
    store = open_store(tmp_path / "store")
    assert float(store.open_step(4).metadata["loss"]) == losses[3]
    assert float(store.open_step(2).metadata["loss"]) == losses[1]
