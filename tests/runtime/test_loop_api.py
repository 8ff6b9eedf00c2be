"""``ravex.loop`` in-process: a wrapped DataLoader inside a wrapped epoch loop, what a
rerun with other loops is told, and the API outside Ravex. A "rerun" is a fresh set of
objects under a fresh activation in the same process (test_loops.py kills for real).
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ravex

pytestmark = pytest.mark.usefixtures("ravex_clean")


@pytest.fixture
def warnings():
    """The ravex logger's warnings (it does not propagate to the root logger)."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Keep()
    logging.getLogger("ravex").addHandler(handler)
    yield records
    logging.getLogger("ravex").removeHandler(handler)


def _objects():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
    return model, opt, DataLoader(data, batch_size=4, shuffle=True)


def _step(model, opt, x, y) -> float:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def _train(model, opt, loader, epochs_started: list[int], stop_after: int | None = None):
    losses: list[float] = []
    for epoch in ravex.loop(range(3)):
        epochs_started.append(epoch)
        for x, y in ravex.loop(loader):
            losses.append(_step(model, opt, x, y))
            if len(losses) == stop_after:
                return losses
    return losses


def _train_elsewhere(model, opt, loader) -> None:
    for _ in ravex.loop(range(3)):  # another call site than _train's
        for x, y in loader:
            _step(model, opt, x, y)


def test_wrapped_dataloader_in_wrapped_epochs_resumes_bitwise(tmp_path):
    """The epoch loop skips its finished epoch without running its body; the DataLoader
    skips its consumed batches at its sampler and replays the epoch's shuffle."""
    reference = _train(*_objects(), epochs_started=[])  # inactive: ravex.loop is the iterable
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=4, checkpoint_on_exit=False)
    first = _train(*_objects(), epochs_started=[], stop_after=13)  # step 12 saved at the 13th start
    ravex.flush()
    assert ravex.status()["last_written_step"] == 12
    ravex.deactivate()

    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=4)
    started: list[int] = []
    second = _train(*_objects(), epochs_started=started)
    assert ravex.status()["resumed_from"] == 12 and ravex.step() == 30
    assert started == [1, 2], "the finished epoch 0 must not run again"
    assert first == reference[:13] and second == reference[12:]


def test_a_rerun_with_other_loops_is_told_which(tmp_path, warnings):
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=4, checkpoint_on_exit=False)
    _train(*_objects(), epochs_started=[], stop_after=6)
    ravex.flush()
    ravex.deactivate()

    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=4)
    _train_elsewhere(*_objects())
    assert ravex.status()["resumed_from"] == 4
    lost = [w for w in warnings if "cannot resume the wrapped loops" in w]
    assert len(lost) == 1 and "\n" not in lost[0]
    assert lost[0].count("test_loop_api.py:") == 2, lost[0]


def test_outside_ravex_loop_is_the_iterable_itself():
    items = [1, 2, 3]
    assert ravex.loop(items) is items


def test_a_loop_without_optimizer_counts_its_innermost_iterations(tmp_path):
    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=3, checkpoint_on_exit=False)
    model = nn.Linear(2, 1)
    for _ in ravex.loop(range(2)):
        for _ in ravex.loop(range(4)):
            model(torch.ones(1, 2)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
    # 8 inner iterations are 8 steps; the outer iterations held a nested loop, so none
    assert ravex.step() == 8
    ravex.flush()
    assert ravex.status()["last_written_step"] == 6
